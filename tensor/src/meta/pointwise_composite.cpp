// Meta functions of trunc and of the composite pointwise rows (pointwise.toml, unary.toml):
// floor_divide, round.decimals, clamp.Tensor, softplus. The composites run them first, so a bad
// argument is reported under the name the user called. In-place rows return self's spec after
// the checks of an in-place op (the result's shape is self's, its dtype casts to self's).
#include "kiln/generated/meta/pointwise.h"
#include "kiln/generated/meta/unary.h"
#include "kiln/meta.h"
#include "op_support.h"

namespace kiln::meta {

TensorSpec trunc(const Tensor& self) {
  KILN_CHECK(self.dtype() != kBool, Type, "trunc: not supported for bool tensors (shape ",
             self.sizes(), ")");
  return contiguous_spec(self.sizes(), self.dtype(), self.device());
}

TensorSpec floor_divide(const Tensor& self, const Tensor& other) {
  return div(self, other, std::string_view("floor"));
}

TensorSpec floor_divide_(const Tensor& self, const Tensor& other) {
  return detail::inplace_spec("floor_divide_", self, floor_divide(self, other));
}

// Integers are rounded only to decimals = 0 (the identity), as in PyTorch.
TensorSpec round_decimals(const Tensor& self, int64_t decimals) {
  KILN_CHECK(self.dtype() != kBool, Type, "round: not supported for bool tensors (shape ",
             self.sizes(), ")");
  KILN_CHECK(decimals == 0 || is_floating(self.dtype()), Type, "round: decimals=", decimals,
             " needs a floating point tensor, got ", self.dtype());
  return contiguous_spec(self.sizes(), self.dtype(), self.device());
}

TensorSpec round_decimals_(const Tensor& self, int64_t decimals) {
  return detail::inplace_spec("round_", self, round_decimals(self, decimals));
}

// self, min, max broadcast together -> result_type(self, min, max).
TensorSpec clamp_tensor(const Tensor& self, const std::optional<Tensor>& min,
                        const std::optional<Tensor>& max) {
  const bool has_min = min && min->defined(), has_max = max && max->defined();
  KILN_CHECK(has_min || has_max, Value, "clamp: at least one of 'min' or 'max' must not be None");
  std::vector<Tensor> ops{self};
  DimVector sizes(self.sizes());
  Device device = self.device();
  for (const Tensor* b : {has_min ? &*min : nullptr, has_max ? &*max : nullptr}) {
    if (!b) continue;
    device = common_device("clamp", self, *b);
    sizes = broadcast_shapes("clamp", sizes, b->sizes());
    ops.push_back(*b);
  }
  ScalarType t = result_type(ops);
  KILN_CHECK(t != kBool, Type, "clamp: not supported for bool tensors (shape ", self.sizes(), ")");
  return contiguous_spec(sizes, t, device);
}

TensorSpec clamp_tensor_(const Tensor& self, const std::optional<Tensor>& min,
                         const std::optional<Tensor>& max) {
  return detail::inplace_spec("clamp_", self, clamp_tensor(self, min, max));
}

TensorSpec softplus(const Tensor& self, const Scalar& beta, const Scalar& /*threshold*/) {
  KILN_CHECK(is_floating(self.dtype()), Type, "softplus: expected a floating point tensor, got ",
             self.dtype(), " (shape ", self.sizes(), ")");
  KILN_CHECK(beta.to_double() != 0, Value, "softplus: beta must not be 0");
  return contiguous_spec(self.sizes(), self.dtype(), self.device());
}

}  // namespace kiln::meta
