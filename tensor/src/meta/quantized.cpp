// Meta functions of the int8 quantization rows (tensor/ops/quantized.toml; Note [Quantization
// scheme] there). Every error names the argument: "linear_int8: expected weight_scale of size [4]
// (one per output channel of weight [4, 3]), got [3]". Scale and zero-point *tensors* are checked
// for values by the kernels (a meta tensor has none).
#include "kiln/generated/meta/quantized.h"

#include <cmath>

#include "kiln/meta.h"
#include "meta/conv.h"

namespace kiln::meta {
namespace {

void check_scale(const char* op, const char* name, double scale) {
  KILN_CHECK(std::isfinite(scale) && scale > 0, Value, op, ": expected ", name,
             " to be a positive finite number, got ", scale);
  KILN_CHECK(static_cast<float>(scale) > 0 && std::isfinite(static_cast<float>(scale)), Value, op,
             ": ", name, " = ", scale, " is not a positive finite float32");
}

// An asymmetric uint8 activation's zero point.
void check_zero_point(const char* op, const char* name, int64_t zp) {
  KILN_CHECK(zp >= 0 && zp <= 255, Value, op, ": expected ", name,
             " in [0, 255] (uint8 activations), got ", zp);
}

void check_dtype(const char* op, const char* name, const Tensor& t, ScalarType want) {
  KILN_CHECK(t.dtype() == want, Type, op, ": expected ", name, " of dtype ", want, ", got ",
             t.dtype());
}

void check_float(const char* op, const char* name, const Tensor& t) {
  KILN_CHECK(is_floating(t.dtype()), Type, op, ": expected a floating-point ", name, ", got ",
             t.dtype());
}

// weight (N, ...) int8 with weight_scale (N,) float32 and bias (N,) float32.
void check_weight(const char* op, const Tensor& weight, const Tensor& weight_scale,
                  const std::optional<Tensor>& bias) {
  check_dtype(op, "weight", weight, kInt8);
  check_dtype(op, "weight_scale", weight_scale, kFloat32);
  const int64_t n = weight.size(0);
  KILN_CHECK(weight_scale.dim() == 1 && weight_scale.size(0) == n, Value, op,
             ": expected weight_scale of size [", n, "] (one per output channel of weight ",
             weight.sizes(), "), got ", weight_scale.sizes());
  if (!bias || !bias->defined()) return;
  check_dtype(op, "bias", *bias, kFloat32);
  KILN_CHECK(bias->dim() == 1 && bias->size(0) == n, Value, op, ": expected bias of size [", n,
             "] (one per output channel of weight ", weight.sizes(), "), got ", bias->sizes());
}

// input (*, K), weight (N, K) -> (*, N).
DimVector linear_shape(const char* op, const Tensor& input, const Tensor& weight) {
  KILN_CHECK(weight.dim() == 2, Value, op, ": expected a 2-D weight [N, K], got weight of size ",
             weight.sizes());
  KILN_CHECK(input.dim() >= 1 && input.size(-1) == weight.size(1), Value, op,
             ": expected input [*, ", weight.size(1), "] for weight ", weight.sizes(),
             ", got input of size ", input.sizes());
  DimVector out(input.sizes());
  out.back() = weight.size(0);
  return out;
}

void check_qrange(const char* op, int64_t zero_point, int64_t quant_min, int64_t quant_max) {
  KILN_CHECK(quant_min <= quant_max, Value, op,
             ": expected quant_min <= quant_max, got quant_min=", quant_min,
             " and quant_max=", quant_max);
  KILN_CHECK(zero_point >= quant_min && zero_point <= quant_max, Value, op,
             ": expected zero_point in [quant_min, quant_max] = [", quant_min, ", ", quant_max,
             "], got ", zero_point);
}

// A static int8 op's uint8 input and its input and output quantization parameters.
void check_static_qparams(const char* op, const Tensor& input, double input_scale,
                          int64_t input_zero_point, double output_scale,
                          int64_t output_zero_point) {
  check_dtype(op, "input", input, kUInt8);
  check_scale(op, "input_scale", input_scale);
  check_zero_point(op, "input_zero_point", input_zero_point);
  check_scale(op, "output_scale", output_scale);
  check_zero_point(op, "output_zero_point", output_zero_point);
}

}  // namespace

TensorSpec quantize_per_tensor(const Tensor& input, double scale, int64_t zero_point) {
  const char* op = "quantize_per_tensor";
  check_float(op, "input", input);
  check_scale(op, "scale", scale);
  check_zero_point(op, "zero_point", zero_point);
  return contiguous_spec(input.sizes(), kUInt8, input.device());
}

TensorSpec dequantize_per_tensor(const Tensor& input, double scale, int64_t zero_point) {
  const char* op = "dequantize_per_tensor";
  check_dtype(op, "input", input, kUInt8);
  check_scale(op, "scale", scale);
  check_zero_point(op, "zero_point", zero_point);
  return contiguous_spec(input.sizes(), kFloat32, input.device());
}

std::vector<TensorSpec> quantize_weight_per_channel(const Tensor& weight, int64_t axis) {
  const char* op = "quantize_weight_per_channel";
  check_float(op, "weight", weight);
  KILN_CHECK(weight.dim() >= 1, Value, op, ": expected a weight of at least 1 dim, got a 0-d one");
  const int64_t a = wrap_dim(op, axis, weight.dim());
  return {contiguous_spec(weight.sizes(), kInt8, weight.device()),
          contiguous_spec({weight.size(a)}, kFloat32, weight.device())};
}

TensorSpec linear_int8(const Tensor& input, double input_scale, int64_t input_zero_point,
                       const Tensor& weight, const Tensor& weight_scale,
                       const std::optional<Tensor>& bias, double output_scale,
                       int64_t output_zero_point, bool relu) {
  const char* op = "linear_int8";
  check_static_qparams(op, input, input_scale, input_zero_point, output_scale, output_zero_point);
  DimVector out = linear_shape(op, input, weight);
  check_weight(op, weight, weight_scale, bias);
  return contiguous_spec(out, kUInt8, common_device(op, input, weight, weight_scale));
}

TensorSpec conv2d_int8(const Tensor& input, double input_scale, int64_t input_zero_point,
                       const Tensor& weight, const Tensor& weight_scale,
                       const std::optional<Tensor>& bias, IntArrayRef stride, IntArrayRef padding,
                       IntArrayRef dilation, int64_t groups, double output_scale,
                       int64_t output_zero_point, bool relu) {
  const char* op = "conv2d_int8";
  check_static_qparams(op, input, input_scale, input_zero_point, output_scale, output_zero_point);
  KILN_CHECK(input.dim() == 4, Value, op, ": expected a 4-D (N, C, H, W) input, got input of size ",
             input.sizes());
  KILN_CHECK(weight.dim() == 4, Value, op,
             ": expected a 4-D weight (O, C / groups, kH, kW), got weight of size ",
             weight.sizes());
  check_weight(op, weight, weight_scale, bias);
  DimVector out = conv_shape(op, input.sizes(), weight.sizes(), stride, padding, dilation,
                             /*transposed=*/false, {0, 0}, groups);
  return contiguous_spec(out, kUInt8, common_device(op, input, weight, weight_scale));
}

TensorSpec linear_int8_dynamic(const Tensor& input, const Tensor& weight,
                               const Tensor& weight_scale, const std::optional<Tensor>& bias,
                               bool relu) {
  const char* op = "linear_int8_dynamic";
  check_dtype(op, "input", input, kFloat32);
  DimVector out = linear_shape(op, input, weight);
  check_weight(op, weight, weight_scale, bias);
  return contiguous_spec(out, kFloat32, common_device(op, input, weight, weight_scale));
}

TensorSpec fake_quantize_per_tensor_affine(const Tensor& input, double scale, int64_t zero_point,
                                           int64_t quant_min, int64_t quant_max) {
  const char* op = "fake_quantize_per_tensor_affine";
  check_float(op, "input", input);
  check_scale(op, "scale", scale);
  check_qrange(op, zero_point, quant_min, quant_max);
  return contiguous_spec(input.sizes(), input.dtype(), input.device());
}

TensorSpec fake_quantize_per_channel_affine(const Tensor& input, const Tensor& scale,
                                            const Tensor& zero_point, int64_t axis,
                                            int64_t quant_min, int64_t quant_max) {
  const char* op = "fake_quantize_per_channel_affine";
  check_float(op, "input", input);
  check_float(op, "scale", scale);
  KILN_CHECK(zero_point.dtype() == kInt32 || zero_point.dtype() == kInt64, Type, op,
             ": expected an int32 or int64 zero_point, got ", zero_point.dtype());
  KILN_CHECK(input.dim() >= 1, Value, op, ": expected an input of at least 1 dim, got a 0-d one");
  const int64_t a = wrap_dim(op, axis, input.dim());
  const int64_t c = input.size(a);
  KILN_CHECK(scale.dim() == 1 && scale.size(0) == c, Value, op, ": expected scale of size [", c,
             "] (input.size(", a, ") for input ", input.sizes(), "), got ", scale.sizes());
  KILN_CHECK(zero_point.dim() == 1 && zero_point.size(0) == c, Value, op,
             ": expected zero_point of size [", c, "] (input.size(", a, ") for input ",
             input.sizes(), "), got ", zero_point.sizes());
  KILN_CHECK(quant_min <= quant_max, Value, op,
             ": expected quant_min <= quant_max, got quant_min=", quant_min,
             " and quant_max=", quant_max);
  return contiguous_spec(input.sizes(), input.dtype(), common_device(op, input, scale, zero_point));
}

}  // namespace kiln::meta
