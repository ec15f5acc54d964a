// kiln/scalar_math.h: integer arithmetic and dtype conversion of one element, with the same
// defined results on the host (CPU kernels, Scalar) and on a CUDA device.
//
//   kiln::int_div_floor<int64_t>(INT64_MIN, -1);   // INT64_MIN: wraps, never traps
//   kiln::wrapping_mul<int32_t>(1 << 30, 4);       // 0
//   kiln::convert<int32_t>(1e30);                  // INT32_MAX (Note [Float to integer casts])
//   kiln::convert<uint8_t>(std::nan(""));          // 0
//
// Note [Integer edge values]: signed overflow is undefined in C++, and x86's idiv traps (SIGFPE)
// on INT_MIN / -1, which killed a worker for one hostile division. Every integer kernel goes
// through these functions, which give PyTorch's answers with no undefined step:
//  - add, sub, mul, neg, abs and pow wrap modulo 2^bits (abs(INT_MIN) and -INT_MIN are INT_MIN);
//  - INT_MIN / -1 is INT_MIN (trunc and floor), and INT_MIN % -1 is 0 (fmod and remainder);
//  - division by zero is the caller's business: the CPU raises ZeroDivisionError, CUDA gives 0
//    (Note [CUDA integer division by zero]); these functions expect b != 0.
//
// Note [Float to integer casts]: C++ leaves a float outside the target's range (and NaN)
// undefined, x86 gives INT_MIN for it, and PyTorch's CPU and CUDA kernels disagree. Kiln casts
// the same way on every backend: the value is truncated toward zero and saturates at the
// target's limits, and NaN becomes 0 (what CUDA's cvt.rzi does, and Rust's `as`). A Scalar (a
// fill value, alpha, a clamp bound) is different: as in PyTorch, one that does not fit is an
// error (Scalar::to).
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include "kiln/half.h"

namespace kiln {

template <typename T>
inline constexpr bool kIsReducedFloat = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

// Signed integers computed in their unsigned twin wrap instead of overflowing; everything else
// (unsigned, bool, floating) is computed as is.
template <typename T>
inline constexpr bool kWraps = std::is_integral_v<T> && std::is_signed_v<T>;

template <typename T>
KILN_HD inline T wrapping_add(T a, T b) {
  if constexpr (kWraps<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return static_cast<T>(a + b);
  }
}
template <typename T>
KILN_HD inline T wrapping_sub(T a, T b) {
  if constexpr (kWraps<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) - static_cast<U>(b)));
  } else {
    return static_cast<T>(a - b);
  }
}
template <typename T>
KILN_HD inline T wrapping_mul(T a, T b) {
  if constexpr (kWraps<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  } else {
    return static_cast<T>(a * b);
  }
}
template <typename T>
KILN_HD inline T wrapping_neg(T a) {
  if constexpr (kWraps<T>) return wrapping_sub(T(0), a);
  else return static_cast<T>(-a);  // -0.0 for 0.0
}
// |a| with abs(INT_MIN) = INT_MIN; abs(-0.0) stays -0.0 as in PyTorch (a < 0 is false).
template <typename T>
KILN_HD inline T wrapping_abs(T a) {
  if constexpr (std::is_unsigned_v<T>) return a;
  else return a < T(0) ? wrapping_neg(a) : a;
}

// a / b rounded toward zero, b != 0.
template <typename T>
KILN_HD inline T int_div_trunc(T a, T b) {
  if constexpr (std::is_signed_v<T>) {
    if (b == T(-1)) return wrapping_neg(a);
  }
  return static_cast<T>(a / b);
}
// a / b rounded toward -inf (Python's //), b != 0.
template <typename T>
KILN_HD inline T int_div_floor(T a, T b) {
  if constexpr (std::is_signed_v<T>) {
    if (b == T(-1)) return wrapping_neg(a);
    T q = static_cast<T>(a / b);
    if (static_cast<T>(a % b) != 0 && ((a < 0) != (b < 0))) --q;
    return q;
  } else {
    return static_cast<T>(a / b);
  }
}
// The remainder with the sign of a (C's %, torch.fmod), b != 0.
template <typename T>
KILN_HD inline T int_mod_trunc(T a, T b) {
  if constexpr (std::is_signed_v<T>) {
    if (b == T(-1)) return 0;
  }
  return static_cast<T>(a % b);
}
// The remainder with the sign of b (Python's %, torch.remainder), b != 0.
template <typename T>
KILN_HD inline T int_mod_floor(T a, T b) {
  T r = int_mod_trunc(a, b);
  if constexpr (std::is_signed_v<T>) {
    if (r != 0 && ((r < 0) != (b < 0))) r = static_cast<T>(r + b);  // opposite signs: no overflow
  }
  return r;
}

// a ** b by squaring, wrapping. A negative exponent gives 0 except for bases 1 and -1 (PyTorch's
// tensor ** tensor; a negative *scalar* exponent of an integer tensor is refused before any
// kernel runs).
template <typename T>
KILN_HD inline T int_pow(T a, T b) {
  if constexpr (std::is_signed_v<T>) {
    if (b < 0) {
      if (a == 1) return 1;
      if (a == -1) return (b & 1) ? T(-1) : T(1);
      return 0;
    }
  }
  T r = 1;
  while (b) {
    if (b & 1) r = wrapping_mul(r, a);
    b = static_cast<T>(b / 2);
    a = wrapping_mul(a, a);
  }
  return r;
}

// A floating value (float or double) to the integer To: truncated, saturated, NaN -> 0
// (Note [Float to integer casts]).
template <typename To, typename F>
KILN_HD inline To float_to_int(F v) {
  constexpr To lo = std::numeric_limits<To>::lowest(), hi = std::numeric_limits<To>::max();
  if (!(v == v)) return To(0);
  // F(lo) is exact (0 or -2^k); F(hi) may round up to 2^k, which is out of range itself.
  if (v <= static_cast<F>(lo)) return lo;
  if (v >= static_cast<F>(hi)) return hi;
  return static_cast<To>(v);
}

// One element from From to To with PyTorch's value semantics: reduced floats go through float,
// bool is `!= 0` (nan is true), floating to integer follows Note [Float to integer casts], and
// integer to narrower integer wraps.
template <typename To, typename From>
KILN_HD inline To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<To, bool>) {
    if constexpr (kIsReducedFloat<From>) return static_cast<float>(v) != 0.0f;
    else return v != From(0);
  } else if constexpr (kIsReducedFloat<From>) {
    return convert<To>(static_cast<float>(v));
  } else if constexpr (kIsReducedFloat<To>) {
    return To(static_cast<float>(v));
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<From>) {
    return float_to_int<To>(v);
  } else {
    return static_cast<To>(v);
  }
}

}  // namespace kiln
