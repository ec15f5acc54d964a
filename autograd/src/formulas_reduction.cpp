// Formula helpers for reductions and softmax (kiln/autograd/formulas.h). A reduction's gradient
// has the reduced shape; these helpers unsqueeze it back (unless keepdim) and broadcast it over
// the input. Only kiln ops, so the results are differentiable again.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kiln/autograd/formulas.h"
#include "kiln/error.h"
#include "kiln/meta.h"

namespace kiln::autograd {

namespace {

bool reduces_all(OptionalIntArrayRef dim) { return !dim.has_value() || dim->empty(); }

// The number of input elements each output element of the reduction reduces.
int64_t reduced_count(IntArrayRef sizes, OptionalIntArrayRef dim, const char* op) {
  int64_t n = 1;
  if (reduces_all(dim)) {
    for (int64_t s : sizes) n *= s;
    return n;
  }
  std::vector<bool> mask = meta::dim_mask(op, dim, static_cast<int64_t>(sizes.size()));
  for (size_t i = 0; i < sizes.size(); ++i)
    if (mask[i]) n *= sizes[i];
  return n;
}

Tensor pow_scalar(const Tensor& t, double e) {
  return pow(t, scalar_tensor_of(e, t.dtype(), t.device()));
}

}  // namespace

// t: the reduced shape (keepdim=false) -> the same rank as the input, reduced dims of size 1
Tensor unsqueeze_dims(const Tensor& t, OptionalIntArrayRef dim, int64_t ndim) {
  if (reduces_all(dim)) return t.reshape(std::vector<int64_t>(ndim, 1));
  std::vector<bool> mask = meta::dim_mask("unsqueeze_dims", dim, ndim);
  Tensor r = t;
  for (int64_t i = 0; i < ndim; ++i)
    if (mask[i]) r = r.unsqueeze(i);
  return r;
}

Tensor restore_reduced(const Tensor& t, OptionalIntArrayRef dim, int64_t ndim, bool keepdim) {
  return keepdim ? t : unsqueeze_dims(t, dim, ndim);
}

Tensor unsqueeze_to(const Tensor& t, IntArrayRef sizes) {
  Tensor r = t;
  for (size_t i = 0; i < sizes.size(); ++i)
    if (sizes[i] == 1) r = r.unsqueeze(static_cast<int64_t>(i));
  return r;
}

Tensor unsqueeze_to(const Tensor& t, int64_t dim, IntArrayRef sizes) {
  if (sizes.empty()) return t;
  int64_t d = meta::wrap_dim("unsqueeze_to", dim, static_cast<int64_t>(sizes.size()));
  return sizes[d] == 1 ? t.unsqueeze(d) : t;
}

// grad: reduced -> sizes
Tensor sum_backward(const Tensor& grad, IntArrayRef sizes, OptionalIntArrayRef dim, bool keepdim) {
  const int64_t ndim = static_cast<int64_t>(sizes.size());
  return restore_reduced(grad, dim, ndim, keepdim).expand(sizes);
}

Tensor expand_grad(const Tensor& grad, IntArrayRef sizes, OptionalIntArrayRef dim, bool keepdim) {
  return sum_backward(grad, sizes, dim, keepdim);
}

Tensor mean_backward(const Tensor& grad, IntArrayRef sizes, OptionalIntArrayRef dim, int64_t numel,
                     bool keepdim) {
  const int64_t n = reduces_all(dim) ? numel : reduced_count(sizes, dim, "mean_backward");
  return sum_backward(grad, sizes, dim, keepdim) / static_cast<double>(n);
}

// prod over each reduced slice: with no zero, d/dx_i = prod / x_i; with one zero, the zero's
// gradient is the product of the others and the rest get 0; with two or more zeros, all 0.
Tensor prod_backward(const Tensor& grad, const Tensor& self, const Tensor& result,
                     OptionalIntArrayRef dim, bool keepdim) {
  (void)result;  // recomputed from self, so that double backward sees the whole dependency
  const int64_t ndim = self.dim();
  Tensor g = restore_reduced(grad, dim, ndim, keepdim);
  Tensor is_zero = self == 0;
  Tensor safe = where(is_zero, ones_like(self), self);
  Tensor n_zeros = is_zero.sum(dim, /*keepdim=*/true);
  Tensor prod_nonzero = safe.prod(dim, /*keepdim=*/true);
  Tensor no_zero_grad = prod_nonzero / safe;
  Tensor one_zero_grad = where(logical_and(n_zeros == 1, is_zero), prod_nonzero, zeros_like(self));
  return g * where(n_zeros == 0, no_zero_grad, one_zero_grad);
}

Tensor evenly_distribute_backward(const Tensor& grad, const Tensor& self, const Tensor& result) {
  Tensor mask = logical_or(self == result, logical_and(self != self, result != result));
  Tensor count = mask.sum(std::nullopt, false, grad.dtype());
  return where(mask, grad / count, zeros(self.sizes(), grad.dtype(), grad.device()));
}

Tensor amax_amin_backward(const Tensor& grad, const Tensor& self, const Tensor& result,
                          IntArrayRef dim, bool keepdim) {
  Tensor r = restore_reduced(result, dim, self.dim(), keepdim);
  Tensor g = restore_reduced(grad, dim, self.dim(), keepdim);
  Tensor mask = logical_or(self == r, logical_and(self != self, r != r));
  Tensor count = mask.sum(dim, /*keepdim=*/true, grad.dtype());
  return where(mask, g / count, zeros(self.sizes(), grad.dtype(), grad.device()));
}

Tensor value_selecting_reduction_backward(const Tensor& grad, int64_t dim, const Tensor& indices,
                                          IntArrayRef sizes, bool keepdim) {
  if (sizes.empty()) return grad.reshape(sizes);
  const int64_t d = meta::wrap_dim("value_selecting_reduction_backward", dim,
                                   static_cast<int64_t>(sizes.size()));
  Tensor g = keepdim ? grad : grad.unsqueeze(d);
  Tensor idx = keepdim ? indices : indices.unsqueeze(d);
  return zeros(sizes, grad.dtype(), grad.device()).scatter(d, idx, g);
}

Tensor minmax_backward(const Tensor& grad, const Tensor& self, const Tensor& result) {
  return evenly_distribute_backward(grad, self, result);
}

Tensor minmax_backward(const Tensor& grad, int64_t dim, const Tensor& indices, IntArrayRef sizes,
                       bool keepdim) {
  return value_selecting_reduction_backward(grad, dim, indices, sizes, keepdim);
}

// var = sum((x - mean)^2) / (N - correction): d/dx_i = 2 (x_i - mean) / (N - correction)
Tensor var_backward(const Tensor& grad, const Tensor& self, OptionalIntArrayRef dim,
                    double correction, bool keepdim) {
  const int64_t n = reduced_count(self.sizes(), dim, "var_backward");
  const double scale = 2.0 / (static_cast<double>(n) - correction);
  Tensor g = restore_reduced(grad, dim, self.dim(), keepdim);
  return g * (self - self.mean(dim, /*keepdim=*/true)) * scale;
}

// std = sqrt(var): d std = d var / (2 std), taken as 0 where std == 0.
Tensor std_backward(const Tensor& result, const Tensor& grad, const Tensor& self,
                    OptionalIntArrayRef dim, double correction, bool keepdim) {
  Tensor gv = where(result == 0, zeros_like(grad), grad / (result * 2));
  return var_backward(gv, self, dim, correction, keepdim);
}

Tensor norm_backward(const Tensor& grad, const Tensor& self, const Scalar& p_, const Tensor& result,
                     OptionalIntArrayRef dim, bool keepdim) {
  const double p = p_.to_double();
  const int64_t ndim = self.dim();
  Tensor g = restore_reduced(grad, dim, ndim, keepdim);
  Tensor norm = restore_reduced(result, dim, ndim, keepdim);
  if (p == 0.0) return zeros(self.sizes(), grad.dtype(), grad.device());
  if (p == 1.0) return sign(self) * g;
  if (p == 2.0) {
    Tensor r = self * (g / norm);
    return where(norm == 0, zeros_like(r), r);
  }
  if (std::isinf(p)) {
    // The gradient is shared evenly among the elements whose |x| equals the norm.
    Tensor mask = abs(self) == norm;
    Tensor count = mask.sum(dim, /*keepdim=*/true, grad.dtype());
    Tensor r = sign(self) * (g / count);
    return where(mask, r, zeros_like(r));
  }
  if (p < 1.0) {
    // |x|^(p-1) is infinite at 0: those elements get 0, as in PyTorch.
    Tensor scaled = sign(self) * pow_scalar(abs(self), p - 1);
    scaled = where(self == 0, zeros_like(scaled), scaled);
    return scaled * g * pow_scalar(norm, 1 - p);
  }
  Tensor scaled = p < 2.0 ? sign(self) * pow_scalar(abs(self), p - 1)
                          : self * pow_scalar(abs(self), p - 2);
  Tensor scale = g / pow_scalar(norm, p - 1);
  scale = where(norm == 0, zeros_like(scale), scale);
  return scaled * scale;
}

Tensor logsumexp_backward(const Tensor& grad, const Tensor& self, const Tensor& result,
                          IntArrayRef dim, bool keepdim) {
  OptionalIntArrayRef d(dim);
  Tensor g = restore_reduced(grad, d, self.dim(), keepdim);
  Tensor r = restore_reduced(result, d, self.dim(), keepdim);
  return g * exp(self - r);
}

// y = softmax(x): dx = y * (g - sum(g * y))
Tensor softmax_backward(const Tensor& grad, const Tensor& result, int64_t dim, const Tensor& self) {
  (void)self;  // the formula's cast_back restores self's dtype
  return result * (grad - (grad * result).sum({dim}, /*keepdim=*/true));
}

// y = log_softmax(x): dx = g - exp(y) * sum(g)
Tensor log_softmax_backward(const Tensor& grad, const Tensor& result, int64_t dim,
                            const Tensor& self) {
  (void)self;
  return grad - exp(result) * grad.sum({dim}, /*keepdim=*/true);
}

}  // namespace kiln::autograd
