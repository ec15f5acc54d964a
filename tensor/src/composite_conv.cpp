// Decompositions of conv.toml's composite rows and of max_pool2d (pool.toml). Every conv is one
// `convolution` (Note [Convolution gradients] in tensor/ops/conv.toml) with the bias added as a
// broadcast; meta::conv_args validates first, so errors name the op the user called.
#include "kiln/generated/composite/conv.h"
#include "kiln/generated/composite/pool.h"
#include "kiln/generated/composite/views.h"
#include "meta/conv.h"

namespace kiln::composite {
namespace {

Tensor conv_with(const char* op, const Tensor& input, const Tensor& weight,
                 const std::optional<Tensor>& bias, const meta::ConvArgs& a) {
  meta::conv_spec(op, input, weight, a);
  Tensor y = kiln::convolution(a.unbatched ? input.unsqueeze(0) : input, weight, a.stride,
                               a.padding, a.dilation, a.transposed, a.output_padding, a.groups);
  for (size_t d = 0; d < a.trim.size(); ++d)
    if (a.trim[d] != 0) y = y.narrow(d + 2, 1, y.size(d + 2) - 1);
  if (bias && bias->defined()) {
    DimVector shape(y.dim(), 1);
    shape[1] = bias->size(0);
    y = kiln::add(y, bias->view(shape));
  }
  return a.unbatched ? y.squeeze(std::vector<int64_t>{0}) : y;
}

}  // namespace

Tensor conv1d(const Tensor& input, const Tensor& weight, const std::optional<Tensor>& bias,
              IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation, int64_t groups) {
  return conv_with("conv1d", input, weight, bias,
                   meta::conv_args("conv1d", 1, input, weight, bias, stride, padding, dilation,
                                   false, {0}, groups));
}

Tensor conv1d_padding(const Tensor& input, const Tensor& weight, const std::optional<Tensor>& bias,
                      IntArrayRef stride, std::string_view padding, IntArrayRef dilation,
                      int64_t groups) {
  return conv_with(
      "conv1d", input, weight, bias,
      meta::conv_args("conv1d", 1, input, weight, bias, stride, padding, dilation, groups));
}

Tensor conv2d(const Tensor& input, const Tensor& weight, const std::optional<Tensor>& bias,
              IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation, int64_t groups) {
  return conv_with("conv2d", input, weight, bias,
                   meta::conv_args("conv2d", 2, input, weight, bias, stride, padding, dilation,
                                   false, {0}, groups));
}

Tensor conv2d_padding(const Tensor& input, const Tensor& weight, const std::optional<Tensor>& bias,
                      IntArrayRef stride, std::string_view padding, IntArrayRef dilation,
                      int64_t groups) {
  return conv_with(
      "conv2d", input, weight, bias,
      meta::conv_args("conv2d", 2, input, weight, bias, stride, padding, dilation, groups));
}

Tensor conv_transpose2d(const Tensor& input, const Tensor& weight,
                        const std::optional<Tensor>& bias, IntArrayRef stride, IntArrayRef padding,
                        IntArrayRef output_padding, int64_t groups, IntArrayRef dilation) {
  return conv_with("conv_transpose2d", input, weight, bias,
                   meta::conv_args("conv_transpose2d", 2, input, weight, bias, stride, padding,
                                   dilation, true, output_padding, groups));
}

Tensor max_pool2d(const Tensor& self, IntArrayRef kernel_size, IntArrayRef stride,
                  IntArrayRef padding, IntArrayRef dilation, bool ceil_mode) {
  return std::get<0>(
      kiln::max_pool2d_with_indices(self, kernel_size, stride, padding, dilation, ceil_mode));
}

}  // namespace kiln::composite
