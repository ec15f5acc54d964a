// kiln/autograd/formulas_index.h: the formula helpers of the advanced-indexing, sort/scan and
// padding rows (indexing.toml, sort.toml, shape.toml), included by formulas.h. Like every helper
// there, each is written with kiln ops only, so double backward runs through it.
//
//   // index: d[self] = "advanced_index_backward(grad, self.sizes(), indices)"
//   Tensor g = advanced_index_backward(grad, x.sizes(), std::vector<Tensor>{i0, mask});
//   // cumsum: d[self] = "cumsum_backward(grad, dim, self)"
//   Tensor gc = cumsum_backward(grad, 1, x);
#pragma once

#include <vector>

#include "kiln/autograd/grad_mode.h"
#include "kiln/kiln.h"
#include "kiln/meta.h"

namespace kiln::autograd {

// From formulas.h (which includes this header at its end).
Tensor sum_to(const Tensor& grad, IntArrayRef sizes);
Tensor cast_back(const Tensor& grad, const Tensor& like);

// index(self, indices): grad accumulated into zeros of `sizes` at the indexed positions (index
// tensors or bool masks; repeated positions add up).
inline Tensor advanced_index_backward(const Tensor& grad, IntArrayRef sizes, TensorList indices) {
  return zeros(sizes, grad.dtype(), grad.device()).index_put(indices, grad, /*accumulate=*/true);
}

// index_put(self, indices, values, accumulate): the gradient for self (the overwritten positions
// get none unless accumulating).
inline Tensor index_put_self_backward(const Tensor& grad, TensorList indices, bool accumulate) {
  if (accumulate) return grad;
  return grad.index_put(indices, zeros({}, grad.dtype(), grad.device()), false);
}

// masked_select(self, mask): grad (one value per true element of the broadcast mask) put back at
// the mask's positions, summed to self's shape.
inline Tensor masked_select_backward(const Tensor& grad, IntArrayRef sizes, const Tensor& mask) {
  DimVector shape = meta::broadcast_shapes("masked_select_backward", sizes, mask.sizes());
  Tensor full = zeros(shape, grad.dtype(), grad.device());
  Tensor m = mask.expand(shape);
  return sum_to(full.index_put(std::vector<Tensor>{m}, grad, true), sizes);
}

// cumsum(self, dim): the reversed cumulative sum of grad, in self's dtype.
inline Tensor cumsum_backward(const Tensor& grad, int64_t dim, const Tensor& self) {
  if (grad.dim() == 0) return cast_back(grad, self);
  std::vector<int64_t> d{dim};
  return cast_back(grad.flip(d).cumsum(dim).flip(d), self);
}

// cumprod(self, dim) = result: d result_k / d x_i = prod_{j <= k, j != i} x_j (k >= i).
// Without create_graph, O(n): before the first zero of a row that is result_k / x_i; at the
// first zero it is the cumulative product with that zero replaced by 1; after it, 0. With
// create_graph (the backward is differentiated again, and the gradient after a zero, though 0,
// depends on that zero), O(n^2) over the products themselves, as PyTorch does.
inline Tensor cumprod_backward(const Tensor& grad, const Tensor& self, int64_t dim,
                               const Tensor& result) {
  if (self.dim() == 0 || self.numel() == 0) return cast_back(grad, self);
  const int64_t d = meta::wrap_dim("cumprod_backward", dim, self.dim()), n = self.size(d);
  std::vector<int64_t> dv{d};
  auto rev_cumsum = [&](const Tensor& t) { return t.flip(dv).cumsum(d).flip(dv); };
  Tensor x = self.to(grad.dtype());
  if (GradMode::is_enabled()) {
    DimVector one_shape(x.sizes());
    one_shape[d] = 1;
    Tensor ones_1 = ones(one_shape, grad.dtype(), grad.device());
    std::vector<Tensor> parts;
    for (int64_t i = 0; i < n; ++i) {
      Tensor before = i == 0 ? ones_1 : x.narrow(d, 0, i).prod(dv, true);
      Tensor after = ones_1;
      if (i + 1 < n) after = cat({ones_1, x.narrow(d, i + 1, n - i - 1).cumprod(d)}, d);
      parts.push_back((grad.narrow(d, i, n - i) * after).sum(dv, true) * before);
    }
    return cast_back(cat(parts, d), self);
  }
  Tensor is_zero = x == 0;
  Tensor zeros_so_far = is_zero.cumsum(d);
  Tensor before = zeros_so_far == 0;
  Tensor first_zero = is_zero.logical_and(zeros_so_far == 1);
  Tensor one = ones({}, grad.dtype(), grad.device()), zero = zeros({}, grad.dtype(), grad.device());
  Tensor g_before = rev_cumsum(grad * result.to(grad.dtype())) / where(before, x, one);
  Tensor g_first = rev_cumsum(grad * where(first_zero, one, x).cumprod(d));
  return cast_back(where(before, g_before, where(first_zero, g_first, zero)), self);
}

// roll(self, shifts, dims): grad rolled back.
inline Tensor roll_backward(const Tensor& grad, IntArrayRef shifts, IntArrayRef dims) {
  std::vector<int64_t> back;
  for (int64_t s : shifts) back.push_back(-s);
  return grad.roll(back, dims);
}

// repeat(self, repeats): grad viewed as (r_0, s_0, r_1, s_1, ...) (self's shape padded with
// leading 1s to len(repeats)) and summed over the r_k.
inline Tensor repeat_backward(const Tensor& grad, IntArrayRef repeats, IntArrayRef sizes) {
  const size_t lead = repeats.size() - sizes.size();
  std::vector<int64_t> split, summed;
  for (size_t k = 0; k < repeats.size(); ++k) {
    const int64_t s = k < lead ? 1 : sizes[k - lead];
    summed.push_back(static_cast<int64_t>(split.size()));
    split.push_back(repeats[k]);
    split.push_back(s);
  }
  return grad.reshape(split).sum(summed).reshape(sizes);
}

// constant_pad_nd(self, pad, value): grad with the padding cut off (and the cropped parts of a
// negative pad zero-filled): constant_pad_nd with every pad negated.
inline Tensor constant_pad_backward(const Tensor& grad, IntArrayRef pad) {
  std::vector<int64_t> back;
  for (int64_t p : pad) back.push_back(-p);
  return constant_pad_nd(grad, back, 0);
}

}  // namespace kiln::autograd
