// Learning-rate schedulers (kiln/optim/lr_scheduler.h), Note [Closed-form schedules].
#include "kiln/optim/lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "kiln/error.h"

namespace kiln::optim {

LRScheduler::LRScheduler(Optimizer& optimizer, const char* name)
    : optimizer_(optimizer), name_(name) {
  for (ParamGroup& g : optimizer_.param_groups()) {
    g.options.emplace("initial_lr", g.options.at("lr"));
    base_lrs_.push_back(g.options.at("initial_lr"));
  }
}

void LRScheduler::initial_step() { step(); }

void LRScheduler::step() {
  ++last_epoch_;
  apply(last_epoch_);
}

void LRScheduler::apply(int64_t epoch) {
  std::vector<ParamGroup>& groups = optimizer_.param_groups();
  for (size_t i = 0; i < groups.size(); ++i) groups[i].options["lr"] = lr_at(i, epoch);
}

std::vector<double> LRScheduler::get_last_lr() const {
  std::vector<double> out;
  for (const ParamGroup& g : optimizer_.param_groups()) out.push_back(g.options.at("lr"));
  return out;
}

std::map<std::string, double> LRScheduler::state_dict() const {
  std::map<std::string, double> sd = {{"last_epoch", static_cast<double>(last_epoch_)}};
  for (size_t i = 0; i < base_lrs_.size(); ++i) sd["base_lr." + std::to_string(i)] = base_lrs_[i];
  return sd;
}

void LRScheduler::load_state_dict(const std::map<std::string, double>& sd) {
  auto it = sd.find("last_epoch");
  KILN_CHECK(it != sd.end(), Value, name_, ": state dict has no \"last_epoch\"");
  std::vector<double> base;
  for (size_t i = 0; i < base_lrs_.size(); ++i) {
    auto b = sd.find("base_lr." + std::to_string(i));
    KILN_CHECK(b != sd.end(), Value, name_, ": state dict has no \"base_lr.", i,
               "\" (the optimizer has ", base_lrs_.size(), " param groups)");
    base.push_back(b->second);
  }
  KILN_CHECK(sd.size() == base.size() + 1, Value, name_, ": state dict has ", sd.size() - 1,
             " base lrs, but the optimizer has ", base_lrs_.size(), " param groups");
  base_lrs_ = std::move(base);
  last_epoch_ = static_cast<int64_t>(it->second);
  apply(last_epoch_);
}

StepLR::StepLR(Optimizer& optimizer, const StepLROptions& options)
    : LRScheduler(optimizer, "StepLR"), o_(options) {
  KILN_CHECK(o_.step_size > 0, Value, name_, ": step_size must be positive, got ", o_.step_size);
  initial_step();
}

double StepLR::lr_at(size_t group, int64_t epoch) const {
  return base_lrs_.at(group) * std::pow(o_.gamma, static_cast<double>(epoch / o_.step_size));
}

MultiStepLR::MultiStepLR(Optimizer& optimizer, MultiStepLROptions options)
    : LRScheduler(optimizer, "MultiStepLR"), o_(std::move(options)) {
  std::sort(o_.milestones.begin(), o_.milestones.end());
  initial_step();
}

double MultiStepLR::lr_at(size_t group, int64_t epoch) const {
  const auto n =
      std::upper_bound(o_.milestones.begin(), o_.milestones.end(), epoch) - o_.milestones.begin();
  return base_lrs_.at(group) * std::pow(o_.gamma, static_cast<double>(n));
}

ExponentialLR::ExponentialLR(Optimizer& optimizer, double gamma)
    : LRScheduler(optimizer, "ExponentialLR"), gamma_(gamma) {
  initial_step();
}

double ExponentialLR::lr_at(size_t group, int64_t epoch) const {
  return base_lrs_.at(group) * std::pow(gamma_, static_cast<double>(epoch));
}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, const CosineAnnealingLROptions& options)
    : LRScheduler(optimizer, "CosineAnnealingLR"), o_(options) {
  KILN_CHECK(o_.T_max > 0, Value, name_, ": T_max must be positive, got ", o_.T_max);
  initial_step();
}

double CosineAnnealingLR::lr_at(size_t group, int64_t epoch) const {
  const double c = std::cos(std::numbers::pi * static_cast<double>(epoch) / o_.T_max);
  return o_.eta_min + (base_lrs_.at(group) - o_.eta_min) * (1 + c) / 2;
}

LinearLR::LinearLR(Optimizer& optimizer, const LinearLROptions& options)
    : LRScheduler(optimizer, "LinearLR"), o_(options) {
  KILN_CHECK(o_.start_factor > 0 && o_.start_factor <= 1, Value, name_,
             ": start_factor must be in (0, 1], got ", o_.start_factor);
  KILN_CHECK(o_.end_factor >= 0 && o_.end_factor <= 1, Value, name_,
             ": end_factor must be in [0, 1], got ", o_.end_factor);
  KILN_CHECK(o_.total_iters > 0, Value, name_, ": total_iters must be positive, got ",
             o_.total_iters);
  initial_step();
}

double LinearLR::lr_at(size_t group, int64_t epoch) const {
  const double frac = static_cast<double>(std::min(epoch, o_.total_iters)) / o_.total_iters;
  return base_lrs_.at(group) * (o_.start_factor + (o_.end_factor - o_.start_factor) * frac);
}

