// Meta functions of the convolutions (tensor/ops/conv.toml). Errors use PyTorch's wording and
// name the shapes: "conv2d: Given groups=1, weight of size [8, 4, 3, 3], expected input[1, 3, 8,
// 8] to have 4 channels, but got 3 channels instead".
#include "meta/conv.h"

#include <sstream>
#include <string>

#include "kiln/generated/meta/conv.h"

namespace kiln::meta {
namespace {

std::string by_x(IntArrayRef s) {  // [2, 3] -> "2 x 3"
  std::ostringstream os;
  for (size_t i = 0; i < s.size(); ++i) os << (i ? " x " : "") << s[i];
  return os.str();
}

void check_dtypes(const char* op, const Tensor& a, const char* an, const Tensor& b,
                  const char* bn) {
  KILN_CHECK(is_floating(a.dtype()), Type, op, ": expected a floating-point ", an, ", got ",
             a.dtype());
  KILN_CHECK(a.dtype() == b.dtype(), Type, op, ": expected ", an, " and ", bn,
             " to have the same dtype, but got ", a.dtype(), " and ", b.dtype());
}

// A per-spatial-dim argument: k entries, or one that applies to every dim.
DimVector per_dim(const char* op, const char* name, IntArrayRef v, int64_t k) {
  KILN_CHECK(static_cast<int64_t>(v.size()) == k || v.size() == 1, Value, op, ": expected ", name,
             " to have 1 or ", k, " elements, got ", v);
  return v.size() == 1 ? DimVector(k, v[0]) : DimVector(v);
}

}  // namespace

DimVector conv_shape(const char* op, IntArrayRef in, IntArrayRef w, IntArrayRef stride,
                     IntArrayRef padding, IntArrayRef dilation, bool transposed,
                     IntArrayRef output_padding, int64_t groups) {
  const int64_t k = static_cast<int64_t>(in.size()) - 2;
  KILN_CHECK(w.size() == in.size(), Value, op, ": expected weight to be ", k + 2, "-D for input",
             in, ", got weight of size ", w);
  for (IntArrayRef v : {stride, padding, dilation, output_padding})
    KILN_CHECK(static_cast<int64_t>(v.size()) == k, Value, op,
               ": expected stride, padding, dilation and output_padding to have ", k,
               " elements (one per spatial dim), got ", stride, ", ", padding, ", ", dilation,
               " and ", output_padding);
  KILN_CHECK(groups > 0, Value, op, ": non-positive groups is not supported (groups=", groups, ")");
  for (int64_t d = 0; d < k; ++d) {
    KILN_CHECK(stride[d] > 0, Value, op, ": non-positive stride is not supported (stride=", stride,
               ")");
    KILN_CHECK(padding[d] >= 0, Value, op, ": negative padding is not supported (padding=", padding,
               ")");
    KILN_CHECK(dilation[d] > 0, Value, op,
               ": dilation should be greater than zero (dilation=", dilation, ")");
    KILN_CHECK(w[d + 2] > 0, Value, op, ": expected a positive kernel size, got weight of size ",
               w);
    KILN_CHECK(!transposed || (output_padding[d] >= 0 && output_padding[d] < stride[d]), Value, op,
               ": output padding must be non-negative and smaller than stride (output_padding=",
               output_padding, ", stride=", stride, ")");
  }
  KILN_CHECK(w[0] % groups == 0, Value, op, ": Given groups=", groups,
             ", expected weight to be divisible by ", groups,
             " at dimension 0, but got weight of size ", w, " instead");
  if (transposed) {
    KILN_CHECK(in[1] == w[0], Value, op, ": Given transposed=1, weight of size ", w,
               ", expected input", in, " to have ", w[0], " channels, but got ", in[1],
               " channels instead");
  } else {
    KILN_CHECK(in[1] == w[1] * groups, Value, op, ": Given groups=", groups, ", weight of size ", w,
               ", expected input", in, " to have ", w[1] * groups, " channels, but got ", in[1],
               " channels instead");
  }
  DimVector out{in[0], transposed ? w[1] * groups : w[0]}, padded, kernel;
  for (int64_t d = 0; d < k; ++d) {
    const int64_t ext = dilation[d] * (w[d + 2] - 1) + 1;
    padded.push_back(in[d + 2] + 2 * padding[d]);
    kernel.push_back(ext);
    out.push_back(transposed
                      ? (in[d + 2] - 1) * stride[d] - 2 * padding[d] + ext + output_padding[d]
                      : (padded[d] - ext) / stride[d] + 1);
  }
  for (int64_t d = 0; d < k; ++d) {
    if (transposed) {
      KILN_CHECK(out[d + 2] > 0, Value, op, ": Given input size per channel: (",
                 by_x(IntArrayRef(in.data() + 2, k)), "). Calculated output size per channel: (",
                 by_x(IntArrayRef(out.data() + 2, k)), "). Output size is too small");
    } else {
      KILN_CHECK(padded[d] >= kernel[d], Value, op, ": Calculated padded input size per channel: (",
                 by_x(padded), "). Kernel size: (", by_x(kernel),
                 "). Kernel size can't be greater than actual input size");
    }
  }
  return out;
}

namespace {

void check_batched_input(const char* op, const Tensor& input) {
  KILN_CHECK(input.dim() == 3 || input.dim() == 4, Value, op,
             ": expected a 3-D (N, C, L) or 4-D (N, C, H, W) input, got input of size ",
             input.sizes());
}

}  // namespace

ConvArgs conv_args(const char* op, int64_t k, const Tensor& input, const Tensor& weight,
                   const std::optional<Tensor>& bias, IntArrayRef stride, IntArrayRef padding,
                   IntArrayRef dilation, bool transposed, IntArrayRef output_padding,
                   int64_t groups) {
  check_dtypes(op, input, "input", weight, "weight");
  KILN_CHECK(input.dim() == k + 1 || input.dim() == k + 2, Value, op, ": expected ", k + 1,
             "-D (unbatched) or ", k + 2, "-D (batched) input, got input of size ", input.sizes());
  KILN_CHECK(weight.dim() == k + 2, Value, op, ": expected weight to be ", k + 2,
             "-D, got weight of size ", weight.sizes());
  ConvArgs a;
  a.stride = per_dim(op, "stride", stride, k);
  a.padding = per_dim(op, "padding", padding, k);
  a.dilation = per_dim(op, "dilation", dilation, k);
  a.output_padding = per_dim(op, "output_padding", output_padding, k);
  a.groups = groups;
  a.transposed = transposed;
  a.unbatched = input.dim() == k + 1;
  a.trim = DimVector(k, 0);
  if (bias && bias->defined()) {
    check_dtypes(op, input, "input", *bias, "bias");
    const int64_t out_channels = transposed ? weight.size(1) * groups : weight.size(0);
    KILN_CHECK(bias->dim() == 1 && bias->size(0) == out_channels, Value, op,
               ": expected bias of size [", out_channels,
               "] (one per output channel), got bias of size ", bias->sizes());
    common_device(op, input, weight, *bias);
  }
  return a;
}

ConvArgs conv_args(const char* op, int64_t k, const Tensor& input, const Tensor& weight,
                   const std::optional<Tensor>& bias, IntArrayRef stride, std::string_view padding,
                   IntArrayRef dilation, int64_t groups) {
  KILN_CHECK(padding == "valid" || padding == "same", Value, op, ": invalid padding string '",
             padding, "', should be one of 'valid' or 'same'");
  ConvArgs a = conv_args(op, k, input, weight, bias, stride, {0}, dilation, false, {0}, groups);
  if (padding == "valid") return a;
  for (int64_t d = 0; d < k; ++d) {
    KILN_CHECK(a.stride[d] == 1, Value, op,
               ": padding='same' is not supported for strided convolutions (stride=", stride, ")");
    const int64_t total = a.dilation[d] * (weight.size(d + 2) - 1);
    a.padding[d] = (total + 1) / 2;
    a.trim[d] = total % 2;
  }
  return a;
}

TensorSpec conv_spec(const char* op, const Tensor& input, const Tensor& weight, const ConvArgs& a) {
  DimVector in(input.sizes());
  if (a.unbatched) in.insert(0, 1);
  DimVector out = conv_shape(op, in, weight.sizes(), a.stride, a.padding, a.dilation, a.transposed,
                             a.output_padding, a.groups);
  for (size_t d = 0; d < a.trim.size(); ++d) out[d + 2] -= a.trim[d];
  if (a.unbatched) out.erase(0);
  return contiguous_spec(out, input.dtype(), common_device(op, input, weight));
}

TensorSpec convolution(const Tensor& input, const Tensor& weight, IntArrayRef stride,
                       IntArrayRef padding, IntArrayRef dilation, bool transposed,
                       IntArrayRef output_padding, int64_t groups) {
  const char* op = "convolution";
  check_dtypes(op, input, "input", weight, "weight");
  check_batched_input(op, input);
  DimVector out = conv_shape(op, input.sizes(), weight.sizes(), stride, padding, dilation,
                             transposed, output_padding, groups);
  return contiguous_spec(out, input.dtype(), common_device(op, input, weight));
}

TensorSpec convolution_backward_weight(const Tensor& grad_output, const Tensor& input,
                                       IntArrayRef weight_size, IntArrayRef stride,
                                       IntArrayRef padding, IntArrayRef dilation, int64_t groups) {
  const char* op = "convolution_backward_weight";
  check_dtypes(op, input, "input", grad_output, "grad_output");
  check_batched_input(op, input);
  DimVector zeros(stride.size(), 0);
  DimVector out =
      conv_shape(op, input.sizes(), weight_size, stride, padding, dilation, false, zeros, groups);
  KILN_CHECK(grad_output.sizes() == out.ref(), Value, op, ": expected grad_output of size ",
             out.ref(), " (the output of input", input.sizes(), " convolved with weight",
             weight_size, "), got ", grad_output.sizes());
  return contiguous_spec(weight_size, input.dtype(), common_device(op, grad_output, input));
}

TensorSpec conv1d(const Tensor& input, const Tensor& weight, const std::optional<Tensor>& bias,
                  IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation, int64_t groups) {
  return conv_spec(
      "conv1d", input, weight,
      conv_args("conv1d", 1, input, weight, bias, stride, padding, dilation, false, {0}, groups));
}

TensorSpec conv1d_padding(const Tensor& input, const Tensor& weight,
                          const std::optional<Tensor>& bias, IntArrayRef stride,
                          std::string_view padding, IntArrayRef dilation, int64_t groups) {
  return conv_spec("conv1d", input, weight,
                   conv_args("conv1d", 1, input, weight, bias, stride, padding, dilation, groups));
}

TensorSpec conv2d(const Tensor& input, const Tensor& weight, const std::optional<Tensor>& bias,
                  IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation, int64_t groups) {
  return conv_spec(
      "conv2d", input, weight,
      conv_args("conv2d", 2, input, weight, bias, stride, padding, dilation, false, {0}, groups));
}

TensorSpec conv2d_padding(const Tensor& input, const Tensor& weight,
                          const std::optional<Tensor>& bias, IntArrayRef stride,
                          std::string_view padding, IntArrayRef dilation, int64_t groups) {
  return conv_spec("conv2d", input, weight,
                   conv_args("conv2d", 2, input, weight, bias, stride, padding, dilation, groups));
}

TensorSpec conv_transpose2d(const Tensor& input, const Tensor& weight,
                            const std::optional<Tensor>& bias, IntArrayRef stride,
                            IntArrayRef padding, IntArrayRef output_padding, int64_t groups,
                            IntArrayRef dilation) {
  return conv_spec("conv_transpose2d", input, weight,
                   conv_args("conv_transpose2d", 2, input, weight, bias, stride, padding, dilation,
                             true, output_padding, groups));
}

}  // namespace kiln::meta
