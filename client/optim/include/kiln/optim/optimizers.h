// kiln/optim/optimizers.h: SGD, Adam, AdamW, RMSprop and Adagrad, with PyTorch's update rules and
// defaults. SGD, Adam and AdamW run on the fused multi-tensor ops (_fused_sgd_, _fused_adam_,
// _fused_adamw_: one call per param group); RMSprop and Adagrad are compositions of table ops.
//
//   kiln::optim::AdamW opt(model_params, {.lr = 3e-4, .weight_decay = 0.1});
//   kiln::optim::SGD sgd({{.params = backbone, .options = {{"lr", 1e-3}}},
//                         {.params = head}}, {.lr = 1e-2, .momentum = 0.9});
//   for (...) { loss = ...; loss.backward(); opt.step(); opt.zero_grad(); }
#pragma once

#include "kiln/optim/optimizer.h"

namespace kiln::optim {

struct SGDOptions {
  double lr = 1e-3, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false, maximize = false;
  Options to_map() const;
};

// State per parameter: momentum_buffer (with a momentum).
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, const SGDOptions& options = {});
  SGD(std::vector<ParamGroup> groups, const SGDOptions& options = {});
  void step() override;
};

struct AdamOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool amsgrad = false, maximize = false;
  Options to_map() const;
};

// State per parameter: step (a float32 scalar), exp_avg, exp_avg_sq, max_exp_avg_sq (amsgrad).
class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, const AdamOptions& options = {});
  Adam(std::vector<ParamGroup> groups, const AdamOptions& options = {});
  void step() override;

 protected:
  Adam(std::vector<ParamGroup> groups, Options defaults, const char* name, bool decoupled);

 private:
  bool decoupled_;  // AdamW's weight decay
};

// Adam's options, with AdamW's default weight decay.
struct AdamWOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 1e-2;
  bool amsgrad = false, maximize = false;
  Options to_map() const;
};

// Adam with decoupled weight decay: p *= 1 - lr * weight_decay before the Adam update.
class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, const AdamWOptions& options = {});
  AdamW(std::vector<ParamGroup> groups, const AdamWOptions& options = {});
};

struct RMSpropOptions {
  double lr = 1e-2, alpha = 0.99, eps = 1e-8, weight_decay = 0, momentum = 0;
  bool centered = false, maximize = false;
  Options to_map() const;
};

// State per parameter: step, square_avg, momentum_buffer (with a momentum), grad_avg (centered).
class RMSprop : public Optimizer {
 public:
  RMSprop(std::vector<Tensor> params, const RMSpropOptions& options = {});
  RMSprop(std::vector<ParamGroup> groups, const RMSpropOptions& options = {});
  void step() override;
};

struct AdagradOptions {
  double lr = 1e-2, lr_decay = 0, weight_decay = 0, initial_accumulator_value = 0, eps = 1e-10;
  bool maximize = false;
  Options to_map() const;
};

// State per parameter: step, sum (created at construction, as PyTorch does).
class Adagrad : public Optimizer {
 public:
  Adagrad(std::vector<Tensor> params, const AdagradOptions& options = {});
  Adagrad(std::vector<ParamGroup> groups, const AdagradOptions& options = {});
  void step() override;

 private:
  void init_state();
};

}  // namespace kiln::optim
