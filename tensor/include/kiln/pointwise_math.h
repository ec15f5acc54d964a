// kiln/pointwise_math.h: the formula of one element of Kiln's floating pointwise ops
// (activations and their derivatives, binary cross-entropy, clamp, nan-propagating maximum,
// floor division, Python's modulo), written once for the host and for CUDA devices.
//
//   double y = kiln::math::gelu_erf(0.5);             // 0.5 Phi(0.5) = 0.3457...
//   struct GeluOp {                                   // a CUDA functor (kernels/cuda)
//     template <typename C> KILN_HD C operator()(C a) const { return math::gelu_erf(a); }
//   };
//
// Note [One home per formula]: each formula here is the only definition of that op's
// arithmetic. The CPU's float64 kernels and its generic (any dtype) lambdas call it, and so do
// the CUDA functors, where C is float (for float16, bfloat16, float32) or double; the two
// backends then differ only by their libm (a few ulp). The math functions are C's overloads
// below (expf for float, exp for double), which nvcc also provides on the device. The CPU's
// float32 (and float16/bfloat16) activations use kernels/cpu/vec_math.h instead: vectorizable
// approximations of these same formulas with the same constants (See Note [Vectorizable math]),
// tested against the ones here in tests/kernels/pointwise_test.cpp (VecMath.*). Tensor-level
// decompositions of the same math (tensor/src/composite_nn.cpp) take their constants from here.
#pragma once

#include <math.h>

#include <type_traits>

#include "kiln/half.h"  // KILN_HD

namespace kiln::math {

// ---- float and double overloads of libm, callable on the host and on a CUDA device ------------
// Inside namespace kiln an unqualified exp(x) would find kiln::exp(Tensor): call math::exp.
#define KILN_MATH_UNARY(NAME, F32, F64)                     \
  KILN_HD inline float NAME(float x) { return ::F32(x); }   \
  KILN_HD inline double NAME(double x) { return ::F64(x); }
KILN_MATH_UNARY(exp, expf, exp)
KILN_MATH_UNARY(log, logf, log)
KILN_MATH_UNARY(log1p, log1pf, log1p)
KILN_MATH_UNARY(expm1, expm1f, expm1)
KILN_MATH_UNARY(sqrt, sqrtf, sqrt)
KILN_MATH_UNARY(sin, sinf, sin)
KILN_MATH_UNARY(cos, cosf, cos)
KILN_MATH_UNARY(tanh, tanhf, tanh)
KILN_MATH_UNARY(erf, erff, erf)
KILN_MATH_UNARY(floor, floorf, floor)
KILN_MATH_UNARY(ceil, ceilf, ceil)
KILN_MATH_UNARY(trunc, truncf, trunc)
KILN_MATH_UNARY(rint, rintf, rint)  // half to even (the default rounding mode), like nearbyint
#undef KILN_MATH_UNARY

#define KILN_MATH_BINARY(NAME, F32, F64)                                  \
  KILN_HD inline float NAME(float x, float y) { return ::F32(x, y); }     \
  KILN_HD inline double NAME(double x, double y) { return ::F64(x, y); }
KILN_MATH_BINARY(pow, powf, pow)
KILN_MATH_BINARY(fmod, fmodf, fmod)
KILN_MATH_BINARY(copysign, copysignf, copysign)
#undef KILN_MATH_BINARY

// ---- constants (double; C(k) rounds once to float) ---------------------------------------------
inline constexpr double kSqrt1_2 = 0.70710678118654752440;      // 1 / sqrt(2)
inline constexpr double kInvSqrt2Pi = 0.39894228040143267794;   // 1 / sqrt(2 pi), phi(0)
inline constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2 / pi)
inline constexpr double kGeluTanhCoeff = 0.044715;              // gelu's tanh form: x + k x^3

// ---- activations --------------------------------------------------------------------------------

// 1 / (1 + e^-x). float: e^x / (1 + e^x) for x < 0, so that tiny results keep their bits
// (sigmoid(-100) is 3.7e-44, not 0); double: 1 / (1 + e^-x), PyTorch's CPU expression.
template <typename C>
KILN_HD inline C sigmoid(C x) {
  if constexpr (std::is_same_v<C, float>) {
    const float e = math::exp(x < 0.0f ? x : -x);  // e^-|x|, in (0, 1]
    const float d = 1.0f + e;
    return x < 0.0f ? e / d : 1.0f / d;
  } else {
    return C(1) / (C(1) + math::exp(-x));
  }
}

