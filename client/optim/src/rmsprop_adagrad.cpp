// RMSprop and Adagrad (kiln/optim/optimizers.h): PyTorch's single-tensor update rules written
// with table ops, one parameter at a time, under no_grad. (The op table has no fused rows for
// them; PyTorch's foreach kernels compute the same values.)
#include "kiln/autograd/grad_mode.h"
#include "kiln/kiln.h"
#include "kiln/optim/optimizers.h"

namespace kiln::optim {
namespace {

std::vector<ParamGroup> one_group(std::vector<Tensor> params) {
  return {ParamGroup{std::move(params), {}}};
}

// Advances a parameter's step counter; returns the new step.
double advance(Tensor& step) {
  step += 1;
  return step.item<double>();
}

// The gradient as the update sees it: negated (maximize) and with L2 weight decay added.
Tensor effective_grad(const Tensor& p, const Tensor& grad, const Options& o) {
  Tensor g = o.at("maximize") != 0 ? -grad : grad;
  const double wd = o.at("weight_decay");
  return wd != 0 ? g + p * wd : g;
}

}  // namespace

Options RMSpropOptions::to_map() const {
  return {{"lr", lr},
          {"alpha", alpha},
          {"eps", eps},
          {"weight_decay", weight_decay},
          {"momentum", momentum},
          {"centered", centered},
          {"maximize", maximize}};
}

RMSprop::RMSprop(std::vector<Tensor> params, const RMSpropOptions& options)
    : RMSprop(one_group(std::move(params)), options) {}

RMSprop::RMSprop(std::vector<ParamGroup> groups, const RMSpropOptions& options)
    : Optimizer(std::move(groups), options.to_map(), "RMSprop") {}

void RMSprop::step() {
  autograd::NoGradGuard no_grad;
  for (const ParamGroup& group : param_groups()) {
    const Options& o = group.options;
    const double alpha = o.at("alpha"), momentum = o.at("momentum"), lr = o.at("lr");
    KILN_CHECK(alpha >= 0 && momentum >= 0 && o.at("eps") >= 0 && o.at("weight_decay") >= 0, Value,
               name_, ": alpha, momentum, eps and weight_decay must be non-negative");
    std::vector<Tensor> params, grads;
    params_with_grad(group, params, grads);
    for (size_t i = 0; i < params.size(); ++i) {
      const Tensor& p = params[i];
      std::map<std::string, Tensor>& s = state(p);
      if (s.empty()) {
        s["step"] = zeros({}, kFloat32, p.device());
        s["square_avg"] = zeros_like(p);
      }
      advance(s.at("step"));
      Tensor g = effective_grad(p, grads[i], o);
      Tensor& sq = s.at("square_avg");
      sq *= alpha;
      sq += g * g * (1 - alpha);
      Tensor avg;
      if (o.at("centered") != 0) {
        if (!s.count("grad_avg")) s["grad_avg"] = zeros_like(p);
        Tensor& ga = s.at("grad_avg");
        ga += (g - ga) * (1 - alpha);
        avg = sqrt(sq - ga * ga) + o.at("eps");
      } else {
        avg = sqrt(sq) + o.at("eps");
      }
      if (momentum > 0) {
        if (!s.count("momentum_buffer")) s["momentum_buffer"] = zeros_like(p);
        Tensor& buf = s.at("momentum_buffer");
        buf *= momentum;
        buf += g / avg;
        p.sub_(buf, lr);
      } else {
        p.sub_(g / avg, lr);
      }
    }
  }
}

Options AdagradOptions::to_map() const {
  return {{"lr", lr},
          {"lr_decay", lr_decay},
          {"weight_decay", weight_decay},
          {"initial_accumulator_value", initial_accumulator_value},
          {"eps", eps},
          {"maximize", maximize}};
}

Adagrad::Adagrad(std::vector<Tensor> params, const AdagradOptions& options)
    : Adagrad(one_group(std::move(params)), options) {}

Adagrad::Adagrad(std::vector<ParamGroup> groups, const AdagradOptions& options)
    : Optimizer(std::move(groups), options.to_map(), "Adagrad") {
  init_state();
}

void Adagrad::init_state() {
  autograd::NoGradGuard no_grad;
  for (const ParamGroup& group : param_groups()) {
    const Options& o = group.options;
    KILN_CHECK(o.at("lr_decay") >= 0 && o.at("weight_decay") >= 0 && o.at("eps") >= 0 &&
                   o.at("initial_accumulator_value") >= 0,
               Value, name_,
               ": lr_decay, weight_decay, eps and initial_accumulator_value must be non-negative");
    for (const Tensor& p : group.params) {
      if (has_state(p)) continue;
      std::map<std::string, Tensor>& s = state(p);
      s["step"] = zeros({}, kFloat32, p.device());
      s["sum"] = full_like(p, o.at("initial_accumulator_value"));
    }
  }
}

void Adagrad::step() {
  init_state();  // parameters of groups added since
  autograd::NoGradGuard no_grad;
  for (const ParamGroup& group : param_groups()) {
    const Options& o = group.options;
    std::vector<Tensor> params, grads;
    params_with_grad(group, params, grads);
    for (size_t i = 0; i < params.size(); ++i) {
      const Tensor& p = params[i];
      std::map<std::string, Tensor>& s = state(p);
      const double t = advance(s.at("step"));
      Tensor g = effective_grad(p, grads[i], o);
      const double clr = o.at("lr") / (1 + (t - 1) * o.at("lr_decay"));
      Tensor& sum = s.at("sum");
      sum += g * g;
      p.sub_(g / (sqrt(sum) + o.at("eps")), clr);
    }
  }
}

}  // namespace kiln::optim
