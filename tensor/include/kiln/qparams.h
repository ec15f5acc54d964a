// kiln/qparams.h: the asymmetric uint8 quantization parameters of a range, the one home of that
// rule: linear_int8_dynamic's activations (kernels/cpu), static quantization's observers
// (kiln/quantization.h) and QAT's fake quantization (kiln.ao.nn.qat, through _C).
//
//   kiln::QParams p = kiln::choose_qparams_u8(-0.5f, 2.0f);   // scale 2.5 / 255, zero_point 51
//
// [lo, hi] is widened to contain 0 (so that 0 is exact, as padding and relu need); scale =
// (hi - lo) / 255, zero_point = clamp(round(-lo / scale), 0, 255), ties to even; an empty or
// non-finite range gets scale 1.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace kiln {

struct QParams {
  float scale;
  int32_t zero_point;
};

inline QParams choose_qparams_u8(float lo, float hi) {
  lo = std::min(lo, 0.0f);
  hi = std::max(hi, 0.0f);
  float scale = (hi - lo) / 255.0f;
  if (!(scale > 0) || !std::isfinite(scale)) scale = 1.0f;
  float zp = -lo / scale;
  zp = zp > 0 ? zp : 0;  // a NaN too
  zp = zp < 255 ? zp : 255;
  return {scale, static_cast<int32_t>(std::nearbyint(zp))};
}

}  // namespace kiln
