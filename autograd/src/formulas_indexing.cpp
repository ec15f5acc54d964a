// Formula helpers for tensor lists (cat, stack, split) and indexing (index_select, gather,
// scatter, advanced indexing): kiln/autograd/formulas.h. Repeated indices accumulate (scatter_add).
#include <algorithm>

#include "kiln/autograd/formulas.h"
#include "kiln/error.h"
#include "kiln/meta.h"

namespace kiln::autograd {

namespace {

// cat skips 1-D tensors of size 0
// (See Note [Legacy empty cat inputs] in tensor/src/meta/shape.cpp).
bool skipped_in_cat(const Tensor& t) { return t.dim() == 1 && t.size(0) == 0; }

}  // namespace

// grad: cat's output -> one slice per input along dim
std::vector<Tensor> cat_backward(const Tensor& grad, TensorList tensors, int64_t dim) {
  std::vector<Tensor> grads;
  grads.reserve(tensors.size());
  const Tensor* ref = nullptr;
  for (const Tensor& t : tensors)
    if (!skipped_in_cat(t)) {
      ref = &t;
      break;
    }
  const int64_t d = ref ? meta::wrap_dim("cat_backward", dim, ref->dim()) : 0;
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    if (ref == nullptr || skipped_in_cat(t)) {
      grads.push_back(zeros(t.sizes(), grad.dtype(), grad.device()));
      continue;
    }
    const int64_t len = t.size(d);
    grads.push_back(grad.narrow(d, offset, len));
    offset += len;
  }
  return grads;
}

std::vector<Tensor> stack_backward(const Tensor& grad, TensorList tensors, int64_t dim) {
  KILN_CHECK(!tensors.empty(), Value, "stack_backward: expected a non-empty list of tensors");
  const int64_t d = meta::wrap_dim("stack_backward", dim, tensors[0].dim() + 1);
  std::vector<Tensor> grads;
  grads.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) grads.push_back(grad.select(d, static_cast<int64_t>(i)));
  return grads;
}

// The output gradients of pieces of `lengths` along d (undefined ones as zeros), concatenated.
static Tensor cat_piece_grads(const char* op, TensorList grads, IntArrayRef sizes,
                              const std::vector<int64_t>& lengths, int64_t d) {
  const Tensor* like = nullptr;
  for (const Tensor& g : grads)
    if (g.defined()) {
      like = &g;
      break;
    }
  KILN_CHECK(like != nullptr, Value, op, ": every output gradient is undefined");
  std::vector<Tensor> parts;
  parts.reserve(grads.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    if (grads[i].defined()) {
      parts.push_back(grads[i]);
      continue;
    }
    std::vector<int64_t> shape = sizes.vec();
    shape[d] = lengths[i];
    parts.push_back(zeros(shape, like->dtype(), like->device()));
  }
  return cat(parts, d);
}

Tensor split_backward(TensorList grads, IntArrayRef sizes, int64_t split_size, int64_t dim) {
  const int64_t d = meta::wrap_dim("split_backward", dim, static_cast<int64_t>(sizes.size()));
  std::vector<int64_t> lengths;
  for (size_t i = 0; i < grads.size(); ++i)
    lengths.push_back(std::min(split_size, sizes[d] - static_cast<int64_t>(i) * split_size));
  return cat_piece_grads("split_backward", grads, sizes, lengths, d);
}

Tensor split_with_sizes_backward(TensorList grads, IntArrayRef sizes, IntArrayRef split_sizes,
                                 int64_t dim) {
  const int64_t d =
      meta::wrap_dim("split_with_sizes_backward", dim, static_cast<int64_t>(sizes.size()));
  return cat_piece_grads("split_with_sizes_backward", grads, sizes, split_sizes.vec(), d);
}

