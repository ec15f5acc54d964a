// Meta functions of the indexing ops (tensor/ops/indexing.toml). They check dtypes and shapes;
// index values are data, so the kernels check those (IndexError naming the value and the size).
#include <algorithm>

#include "kiln/generated/meta/creation.h"
#include "kiln/generated/meta/indexing.h"
#include "kiln/generated/meta/shape.h"
#include "kiln/meta.h"
#include "op_support.h"

namespace kiln::meta {

// gather/scatter treat a 0-d tensor as 1-d of size 1 (PyTorch's ensure_nonempty_dim).
static int64_t dim1(const Tensor& t) { return std::max<int64_t>(t.dim(), 1); }
static int64_t size1(const Tensor& t, int64_t d) { return t.dim() == 0 ? 1 : t.size(d); }

TensorSpec index_select(const Tensor& self, int64_t dim, const Tensor& index) {
  KILN_CHECK(index.dtype() == kInt64 || index.dtype() == kInt32, Type,
             "index_select: expected index to have dtype int64 or int32, got ", index.dtype());
  KILN_CHECK(index.dim() <= 1, Value,
             "index_select: index must be a vector or a scalar, got shape ", index.sizes());
  int64_t d = wrap_dim("index_select", dim, self.dim());
  Device device = common_device("index_select", self, index);
  if (self.dim() == 0) {
    KILN_CHECK(index.numel() == 1, Index, "index_select: a 0-d self takes exactly one index, got ",
               index.numel());
    return contiguous_spec({}, self.dtype(), device);
  }
  DimVector sizes(self.sizes());
  sizes[d] = index.numel();
  return contiguous_spec(sizes, self.dtype(), device);
}

// gather and scatter.value: an int64 index of self's rank, no larger than self except along d.
static void check_index_fits(const char* op, const Tensor& self, const Tensor& index, int64_t d) {
  KILN_CHECK(index.dtype() == kInt64, Type, op, ": expected index to have dtype int64, got ",
             index.dtype());
  if (index.numel() == 0) return;
  KILN_CHECK(dim1(index) == dim1(self), Value, op,
             ": index must have the same number of dimensions as self, got index of shape ",
             index.sizes(), " and self of shape ", self.sizes());
  for (int64_t k = 0; k < dim1(self); ++k)
    KILN_CHECK(k == d || size1(index, k) <= size1(self, k), Value, op, ": index of shape ",
               index.sizes(), " is larger than self of shape ", self.sizes(), " at dimension ", k,
               " (only dimension ", d, " may be larger)");
}

TensorSpec gather(const Tensor& self, int64_t dim, const Tensor& index) {
  int64_t d = wrap_dim("gather", dim, self.dim());
  Device device = common_device("gather", self, index);
  check_index_fits("gather", self, index, d);
  return contiguous_spec(index.sizes(), self.dtype(), device);
}

TensorSpec scatter(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  KILN_CHECK(index.dtype() == kInt64, Type, "scatter: expected index to have dtype int64, got ",
             index.dtype());
  KILN_CHECK(self.dtype() == src.dtype(), Type,
             "scatter: expected self and src to have the same dtype, got ", self.dtype(), " and ",
             src.dtype());
  int64_t d = wrap_dim("scatter", dim, self.dim());
  Device device = common_device("scatter", self, index, src);
  if (index.numel() != 0) {
    KILN_CHECK(
        dim1(index) == dim1(self) && dim1(src) == dim1(self), Value,
        "scatter: index, self and src must have the same number of dimensions, got index of shape ",
        index.sizes(), ", self of shape ", self.sizes(), " and src of shape ", src.sizes());
    for (int64_t k = 0; k < dim1(self); ++k) {
      KILN_CHECK(size1(index, k) <= size1(src, k), Value, "scatter: index of shape ", index.sizes(),
                 " is larger than src of shape ", src.sizes(), " at dimension ", k);
      KILN_CHECK(k == d || size1(index, k) <= size1(self, k), Value, "scatter: index of shape ",
                 index.sizes(), " is larger than self of shape ", self.sizes(), " at dimension ", k,
                 " (only dimension ", d, " may be larger)");
    }
  }
  return contiguous_spec(self.sizes(), self.dtype(), device);
}

// scatter.value: scatter of a source of index's shape that holds `value` (cast to self's dtype).
TensorSpec scatter_value(const Tensor& self, int64_t dim, const Tensor& index, const Scalar&) {
  int64_t d = wrap_dim("scatter", dim, self.dim());
  Device device = common_device("scatter", self, index);
  check_index_fits("scatter", self, index, d);
  return contiguous_spec(self.sizes(), self.dtype(), device);
}

TensorSpec scatter_value_(const Tensor& self, int64_t dim, const Tensor& index,
                          const Scalar& value) {
  return detail::inplace_spec("scatter_", self, scatter_value(self, dim, index, value));
}

TensorSpec masked_fill(const Tensor& self, const Tensor& mask, const Scalar&) {
  KILN_CHECK(mask.dtype() == kBool, Type, "masked_fill: expected a mask of dtype bool, got ",
             mask.dtype());
  Device device = common_device("masked_fill", self, mask);
  return contiguous_spec(broadcast_shapes("masked_fill", self.sizes(), mask.sizes()), self.dtype(),
                         device);
}

TensorSpec one_hot(const Tensor& self, int64_t num_classes) {
  KILN_CHECK(self.dtype() == kInt64, Type, "one_hot: expected an index tensor of dtype int64, got ",
             self.dtype());
  KILN_CHECK(num_classes >= -1, Value, "one_hot: num_classes must be -1 or non-negative, got ",
             num_classes);
  // The CPU kernel resolves -1 from the data before calling here; without data it can't be done.
  KILN_CHECK(
      num_classes != -1, NotImplemented,
      "one_hot: num_classes=-1 infers the number of classes from the values of self, which a ",
      self.device(), " tensor of shape ", self.sizes(),
      " does not provide here (the output size depends on data); pass num_classes explicitly");
  DimVector sizes(self.sizes());
  sizes.push_back(num_classes);
  return contiguous_spec(sizes, kInt64, self.device());
}

}  // namespace kiln::meta

