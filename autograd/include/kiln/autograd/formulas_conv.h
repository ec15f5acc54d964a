// kiln/autograd/formulas_conv.h: the formula helpers of tensor/ops/conv.toml and pool.toml
// (included by formulas.h; Note [Convolution gradients] in conv.toml).
//
//   // convolution: d[input], d[weight]
//   Tensor gi = conv_input_grad(grad, input.sizes(), weight, stride, padding, dilation,
//                               transposed, groups);
//   Tensor gw = conv_weight_grad(grad, input, weight.sizes(), stride, padding, dilation,
//                                transposed, groups);
#pragma once

#include <vector>

#include "kiln/kiln.h"

namespace kiln::autograd {

// The gradient of convolution(input, weight, ...) for its input, of shape input_sizes: a
// transposed convolution of grad (output_padding restores the rows the forward's floor dropped)
// or, for a transposed convolution, a plain one.
Tensor conv_input_grad(const Tensor& grad, IntArrayRef input_sizes, const Tensor& weight,
                       IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                       bool transposed, int64_t groups);
// The gradient for its weight: convolution_backward_weight(grad, input), with the two swapped
// for a transposed convolution.
Tensor conv_weight_grad(const Tensor& grad, const Tensor& input, IntArrayRef weight_sizes,
                        IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                        bool transposed, int64_t groups);
// convolution(input, weight, ...) without transposition or output padding.
Tensor conv_plain(const Tensor& input, const Tensor& weight, IntArrayRef stride,
                  IntArrayRef padding, IntArrayRef dilation, int64_t groups);
// The last two sizes (H, W) of a pooled tensor's sizes.
std::vector<int64_t> pool_output_size(IntArrayRef sizes);

}  // namespace kiln::autograd
