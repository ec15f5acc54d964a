// Meta functions of the reductions and softmax (tensor/ops/reduction.toml): output shape and
// dtype, and the user-facing errors (dims out of range, repeated dims, empty reductions, dtypes).
#include <cmath>

#include "kiln/generated/meta/creation.h"
#include "kiln/generated/meta/reduction.h"
#include "kiln/meta.h"

namespace kiln::meta {
namespace {

// A reduction over the dims of `dim` (all dims when absent or empty) with output dtype `out`.
TensorSpec reduce_spec(const char* op, const Tensor& self, OptionalIntArrayRef dim, bool keepdim,
                       ScalarType out) {
  std::vector<bool> mask = dim_mask(op, dim, self.dim());
  return contiguous_spec(reduced_shape(self.sizes(), mask, keepdim), out, self.device());
}

// sum/prod: integers and bool accumulate into int64 unless a dtype is given (as PyTorch).
ScalarType sum_dtype(const Tensor& self, std::optional<ScalarType> dtype) {
  if (dtype) return *dtype;
  return is_integral(self.dtype(), /*include_bool=*/true) ? kInt64 : self.dtype();
}

void check_floating(const char* op, const char* what, ScalarType t) {
  KILN_CHECK(is_floating(t), Type, op, ": ", what, " only support floating point dtypes, got ",
             scalar_type_name(t));
}

// max()/min()/argmax() without a dim: there is no identity to return for an empty tensor.
void check_nonempty(const char* op, const Tensor& self) {
  KILN_CHECK(self.numel() > 0, Runtime, op,
             "(): Expected reduction dim to be specified for input.numel() == 0. Specify the "
             "reduction dim with the 'dim' argument.");
}

// A reduction over one dim of zero size has no identity either (IndexError, as PyTorch).
int64_t check_dim_nonempty(const char* op, const Tensor& self, int64_t dim) {
  int64_t d = wrap_dim(op, dim, self.dim());
  if (self.dim() > 0)
    KILN_CHECK(self.size(d) > 0, Index, op, "(): Expected reduction dim ", d,
               " to have non-zero size (input of size ", self.sizes(), ").");
  return d;
}

std::vector<TensorSpec> value_index_spec(const char* op, const Tensor& self, int64_t dim,
                                         bool keepdim) {
  int64_t d = check_dim_nonempty(op, self, dim);
  std::vector<bool> mask(self.dim(), false);
  if (self.dim() > 0) mask[d] = true;
  DimVector shape = reduced_shape(self.sizes(), mask, keepdim);
  return {contiguous_spec(shape, self.dtype(), self.device()),
          contiguous_spec(shape, kInt64, self.device())};
}

TensorSpec arg_spec(const char* op, const Tensor& self, std::optional<int64_t> dim, bool keepdim) {
  KILN_CHECK(self.dtype() != kBool, Type, op, ": dtype bool is not supported");
  if (!dim) {
    check_nonempty(op, self);
    DimVector shape(keepdim ? self.dim() : 0, 1);
    return contiguous_spec(shape, kInt64, self.device());
  }
  int64_t d = check_dim_nonempty(op, self, *dim);
  std::vector<bool> mask(self.dim(), false);
  if (self.dim() > 0) mask[d] = true;
  return contiguous_spec(reduced_shape(self.sizes(), mask, keepdim), kInt64, self.device());
}

TensorSpec softmax_spec(const char* op, const Tensor& self, int64_t dim,
                        std::optional<ScalarType> dtype) {
  wrap_dim(op, dim, self.dim());
  ScalarType out = dtype.value_or(self.dtype());
  KILN_CHECK(is_floating(out), Type, op, ": expected a floating point input or dtype, got ",
             scalar_type_name(out), " (pass dtype=float32 to compute in floating point)");
  return contiguous_spec(self.sizes(), out, self.device());
}

}  // namespace

TensorSpec sum(const Tensor& self, OptionalIntArrayRef dim, bool keepdim, std::optional<ScalarType> dtype) {
  return reduce_spec("sum", self, dim, keepdim, sum_dtype(self, dtype));
}

TensorSpec prod(const Tensor& self, OptionalIntArrayRef dim, bool keepdim, std::optional<ScalarType> dtype) {
  return reduce_spec("prod", self, dim, keepdim, sum_dtype(self, dtype));
}

TensorSpec mean(const Tensor& self, OptionalIntArrayRef dim, bool keepdim, std::optional<ScalarType> dtype) {
  if (dtype) {
    KILN_CHECK(is_floating(*dtype), Type,
               "mean(): could not infer output dtype. Optional dtype must be either a floating "
               "point or complex dtype. Got: ", scalar_type_name(*dtype));
  } else {
    KILN_CHECK(is_floating(self.dtype()), Type,
               "mean(): could not infer output dtype. Input dtype must be either a floating point "
               "or complex dtype. Got: ", scalar_type_name(self.dtype()));
  }
  return reduce_spec("mean", self, dim, keepdim, dtype.value_or(self.dtype()));
}

TensorSpec max_all(const Tensor& self) {
  check_nonempty("max", self);
  return contiguous_spec({}, self.dtype(), self.device());
}

TensorSpec min_all(const Tensor& self) {
  check_nonempty("min", self);
  return contiguous_spec({}, self.dtype(), self.device());
}

// amax/amin: every reduced dim must be non-empty (there is no identity), as in PyTorch.
static TensorSpec amax_amin(const char* op, const Tensor& self, IntArrayRef dim, bool keepdim) {
  std::vector<bool> mask = dim_mask(op, dim, self.dim());
  for (int64_t d = 0; d < self.dim(); ++d)
    KILN_CHECK(!mask[d] || self.size(d) > 0, Index, op, "(): Expected reduction dim ", d,
               " to have non-zero size (input of size ", self.sizes(), ").");
  return contiguous_spec(reduced_shape(self.sizes(), mask, keepdim), self.dtype(), self.device());
}

TensorSpec amax(const Tensor& self, IntArrayRef dim, bool keepdim) {
  return amax_amin("amax", self, dim, keepdim);
}

TensorSpec amin(const Tensor& self, IntArrayRef dim, bool keepdim) {
  return amax_amin("amin", self, dim, keepdim);
}

std::vector<TensorSpec> max_dim(const Tensor& self, int64_t dim, bool keepdim) {
  return value_index_spec("max", self, dim, keepdim);
}

std::vector<TensorSpec> min_dim(const Tensor& self, int64_t dim, bool keepdim) {
  return value_index_spec("min", self, dim, keepdim);
}

TensorSpec argmax(const Tensor& self, std::optional<int64_t> dim, bool keepdim) {
  return arg_spec("argmax", self, dim, keepdim);
}

TensorSpec argmin(const Tensor& self, std::optional<int64_t> dim, bool keepdim) {
  return arg_spec("argmin", self, dim, keepdim);
}

TensorSpec var(const Tensor& self, OptionalIntArrayRef dim, double correction, bool keepdim) {
  check_floating("var", "std and var", self.dtype());
  return reduce_spec("var", self, dim, keepdim, self.dtype());
}

TensorSpec std_dev(const Tensor& self, OptionalIntArrayRef dim, double correction, bool keepdim) {
  check_floating("std", "std and var", self.dtype());
  return reduce_spec("std", self, dim, keepdim, self.dtype());
}

TensorSpec norm(const Tensor& self, const Scalar& p, OptionalIntArrayRef dim, bool keepdim) {
  check_floating("norm", "norm", self.dtype());
  TensorSpec spec = reduce_spec("norm", self, dim, keepdim, self.dtype());
  double pv = p.to_double();
  if (std::isinf(pv)) {
    // max/min of |x| has no identity: every reduced dim must be non-empty.
    std::vector<bool> mask = dim_mask("norm", dim, self.dim());
    bool empty = self.numel() == 0 && (self.dim() == 0 || !dim || dim->empty());
    for (int64_t i = 0; i < self.dim(); ++i) empty = empty || (mask[i] && self.size(i) == 0);
    KILN_CHECK(!empty, Runtime, "norm: cannot compute the ", pv, " norm on an empty tensor (size ",
               self.sizes(), ") because the operation does not have an identity");
  }
  return spec;
}

TensorSpec logsumexp(const Tensor& self, IntArrayRef dim, bool keepdim) {
  return reduce_spec("logsumexp", self, dim, keepdim, default_float(self.dtype()));
}

TensorSpec any(const Tensor& self, OptionalIntArrayRef dim, bool keepdim) {
  return reduce_spec("any", self, dim, keepdim, kBool);
}

TensorSpec all(const Tensor& self, OptionalIntArrayRef dim, bool keepdim) {
  return reduce_spec("all", self, dim, keepdim, kBool);
}

TensorSpec softmax(const Tensor& self, int64_t dim, std::optional<ScalarType> dtype) {
  return softmax_spec("softmax", self, dim, dtype);
}

TensorSpec log_softmax(const Tensor& self, int64_t dim, std::optional<ScalarType> dtype) {
  return softmax_spec("log_softmax", self, dim, dtype);
}

}  // namespace kiln::meta
