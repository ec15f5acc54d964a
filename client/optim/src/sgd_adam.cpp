// SGD, Adam and AdamW (kiln/optim/optimizers.h) on the fused multi-tensor ops: one call per
// param group (two for SGD when some momentum buffers are new), under no_grad.
#include "kiln/autograd/grad_mode.h"
#include "kiln/kiln.h"
#include "kiln/optim/optimizers.h"

namespace kiln::optim {
namespace {

std::vector<ParamGroup> one_group(std::vector<Tensor> params) {
  return {ParamGroup{std::move(params), {}}};
}

}  // namespace

Options SGDOptions::to_map() const {
  return {{"lr", lr},
          {"momentum", momentum},
          {"dampening", dampening},
          {"weight_decay", weight_decay},
          {"nesterov", nesterov},
          {"maximize", maximize}};
}

SGD::SGD(std::vector<Tensor> params, const SGDOptions& options)
    : SGD(one_group(std::move(params)), options) {}

SGD::SGD(std::vector<ParamGroup> groups, const SGDOptions& options)
    : Optimizer(std::move(groups), options.to_map(), "SGD") {}

void SGD::step() {
  autograd::NoGradGuard no_grad;
  for (const ParamGroup& g : param_groups()) {
    const Options& o = g.options;
    const double momentum = o.at("momentum");
    KILN_CHECK(o.at("nesterov") == 0 || (momentum > 0 && o.at("dampening") == 0), Value, name_,
               ": nesterov momentum requires a momentum and zero dampening");
    std::vector<Tensor> params, grads;
    params_with_grad(g, params, grads);
    auto run = [&](const std::vector<Tensor>& p, const std::vector<Tensor>& gr,
                   const std::vector<Tensor>& bufs, bool first) {
      if (p.empty()) return;
      _fused_sgd_(p, gr, bufs, o.at("weight_decay"), momentum, o.at("lr"), o.at("dampening"),
                  o.at("nesterov") != 0, o.at("maximize") != 0, first);
    };
    if (momentum == 0) {
      run(params, grads, {}, false);
      continue;
    }
    // Parameters whose buffer exists, and those stepping with momentum for the first time.
    std::vector<Tensor> old_p, old_g, old_b, new_p, new_g, new_b;
    for (size_t i = 0; i < params.size(); ++i) {
      std::map<std::string, Tensor>& s = state(params[i]);
      auto it = s.find("momentum_buffer");
      if (it != s.end()) {
        old_p.push_back(params[i]), old_g.push_back(grads[i]), old_b.push_back(it->second);
        continue;
      }
      Tensor buf = zeros_like(params[i]);
      s["momentum_buffer"] = buf;
      new_p.push_back(params[i]), new_g.push_back(grads[i]), new_b.push_back(buf);
    }
    run(old_p, old_g, old_b, false);
    run(new_p, new_g, new_b, true);
  }
}

Options AdamOptions::to_map() const {
  return {{"lr", lr},
          {"beta1", beta1},
          {"beta2", beta2},
          {"eps", eps},
          {"weight_decay", weight_decay},
          {"amsgrad", amsgrad},
          {"maximize", maximize}};
}

Options AdamWOptions::to_map() const {
  return AdamOptions{lr, beta1, beta2, eps, weight_decay, amsgrad, maximize}.to_map();
}

Adam::Adam(std::vector<Tensor> params, const AdamOptions& options)
    : Adam(one_group(std::move(params)), options) {}

Adam::Adam(std::vector<ParamGroup> groups, const AdamOptions& options)
    : Adam(std::move(groups), options.to_map(), "Adam", false) {}

Adam::Adam(std::vector<ParamGroup> groups, Options defaults, const char* name, bool decoupled)
    : Optimizer(std::move(groups), std::move(defaults), name), decoupled_(decoupled) {}

void Adam::step() {
  autograd::NoGradGuard no_grad;
  for (const ParamGroup& g : param_groups()) {
    const Options& o = g.options;
    const bool amsgrad = o.at("amsgrad") != 0;
    std::vector<Tensor> params, grads, m, v, vmax, steps;
    params_with_grad(g, params, grads);
    if (params.empty()) continue;
    for (const Tensor& p : params) {
      std::map<std::string, Tensor>& s = state(p);
      if (s.empty()) {
        s["step"] = zeros({}, kFloat32, p.device());
        s["exp_avg"] = zeros_like(p);
        s["exp_avg_sq"] = zeros_like(p);
      }
      if (amsgrad && !s.count("max_exp_avg_sq")) s["max_exp_avg_sq"] = zeros_like(p);
      steps.push_back(s.at("step"));
      m.push_back(s.at("exp_avg"));
      v.push_back(s.at("exp_avg_sq"));
      if (amsgrad) vmax.push_back(s.at("max_exp_avg_sq"));
    }
    auto fused = decoupled_ ? _fused_adamw_ : _fused_adam_;
    fused(params, grads, m, v, vmax, steps, o.at("lr"), o.at("beta1"), o.at("beta2"),
          o.at("weight_decay"), o.at("eps"), amsgrad, o.at("maximize") != 0);
  }
}

AdamW::AdamW(std::vector<Tensor> params, const AdamWOptions& options)
    : AdamW(one_group(std::move(params)), options) {}

AdamW::AdamW(std::vector<ParamGroup> groups, const AdamWOptions& options)
    : Adam(std::move(groups), options.to_map(), "AdamW", true) {}

}  // namespace kiln::optim