namespace kiln::meta {

// Note [Data-dependent shapes]: nonzero, masked_select, repeat_interleave with a repeats tensor
// and index with a bool mask have an output shape that depends on the input's values. A backend
// with data (CPU, CUDA) computes it in its kernel; without data (Meta) these meta functions raise
// NotImplemented, naming the op (tests recognise the phrase "data-dependent output shape").
[[noreturn]] static void data_dependent(const char* op, const Tensor& t) {
  KILN_FAIL(NotImplemented, op, ": the output shape depends on the values of a ", t.device(),
            " tensor of shape ", t.sizes(),
            " (a data-dependent output shape), which are not available here");
}

// Note [Advanced indexing]: index(self, indices) indexes the leading dims of self, one per
// integer index tensor (int64 or int32; negative values wrap as in Python) and m per bool mask
// of m dims (whose shape must equal those dims; it stands for the positions of its true
// elements, as nonzero gives them). The integer indices and the masks' position lists broadcast
// together to a shape B; the result is B + self.sizes()[consumed dims:]. index_put writes values
// (broadcast to that shape) at the same positions. PyTorch's None and slices between index
// tensors are not part of this schema: permute or narrow first.
struct IndexInfo {
  int64_t consumed = 0;  // dims of self the indices cover
  bool has_mask = false;
  DimVector batch;       // B (when there is no mask)
};

static IndexInfo analyze_indices(const char* op, const Tensor& self, TensorList indices) {
  KILN_CHECK(!indices.empty(), Value, op, ": expected at least one index tensor");
  IndexInfo info;
  for (size_t i = 0; i < indices.size(); ++i) {
    const Tensor& idx = indices[i].check_defined(op);
    const ScalarType dt = idx.dtype();
    KILN_CHECK(dt == kInt64 || dt == kInt32 || dt == kBool, Type, op,
               ": tensors used as indices must be int64, int32 or bool tensors, got ", dt,
               " at position ", i);
    if (dt == kBool) {
      KILN_CHECK(idx.dim() > 0, Index, op,
                 ": a 0-dim bool index is not supported (at position ", i, ")");
      KILN_CHECK(info.consumed + idx.dim() <= self.dim(), Index, op, ": too many indices for a ",
                 "tensor of shape ", self.sizes(), " (the bool mask at position ", i, " of shape ",
                 idx.sizes(), " starts at dimension ", info.consumed, ")");
      for (int64_t k = 0; k < idx.dim(); ++k)
        KILN_CHECK(idx.size(k) == self.size(info.consumed + k), Index, op, ": the shape of the mask ",
                   idx.sizes(), " at position ", i, " does not match the shape of the indexed tensor ",
                   self.sizes(), " at dimension ", info.consumed + k);
      info.consumed += idx.dim();
      info.has_mask = true;
      continue;
    }
    KILN_CHECK(info.consumed < self.dim(), Index, op, ": too many indices for a tensor of shape ",
               self.sizes(), " (", indices.size(), " index tensors)");
    info.consumed += 1;
    info.batch = i == 0 ? DimVector(idx.sizes()) : broadcast_shapes(op, info.batch, idx.sizes());
  }
  return info;
}

// Whether a tensor of shape `from` broadcasts to `to` (without changing `to`).
static bool broadcasts_to(IntArrayRef from, IntArrayRef to) {
  if (from.size() > to.size()) return false;
  for (size_t k = 1; k <= from.size(); ++k)
    if (from[from.size() - k] != 1 && from[from.size() - k] != to[to.size() - k]) return false;
  return true;
}

// B + self.sizes()[consumed:]
static DimVector indexed_shape(const Tensor& self, const IndexInfo& info) {
  DimVector sizes = info.batch;
  for (int64_t k = info.consumed; k < self.dim(); ++k) sizes.push_back(self.size(k));
  return sizes;
}

TensorSpec index(const Tensor& self, TensorList indices) {
  IndexInfo info = analyze_indices("index", self, indices);
  std::vector<const Tensor*> all{&self};
  for (const Tensor& t : indices) all.push_back(&t);
  Device device = common_device("index", all.data(), all.size());
  if (info.has_mask) data_dependent("index (with a bool mask)", self);
  return contiguous_spec(indexed_shape(self, info), self.dtype(), device);
}

TensorSpec index_put(const Tensor& self, TensorList indices, const Tensor& values, bool) {
  KILN_CHECK(self.dtype() == values.dtype(), Type,
             "index_put: expected values to have the dtype of self, got ", values.dtype(), " and ",
             self.dtype());
  IndexInfo info = analyze_indices("index_put", self, indices);
  std::vector<const Tensor*> all{&self, &values};
  for (const Tensor& t : indices) all.push_back(&t);
  Device device = common_device("index_put", all.data(), all.size());
  if (info.has_mask) {  // only the trailing (non-indexed) dims can be checked without data
    const int64_t rest = self.dim() - info.consumed;
    for (int64_t k = 1; k <= std::min(rest, values.dim()); ++k)
      KILN_CHECK(values.size(-k) == 1 || values.size(-k) == self.size(-k), Value,
                 "index_put: shape mismatch: values of shape ", values.sizes(),
                 " cannot be broadcast to the indexed part of self of shape ", self.sizes());
  } else {
    DimVector target = indexed_shape(self, info);
    KILN_CHECK(broadcasts_to(values.sizes(), target), Value, "index_put: shape mismatch: values of shape ", values.sizes(),
               " cannot be broadcast to the indexing result of shape ", target);
  }
  return contiguous_spec(self.sizes(), self.dtype(), device);
}

TensorSpec masked_select(const Tensor& self, const Tensor& mask) {
  KILN_CHECK(mask.dtype() == kBool, Type, "masked_select: expected a mask of dtype bool, got ",
             mask.dtype());
  common_device("masked_select", self, mask);
  broadcast_shapes("masked_select", self.sizes(), mask.sizes());
  data_dependent("masked_select", mask);
}

TensorSpec nonzero(const Tensor& self) { data_dependent("nonzero", self); }

}  // namespace kiln::meta

