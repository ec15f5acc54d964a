// kernels/cpu/vec_math.h: float32 math that GCC vectorizes (exp, log, tanh, sigmoid, erf, gelu).
//
//   #pragma omp simd
//   for (int64_t i = 0; i < n; ++i) y[i] = kiln::vec::erf(x[i]);   // 16 lanes with AVX-512
//   float g = kiln::vec::gelu_erf(x);                                 // 0.5 x (1 + erf(x / sqrt 2))
//   float s = kiln::vec::sigmoid(-100.0f);                            // 3.7e-44, not 0
//
// Note [Vectorizable math]: glibc's expf/erff/tanhf are scalar calls, so a loop over them runs
// one element at a time (std::erf made gelu ~10x slower than a memory-bound add). These versions
// use only arithmetic, std::fma, comparisons turned into selects, and bit casts, so the loops in
// loops.h vectorize. Both sides of every branch are computed and one is selected; special
// values (inf, nan, denormals) are patched with selects at the end. Accuracy against the double
// results of std:: is checked in tests/kernels/pointwise_test.cpp (VecMath.*): a few ulp.
// float64 kernels keep std::; float16/bfloat16 compute through these float versions.
// The activations (sigmoid, silu, gelu and its derivatives) are float32 fast paths of the
// formulas in kiln/pointwise_math.h (See Note [One home per formula]), with its constants; they
// differ from it only through the approximations above (vec::exp, vec::tanh, erf_rational), and
// VecMath.* checks each one against its kiln::math formula in double.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kiln/pointwise_math.h"

// Forced inline: a call left in a loop body stops GCC from vectorizing the loop, and GCC's
// heuristics decline to inline erf (which inlines exp) into the gelu lambda.
#define KILN_VEC_INLINE inline __attribute__((always_inline))
// For lambdas handed to the loops: GCC otherwise may decline to inline the math into them.
#define KILN_VEC_INLINE_LAMBDA __attribute__((always_inline))

