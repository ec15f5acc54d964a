#include "kiln/nn/loss.h"

#include "kiln/nn/functional.h"

namespace kiln::nn {

Loss::Loss(std::string name, std::string reduction_, bool allow_batchmean)
    : Module(std::move(name)), reduction(std::move(reduction_)) {
  const bool known = reduction == "none" || reduction == "mean" || reduction == "sum" ||
                     (allow_batchmean && reduction == "batchmean");
  KILN_CHECK(known, Value, type_name(), ": reduction must be 'none', 'mean', 'sum'",
             allow_batchmean ? " or 'batchmean'" : "", ", got '", reduction, "'");
}

std::optional<Tensor> Loss::opt(const Tensor& t) {
  return t.defined() ? std::optional<Tensor>(t) : std::nullopt;
}

CrossEntropyLoss::CrossEntropyLoss(CrossEntropyLossOptions o)
    : Loss("CrossEntropyLoss", std::move(o.reduction)),
      ignore_index(o.ignore_index),
      label_smoothing(o.label_smoothing) {
  register_buffer("weight", std::move(o.weight), &weight);
}

Tensor CrossEntropyLoss::forward(const Tensor& input, const Tensor& target) {
  return functional::cross_entropy(input, target, opt(weight), reduction, ignore_index,
                                   label_smoothing);
}

NLLLoss::NLLLoss(NLLLossOptions o)
    : Loss("NLLLoss", std::move(o.reduction)), ignore_index(o.ignore_index) {
  register_buffer("weight", std::move(o.weight), &weight);
}

Tensor NLLLoss::forward(const Tensor& input, const Tensor& target) {
  return functional::nll_loss(input, target, opt(weight), reduction, ignore_index);
}

Tensor MSELoss::forward(const Tensor& input, const Tensor& target) {
  return functional::mse_loss(input, target, reduction);
}

Tensor L1Loss::forward(const Tensor& input, const Tensor& target) {
  return functional::l1_loss(input, target, reduction);
}

SmoothL1Loss::SmoothL1Loss(std::string reduction, double beta)
    : Loss("SmoothL1Loss", std::move(reduction)), beta(beta) {
  KILN_CHECK(beta >= 0, Value, "SmoothL1Loss: beta must be non-negative, got ", beta);
}

Tensor SmoothL1Loss::forward(const Tensor& input, const Tensor& target) {
  return functional::smooth_l1_loss(input, target, reduction, beta);
}

HuberLoss::HuberLoss(std::string reduction, double delta)
    : Loss("HuberLoss", std::move(reduction)), delta(delta) {
  KILN_CHECK(delta > 0, Value, "HuberLoss: delta must be positive, got ", delta);
}

Tensor HuberLoss::forward(const Tensor& input, const Tensor& target) {
  return functional::smooth_l1_loss(input, target, reduction, delta) * delta;
}

BCELoss::BCELoss(BCELossOptions o) : Loss("BCELoss", std::move(o.reduction)) {
  register_buffer("weight", std::move(o.weight), &weight);
}

Tensor BCELoss::forward(const Tensor& input, const Tensor& target) {
  return functional::binary_cross_entropy(input, target, opt(weight), reduction);
}

BCEWithLogitsLoss::BCEWithLogitsLoss(BCEWithLogitsLossOptions o)
    : Loss("BCEWithLogitsLoss", std::move(o.reduction)) {
  register_buffer("weight", std::move(o.weight), &weight);
  register_buffer("pos_weight", std::move(o.pos_weight), &pos_weight);
}

Tensor BCEWithLogitsLoss::forward(const Tensor& input, const Tensor& target) {
  return functional::binary_cross_entropy_with_logits(input, target, opt(weight), opt(pos_weight),
                                                      reduction);
}

KLDivLoss::KLDivLoss(std::string reduction, bool log_target)
    : Loss("KLDivLoss", std::move(reduction), /*allow_batchmean=*/true), log_target(log_target) {}

Tensor KLDivLoss::forward(const Tensor& input, const Tensor& target) {
  return functional::kl_div(input, target, reduction, log_target);
}

}  // namespace kiln::nn
