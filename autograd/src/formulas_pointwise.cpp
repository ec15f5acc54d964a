// Formula helpers for broadcasting, casts, pointwise ops and matmul (kiln/autograd/formulas.h).
// Only kiln ops: the gradients these return are differentiable again (double backward).
#include <cmath>

#include "kiln/autograd/formulas.h"
#include "kiln/error.h"

namespace kiln::autograd {

namespace {

// Zeros with t's shape in grad's dtype and device.
Tensor zeros_as(const Tensor& t, const Tensor& grad) {
  return zeros(t.sizes(), grad.dtype(), grad.device());
}

// t ** e for a scalar e (as a 0-dim tensor of t's dtype, so no promotion happens).
Tensor pow_scalar(const Tensor& t, const Scalar& e) {
  return pow(t, scalar_tensor_of(e, t.dtype(), t.device()));
}

Scalar minus_one(const Scalar& s) {
  return s.is_floating() ? Scalar(s.to_double() - 1.0) : Scalar(wrapping_sub(s.to_int(), int64_t{1}));
}

}  // namespace

// grad: (..., *broadcast of sizes) -> sizes
Tensor sum_to(const Tensor& grad, IntArrayRef sizes) {
  if (grad.sizes() == sizes) return grad;
  const int64_t n = grad.dim(), m = static_cast<int64_t>(sizes.size());
  KILN_CHECK(m <= n, Value, "sum_to: cannot reduce a gradient of shape ", grad.sizes(),
             " to the larger shape ", sizes);
  const int64_t lead = n - m;
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < lead; ++i) dims.push_back(i);
  for (int64_t i = lead; i < n; ++i) {
    const int64_t want = sizes[i - lead];
    if (want == 1 && grad.size(i) != 1) {
      dims.push_back(i);
    } else {
      KILN_CHECK(want == grad.size(i), Value, "sum_to: gradient of shape ", grad.sizes(),
                 " does not broadcast from shape ", sizes);
    }
  }
  Tensor r = dims.empty() ? grad : grad.sum(dims, /*keepdim=*/true);
  return r.reshape(sizes);
}

Tensor scaled(const Tensor& grad, const Scalar& s) {
  return s.to_double() == 1.0 ? grad : grad * s;
}

Tensor grad_for_broadcast(const Tensor& grad, IntArrayRef sizes) { return sum_to(grad, sizes); }

Tensor reduce_grad(const Tensor& grad, const Tensor& input) { return sum_to(grad, input.sizes()); }

Tensor cast_back(const Tensor& grad, const Tensor& like) {
  return cast_back(grad, like.dtype(), like.device());
}

Tensor cast_back(const Tensor& grad, ScalarType dtype, Device device) {
  if (!grad.defined()) return grad;
  if (grad.dtype() == dtype && grad.device() == device) return grad;
  return grad.to(dtype, device);
}

Tensor copy_backward(const Tensor& grad, const Tensor& src) {
  return cast_back(sum_to(grad, src.sizes()), src);
}

Tensor mask_grad(const Tensor& grad, const Tensor& mask) {
  return where(mask, grad, zeros_like(grad));
}

Tensor sign_grad(const Tensor& grad, const Tensor& self) { return grad * sign(self); }

// d/dx x^y = y x^(y-1), taken as 0 where y == 0 (also at x == 0).
Tensor pow_backward_self(const Tensor& grad, const Tensor& self, const Tensor& exponent) {
  Tensor g = grad * exponent * pow(self, exponent - 1);
  return sum_to(where(exponent == 0, zeros_like(g), g), self.sizes());
}

Tensor pow_backward_self(const Tensor& grad, const Tensor& self, const Scalar& exponent) {
  if (exponent.to_double() == 0.0) return zeros_as(self, grad);
  Tensor g = grad * exponent * pow_scalar(self, minus_one(exponent));
  return sum_to(g, self.sizes());
}

// d/dy x^y = x^y log(x), taken as 0 where x == 0 and y >= 0.
Tensor pow_backward_exponent(const Tensor& grad, const Tensor& self, const Tensor& exponent,
                             const Tensor& result) {
  Tensor g = grad * (result * log(self));
  Tensor zero = logical_and(self == 0, exponent >= 0);
  return sum_to(where(zero, zeros_like(g), g), exponent.sizes());
}