namespace kiln::vec {

constexpr float kInf = std::numeric_limits<float>::infinity();

// 2^n for n in [-126, 127] (a normal float built from its exponent bits).
KILN_VEC_INLINE float pow2i(int32_t n) { return std::bit_cast<float>((n + 127) << 23); }

// e^r for |r| <= ln2 / 2 by a degree-7 polynomial (Cephes expf's).
KILN_VEC_INLINE float exp_poly(float r) {
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  return std::fma(p, r * r, r) + 1.0f;
}

// x - j ln2 for j = round(x / ln2) (Cody-Waite, two-part ln2): |result| <= ln2 / 2.
KILN_VEC_INLINE float exp_remainder(float x, float j) {
  float r = std::fma(j, -0.693359375f, x);
  return std::fma(j, 2.12194440e-4f, r);
}

// The shared core of exp: x = n ln2 + r. Returns e^r and sets n; the caller scales by 2^n.
KILN_VEC_INLINE float exp_reduced(float xc, int32_t& n) {
  float j = std::fma(xc, 1.44269504088896341f, 12582912.0f) - 12582912.0f;  // round(x / ln2)
  n = static_cast<int32_t>(j);
  return exp_poly(exp_remainder(xc, j));
}

// e^x (Cephes expf, ~1 ulp): exp_reduced, then 2^n applied in two halves so that results down to
// the smallest denormal round once.
KILN_VEC_INLINE float exp(float x) {
  constexpr float kHi = 88.7228394f, kLo = -103.972084f;
  float xc = x < kHi ? x : kHi;  // nan -> kHi, patched at the end
  xc = xc > kLo ? xc : kLo;
  int32_t n;
  float p = exp_reduced(xc, n);
  int32_t n1 = n >> 1;
  float y = p * pow2i(n1) * pow2i(n - n1);
  y = x > kHi ? kInf : y;
  return x != x ? x : y;
}

// e^x for x <= 0: results below e^-87 are flushed to 0 (-inf gives 0), NaN stays NaN. Cheaper
// than exp: no clamp and no patches, and 2^n comes from the rounding's bits. With the bias 127 in
// the magic constant, t's low mantissa bits hold n + 127 (t stays in [2^23, 2^24) for x >= -87),
// so t's bits shifted left by 23 are the float 2^n; below -87 that is garbage, masked at the end.
// Softmax's and attention's shifted exponents and erf's tail use it.
KILN_VEC_INLINE float exp_nonpositive(float x) {
  constexpr float kMagic = 12582912.0f + 127.0f;  // 1.5 * 2^23 + the exponent bias
  float t = std::fma(x, 1.44269504088896341f, kMagic);
  float j = t - kMagic;  // round(x / ln2)
  float e = exp_poly(exp_remainder(x, j)) * std::bit_cast<float>(std::bit_cast<int32_t>(t) << 23);
  return x < -87.0f ? 0.0f : e;  // nan compares false and stays nan
}

// Natural log. Cephes logf: x = m 2^e with m in [sqrt(1/2), sqrt(2)), a degree-8 polynomial in
// m - 1, e ln2 added in two parts. Denormal inputs are scaled by 2^23 first. ~1 ulp.
KILN_VEC_INLINE float log(float x) {
  bool den = x < 1.17549435e-38f;
  float xs = den ? x * 8388608.0f : x;
  int32_t bits = std::bit_cast<int32_t>(xs);
  int32_t e = ((bits >> 23) & 0xff) - 126;
  float m = std::bit_cast<float>((bits & 0x007fffff) | 0x3f000000);  // [0.5, 1)
  bool lo = m < 0.707106781186547524f;
  e = lo ? e - 1 : e;
  m = lo ? m + m - 1.0f : m - 1.0f;
  float ef = static_cast<float>(e) - (den ? 23.0f : 0.0f);
  float z = m * m;
  float y = 7.0376836292e-2f;
  y = std::fma(y, m, -1.1514610310e-1f);
  y = std::fma(y, m, 1.1676998740e-1f);
  y = std::fma(y, m, -1.2420140846e-1f);
  y = std::fma(y, m, 1.4249322787e-1f);
  y = std::fma(y, m, -1.6668057665e-1f);
  y = std::fma(y, m, 2.0000714765e-1f);
  y = std::fma(y, m, -2.4999993993e-1f);
  y = std::fma(y, m, 3.3333331174e-1f);
  y = y * m * z;
  y = std::fma(ef, -2.12194440e-4f, y);
  y = std::fma(z, -0.5f, y);
  float r = std::fma(ef, 0.693359375f, m + y);
  r = x == kInf ? kInf : r;
  r = x == 0.0f ? -kInf : r;
  r = x < 0.0f ? std::numeric_limits<float>::quiet_NaN() : r;
  return x != x ? x : r;
}

// tanh. |x| < 0.625: odd polynomial (Cephes tanhf); else 1 - 2 / (e^{2|x|} + 1) with x's sign.
KILN_VEC_INLINE float tanh(float x) {
  float a = x < 0.0f ? -x : x;
  float z = x * x;
  float p = -5.70498872745e-3f;
  p = std::fma(p, z, 2.06390887954e-2f);
  p = std::fma(p, z, -5.37397155531e-2f);
  p = std::fma(p, z, 1.33314422036e-1f);
  p = std::fma(p, z, -3.33332819422e-1f);
  float small = std::fma(p * z, x, x);
  float big = 1.0f - 2.0f / (vec::exp(a + a) + 1.0f);
  big = x < 0.0f ? -big : big;
  float r = a < 0.625f ? small : big;
  return x != x ? x : r;
}

// 1 / (1 + e^-x), written as e^x / (1 + e^x) for x < 0 so that tiny results keep their bits
// (math::sigmoid's float form, with vec::exp).
KILN_VEC_INLINE float sigmoid(float x) {
  float e = vec::exp(x < 0.0f ? x : -x);  // e^-|x|, in (0, 1]
  float d = 1.0f + e;
  return x < 0.0f ? e / d : 1.0f / d;
}

// erf. Coefficients of Norbert Juffa's faithfully rounded erff (StackOverflow question 35148198,
// "Efficient faithfully rounded implementation of error function erff"): |x| <= 0.9277 an odd
// polynomial, else 1 - e^{p(|x|)} with x's sign. Our exp adds ~1 ulp.
KILN_VEC_INLINE float erf(float x) {
  float t = x < 0.0f ? -x : x;
  float s = x * x;
  float r = std::fma(-1.72853470e-5f, t, 3.83197126e-4f);
  float u = std::fma(-3.88396438e-3f, t, 2.42546219e-2f);
  r = std::fma(r, s, u);
  r = std::fma(r, t, -1.06777877e-1f);
  r = std::fma(r, t, -6.34846687e-1f);
  r = std::fma(r, t, -1.28717512e-1f);
  r = std::fma(r, t, -t);
  float big = 1.0f - vec::exp_nonpositive(r);
  big = x < 0.0f ? -big : big;
  float q = -5.96761703e-4f;
  q = std::fma(q, s, 4.99119423e-3f);
  q = std::fma(q, s, -2.67681349e-2f);
  q = std::fma(q, s, 1.12819925e-1f);
  q = std::fma(q, s, -3.76125336e-1f);
  q = std::fma(q, s, 1.28379166e-1f);
  float small = std::fma(q, x, x);
  return t > 0.927734375f ? big : small;  // nan takes the small branch and stays nan
}

// erf as one rational function, erf(z) ~ z P(z^2) / Q(z^2) on |z| <= 3.92 (beyond it erf rounds
// to +-1 in float32). Branch-free and about half the work of vec::erf, for gelu's hot loop.
// Coefficients: Kiln's own weighted least-squares fit of degrees (5, 5) in z^2 against erf in
// 30-digit arithmetic; float32 evaluation stays within 5 ulp of erf over the whole line.
KILN_VEC_INLINE float erf_rational(float z) {
  z = z < -3.92f ? -3.92f : (z > 3.92f ? 3.92f : z);  // nan stays nan
  float s = z * z;
  float p = 2.0500867776718223e-06f;
  p = std::fma(p, s, 2.848792355507612e-04f);
  p = std::fma(p, s, 3.7655222695320845e-03f);
  p = std::fma(p, s, 5.2748437970876694e-02f);
  p = std::fma(p, s, 1.9040445983409882e-01f);
  p = std::fma(p, s, 1.1283791065216064f);
  float q = 3.809152258327231e-05f;
  q = std::fma(q, s, 1.1625097831711173e-03f);
  q = std::fma(q, s, 1.4969032257795334e-02f);
  q = std::fma(q, s, 1.1410826444625854e-01f);
  q = std::fma(q, s, 5.020743012428284e-01f);
  q = std::fma(q, s, 1.0f);
  return z * p / q;
}

// e^x in a kernel's accumulator type A (float for float32/float16/bfloat16, double): vec::exp
// for float, std::exp for double. Softmax's and cross-entropy's exponents use it.
template <typename A>
KILN_VEC_INLINE A exp_acc(A x) {
  if constexpr (std::is_same_v<A, float>) return vec::exp(x);
  else return std::exp(x);
}

// e^x for x <= 0 or nan in A, a max-shifted exponent (s - max of a softmax row, and s - lse in a
// backward, <= 0 up to rounding): vec::exp_nonpositive for float, whose lack of inf/nan patches
// lets the loops vectorize; std::exp for double. Attention's and cross-entropy's use it.
template <typename A>
KILN_VEC_INLINE A exp_nonpositive_acc(A x) {
  if constexpr (std::is_same_v<A, float>) return vec::exp_nonpositive(x);
  else return std::exp(x);
}

// The constants of kiln/pointwise_math.h's gelu, rounded to float.
constexpr float kSqrt1_2 = static_cast<float>(math::kSqrt1_2);
constexpr float kInvSqrt2Pi = static_cast<float>(math::kInvSqrt2Pi);
constexpr float kSqrt2OverPi = static_cast<float>(math::kSqrt2OverPi);
constexpr float kGeluTanhCoeff = static_cast<float>(math::kGeluTanhCoeff);
constexpr float kGeluTanhCoeff3 = static_cast<float>(3 * math::kGeluTanhCoeff);

// gelu, erf form: x/2 (1 + erf(x / sqrt 2)) (math::gelu_erf, with erf_rational).
KILN_VEC_INLINE float gelu_erf(float x) {
  return 0.5f * x * (1.0f + vec::erf_rational(x * kSqrt1_2));
}

// gelu, tanh form: x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (math::gelu_tanh).
KILN_VEC_INLINE float gelu_tanh(float x) {
  float inner = kSqrt2OverPi * std::fma(kGeluTanhCoeff * x * x, x, x);
  return 0.5f * x * (1.0f + vec::tanh(inner));
}

// d/dx gelu(x), erf form: Phi(x) + x phi(x), phi(x) = e^(-x^2 / 2) / sqrt(2 pi)
// (math::gelu_erf_backward).
KILN_VEC_INLINE float gelu_erf_backward(float x) {
  float cdf = 0.5f * (1.0f + vec::erf_rational(x * kSqrt1_2));
  return std::fma(x * kInvSqrt2Pi, vec::exp_nonpositive(-0.5f * x * x), cdf);
}

// d/dx gelu(x), tanh form: with u = sqrt(2/pi) (x + 0.044715 x^3) and t = tanh(u),
// 0.5 (1 + t) + 0.5 x (1 - t^2) du/dx (math::gelu_tanh_backward).
KILN_VEC_INLINE float gelu_tanh_backward(float x) {
  float x2 = x * x;
  float t = vec::tanh(kSqrt2OverPi * std::fma(kGeluTanhCoeff * x2, x, x));
  float du = kSqrt2OverPi * std::fma(kGeluTanhCoeff3, x2, 1.0f);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

// x sigmoid(x) (math::silu's float form).
KILN_VEC_INLINE float silu(float x) { return x * vec::sigmoid(x); }

}  // namespace kiln::vec
