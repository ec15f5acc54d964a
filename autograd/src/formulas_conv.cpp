// Formula helpers of the convolution and pooling rows (kiln/autograd/formulas_conv.h): only
// `convolution` and `convolution_backward_weight`, so double backward runs through them again.
#include "kiln/autograd/formulas.h"

namespace kiln::autograd {

Tensor conv_input_grad(const Tensor& grad, IntArrayRef input_sizes, const Tensor& weight,
                       IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                       bool transposed, int64_t groups) {
  const size_t k = stride.size();
  std::vector<int64_t> output_padding(k, 0);
  if (transposed)
    return convolution(grad, weight, stride, padding, dilation, false, output_padding, groups);
  for (size_t d = 0; d < k; ++d) {
    const int64_t covered = (grad.size(d + 2) - 1) * stride[d] - 2 * padding[d] +
                            dilation[d] * (weight.size(d + 2) - 1) + 1;
    output_padding[d] = input_sizes[d + 2] - covered;
  }
  return convolution(grad, weight, stride, padding, dilation, true, output_padding, groups);
}

Tensor conv_weight_grad(const Tensor& grad, const Tensor& input, IntArrayRef weight_sizes,
                        IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                        bool transposed, int64_t groups) {
  if (transposed)
    return convolution_backward_weight(input, grad, weight_sizes, stride, padding, dilation,
                                       groups);
  return convolution_backward_weight(grad, input, weight_sizes, stride, padding, dilation, groups);
}

Tensor conv_plain(const Tensor& input, const Tensor& weight, IntArrayRef stride,
                  IntArrayRef padding, IntArrayRef dilation, int64_t groups) {
  return convolution(input, weight, stride, padding, dilation, false,
                     std::vector<int64_t>(stride.size(), 0), groups);
}

std::vector<int64_t> pool_output_size(IntArrayRef sizes) {
  return {sizes[sizes.size() - 2], sizes[sizes.size() - 1]};
}

}  // namespace kiln::autograd
