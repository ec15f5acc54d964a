// kiln/scalar.h: a number that is not a tensor (alpha, fill values, clamp bounds).
//
//   kiln::Scalar s = 2.5;   s.to<float>();   s.is_floating();
//   kiln::Scalar i = int64_t{3};   kiln::Scalar b = true;
//   s.dtype();              // float64 / int64 / bool: the type a wrapped number gets
#pragma once

#include <cstdint>
#include <ostream>
#include <type_traits>

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

  template <typename T>
  T to() const {
    if (tag_ == Tag::Double) return static_cast<T>(d_);
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
      return T(static_cast<float>(i_));
    else
      return static_cast<T>(i_);
  }
  double to_double() const { return to<double>(); }
  int64_t to_int() const { return to<int64_t>(); }
  bool to_bool() const { return tag_ == Tag::Double ? d_ != 0 : i_ != 0; }

 private:
  enum class Tag : uint8_t { Double, Int, Bool };
  Tag tag_;
  union {
    double d_;
    int64_t i_;
  };
};

std::ostream& operator<<(std::ostream& os, const Scalar& s);

}  // namespace kiln
