// kernels/cpu/quantized.h: the element-wise quantization math the int8 CPU kernels share
// (quantized.cpp: quantize/dequantize/fake-quantize rows; quantized_dnnl.cpp: the dynamic
// linear's activation pass). Note [Quantization scheme] in tensor/ops/quantized.toml.
//
//   float r = round_half_even(x / scale);                  // vectorizes (no libm call)
//   uint8_t q = quantize_u8(x, scale, zero_point);         // clamp(r + zp, 0, 255)
//   QParams p = choose_qparams_u8(lo, hi);                 // kiln/qparams.h
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kiln/qparams.h"

namespace kiln::kernels::quant {

// Note [Vectorizable rounding]: std::nearbyint is a libm call that stops GCC from vectorizing a
// loop. Adding and subtracting 1.5 * 2^23 (2^52 for double) rounds |v| < 2^22 to the nearest
// integer, ties to even, in the default rounding mode (Kiln never changes it, and nothing is
// compiled with -ffast-math, which could fold the pair away). Callers first clamp v into a small
// range that the result clamps to anyway; a NaN falls to the lower bound (comparisons with NaN
// are false), so NaN quantizes to the lowest code.
inline float round_half_even(float v) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  return (v + kMagic) - kMagic;
}
inline double round_half_even(double v) {
  constexpr double kMagic = 6755399441055744.0;  // 1.5 * 2^52
  return (v + kMagic) - kMagic;
}

// v clamped to [lo, hi], a NaN to lo.
template <typename T>
inline T clamp_nan_low(T v, T lo, T hi) {
  v = v > lo ? v : lo;
  return v < hi ? v : hi;
}

// clamp(round_half_even(x / scale) + zp, qmin, qmax), as a T holding an integer value.
template <typename T>
inline T quantize_value(T x, T scale, T zp, T qmin, T qmax) {
  T v = clamp_nan_low(x / scale, qmin - zp - 1, qmax - zp + 1);
  return clamp_nan_low(round_half_even(v) + zp, qmin, qmax);
}

inline uint8_t quantize_u8(float x, float scale, float zp) {
  return static_cast<uint8_t>(static_cast<int32_t>(quantize_value(x, scale, zp, 0.0f, 255.0f)));
}

// q[i] = quantize_u8(x[i], scale, zp) for i < n. Loops over uint8 outputs call this rather than
// writing the loop in a lambda: a char store may alias the lambda's captures, which GCC then
// reloads every iteration and does not vectorize.
inline void quantize_u8_n(const float* x, uint8_t* q, int64_t n, float scale, float zp) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) q[i] = quantize_u8(x[i], scale, zp);
}

// lo = min(lo, x[i]), hi = max(hi, x[i]) for i < n. Sixteen running minima and maxima (one
// AVX-512 register each) reduced at the end: GCC does not vectorize a min/max reduction without
// -ffast-math, even under `omp simd reduction`.
inline void min_max_n(const float* x, int64_t n, float& lo, float& hi) {
  constexpr int64_t kLanes = 16;
  float l[kLanes], h[kLanes];
  for (int64_t j = 0; j < kLanes; ++j) l[j] = lo, h[j] = hi;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) {
      l[j] = x[i + j] < l[j] ? x[i + j] : l[j];
      h[j] = x[i + j] > h[j] ? x[i + j] : h[j];
    }
  for (; i < n; ++i) l[0] = std::min(l[0], x[i]), h[0] = std::max(h[0], x[i]);
  for (int64_t j = 0; j < kLanes; ++j) lo = std::min(lo, l[j]), hi = std::max(hi, h[j]);
}

using kiln::choose_qparams_u8;  // kiln/qparams.h
using kiln::QParams;

}  // namespace kiln::kernels::quant
