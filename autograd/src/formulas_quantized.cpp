// Formula helpers of the fake-quantize rows (kiln/autograd/formulas_quantized.h; Note
// [Quantization scheme] in tensor/ops/quantized.toml).
#include "kiln/autograd/formulas.h"

namespace kiln::autograd {
namespace {

// grad masked to where the unclamped code r = round(input / scale) + zero_point lies in range;
// scale and zero_point broadcast against input.
Tensor ste(const Tensor& grad, const Tensor& input, const Tensor& scale, const Tensor& zero_point,
           int64_t quant_min, int64_t quant_max) {
  Tensor r = kiln::round(input / scale.to(input.dtype())) + zero_point.to(input.dtype());
  Tensor keep = logical_and(r >= Scalar(quant_min), r <= Scalar(quant_max));
  return where(keep, grad, zeros_like(grad));
}

}  // namespace

Tensor fake_quantize_grad(const Tensor& grad, const Tensor& input, double scale, int64_t zero_point,
                          int64_t quant_min, int64_t quant_max) {
  return ste(grad, input, scalar_tensor_of(scale, input.dtype()),
             scalar_tensor_of(zero_point, input.dtype()), quant_min, quant_max);
}

Tensor fake_quantize_per_channel_grad(const Tensor& grad, const Tensor& input, const Tensor& scale,
                                      const Tensor& zero_point, int64_t axis, int64_t quant_min,
                                      int64_t quant_max) {
  const int64_t a = axis < 0 ? axis + input.dim() : axis;
  std::vector<int64_t> shape(input.dim(), 1);
  shape[a] = input.size(a);
  return ste(grad, input, scale.detach().reshape(shape), zero_point.reshape(shape), quant_min,
             quant_max);
}

}  // namespace kiln::autograd