Tensor chunk_backward(TensorList grads, IntArrayRef sizes, int64_t chunks, int64_t dim) {
  const int64_t d = meta::wrap_dim("chunk_backward", dim, static_cast<int64_t>(sizes.size()));
  return split_backward(grads, sizes, (sizes[d] + chunks - 1) / chunks, d);
}

// self: sizes; index: (n,); grad: sizes with sizes[dim] replaced by n
Tensor index_select_backward(const Tensor& grad, IntArrayRef sizes, int64_t dim,
                             const Tensor& index) {
  Tensor out = zeros(sizes, grad.dtype(), grad.device());
  if (sizes.empty()) return out.scatter_add(0, index.reshape({1}), grad.reshape({1})).reshape(sizes);
  const int64_t d = meta::wrap_dim("index_select_backward", dim, static_cast<int64_t>(sizes.size()));
  std::vector<int64_t> view(sizes.size(), 1);
  view[d] = index.numel();
  Tensor idx = index.reshape(view).expand(grad.sizes()).contiguous();
  return out.scatter_add(d, idx, grad);
}

Tensor gather_backward(const Tensor& grad, const Tensor& self, int64_t dim, const Tensor& index) {
  return zeros(self.sizes(), grad.dtype(), grad.device()).scatter_add(dim, index, grad);
}

Tensor scatter_backward(const Tensor& grad, int64_t dim, const Tensor& index) {
  return grad.scatter(dim, index, zeros(index.sizes(), grad.dtype(), grad.device()));
}

Tensor scatter_add_backward(const Tensor& grad, int64_t dim, const Tensor& index) {
  return grad.gather(dim, index);
}

// index: (i0, i1, ...) <= src_sizes in every dim; the gathered gradient fills the leading corner.
Tensor scatter_add_backward(const Tensor& grad, int64_t dim, const Tensor& index,
                            IntArrayRef src_sizes) {
  Tensor g = grad.gather(dim, index);
  if (g.sizes() == src_sizes) return g;
  Tensor pos = arange(0, numel_of(src_sizes), 1, kInt64, grad.device()).reshape(src_sizes);
  for (int64_t d = 0; d < index.dim(); ++d) pos = pos.narrow(d, 0, index.size(d));
  Tensor flat = zeros({numel_of(src_sizes)}, grad.dtype(), grad.device());
  return flat.scatter_add(0, pos.reshape({-1}), g.reshape({-1})).reshape(src_sizes);
}

// indices[j] index dim j of self (j < k); they broadcast to shape B, and grad has shape
// B + sizes[k:]. The k indexed dims are flattened to one of size P = prod(sizes[:k]) and grad is
// scatter-added along it at the linear index sum_j indices[j] * stride_j.
Tensor index_backward(const Tensor& grad, IntArrayRef sizes, TensorList indices) {
  const size_t k = indices.size();
  KILN_CHECK(k >= 1 && k <= sizes.size(), Value, "index_backward: ", k,
             " index tensors for a tensor of shape ", sizes);
  Tensor linear;
  int64_t stride = 1;
  for (size_t j = k; j-- > 0;) {
    const Tensor& idx = indices[j];
    Tensor wrapped = where(idx < 0, idx + sizes[j], idx);
    Tensor term = stride == 1 ? wrapped : wrapped * stride;
    linear = linear.defined() ? term + linear : term;
    stride *= sizes[j];
  }
  const int64_t nb = linear.numel();
  std::vector<int64_t> rest(sizes.begin() + k, sizes.end());
  std::vector<int64_t> flat_shape{stride}, grad_shape{nb}, idx_view{nb};
  for (int64_t s : rest) {
    flat_shape.push_back(s);
    grad_shape.push_back(s);
    idx_view.push_back(1);
  }
  Tensor idx = linear.reshape(idx_view).expand(grad_shape).contiguous();
  Tensor flat = zeros(flat_shape, grad.dtype(), grad.device());
  return flat.scatter_add(0, idx, grad.reshape(grad_shape)).reshape(sizes);
}

}  // namespace kiln::autograd
