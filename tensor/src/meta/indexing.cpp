// Meta functions of the indexing ops (tensor/ops/indexing.toml). They check dtypes and shapes;
// index values are data, so the kernels check those (IndexError naming the value and the size).
#include <algorithm>

#include "kiln/generated/meta_decls.h"
#include "kiln/meta.h"

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

TensorSpec gather(const Tensor& self, int64_t dim, const Tensor& index) {
  KILN_CHECK(index.dtype() == kInt64, Type, "gather: expected index to have dtype int64, got ",
             index.dtype());
  int64_t d = wrap_dim("gather", dim, self.dim());
  Device device = common_device("gather", self, index);
  if (index.numel() != 0) {
    KILN_CHECK(dim1(index) == dim1(self), Value,
               "gather: index must have the same number of dimensions as self, got index of shape ",
               index.sizes(), " and self of shape ", self.sizes());
    for (int64_t k = 0; k < dim1(self); ++k)
      KILN_CHECK(k == d || size1(index, k) <= size1(self, k), Value, "gather: index of shape ",
                 index.sizes(), " is larger than self of shape ", self.sizes(), " at dimension ", k,
                 " (only dimension ", d, " may be larger)");
  }
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
