// Meta functions of the fused optimizer steps (tensor/ops/optim.toml). They return nothing: every
// list is updated in place. They check that each state list matches the parameters one to one
// (same shape, dtype and device) and that every step counter holds one element.
#include <string>

#include "kiln/generated/meta/creation.h"
#include "kiln/generated/meta/optim.h"
#include "kiln/meta.h"

namespace kiln::meta {
namespace {

// `list` (named `what`) matches `params` element by element.
void check_like_params(const char* op, TensorList params, TensorList list, const char* what) {
  KILN_CHECK(list.size() == params.size(), Value, op, ": expected ", params.size(), " ", what,
             " (one per parameter), got ", list.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor &p = params[i], &t = list[i];
    KILN_CHECK(t.sizes() == p.sizes(), Value, op, ": ", what, "[", i, "] has shape ", t.sizes(),
               " but parameter ", i, " has shape ", p.sizes());
    KILN_CHECK(t.dtype() == p.dtype(), Type, op, ": ", what, "[", i, "] has dtype ", t.dtype(),
               " but parameter ", i, " has dtype ", p.dtype());
    KILN_CHECK(t.device() == p.device(), Value, op, ": ", what, "[", i, "] is on ", t.device(),
               " but parameter ", i, " is on ", p.device());
  }
}

void check_params(const char* op, TensorList params, TensorList grads, double lr) {
  KILN_CHECK(lr >= 0, Value, op, ": invalid learning rate ", lr);
  for (size_t i = 0; i < params.size(); ++i)
    KILN_CHECK(is_floating(params[i].dtype()), Type, op, ": parameter ", i,
               " must be floating-point, got ", params[i].dtype());
  check_like_params(op, params, grads, "grads");
}

std::vector<TensorSpec> adam_meta(const char* op, TensorList self, TensorList grads,
                                  TensorList exp_avgs, TensorList exp_avg_sqs,
                                  TensorList max_exp_avg_sqs, TensorList state_steps, double lr,
                                  double beta1, double beta2, double eps, bool amsgrad) {
  check_params(op, self, grads, lr);
  KILN_CHECK(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1, Value, op, ": invalid betas (",
             beta1, ", ", beta2, "): each must be in [0, 1)");
  KILN_CHECK(eps >= 0, Value, op, ": invalid epsilon ", eps);
  check_like_params(op, self, exp_avgs, "exp_avgs");
  check_like_params(op, self, exp_avg_sqs, "exp_avg_sqs");
  if (amsgrad || !max_exp_avg_sqs.empty())
    check_like_params(op, self, max_exp_avg_sqs, "max_exp_avg_sqs");
  KILN_CHECK(state_steps.size() == self.size(), Value, op, ": expected ", self.size(),
             " state_steps (one per parameter), got ", state_steps.size());
  for (size_t i = 0; i < state_steps.size(); ++i) {
    const Tensor& s = state_steps[i];
    KILN_CHECK(s.numel() == 1, Value, op, ": state_steps[", i,
               "] must hold one element, got shape ", s.sizes());
    KILN_CHECK(is_floating(s.dtype()) || s.dtype() == kInt64, Type, op, ": state_steps[", i,
               "] must be floating-point or int64, got ", s.dtype());
  }
  return {};
}

}  // namespace

std::vector<TensorSpec> fused_sgd_(TensorList self, TensorList grads,
                                   TensorList momentum_buffer_list, double weight_decay,
                                   double momentum, double lr, double, bool nesterov, bool, bool) {
  const char* op = "_fused_sgd_";
  check_params(op, self, grads, lr);
  KILN_CHECK(momentum >= 0, Value, op, ": invalid momentum value ", momentum);
  KILN_CHECK(weight_decay >= 0, Value, op, ": invalid weight_decay value ", weight_decay);
  KILN_CHECK(!nesterov || momentum > 0, Value, op, ": nesterov momentum requires a momentum");
  if (momentum != 0) check_like_params(op, self, momentum_buffer_list, "momentum_buffer_list");
  return {};
}

std::vector<TensorSpec> fused_adam_(TensorList self, TensorList grads, TensorList exp_avgs,
                                    TensorList exp_avg_sqs, TensorList max_exp_avg_sqs,
                                    TensorList state_steps, double lr, double beta1, double beta2,
                                    double, double eps, bool amsgrad, bool) {
  return adam_meta("_fused_adam_", self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps,
                   lr, beta1, beta2, eps, amsgrad);
}

std::vector<TensorSpec> fused_adamw_(TensorList self, TensorList grads, TensorList exp_avgs,
                                     TensorList exp_avg_sqs, TensorList max_exp_avg_sqs,
                                     TensorList state_steps, double lr, double beta1, double beta2,
                                     double, double eps, bool amsgrad, bool) {
  return adam_meta("_fused_adamw_", self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
                   state_steps, lr, beta1, beta2, eps, amsgrad);
}

}  // namespace kiln::meta
