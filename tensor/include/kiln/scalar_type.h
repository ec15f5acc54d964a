// kiln/scalar_type.h: element types, their sizes and names, and PyTorch's type promotion.
//
//   kiln::ScalarType t = kiln::promote_types(kiln::kInt32, kiln::kFloat32);   // Float32
//   kiln::element_size(kiln::kBFloat16);                                       // 2
//   KILN_DISPATCH_ALL_TYPES(t, "add", [&] { using T = scalar_t; ... });
//
// Note [Type promotion]: like PyTorch, operands fall in categories bool < integer < floating.
// Tensor operands (dim > 0) win over zero-dim tensors, which win over Python-style scalars, but
// only within a category; a higher category always wins and then takes the default type of
// that category from the lower-priority operand (float32 for a float scalar).
#pragma once

#include <cstdint>
#include <cstring>
#include <ostream>

#include "kiln/half.h"

namespace kiln {

enum class ScalarType : int8_t {
  Bool,
  UInt8,
  Int8,
  Int16,
  Int32,
  Int64,
  Float16,
  BFloat16,
  Float32,
  Float64,
};
constexpr int kNumScalarTypes = 10;

constexpr ScalarType kBool = ScalarType::Bool;
constexpr ScalarType kUInt8 = ScalarType::UInt8;
constexpr ScalarType kInt8 = ScalarType::Int8;
constexpr ScalarType kInt16 = ScalarType::Int16;
constexpr ScalarType kInt32 = ScalarType::Int32;
constexpr ScalarType kInt64 = ScalarType::Int64;
constexpr ScalarType kFloat16 = ScalarType::Float16;
constexpr ScalarType kBFloat16 = ScalarType::BFloat16;
constexpr ScalarType kFloat32 = ScalarType::Float32;
constexpr ScalarType kFloat64 = ScalarType::Float64;

constexpr size_t element_size(ScalarType t) {
  constexpr size_t sizes[] = {1, 1, 1, 2, 4, 8, 2, 2, 4, 8};
  return sizes[static_cast<int>(t)];
}
constexpr bool is_floating(ScalarType t) { return t >= ScalarType::Float16; }
constexpr bool is_integral(ScalarType t, bool include_bool = false) {
  return (t >= ScalarType::UInt8 && t <= ScalarType::Int64) || (include_bool && t == kBool);
}
const char* scalar_type_name(ScalarType t);  // "float32", ...
// Parses "float32", "float", "bfloat16", ... ; throws ValueError for an unknown name.
ScalarType scalar_type_from_name(const char* name);
std::ostream& operator<<(std::ostream& os, ScalarType t);

// The common type of two dtypes (torch.promote_types).
ScalarType promote_types(ScalarType a, ScalarType b);

// Category of a value for result_type: 0 bool, 1 integer, 2 floating.
inline int type_category(ScalarType t) { return t == kBool ? 0 : (is_floating(t) ? 2 : 1); }

template <typename T> struct CppTypeToScalarType;
#define KILN_MAP_TYPE(cpp, st) \
  template <> struct CppTypeToScalarType<cpp> { static constexpr ScalarType value = st; };
KILN_MAP_TYPE(bool, kBool)
KILN_MAP_TYPE(uint8_t, kUInt8)
KILN_MAP_TYPE(int8_t, kInt8)
KILN_MAP_TYPE(int16_t, kInt16)
KILN_MAP_TYPE(int32_t, kInt32)
KILN_MAP_TYPE(int64_t, kInt64)
KILN_MAP_TYPE(Half, kFloat16)
KILN_MAP_TYPE(BFloat16, kBFloat16)
KILN_MAP_TYPE(float, kFloat32)
KILN_MAP_TYPE(double, kFloat64)
#undef KILN_MAP_TYPE

// The accumulation type: float for the reduced-precision floats and float32, double for float64,
// int64 for the integers (as PyTorch sums integers into int64).
template <typename T> struct AccType { using type = T; };
template <> struct AccType<Half> { using type = float; };
template <> struct AccType<BFloat16> { using type = float; };
template <> struct AccType<float> { using type = float; };
template <> struct AccType<bool> { using type = int64_t; };
template <> struct AccType<uint8_t> { using type = int64_t; };
template <> struct AccType<int8_t> { using type = int64_t; };
template <> struct AccType<int16_t> { using type = int64_t; };
template <> struct AccType<int32_t> { using type = int64_t; };
template <typename T> using acc_t = typename AccType<T>::type;

[[noreturn]] void unsupported_dtype(const char* op, ScalarType t);

}  // namespace kiln

