// kiln/optim/lr_scheduler.h: learning-rate schedulers (PyTorch's torch.optim.lr_scheduler):
// StepLR, MultiStepLR, ExponentialLR, CosineAnnealingLR, LinearLR, OneCycleLR, SequentialLR.
//
//   kiln::optim::AdamW opt(params, {.lr = 1e-3});
//   kiln::optim::CosineAnnealingLR sched(opt, {.T_max = 100});  // sets the lr of epoch 0
//   for (int epoch = 0; epoch < 100; ++epoch) { train(opt); sched.step(); }
//   double lr = sched.get_last_lr()[0];
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/optim/optimizer.h"

namespace kiln::optim {

// Note [Closed-form schedules]: every scheduler computes a group's lr at epoch e from its base lr
// (the group's "initial_lr", set by the first scheduler built on the optimizer) in closed form,
// the values PyTorch's chained updates reach. So a scheduler restored from its state dict (the
// epoch) resumes exactly, but an lr changed by hand between steps is overwritten at the next one.
class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  // Advances one epoch and sets every group's lr for it.
  void step();
  int64_t last_epoch() const { return last_epoch_; }
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  // The lrs this scheduler set last, one per param group.
  std::vector<double> get_last_lr() const;
  // The lr of param group `group` at `epoch`.
  virtual double lr_at(size_t group, int64_t epoch) const = 0;

  // {"last_epoch": e, "base_lr.0": ..., "base_lr.1": ...}; loading sets the optimizer's lrs for
  // the restored epoch.
  std::map<std::string, double> state_dict() const;
  void load_state_dict(const std::map<std::string, double>& sd);

 protected:
  LRScheduler(Optimizer& optimizer, const char* name);
  // Sets the groups' options for `epoch` (the lr; OneCycleLR also the momentum).
  virtual void apply(int64_t epoch);
  // Epoch 0: the derived constructor calls it once its members are set.
  void initial_step();
  friend class SequentialLR;

  Optimizer& optimizer_;
  const char* name_;
  std::vector<double> base_lrs_;
  int64_t last_epoch_ = -1;
};

// lr = base * gamma^(epoch / step_size).
struct StepLROptions {
  int64_t step_size = 1;
  double gamma = 0.1;
};
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, const StepLROptions& options);
  double lr_at(size_t group, int64_t epoch) const override;

 private:
  StepLROptions o_;
};

// lr = base * gamma^(number of milestones <= epoch).
struct MultiStepLROptions {
  std::vector<int64_t> milestones;
  double gamma = 0.1;
};
class MultiStepLR : public LRScheduler {
 public:
  MultiStepLR(Optimizer& optimizer, MultiStepLROptions options);
  double lr_at(size_t group, int64_t epoch) const override;

 private:
  MultiStepLROptions o_;
};

// lr = base * gamma^epoch.
class ExponentialLR : public LRScheduler {
 public:
  ExponentialLR(Optimizer& optimizer, double gamma);
  double lr_at(size_t group, int64_t epoch) const override;

 private:
  double gamma_;
};

// lr = eta_min + (base - eta_min) * (1 + cos(pi * epoch / T_max)) / 2.
struct CosineAnnealingLROptions {
  int64_t T_max = 1;
  double eta_min = 0;
};
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, const CosineAnnealingLROptions& options);
  double lr_at(size_t group, int64_t epoch) const override;

 private:
  CosineAnnealingLROptions o_;
};

// lr = base * (start + (end - start) * min(epoch, total_iters) / total_iters).
struct LinearLROptions {
  double start_factor = 1.0 / 3, end_factor = 1.0;
  int64_t total_iters = 5;
};
class LinearLR : public LRScheduler {
 public:
  LinearLR(Optimizer& optimizer, const LinearLROptions& options = {});
  double lr_at(size_t group, int64_t epoch) const override;

 private:
  LinearLROptions o_;
};

// The 1cycle policy: lr warms from max_lr / div_factor up to max_lr over pct_start of the steps,
// then anneals to that / final_div_factor (three_phase: back to the start first). With
// cycle_momentum, the groups' momentum (SGD, RMSprop) or beta1 (Adam) goes the opposite way,
// between max_momentum and base_momentum. max_lr: one value, or one per param group.
struct OneCycleLROptions {
  std::vector<double> max_lr;
  int64_t total_steps = 0;  // or epochs * steps_per_epoch
  int64_t epochs = 0, steps_per_epoch = 0;
  double pct_start = 0.3;
  bool anneal_cos = true;  // false: linear
  bool cycle_momentum = true;
  double base_momentum = 0.85, max_momentum = 0.95, div_factor = 25, final_div_factor = 1e4;
  bool three_phase = false;
};
class OneCycleLR : public LRScheduler {
 public:
  OneCycleLR(Optimizer& optimizer, OneCycleLROptions options);
  double lr_at(size_t group, int64_t epoch) const override;
  // The momentum (or beta1) of `group` at `epoch`.
  double momentum_at(size_t group, int64_t epoch) const;

 private:
  void apply(int64_t epoch) override;
  struct Phase {
    double end_step;
    std::string lr_start, lr_end;  // group options: initial_lr, max_lr, min_lr
    double momentum_start, momentum_end;
  };
  double anneal(double start, double end, double pct) const;
  // The phase of `epoch` and how far into it (0..1).
  std::pair<const Phase*, double> phase_of(int64_t epoch) const;

  OneCycleLROptions o_;
  std::vector<Phase> phases_;
  std::string momentum_key_;  // "momentum" or "beta1"
};

// Runs schedulers[0] until milestones[0], then schedulers[1] (from its epoch 0), and so on. The
// schedulers must be built on `optimizer`; SequentialLR restores the initial lrs they changed.
class SequentialLR : public LRScheduler {
 public:
  SequentialLR(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
               std::vector<int64_t> milestones);
  double lr_at(size_t group, int64_t epoch) const override;

 private:
  void apply(int64_t epoch) override;
  // The scheduler running at `epoch`, and the epoch it is at.
  std::pair<LRScheduler*, int64_t> at(int64_t epoch) const;
  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
  std::vector<int64_t> milestones_;
};

}  // namespace kiln::optim