// x sigmoid(x). float: through sigmoid above; double: x / (1 + e^-x), PyTorch's CPU expression.
template <typename C>
KILN_HD inline C silu(C x) {
  if constexpr (std::is_same_v<C, float>) return x * math::sigmoid(x);
  else return x / (C(1) + math::exp(-x));
}

// gelu, erf form: x Phi(x) = x/2 (1 + erf(x / sqrt 2)).
template <typename C>
KILN_HD inline C gelu_erf(C x) {
  return C(0.5) * x * (C(1) + math::erf(x * C(kSqrt1_2)));
}

// gelu, tanh form: x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <typename C>
KILN_HD inline C gelu_tanh(C x) {
  const C inner = C(kSqrt2OverPi) * (x + C(kGeluTanhCoeff) * x * x * x);
  return C(0.5) * x * (C(1) + math::tanh(inner));
}

// d/dx gelu(x), erf form: Phi(x) + x phi(x), phi(x) = e^(-x^2 / 2) / sqrt(2 pi).
template <typename C>
KILN_HD inline C gelu_erf_backward(C x) {
  const C cdf = C(0.5) * (C(1) + math::erf(x * C(kSqrt1_2)));
  return cdf + x * math::exp(C(-0.5) * x * x) * C(kInvSqrt2Pi);
}

// d/dx gelu(x), tanh form: with u = sqrt(2/pi) (x + 0.044715 x^3) and t = tanh(u),
// 0.5 (1 + t) + 0.5 x (1 - t^2) du/dx, du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
template <typename C>
KILN_HD inline C gelu_tanh_backward(C x) {
  const C t = math::tanh(C(kSqrt2OverPi) * (x + C(kGeluTanhCoeff) * x * x * x));
  const C du = C(kSqrt2OverPi) * (C(1) + C(3 * kGeluTanhCoeff) * x * x);
  return C(0.5) * (C(1) + t) + C(0.5) * x * (C(1) - t * t) * du;
}

// ---- losses -------------------------------------------------------------------------------------

// binary_cross_entropy of one element, PyTorch's expression (so the same rounding):
// (t - 1) max(log1p(-x), -100) - t max(log(x), -100); a nan log stays nan.
template <typename C>
KILN_HD inline C binary_cross_entropy(C x, C t) {
  const C a = math::log1p(-x), b = math::log(x);
  return (t - C(1)) * (a > C(-100) || a != a ? a : C(-100)) - t * (b > C(-100) || b != b ? b : C(-100));
}

// ---- clamping and binary arithmetic ------------------------------------------------------------------------

// min(max(a, lo), hi) of any dtype: nan stays nan, lo > hi gives hi (as PyTorch).
template <typename C>
KILN_HD inline C clamp(C a, C lo, C hi) {
  C r = a < lo ? lo : a;
  r = r > hi ? hi : r;
  return a != a ? a : r;
}

// maximum / minimum of any dtype: nan propagates (the first nan operand is returned).
template <typename C>
KILN_HD inline C maximum(C a, C b) {
  return a != a ? a : (b != b ? b : (a < b ? b : a));
}
template <typename C>
KILN_HD inline C minimum(C a, C b) {
  return a != a ? a : (b != b ? b : (b < a ? b : a));
}

// Python's floor division of floats (c10::div_floor_floating): exact at integer boundaries.
template <typename C>
KILN_HD inline C div_floor(C a, C b) {
  if (b == 0) return a / b;
  const C mod = math::fmod(a, b);
  C div = (a - mod) / b;
  if (mod != 0 && (b < 0) != (mod < 0)) div -= 1;
  if (div == 0) return math::copysign(C(0), a / b);
  const C fl = math::floor(div);
  return div - fl > C(0.5) ? fl + 1 : fl;
}

// Floating modulo. fmod: the remainder has the sign of a (C fmod); Python's % (remainder): the
// sign of b.
template <typename C>
KILN_HD inline C python_mod(C a, C b) {
  C r = math::fmod(a, b);
  if (r != 0 && ((b < 0) != (r < 0))) r += b;
  return r;
}

}  // namespace kiln::math