#define KILN_DTYPE_CASE(st, cpp, ...) \
  case st: {                          \
    using scalar_t = cpp;             \
    return __VA_ARGS__();             \
  }

// Calls the lambda with `scalar_t` bound to the C++ type of `TYPE`.
#define KILN_DISPATCH_FLOAT_TYPES(TYPE, NAME, ...)                        \
  [&] {                                                                   \
    switch (TYPE) {                                                       \
      KILN_DTYPE_CASE(::kiln::kFloat32, float, __VA_ARGS__)               \
      KILN_DTYPE_CASE(::kiln::kFloat64, double, __VA_ARGS__)              \
      KILN_DTYPE_CASE(::kiln::kFloat16, ::kiln::Half, __VA_ARGS__)        \
      KILN_DTYPE_CASE(::kiln::kBFloat16, ::kiln::BFloat16, __VA_ARGS__)   \
      default:                                                            \
        ::kiln::unsupported_dtype(NAME, TYPE);                            \
    }                                                                     \
  }()

#define KILN_DISPATCH_INT_TYPES_CASES(...)                          \
  KILN_DTYPE_CASE(::kiln::kUInt8, uint8_t, __VA_ARGS__)             \
  KILN_DTYPE_CASE(::kiln::kInt8, int8_t, __VA_ARGS__)               \
  KILN_DTYPE_CASE(::kiln::kInt16, int16_t, __VA_ARGS__)             \
  KILN_DTYPE_CASE(::kiln::kInt32, int32_t, __VA_ARGS__)             \
  KILN_DTYPE_CASE(::kiln::kInt64, int64_t, __VA_ARGS__)

// Every numeric type except bool.
#define KILN_DISPATCH_NUMERIC_TYPES(TYPE, NAME, ...)                      \
  [&] {                                                                   \
    switch (TYPE) {                                                       \
      KILN_DTYPE_CASE(::kiln::kFloat32, float, __VA_ARGS__)               \
      KILN_DTYPE_CASE(::kiln::kFloat64, double, __VA_ARGS__)              \
      KILN_DTYPE_CASE(::kiln::kFloat16, ::kiln::Half, __VA_ARGS__)        \
      KILN_DTYPE_CASE(::kiln::kBFloat16, ::kiln::BFloat16, __VA_ARGS__)   \
      KILN_DISPATCH_INT_TYPES_CASES(__VA_ARGS__)                          \
      default:                                                            \
        ::kiln::unsupported_dtype(NAME, TYPE);                            \
    }                                                                     \
  }()

#define KILN_DISPATCH_ALL_TYPES(TYPE, NAME, ...)                          \
  [&] {                                                                   \
    switch (TYPE) {                                                       \
      KILN_DTYPE_CASE(::kiln::kFloat32, float, __VA_ARGS__)               \
      KILN_DTYPE_CASE(::kiln::kFloat64, double, __VA_ARGS__)              \
      KILN_DTYPE_CASE(::kiln::kFloat16, ::kiln::Half, __VA_ARGS__)        \
      KILN_DTYPE_CASE(::kiln::kBFloat16, ::kiln::BFloat16, __VA_ARGS__)   \
      KILN_DISPATCH_INT_TYPES_CASES(__VA_ARGS__)                          \
      KILN_DTYPE_CASE(::kiln::kBool, bool, __VA_ARGS__)                   \
      default:                                                            \
        ::kiln::unsupported_dtype(NAME, TYPE);                            \
    }                                                                     \
  }()
