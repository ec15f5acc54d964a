// Meta functions of the losses (tensor/ops/loss.toml): the shapes of input and target, the
// reduction name, and the output (the loss per element for 'none', a scalar otherwise).
#include "kiln/generated/meta/loss.h"
#include "kiln/meta.h"

namespace kiln::meta {
namespace {

// 'none' keeps `sizes`; 'mean' and 'sum' (and kl_div's 'batchmean') give a scalar.
TensorSpec reduced(const char* op, std::string_view reduction, IntArrayRef sizes, ScalarType dtype,
                   Device device, bool batchmean = false) {
  const bool known = reduction == "none" || reduction == "mean" || reduction == "sum" ||
                     (batchmean && reduction == "batchmean");
  KILN_CHECK(known, Value, op, ": reduction must be 'none', 'mean', 'sum'",
             batchmean ? " or 'batchmean'" : "", ", got '", reduction, "'");
  if (reduction == "none") return contiguous_spec(sizes, dtype, device);
  return contiguous_spec({}, dtype, device);
}

void check_floating(const char* op, const char* name, const Tensor& t) {
  KILN_CHECK(is_floating(t.dtype()), Type, op, ": expected ", name,
             " to have a floating point dtype, got ", t.dtype());
}

// Elementwise losses: input and target broadcast together (as PyTorch's, which warns).
TensorSpec elementwise(const char* op, const Tensor& input, const Tensor& target,
                       std::string_view reduction, bool batchmean = false) {
  check_floating(op, "input", input);
  check_floating(op, "target", target);
  DimVector sizes = broadcast_shapes(op, input.sizes(), target.sizes());
  return reduced(op, reduction, sizes, input.dtype(), common_device(op, input, target), batchmean);
}

// Class-index losses: input (C,) or (N, C, d1, ...); target () or (N, d1, ...) of int64; the
// per-sample shape is the target's. Floating targets (class probabilities) have input's shape.
DimVector class_target_shape(const char* op, const Tensor& input, const Tensor& target,
                             const std::optional<Tensor>& weight, bool allow_probs) {
  check_floating(op, "input", input);
  KILN_CHECK(input.dim() >= 1, Value, op, ": expected an input of shape (C,) or (N, C, ...), got ",
             input.sizes());
  const int64_t C = input.dim() == 1 ? input.size(0) : input.size(1);
  if (weight) {
    KILN_CHECK(weight->sizes() == IntArrayRef({C}), Value, op,
               ": expected a weight with one value per class (", C, "), got shape ",
               weight->sizes());
    KILN_CHECK(weight->dtype() == input.dtype(), Type, op, ": expected weight to have dtype ",
               input.dtype(), ", got ", weight->dtype());
  }
  if (allow_probs && is_floating(target.dtype())) {
    KILN_CHECK(target.sizes() == input.sizes(), Value, op,
               ": class probabilities must have the input's shape ", input.sizes(), ", got ",
               target.sizes());
    DimVector sizes(input.sizes());
    sizes.erase(input.dim() == 1 ? 0 : 1);
    return sizes;
  }
  KILN_CHECK(target.dtype() == kInt64, Type, op, ": expected class indices of dtype int64",
             allow_probs ? " (or class probabilities of a floating dtype)" : "", ", got ",
             target.dtype());
  DimVector want(input.sizes());
  want.erase(input.dim() == 1 ? 0 : 1);
  KILN_CHECK(target.sizes() == want.ref(), Value, op, ": expected target of shape ", want.ref(),
             " for input of shape ", input.sizes(), ", got ", target.sizes());
  return want;
}

}  // namespace

TensorSpec cross_entropy(const Tensor& input, const Tensor& target,
                         const std::optional<Tensor>& weight, std::string_view reduction, int64_t,
                         double label_smoothing) {
  DimVector sizes = class_target_shape("cross_entropy", input, target, weight, true);
  KILN_CHECK(label_smoothing >= 0 && label_smoothing <= 1, Value,
             "cross_entropy: label_smoothing must be between 0.0 and 1.0, got ", label_smoothing);
  return reduced("cross_entropy", reduction, sizes, input.dtype(),
                 common_device("cross_entropy", input, target));
}

TensorSpec cross_entropy_indices(const Tensor& input, const Tensor& target,
                                 const std::optional<Tensor>& weight, int64_t,
                                 double label_smoothing) {
  KILN_CHECK(input.dim() == 2, Value,
             "cross_entropy_indices: expected an input of shape (N, C), got ", input.sizes());
  DimVector sizes = class_target_shape("cross_entropy_indices", input, target, weight, false);
  KILN_CHECK(label_smoothing >= 0 && label_smoothing <= 1, Value,
             "cross_entropy_indices: label_smoothing must be between 0.0 and 1.0, got ",
             label_smoothing);
  return contiguous_spec(sizes, input.dtype(),
                         common_device("cross_entropy_indices", input, target));
}

TensorSpec cross_entropy_indices_backward(const Tensor& grad, const Tensor& input,
                                          const Tensor& target,
                                          const std::optional<Tensor>& weight,
                                          int64_t ignore_index, double label_smoothing) {
  TensorSpec per = cross_entropy_indices(input, target, weight, ignore_index, label_smoothing);
  KILN_CHECK(grad.sizes() == per.sizes.ref() && grad.dtype() == input.dtype(), Value,
             "cross_entropy_indices_backward: expected grad of shape ", per.sizes.ref(),
             " and dtype ", input.dtype(), ", got ", grad.sizes(), " ", grad.dtype());
  return contiguous_spec(input.sizes(), input.dtype(),
                         common_device("cross_entropy_indices_backward", grad, input, target));
}

TensorSpec nll_loss(const Tensor& input, const Tensor& target, const std::optional<Tensor>& weight,
                    std::string_view reduction, int64_t) {
  DimVector sizes = class_target_shape("nll_loss", input, target, weight, false);
  return reduced("nll_loss", reduction, sizes, input.dtype(),
                 common_device("nll_loss", input, target));
}

TensorSpec mse_loss(const Tensor& input, const Tensor& target, std::string_view reduction) {
  return elementwise("mse_loss", input, target, reduction);
}

TensorSpec l1_loss(const Tensor& input, const Tensor& target, std::string_view reduction) {
  return elementwise("l1_loss", input, target, reduction);
}

TensorSpec smooth_l1_loss(const Tensor& input, const Tensor& target, std::string_view reduction,
                          double beta) {
  KILN_CHECK(beta >= 0, Value, "smooth_l1_loss: beta must be non-negative, got ", beta);
  return elementwise("smooth_l1_loss", input, target, reduction);
}

TensorSpec binary_cross_entropy(const Tensor& input, const Tensor& target,
                                const std::optional<Tensor>& weight, std::string_view reduction) {
  KILN_CHECK(input.sizes() == target.sizes(), Value,
             "binary_cross_entropy: expected target of the input's shape ", input.sizes(),
             ", got ", target.sizes());
  if (weight) broadcast_shapes("binary_cross_entropy", input.sizes(), weight->sizes());
  return elementwise("binary_cross_entropy", input, target, reduction);
}

// _binary_cross_entropy: input, target broadcast together -> result_type(input, target).
TensorSpec binary_cross_entropy_unreduced(const Tensor& input, const Tensor& target) {
  const char* op = "binary_cross_entropy";
  check_floating(op, "input", input);
  check_floating(op, "target", target);
  return contiguous_spec(broadcast_shapes(op, input.sizes(), target.sizes()),
                         result_type(input, target), common_device(op, input, target));
}

TensorSpec binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target,
                                            const std::optional<Tensor>& weight,
                                            const std::optional<Tensor>& pos_weight,
                                            std::string_view reduction) {
  const char* op = "binary_cross_entropy_with_logits";
  KILN_CHECK(input.sizes() == target.sizes(), Value, op, ": expected target of the input's shape ",
             input.sizes(), ", got ", target.sizes());
  if (weight) broadcast_shapes(op, input.sizes(), weight->sizes());
  if (pos_weight) broadcast_shapes(op, input.sizes(), pos_weight->sizes());
  return elementwise(op, input, target, reduction);
}

TensorSpec kl_div(const Tensor& input, const Tensor& target, std::string_view reduction, bool) {
  return elementwise("kl_div", input, target, reduction, /*batchmean=*/true);
}

}  // namespace kiln::meta
