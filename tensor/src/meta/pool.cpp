// Meta functions of the 2-D pools (tensor/ops/pool.toml): output sizes as PyTorch computes them
// (floor or ceil mode; a ceil-mode window that would start in the right padding is dropped) and
// PyTorch's errors, naming the shapes.

#include "kiln/generated/meta/creation.h"
#include "kiln/generated/meta/pool.h"
#include "kiln/meta.h"

namespace kiln::meta {
namespace {

struct Pool2d {
  int64_t kh, kw, sh, sw, ph, pw, dh, dw;
};

// One value for both dims, or two (kernel_size, stride, padding, dilation as PyTorch takes them).
void one_or_two(const char* op, const char* name, IntArrayRef v, bool may_be_empty) {
  KILN_CHECK(v.size() == 1 || v.size() == 2 || (may_be_empty && v.empty()), Value, op, ": ", name,
             " must either be a single int, or a tuple of two ints, got ", v);
}

Pool2d pool_params(const char* op, IntArrayRef kernel, IntArrayRef stride, IntArrayRef padding,
                   IntArrayRef dilation) {
  one_or_two(op, "kernel_size", kernel, false);
  one_or_two(op, "stride", stride, true);
  one_or_two(op, "padding", padding, false);
  one_or_two(op, "dilation", dilation, false);
  auto second = [](IntArrayRef v) { return v.size() == 2 ? v[1] : v[0]; };
  Pool2d p{kernel[0],  second(kernel),  0,           0,
           padding[0], second(padding), dilation[0], second(dilation)};
  p.sh = stride.empty() ? p.kh : stride[0];
  p.sw = stride.empty() ? p.kw : second(stride);
  KILN_CHECK(p.kh > 0 && p.kw > 0, Value, op,
             ": kernel size should be greater than zero, but got kH: ", p.kh, " kW: ", p.kw);
  KILN_CHECK(p.sh > 0 && p.sw > 0, Value, op,
             ": stride should be greater than zero, but got dH: ", p.sh, " dW: ", p.sw);
  KILN_CHECK(p.dh > 0 && p.dw > 0, Value, op,
             ": dilation should be greater than zero, but got dilationH: ", p.dh,
             " dilationW: ", p.dw);
  KILN_CHECK(p.ph >= 0 && p.pw >= 0 && p.ph <= ((p.kh - 1) * p.dh + 1) / 2 &&
                 p.pw <= ((p.kw - 1) * p.dw + 1) / 2,
             Value, op,
             ": pad should be at most half of effective kernel size, but got pad=", padding,
             ", kernel_size=", kernel, " and dilation=", dilation);
  return p;
}

int64_t pooled(int64_t in, int64_t k, int64_t pad, int64_t stride, int64_t dil, bool ceil) {
  int64_t num = in + 2 * pad - dil * (k - 1) - 1 + (ceil ? stride - 1 : 0);
  int64_t out = (num >= 0 ? num / stride : -((-num + stride - 1) / stride)) + 1;
  if (ceil && (out - 1) * stride >= in + pad) --out;
  return out;
}

void check_input(const char* op, IntArrayRef s) {
  KILN_CHECK((s.size() == 3 || s.size() == 4) && s[s.size() - 1] > 0 && s[s.size() - 2] > 0 &&
                 s[s.size() - 3] > 0,
             Value, op,
             ": Expected 3D or 4D (batch mode) tensor with optional 0 dim batch size for input, "
             "but got: ",
             s);
}

void check_floating(const char* op, const Tensor& t) {
  KILN_CHECK(is_floating(t.dtype()), Type, op, ": expected a floating-point input, got ",
             t.dtype());
}

DimVector pool_shape(const char* op, IntArrayRef in, const Pool2d& p, bool ceil) {
  check_input(op, in);
  const int64_t n = in.size();
  int64_t oh = pooled(in[n - 2], p.kh, p.ph, p.sh, p.dh, ceil);
  int64_t ow = pooled(in[n - 1], p.kw, p.pw, p.sw, p.dw, ceil);
  KILN_CHECK(oh >= 1 && ow >= 1, Value, op, ": Given input size: (", in[n - 3], "x", in[n - 2], "x",
             in[n - 1], "). Calculated output size: (", in[n - 3], "x", oh, "x", ow,
             "). Output size is too small");
  DimVector out(in);
  out[n - 2] = oh;
  out[n - 1] = ow;
  return out;
}

// A backward row's self_size against its grad_output: same rank (3 or 4), same leading dims.
void check_backward_sizes(const char* op, const Tensor& grad_output, IntArrayRef self_size) {
  check_input(op, self_size);
  KILN_CHECK(grad_output.dim() == static_cast<int64_t>(self_size.size()) &&
                 IntArrayRef(grad_output.sizes().data(), self_size.size() - 2) ==
                     IntArrayRef(self_size.data(), self_size.size() - 2),
             Value, op, ": grad_output of size ", grad_output.sizes(),
             " does not match an input of size ", self_size);
  check_floating(op, grad_output);
}

}  // namespace

std::vector<TensorSpec> max_pool2d_with_indices(const Tensor& self, IntArrayRef kernel_size,
                                                IntArrayRef stride, IntArrayRef padding,
                                                IntArrayRef dilation, bool ceil_mode) {
  const char* op = "max_pool2d";
  check_floating(op, self);
  DimVector out = pool_shape(op, self.sizes(),
                             pool_params(op, kernel_size, stride, padding, dilation), ceil_mode);
  return {contiguous_spec(out, self.dtype(), self.device()),
          contiguous_spec(out, kInt64, self.device())};
}

TensorSpec max_pool2d(const Tensor& self, IntArrayRef kernel_size, IntArrayRef stride,
                      IntArrayRef padding, IntArrayRef dilation, bool ceil_mode) {
  return max_pool2d_with_indices(self, kernel_size, stride, padding, dilation, ceil_mode)[0];
}

TensorSpec max_pool2d_backward(const Tensor& grad_output, const Tensor& indices,
                               IntArrayRef self_size) {
  const char* op = "max_pool2d_backward";
  check_backward_sizes(op, grad_output, self_size);
  KILN_CHECK(indices.dtype() == kInt64 && indices.sizes() == grad_output.sizes(), Value, op,
             ": expected int64 indices of size ", grad_output.sizes(), ", got ", indices.dtype(),
             " indices of size ", indices.sizes());
  return contiguous_spec(self_size, grad_output.dtype(), common_device(op, grad_output, indices));
}

TensorSpec avg_pool2d(const Tensor& self, IntArrayRef kernel_size, IntArrayRef stride,
                      IntArrayRef padding, bool ceil_mode, bool,
                      std::optional<int64_t> divisor_override) {
  const char* op = "avg_pool2d";
  check_floating(op, self);
  KILN_CHECK(!divisor_override || *divisor_override != 0, Value, op, ": divisor must be not zero");
  DimVector out =
      pool_shape(op, self.sizes(), pool_params(op, kernel_size, stride, padding, {1}), ceil_mode);
  return contiguous_spec(out, self.dtype(), self.device());
}

TensorSpec avg_pool2d_backward(const Tensor& grad_output, IntArrayRef self_size,
                               IntArrayRef kernel_size, IntArrayRef stride, IntArrayRef padding,
                               bool ceil_mode, bool, std::optional<int64_t> divisor_override) {
  const char* op = "avg_pool2d_backward";
  check_backward_sizes(op, grad_output, self_size);
  KILN_CHECK(!divisor_override || *divisor_override != 0, Value, op, ": divisor must be not zero");
  DimVector out =
      pool_shape(op, self_size, pool_params(op, kernel_size, stride, padding, {1}), ceil_mode);
  KILN_CHECK(grad_output.sizes() == out.ref(), Value, op, ": expected grad_output of size ",
             out.ref(), " for an input of size ", self_size, ", got ", grad_output.sizes());
  return contiguous_spec(self_size, grad_output.dtype(), grad_output.device());
}

TensorSpec adaptive_avg_pool2d(const Tensor& self, IntArrayRef output_size) {
  const char* op = "adaptive_avg_pool2d";
  check_floating(op, self);
  check_input(op, self.sizes());
  one_or_two(op, "output_size", output_size, false);
  const int64_t oh = output_size[0], ow = output_size.size() == 2 ? output_size[1] : oh;
  KILN_CHECK(oh >= 0 && ow >= 0, Value, op,
             ": elements of output_size must be greater than or equal to 0, got ", output_size);
  DimVector out(self.sizes());
  out[out.size() - 2] = oh;
  out.back() = ow;
  return contiguous_spec(out, self.dtype(), self.device());
}

TensorSpec adaptive_avg_pool2d_backward(const Tensor& grad_output, IntArrayRef self_size) {
  check_backward_sizes("adaptive_avg_pool2d_backward", grad_output, self_size);
  return contiguous_spec(self_size, grad_output.dtype(), grad_output.device());
}

}  // namespace kiln::meta
