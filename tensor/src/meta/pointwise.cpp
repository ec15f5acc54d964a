// Meta functions of pointwise ops (pointwise.toml, unary.toml): broadcasting, type promotion,
// device agreement and the dtype checks PyTorch makes.
#include "kiln/generated/meta/pointwise.h"
#include "kiln/generated/meta/reduction.h"
#include "kiln/generated/meta/unary.h"
#include "kiln/meta.h"

namespace kiln::meta {
namespace {

TensorSpec broadcast_spec(const char* op, const Tensor& a, const Tensor& b, ScalarType dtype) {
  Device d = common_device(op, a, b);
  return contiguous_spec(broadcast_shapes(op, a.sizes(), b.sizes()), dtype, d);
}

TensorSpec same_spec(const Tensor& self, ScalarType dtype) {
  return contiguous_spec(self.sizes(), dtype, self.device());
}

// Unary ops that keep the dtype but, like PyTorch, have no bool kernel.
TensorSpec unary_no_bool(const char* op, const Tensor& self, const char* hint = "") {
  KILN_CHECK(self.dtype() != kBool, Type, op, ": not supported for bool tensors (shape ",
             self.sizes(), ")", hint);
  return same_spec(self, self.dtype());
}

// Binary ops over the promoted type that have no bool kernel (pow, fmod, remainder, ...).
TensorSpec binary_no_bool(const char* op, const Tensor& self, const Tensor& other) {
  ScalarType t = result_type(self, other);
  KILN_CHECK(t != kBool, Type, op, ": not supported for bool tensors (shapes ", self.sizes(),
             " and ", other.sizes(), ")");
  return broadcast_spec(op, self, other, t);
}

TensorSpec binary_promoted(const char* op, const Tensor& self, const Tensor& other) {
  return broadcast_spec(op, self, other, result_type(self, other));
}

TensorSpec binary_bool_result(const char* op, const Tensor& self, const Tensor& other) {
  return broadcast_spec(op, self, other, kBool);
}

void check_alpha(const char* op, ScalarType t, const Scalar& alpha) {
  KILN_CHECK(is_floating(t) || !alpha.is_floating(), Type, op,
             ": for integral input tensors, argument alpha must not be a floating point number");
  KILN_CHECK(t != kBool || alpha.is_bool() || alpha.to_int() == 1, Type, op,
             ": boolean alpha only supported for boolean results");
}

}  // namespace

TensorSpec binary_alpha(const Tensor& self, const Tensor& other, const Scalar& alpha) {
  ScalarType t = result_type(self, other);
  check_alpha("add", t, alpha);
  return broadcast_spec("add", self, other, t);
}

TensorSpec sub(const Tensor& self, const Tensor& other, const Scalar& alpha) {
  KILN_CHECK(self.dtype() != kBool && other.dtype() != kBool, Type,
             "sub: subtraction, the `-` operator, with a bool tensor is not supported (shapes ",
             self.sizes(), " and ", other.sizes(),
             "). If you are trying to invert a mask, use the `~` or `logical_not()` operator instead.");
  ScalarType t = result_type(self, other);
  check_alpha("sub", t, alpha);
  return broadcast_spec("sub", self, other, t);
}

TensorSpec mul(const Tensor& self, const Tensor& other) { return binary_promoted("mul", self, other); }

TensorSpec div(const Tensor& self, const Tensor& other, std::optional<std::string_view> rounding_mode) {
  ScalarType t = result_type(self, other);
  if (!rounding_mode) return broadcast_spec("div", self, other, default_float(t));
  KILN_CHECK(*rounding_mode == "trunc" || *rounding_mode == "floor", Value,
             "div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '",
             *rounding_mode, "'");
  KILN_CHECK(t != kBool, Type, "div: rounding_mode='", *rounding_mode,
             "' is not supported for bool tensors (shapes ", self.sizes(), " and ", other.sizes(), ")");
  return broadcast_spec("div", self, other, t);
}

TensorSpec maximum(const Tensor& self, const Tensor& other) { return binary_promoted("maximum", self, other); }
TensorSpec minimum(const Tensor& self, const Tensor& other) { return binary_promoted("minimum", self, other); }
// An integer tensor to a negative integer *scalar* power is refused, as in PyTorch (an integer
// exponent tensor follows int_pow's rule instead: 0, or +-1 for bases +-1). A wrapped number is
// a CPU scalar whose value is an argument, so reading it here needs no data of `self`.
TensorSpec pow(const Tensor& self, const Tensor& exponent) {
  if (exponent.impl()->is_wrapped_number() && is_integral(exponent.dtype()) &&
      is_integral(self.dtype()) && !self.impl()->is_wrapped_number()) {
    int64_t e = exponent.item().to_int();
    KILN_CHECK(e >= 0, Value, "pow: integers to negative integer powers are not allowed (a ",
               self.dtype(), " tensor of shape ", self.sizes(), " to the power ", e, ")");
  }
  return binary_no_bool("pow", self, exponent);
}
TensorSpec fmod(const Tensor& self, const Tensor& other) { return binary_no_bool("fmod", self, other); }
TensorSpec remainder(const Tensor& self, const Tensor& other) { return binary_no_bool("remainder", self, other); }

TensorSpec eq(const Tensor& self, const Tensor& other) { return binary_bool_result("eq", self, other); }
TensorSpec ne(const Tensor& self, const Tensor& other) { return binary_bool_result("ne", self, other); }
TensorSpec lt(const Tensor& self, const Tensor& other) { return binary_bool_result("lt", self, other); }
TensorSpec le(const Tensor& self, const Tensor& other) { return binary_bool_result("le", self, other); }
TensorSpec gt(const Tensor& self, const Tensor& other) { return binary_bool_result("gt", self, other); }
TensorSpec ge(const Tensor& self, const Tensor& other) { return binary_bool_result("ge", self, other); }
TensorSpec logical_and(const Tensor& self, const Tensor& other) {
  return binary_bool_result("logical_and", self, other);
}
TensorSpec logical_or(const Tensor& self, const Tensor& other) {
  return binary_bool_result("logical_or", self, other);
}
TensorSpec logical_xor(const Tensor& self, const Tensor& other) {
  return binary_bool_result("logical_xor", self, other);
}

// condition, self, other: broadcast together -> result_type(self, other)
TensorSpec where(const Tensor& condition, const Tensor& self, const Tensor& other) {
  KILN_CHECK(condition.dtype() == kBool, Type, "where: expected condition to be a bool tensor, but got ",
             condition.dtype(), " (shape ", condition.sizes(), ")");
  Device d = common_device("where", condition, self, other);
  DimVector s = broadcast_shapes("where", condition.sizes(), self.sizes());
  s = broadcast_shapes("where", s, other.sizes());
  return contiguous_spec(s, result_type(self, other), d);
}

// ---- unary

TensorSpec unary_float(const Tensor& self) { return same_spec(self, default_float(self.dtype())); }

TensorSpec neg(const Tensor& self) {
  return unary_no_bool("neg", self,
                       ". Negation, the `-` operator, on a bool tensor is not supported; use the `~` "
                       "or `logical_not()` operator instead.");
}
TensorSpec abs(const Tensor& self) { return unary_no_bool("abs", self); }
TensorSpec relu(const Tensor& self) { return unary_no_bool("relu", self); }
TensorSpec floor(const Tensor& self) { return unary_no_bool("floor", self); }
TensorSpec ceil(const Tensor& self) { return unary_no_bool("ceil", self); }
TensorSpec round(const Tensor& self) { return unary_no_bool("round", self); }
TensorSpec sign(const Tensor& self) { return same_spec(self, self.dtype()); }
TensorSpec logical_not(const Tensor& self) { return same_spec(self, kBool); }

TensorSpec gelu(const Tensor& self, std::string_view approximate) {
  KILN_CHECK(approximate == "none" || approximate == "tanh", Value,
             "gelu: approximate argument must be either 'none' or 'tanh', but got '", approximate, "'");
  KILN_CHECK(is_floating(self.dtype()), Type, "gelu: expected a floating point tensor, but got ",
             self.dtype(), " (shape ", self.sizes(), ")");
  return same_spec(self, self.dtype());
}

// grad_output, self: broadcast together -> result_type(grad_output, self)
TensorSpec threshold_backward(const Tensor& grad_output, const Tensor& self, const Scalar& threshold) {
  return binary_no_bool("threshold_backward", grad_output, self);
}

// grad_output, self: broadcast together -> result_type(grad_output, self), floating
TensorSpec gelu_backward(const Tensor& grad_output, const Tensor& self, std::string_view approximate) {
  KILN_CHECK(approximate == "none" || approximate == "tanh", Value,
             "gelu_backward: approximate argument must be either 'none' or 'tanh', but got '",
             approximate, "'");
  ScalarType t = result_type(grad_output, self);
  KILN_CHECK(is_floating(t), Type, "gelu_backward: expected floating point tensors, but got ",
             grad_output.dtype(), " and ", self.dtype(), " (shapes ", grad_output.sizes(), " and ",
             self.sizes(), ")");
  return broadcast_spec("gelu_backward", grad_output, self, t);
}

TensorSpec silu(const Tensor& self) {
  KILN_CHECK(is_floating(self.dtype()), Type, "silu: expected a floating point tensor, but got ",
             self.dtype(), " (shape ", self.sizes(), ")");
  return same_spec(self, self.dtype());
}

// The bounds take part in type promotion as wrapped numbers (int tensor, min=0.5 -> float32).
TensorSpec clamp(const Tensor& self, const std::optional<Scalar>& min, const std::optional<Scalar>& max) {
  KILN_CHECK(min || max, Value, "clamp: at least one of 'min' or 'max' must not be None");
  std::vector<Tensor> ops{self};
  if (min) ops.push_back(scalar_to_tensor(*min));
  if (max) ops.push_back(scalar_to_tensor(*max));
  ScalarType t = result_type(ops);
  KILN_CHECK(t != kBool, Type, "clamp: not supported for bool tensors (shape ", self.sizes(), ")");
  return same_spec(self, t);
}

}  // namespace kiln::meta
