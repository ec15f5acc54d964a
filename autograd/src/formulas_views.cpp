// Formula helpers for views (kiln/autograd/formulas.h): the gradient of a view is the input-shaped
// zeros with grad placed where the view took its elements.
//
// Note [Placing a view's gradient]: select and slice with step 1 concatenate zero blocks around
// grad. The others take the view of an int64 tensor of storage positions
// (arange(numel).reshape(sizes)) with the same arguments as the forward view, then scatter_add grad into a flat zero tensor at those positions. scatter_add's gradient with respect
// to its source is gather, so double backward works without in-place writes into views, and
// overlapping views (as_strided with a stride of 0) add up as they must.
#include <algorithm>

#include "kiln/autograd/formulas.h"
#include "kiln/error.h"
#include "kiln/meta.h"

namespace kiln::autograd {

namespace {

// int64 positions 0..numel-1 laid out with shape `sizes`.
Tensor positions(IntArrayRef sizes, Device device) {
  return arange(0, numel_of(sizes), 1, kInt64, device).reshape(sizes);
}

// zeros of `sizes` in grad's dtype; grad added at the flat positions `pos` (grad's shape).
Tensor place(const Tensor& grad, IntArrayRef sizes, const Tensor& pos) {
  Tensor flat = zeros({numel_of(sizes)}, grad.dtype(), grad.device());
  return flat.scatter_add(0, pos.reshape({-1}), grad.reshape({-1})).reshape(sizes);
}

// zeros of `sizes` with `part` (sizes but part.size(d) along d) at offset `start` along d: a cat
// with zero blocks (cheaper than a scatter; cat's gradient is narrow).
Tensor pad_along(const Tensor& part, IntArrayRef sizes, int64_t d, int64_t start) {
  const int64_t after = sizes[d] - start - part.size(d);
  if (start == 0 && after == 0) return part;
  std::vector<Tensor> pieces;
  std::vector<int64_t> shape = sizes.vec();
  if (start > 0) {
    shape[d] = start;
    pieces.push_back(zeros(shape, part.dtype(), part.device()));
  }
  pieces.push_back(part);
  if (after > 0) {
    shape[d] = after;
    pieces.push_back(zeros(shape, part.dtype(), part.device()));
  }
  return cat(pieces, d);
}

// One past the last storage element a (sizes, strides, offset) geometry touches (0 when empty).
int64_t extent(IntArrayRef sizes, IntArrayRef strides, int64_t offset) {
  int64_t end = offset + 1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) return 0;
    end += (sizes[i] - 1) * strides[i];
  }
  return end;
}

}  // namespace

Tensor view_backward(const Tensor& grad, IntArrayRef sizes) { return grad.reshape(sizes); }

Tensor permute_backward(const Tensor& grad, IntArrayRef dims) {
  const int64_t n = static_cast<int64_t>(dims.size());
  std::vector<int64_t> inverse(dims.size());
  for (int64_t i = 0; i < n; ++i) inverse[meta::wrap_dim("permute_backward", dims[i], n)] = i;
  return grad.permute(inverse);
}

Tensor select_backward(const Tensor& grad, IntArrayRef sizes, int64_t dim, int64_t index) {
  const int64_t d = meta::wrap_dim("select_backward", dim, static_cast<int64_t>(sizes.size()));
  const int64_t n = sizes[d];
  KILN_CHECK(index >= -n && index < n, Index, "select_backward: index ", index,
             " out of range for dimension of size ", n);
  return pad_along(grad.unsqueeze(d), sizes, d, index < 0 ? index + n : index);
}

Tensor slice_backward(const Tensor& grad, IntArrayRef sizes, int64_t dim,
                      std::optional<int64_t> start, std::optional<int64_t> end, int64_t step) {
  if (step != 1) return place(grad, sizes, positions(sizes, grad.device()).slice(dim, start, end, step));
  // The start that slice's meta function computes (tensor/src/meta/views.cpp).
  const int64_t d = meta::wrap_dim("slice_backward", dim, static_cast<int64_t>(sizes.size()));
  int64_t s = start.value_or(0);
  if (s < 0) s += sizes[d];
  s = std::clamp<int64_t>(s, 0, sizes[d]);
  return pad_along(grad, sizes, d, s);
}

Tensor diagonal_backward(const Tensor& grad, IntArrayRef sizes, int64_t offset, int64_t dim1,
                         int64_t dim2) {
  return place(grad, sizes, positions(sizes, grad.device()).diagonal(offset, dim1, dim2));
}

// self's elements and the output's elements are both positions in one storage. grad is summed
// into that storage; each input element reads back its position, divided by the number of input
// elements that share it (an input that overlaps itself, such as an expanded tensor).
Tensor as_strided_backward(const Tensor& grad, const Tensor& self, IntArrayRef size,
                           IntArrayRef stride, std::optional<int64_t> storage_offset) {
  return as_strided_backward_geometry(grad, self.sizes(), self.strides(), self.storage_offset(),
                                      size, stride, storage_offset.value_or(self.storage_offset()));
}

Tensor as_strided_backward_geometry(const Tensor& grad, IntArrayRef in_sizes,
                                    IntArrayRef in_strides, int64_t in_offset, IntArrayRef size,
                                    IntArrayRef stride, int64_t out_offset) {
  const int64_t n = std::max(extent(in_sizes, in_strides, in_offset),
                             extent(size, stride, out_offset));
  Tensor base = arange(0, n, 1, kInt64, grad.device());
  Tensor out_pos = base.as_strided(size, stride, out_offset).reshape({-1});
  Tensor in_pos = base.as_strided(in_sizes, in_strides, in_offset).reshape({-1});
  Tensor storage = zeros({n}, grad.dtype(), grad.device()).scatter_add(0, out_pos, grad.reshape({-1}));
  Tensor ones_in = ones({numel_of(in_sizes)}, grad.dtype(), grad.device());
  Tensor count = zeros({n}, grad.dtype(), grad.device()).scatter_add(0, in_pos, ones_in);
  storage = storage / where(count == 0, ones_like(count), count);
  return storage.gather(0, in_pos).reshape(in_sizes);
}

Tensor tril_backward(const Tensor& grad, int64_t diagonal) { return grad.tril(diagonal); }

Tensor triu_backward(const Tensor& grad, int64_t diagonal) { return grad.triu(diagonal); }

}  // namespace kiln::autograd