OneCycleLR::OneCycleLR(Optimizer& optimizer, OneCycleLROptions options)
    : LRScheduler(optimizer, "OneCycleLR"), o_(std::move(options)) {
  if (o_.total_steps <= 0) {
    KILN_CHECK(o_.epochs > 0 && o_.steps_per_epoch > 0, Value, name_,
               ": give total_steps, or epochs and steps_per_epoch (all positive)");
    o_.total_steps = o_.epochs * o_.steps_per_epoch;
  }
  KILN_CHECK(o_.pct_start >= 0 && o_.pct_start <= 1, Value, name_,
             ": pct_start must be in [0, 1], got ", o_.pct_start);
  std::vector<ParamGroup>& groups = optimizer_.param_groups();
  KILN_CHECK(o_.max_lr.size() == 1 || o_.max_lr.size() == groups.size(), Value, name_,
             ": expected 1 max_lr or one per param group (", groups.size(), "), got ",
             o_.max_lr.size());
  const double total = static_cast<double>(o_.total_steps), pct = o_.pct_start;
  const double lo = o_.base_momentum, hi = o_.max_momentum;
  if (o_.three_phase)
    phases_ = {{pct * total - 1, "initial_lr", "max_lr", hi, lo},
               {2 * pct * total - 2, "max_lr", "initial_lr", lo, hi},
               {total - 1, "initial_lr", "min_lr", hi, hi}};
  else
    phases_ = {{pct * total - 1, "initial_lr", "max_lr", hi, lo},
               {total - 1, "max_lr", "min_lr", lo, hi}};
  if (o_.cycle_momentum) {
    const Options& d = optimizer_.defaults();
    momentum_key_ = d.count("beta1") ? "beta1" : d.count("momentum") ? "momentum" : "";
    KILN_CHECK(!momentum_key_.empty(), Value, name_,
               ": the optimizer has no momentum or beta1 to cycle (set cycle_momentum = false)");
  }
  for (size_t i = 0; i < groups.size(); ++i) {
    Options& g = groups[i].options;
    const double max_lr = o_.max_lr[o_.max_lr.size() == 1 ? 0 : i];
    g["initial_lr"] = max_lr / o_.div_factor;
    g["max_lr"] = max_lr;
    g["min_lr"] = g["initial_lr"] / o_.final_div_factor;
    base_lrs_[i] = g["initial_lr"];
  }
  initial_step();
}

double OneCycleLR::anneal(double start, double end, double pct) const {
  if (o_.anneal_cos) return end + (start - end) / 2 * (std::cos(std::numbers::pi * pct) + 1);
  return (end - start) * pct + start;
}

std::pair<const OneCycleLR::Phase*, double> OneCycleLR::phase_of(int64_t epoch) const {
  KILN_CHECK(epoch <= o_.total_steps, Value, name_, ": tried to step ", epoch,
             " times; the specified number of total steps is ", o_.total_steps);
  double start = 0;
  for (size_t i = 0; i < phases_.size(); ++i) {
    const Phase& p = phases_[i];
    if (epoch <= p.end_step || i + 1 == phases_.size())
      return {&p, (static_cast<double>(epoch) - start) / (p.end_step - start)};
    start = p.end_step;
  }
  KILN_ASSERT(false, "OneCycleLR has no phases");
}

double OneCycleLR::lr_at(size_t group, int64_t epoch) const {
  const auto [phase, pct] = phase_of(epoch);
  const Options& g = optimizer_.param_groups().at(group).options;
  return anneal(g.at(phase->lr_start), g.at(phase->lr_end), pct);
}

double OneCycleLR::momentum_at(size_t, int64_t epoch) const {
  const auto [phase, pct] = phase_of(epoch);
  return anneal(phase->momentum_start, phase->momentum_end, pct);
}

void OneCycleLR::apply(int64_t epoch) {
  LRScheduler::apply(epoch);
  if (!o_.cycle_momentum) return;
  std::vector<ParamGroup>& groups = optimizer_.param_groups();
  for (size_t i = 0; i < groups.size(); ++i)
    groups[i].options[momentum_key_] = momentum_at(i, epoch);
}

SequentialLR::SequentialLR(Optimizer& optimizer,
                           std::vector<std::shared_ptr<LRScheduler>> schedulers,
                           std::vector<int64_t> milestones)
    : LRScheduler(optimizer, "SequentialLR"),
      schedulers_(std::move(schedulers)),
      milestones_(std::move(milestones)) {
  KILN_CHECK(!schedulers_.empty(), Value, name_, ": expected at least one scheduler");
  KILN_CHECK(milestones_.size() + 1 == schedulers_.size(), Value, name_, ": expected ",
             schedulers_.size() - 1, " milestones for ", schedulers_.size(), " schedulers, got ",
             milestones_.size());
  KILN_CHECK(std::is_sorted(milestones_.begin(), milestones_.end()), Value, name_,
             ": milestones must be in increasing order");
  for (size_t i = 0; i < schedulers_.size(); ++i)
    KILN_CHECK(schedulers_[i] && &schedulers_[i]->optimizer_ == &optimizer_, Value, name_,
               ": scheduler ", i, " is not built on this optimizer");
  // Undo the epoch-0 steps of the schedulers built after the first.
  std::vector<ParamGroup>& groups = optimizer_.param_groups();
  for (ParamGroup& g : groups) g.options["lr"] = g.options.at("initial_lr");
  initial_step();
}

std::pair<LRScheduler*, int64_t> SequentialLR::at(int64_t epoch) const {
  const size_t i =
      std::upper_bound(milestones_.begin(), milestones_.end(), epoch) - milestones_.begin();
  return {schedulers_[i].get(), i == 0 ? epoch : epoch - milestones_[i - 1]};
}

double SequentialLR::lr_at(size_t group, int64_t epoch) const {
  const auto [s, e] = at(epoch);
  return s->lr_at(group, e);
}

void SequentialLR::apply(int64_t epoch) {
  const auto [s, e] = at(epoch);
  s->last_epoch_ = e;
  s->apply(e);
}

}  // namespace kiln::optim
