// kiln/scalar.h: a number that is not a tensor (alpha, fill values, clamp bounds).
//
//   kiln::Scalar s = 2.5;   s.to<float>();   s.is_floating();
//   kiln::Scalar i = int64_t{3};   kiln::Scalar b = true;
//   s.dtype();              // float64 / int64 / bool: the type a wrapped number gets
#pragma once

#include <cstdint>
#include <limits>
#include <ostream>
#include <type_traits>

#include "kiln/scalar_math.h"
#include "kiln/scalar_type.h"

namespace kiln {

class Scalar {
 public:
  Scalar() : Scalar(int64_t{0}) {}
  Scalar(double v) : tag_(Tag::Double), d_(v) {}  // NOLINT
  Scalar(float v) : Scalar(double{v}) {}           // NOLINT
  Scalar(bool v) : tag_(Tag::Bool), i_(v) {}       // NOLINT
  template <typename T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  Scalar(T v) : tag_(Tag::Int), i_(static_cast<int64_t>(v)) {}  // NOLINT
  Scalar(Half v) : Scalar(double{float(v)}) {}      // NOLINT
  Scalar(BFloat16 v) : Scalar(double{float(v)}) {}  // NOLINT

  bool is_floating() const { return tag_ == Tag::Double; }
  bool is_integral() const { return tag_ == Tag::Int; }
  bool is_bool() const { return tag_ == Tag::Bool; }
  ScalarType dtype() const { return is_floating() ? kFloat64 : (is_bool() ? kBool : kInt64); }

  // The value in T. As in PyTorch, a value T cannot hold is an error ("value cannot be converted
  // to type int8 without overflow"): a fill value, alpha or bound is never silently changed.
  // Floating targets accept inf and nan; unsigned ones accept -max..-1 (uint8: -1 is 255).
  template <typename T>
  T to() const {
    if (tag_ == Tag::Double) {
      if (overflows<T>(d_)) fail_overflow(CppTypeToScalarType<T>::value);
      return convert<T>(d_);
    }
    if (overflows<T>(i_)) fail_overflow(CppTypeToScalarType<T>::value);
    return convert<T>(i_);
  }
  double to_double() const { return to<double>(); }
  int64_t to_int() const { return to<int64_t>(); }
  bool to_bool() const { return tag_ == Tag::Double ? d_ != 0 : i_ != 0; }

 private:
  template <typename T, typename V>
  static bool overflows(V v) {
    if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, double>) {
      return false;
    } else if constexpr (std::is_integral_v<T>) {
      constexpr double lo = static_cast<double>(std::numeric_limits<T>::lowest());
      constexpr double hi = static_cast<double>(std::numeric_limits<T>::max());
      if constexpr (std::is_floating_point_v<V>) {
        return v != v || v < lo || v > hi;  // PyTorch's rule: 127.5 does not fit int8
      } else if constexpr (sizeof(T) == 8) {
        return false;  // int64_t
      } else {
        return v > static_cast<int64_t>(hi) ||
               v < (std::is_unsigned_v<T> ? -static_cast<int64_t>(hi) : static_cast<int64_t>(lo));
      }
    } else {  // float, Half, BFloat16: a finite value beyond the largest finite one
      const double big = std::is_same_v<T, Half>       ? 65504.0
                         : std::is_same_v<T, BFloat16> ? 3.3895313892515355e38
                                                       : 3.4028234663852886e38;
      const double d = static_cast<double>(v);
      return d - d == 0 && (d > big || d < -big);
    }
  }
  [[noreturn]] void fail_overflow(ScalarType t) const;

  enum class Tag : uint8_t { Double, Int, Bool };
  Tag tag_;
  union {
    double d_;
    int64_t i_;
  };
};

std::ostream& operator<<(std::ostream& os, const Scalar& s);

}  // namespace kiln