namespace kiln::meta {

// ---- repeat_interleave (shape.toml; here for data_dependent)

TensorSpec repeat_interleave_indices(const Tensor& repeats) {
  KILN_CHECK(repeats.dtype() == kInt64, Type,
             "repeat_interleave: expected repeats to have dtype int64, got ", repeats.dtype());
  KILN_CHECK(repeats.dim() <= 1, Value, "repeat_interleave: repeats must be 0-dim or 1-dim, got shape ",
             repeats.sizes());
  data_dependent("repeat_interleave", repeats);
}

TensorSpec repeat_interleave_tensor(const Tensor& self, const Tensor& repeats,
                                    std::optional<int64_t> dim) {
  KILN_CHECK(repeats.dtype() == kInt64, Type,
             "repeat_interleave: expected repeats to have dtype int64, got ", repeats.dtype());
  KILN_CHECK(repeats.dim() <= 1, Value, "repeat_interleave: repeats must be 0-dim or 1-dim, got shape ",
             repeats.sizes());
  const int64_t n = dim ? (self.dim() == 0 ? 1 : self.size(wrap_dim("repeat_interleave", *dim, self.dim())))
                        : self.numel();
  KILN_CHECK(repeats.numel() == 1 || repeats.numel() == n, Value,
             "repeat_interleave: repeats must have one element or as many as the repeated dimension (",
             n, "), got shape ", repeats.sizes(), " for self of shape ", self.sizes());
  common_device("repeat_interleave", self, repeats);
  data_dependent("repeat_interleave", repeats);
}

TensorSpec repeat_interleave_int(const Tensor& self, int64_t repeats, std::optional<int64_t> dim) {
  KILN_CHECK(repeats >= 0, Value, "repeat_interleave: repeats must be non-negative, got ", repeats);
  if (!dim) return contiguous_spec({self.numel() * repeats}, self.dtype(), self.device());
  const int64_t d = wrap_dim("repeat_interleave", *dim, self.dim());
  DimVector sizes = self.dim() == 0 ? DimVector{1} : DimVector(self.sizes());
  sizes[d] *= repeats;
  return contiguous_spec(sizes, self.dtype(), self.device());
}

}  // namespace kiln::meta
