// Private to tensor/: the arguments of conv1d/conv2d/conv_transpose2d resolved for `convolution`
// (meta/conv.cpp validates them; composite_conv.cpp decomposes with them).
//
//   ConvArgs a = conv_args("conv2d", 2, input, weight, bias, stride, padding, dilation,
//                          /*transposed=*/false, {0, 0}, groups);
//   Tensor y = kiln::convolution(input, weight, a.stride, a.padding, a.dilation, false,
//                                a.output_padding, a.groups);
#pragma once

#include <optional>
#include <string_view>

#include "kiln/meta.h"

namespace kiln::meta {

struct ConvArgs {
  DimVector stride, padding, dilation, output_padding;  // one entry per spatial dim
  int64_t groups = 1;
  bool transposed = false;
  bool unbatched = false;  // the input has no batch dim: add one around `convolution`
  // padding='same' with an odd total padding along a dim: `convolution` pads one more on each
  // side and the output is narrowed by 1 from the start along that dim (PyTorch pads the extra
  // element at the end).
  DimVector trim;
};

// Validates (naming `op`) and resolves per-dim lists of length 1 to the `k` spatial dims.
ConvArgs conv_args(const char* op, int64_t k, const Tensor& input, const Tensor& weight,
                   const std::optional<Tensor>& bias, IntArrayRef stride, IntArrayRef padding,
                   IntArrayRef dilation, bool transposed, IntArrayRef output_padding,
                   int64_t groups);
// The same with padding "valid" (none) or "same" (output size = input size; stride 1 only).
ConvArgs conv_args(const char* op, int64_t k, const Tensor& input, const Tensor& weight,
                   const std::optional<Tensor>& bias, IntArrayRef stride, std::string_view padding,
                   IntArrayRef dilation, int64_t groups);
// The output size of a convolution of `in` (N, C, spatial...) with a weight of size `w`: (O, C /
// groups, kernel...) or, transposed, (C, O / groups, kernel...). Validates the geometry only
// (conv2d_int8 shares it: meta/quantized.cpp).
DimVector conv_shape(const char* op, IntArrayRef in, IntArrayRef w, IntArrayRef stride,
                     IntArrayRef padding, IntArrayRef dilation, bool transposed,
                     IntArrayRef output_padding, int64_t groups);
// The output spec of the op those arguments describe.
TensorSpec conv_spec(const char* op, const Tensor& input, const Tensor& weight, const ConvArgs& a);

}  // namespace kiln::meta
