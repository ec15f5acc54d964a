// kiln/autograd/formulas_quantized.h: the formula helpers of tensor/ops/quantized.toml (included
// by formulas.h): the straight-through estimator of the fake-quantize rows.
//
//   // fake_quantize_per_tensor_affine: d[input]
//   Tensor gi = fake_quantize_grad(grad, input, scale, zero_point, quant_min, quant_max);
#pragma once

#include "kiln/kiln.h"

namespace kiln::autograd {

// grad where quant_min <= round(input / scale) + zero_point <= quant_max, else 0 (PyTorch's
// straight-through estimator). Built from table ops on a constant mask, so it differentiates
// again (to zero through the mask).
Tensor fake_quantize_grad(const Tensor& grad, const Tensor& input, double scale, int64_t zero_point,
                          int64_t quant_min, int64_t quant_max);
// The same with scale and zero_point (C) per slice of input along axis.
Tensor fake_quantize_per_channel_grad(const Tensor& grad, const Tensor& input, const Tensor& scale,
                                      const Tensor& zero_point, int64_t axis, int64_t quant_min,
                                      int64_t quant_max);

}  // namespace kiln::autograd
