// Meta functions of the sort and scan ops (tensor/ops/sort.toml): sort, argsort, topk, cumsum,
// cumprod. A 0-dim self acts as a 1-element vector along dim 0 or -1, as in PyTorch.
#include "kiln/generated/meta/sort.h"
#include "kiln/meta.h"

namespace kiln::meta {

std::vector<TensorSpec> sort(const Tensor& self, int64_t dim, bool, bool) {
  wrap_dim("sort", dim, self.dim());
  return {contiguous_spec(self.sizes(), self.dtype(), self.device()),
          contiguous_spec(self.sizes(), kInt64, self.device())};
}

TensorSpec argsort(const Tensor& self, int64_t dim, bool, bool) {
  wrap_dim("argsort", dim, self.dim());
  return contiguous_spec(self.sizes(), kInt64, self.device());
}

std::vector<TensorSpec> topk(const Tensor& self, int64_t k, int64_t dim, bool, bool) {
  const int64_t d = wrap_dim("topk", dim, self.dim());
  const int64_t n = self.dim() == 0 ? 1 : self.size(d);
  KILN_CHECK(k >= 0 && k <= n, Index, "topk: k (", k, ") is out of range for dimension ", d,
             " of size ", n, " of self of shape ", self.sizes());
  DimVector sizes(self.sizes());
  if (self.dim() > 0) sizes[d] = k;
  return {contiguous_spec(sizes, self.dtype(), self.device()),
          contiguous_spec(sizes, kInt64, self.device())};
}

// Integer and bool inputs accumulate in int64 unless a dtype is given (as PyTorch).
static TensorSpec scan(const char* op, const Tensor& self, int64_t dim,
                       std::optional<ScalarType> dtype) {
  wrap_dim(op, dim, self.dim());
  ScalarType out = dtype ? *dtype : (is_floating(self.dtype()) ? self.dtype() : kInt64);
  return contiguous_spec(self.sizes(), out, self.device());
}

TensorSpec cumsum(const Tensor& self, int64_t dim, std::optional<ScalarType> dtype) {
  return scan("cumsum", self, dim, dtype);
}

TensorSpec cumprod(const Tensor& self, int64_t dim, std::optional<ScalarType> dtype) {
  return scan("cumprod", self, dim, dtype);
}

}  // namespace kiln::meta