Tensor pow_backward_exponent(const Tensor& grad, const Scalar& self, const Tensor& exponent,
                             const Tensor& result) {
  Tensor base = scalar_tensor_of(self, result.dtype(), result.device());
  return pow_backward_exponent(grad, base, exponent, result);
}

Tensor fmod_backward(const Tensor& grad, const Tensor& self, const Tensor& other) {
  return sum_to(-(grad * div(self, other, "trunc")), other.sizes());
}

Tensor clamp_backward(const Tensor& grad, const Tensor& self, const std::optional<Scalar>& min,
                      const std::optional<Scalar>& max) {
  if (!min && !max) return grad;
  Tensor mask;
  if (min) mask = self >= *min;
  if (max) mask = mask.defined() ? logical_and(mask, self <= *max) : (self <= *max);
  return where(mask, grad, zeros_like(grad));
}

Tensor clamp_backward(const Tensor& grad, const Tensor& self, const std::optional<Tensor>& min,
                      const std::optional<Tensor>& max) {
  const bool has_min = min && min->defined(), has_max = max && max->defined();
  if (!has_min && !has_max) return sum_to(grad, self.sizes());
  Tensor mask;
  if (has_min) mask = self >= *min;
  if (has_max) mask = mask.defined() ? logical_and(mask, self <= *max) : (self <= *max);
  return sum_to(where(mask, grad, zeros_like(grad)), self.sizes());
}

Tensor where_backward(const Tensor& grad, const Tensor& condition, bool is_self, IntArrayRef sizes) {
  Tensor z = zeros_like(grad);
  return sum_to(is_self ? where(condition, grad, z) : where(condition, z, grad), sizes);
}

Tensor masked_fill_backward(const Tensor& grad, const Tensor& mask, IntArrayRef sizes) {
  return sum_to(grad.masked_fill(mask, 0), sizes);
}

// matmul: 1-D operands get a unit dim (self as a row, other as a column), the product's gradient is
// taken in matrix form and summed over broadcast batch dims.
namespace {

struct MatmulOperands {
  Tensor self, other, grad;
};

MatmulOperands as_matrices(const Tensor& grad, const Tensor& self, const Tensor& other) {
  KILN_CHECK(self.dim() >= 1 && other.dim() >= 1, Value,
             "matmul backward: both operands must be at least 1-D, got ", self.sizes(), " and ",
             other.sizes());
  MatmulOperands m{self, other, grad};
  if (other.dim() == 1) {
    m.other = other.unsqueeze(-1);
    m.grad = m.grad.unsqueeze(-1);
  }
  if (self.dim() == 1) {
    m.self = self.unsqueeze(0);
    m.grad = m.grad.unsqueeze(-2);
  }
  return m;
}

}  // namespace

Tensor matmul_backward_self(const Tensor& grad, const Tensor& self, const Tensor& other) {
  MatmulOperands m = as_matrices(grad, self, other);
  Tensor g = matmul(m.grad, m.other.transpose(-1, -2));
  return sum_to(g, m.self.sizes()).reshape(self.sizes());
}

Tensor matmul_backward_other(const Tensor& grad, const Tensor& self, const Tensor& other) {
  MatmulOperands m = as_matrices(grad, self, other);
  Tensor g = matmul(m.self.transpose(-1, -2), m.grad);
  return sum_to(g, m.other.sizes()).reshape(other.sizes());
}

Tensor mm_mat2_backward(const Tensor& grad, const Tensor& mat1, const Tensor& mat2) {
  // mat2 a transposed view (linear's weight.t()): compute the transposed product, so that the
  // gradient reaching the weight through t()'s backward is contiguous and is not copied.
  if (mat2.dim() == 2 && mat2.stride(0) == 1 && mat2.stride(1) == mat2.size(0) && mat2.size(1) > 1)
    return grad.t().mm(mat1).t();
  return mat1.t().mm(grad);
}

}  // namespace kiln::autograd
