// Decompositions of the composite rows of shape.toml and linalg.toml: stack, matmul and linear
// (over mm/bmm/addmm). Each validates through its meta function first, so errors name the op the
// user called.
#include "kiln/generated/composite/linalg.h"
#include "kiln/generated/composite/shape.h"
#include "kiln/generated/composite/views.h"
#include "kiln/generated/meta/linalg.h"
#include "kiln/generated/meta/shape.h"
#include "kiln/meta.h"

namespace kiln::composite {

Tensor stack(TensorList tensors, int64_t dim) {
  meta::stack(tensors, dim);
  int64_t d = meta::wrap_dim("stack", dim, tensors[0].dim() + 1);
  std::vector<Tensor> parts;
  parts.reserve(tensors.size());
  for (const Tensor& t : tensors) parts.push_back(t.unsqueeze(d));
  return kiln::cat(parts, d);
}

// self: (..., n, k) or (k), other: (..., k, m) or (k) -> broadcast(...) + (n) + (m); see
// meta::matmul. Operands that are plain matrices go to mm without copies (mm passes transposed
// layouts to the GEMM as they are); batched operands are expanded to a common batch, folded to
// (B, n, k) and (B, k, m), and go to bmm.
Tensor matmul(const Tensor& self, const Tensor& other) {
  TensorSpec spec = meta::matmul(self, other);
  int64_t d1 = self.dim(), d2 = other.dim();
  if (d1 == 1 && d2 == 1) return self.unsqueeze(0).mm(other.unsqueeze(1)).reshape({});
  if (d1 == 2 && d2 == 1) return self.mm(other.unsqueeze(1)).squeeze({1});
  if (d1 == 1 && d2 == 2) return self.unsqueeze(0).mm(other).squeeze({0});
  if (d1 == 2 && d2 == 2) return self.mm(other);
  int64_t k = self.size(-1);
  if (d1 >= 3 && d2 <= 2) {
    // Fold self's batch dims into its rows: one mm instead of a bmm over a broadcast other.
    Tensor rhs = d2 == 1 ? other.unsqueeze(1) : other;
    int64_t rows = numel_of(IntArrayRef(self.sizes().data(), d1 - 1));
    return self.reshape({rows, k}).mm(rhs).reshape(spec.sizes);
  }
  Tensor a = d1 == 1 ? self.unsqueeze(0) : self;
  Tensor b = d2 == 1 ? other.unsqueeze(1) : other;
  int64_t n = a.size(-2), m = b.size(-1);
  IntArrayRef ba(a.sizes().data(), a.dim() - 2), bb(b.sizes().data(), b.dim() - 2);
  DimVector batch = meta::broadcast_shapes("matmul", ba, bb);
  int64_t nb = numel_of(batch);
  DimVector ea(batch), eb(batch);
  ea.push_back(n);
  ea.push_back(k);
  eb.push_back(k);
  eb.push_back(m);
  Tensor a3 = a.expand(ea).reshape({nb, n, k});
  Tensor b3 = b.expand(eb).reshape({nb, k, m});
  return a3.bmm(b3).reshape(spec.sizes);
}

// input: (..., in), weight: (out, in), bias: broadcastable to (..., out) -> (..., out).
// weight.t() is a transposed view: mm/addmm hand it to the GEMM as a transposed operand.
Tensor linear(const Tensor& input, const Tensor& weight, const std::optional<Tensor>& bias) {
  TensorSpec spec = meta::linear(input, weight, bias);
  bool has_bias = bias && bias->defined();
  if (input.dim() == 1) {
    Tensor r = kiln::matmul(input, weight.t());
    return has_bias ? r.add(*bias) : r;
  }
  int64_t rows = numel_of(IntArrayRef(input.sizes().data(), input.dim() - 1));
  Tensor x = input.reshape({rows, input.size(-1)});
  Tensor r;
  if (has_bias && bias->dim() <= 1) {
    r = kiln::addmm(*bias, x, weight.t());
  } else {
    r = x.mm(weight.t());
    if (has_bias) return r.reshape(spec.sizes).add(*bias);
  }
  return r.reshape(spec.sizes);
}

}  // namespace kiln::composite
