// The Optimizer base class (kiln/optim/optimizer.h): param groups, zero_grad, state dicts.
#include "kiln/optim/optimizer.h"

#include <nlohmann/json.hpp>
#include <unordered_set>

#include "kiln/autograd/grad_mode.h"
#include "kiln/kiln.h"

namespace kiln::optim {

std::string StateDict::groups_to_json() const {
  nlohmann::json groups = nlohmann::json::array();
  for (const Group& g : param_groups) {
    nlohmann::json j(g.options);
    j["params"] = g.params;
    groups.push_back(std::move(j));
  }
  return nlohmann::json{{"param_groups", groups}}.dump();
}

std::vector<StateDict::Group> StateDict::groups_from_json(const std::string& json) {
  nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  KILN_CHECK(j.is_object() && j.contains("param_groups") && j["param_groups"].is_array(), Value,
             "optimizer state: expected a JSON object with a \"param_groups\" array");
  std::vector<Group> out;
  for (const nlohmann::json& g : j["param_groups"]) {
    KILN_CHECK(g.is_object(), Value, "optimizer state: each param group must be a JSON object");
    Group group;
    for (const auto& [key, value] : g.items()) {
      if (key == "params") {
        KILN_CHECK(value.is_array(), Value, "optimizer state: \"params\" must be an array");
        for (const nlohmann::json& i : value) {
          KILN_CHECK(i.is_number_integer(), Value,
                     "optimizer state: parameter indices must be integers");
          group.params.push_back(i.get<int64_t>());
        }
        continue;
      }
      KILN_CHECK(value.is_number() || value.is_boolean(), Value, "optimizer state: option \"", key,
                 "\" must be a number");
      group.options[key] = value.is_boolean() ? double(value.get<bool>()) : value.get<double>();
    }
    out.push_back(std::move(group));
  }
  return out;
}

Optimizer::Optimizer(std::vector<ParamGroup> groups, Options defaults, const char* name)
    : name_(name), defaults_(std::move(defaults)) {
  KILN_CHECK(!groups.empty(), Value, name_, ": optimizer got an empty parameter list");
  for (ParamGroup& g : groups) add_param_group(std::move(g));
}

void Optimizer::add_param_group(ParamGroup group) {
  KILN_CHECK(!group.params.empty(), Value, name_, ": a param group needs at least one parameter");
  for (const auto& [key, value] : group.options)
    KILN_CHECK(defaults_.count(key) != 0, Value, name_, ": unknown option \"", key,
               "\" in param group ", groups_.size());
  for (const auto& [key, value] : defaults_) group.options.emplace(key, value);
  KILN_CHECK(group.options.at("lr") >= 0, Value, name_, ": invalid learning rate ",
             group.options.at("lr"));
  std::unordered_set<const TensorImpl*> seen;
  for (const ParamGroup& g : groups_)
    for (const Tensor& p : g.params) seen.insert(p.impl());
  for (size_t i = 0; i < group.params.size(); ++i) {
    const Tensor& p = group.params[i];
    p.check_defined("optimizer parameter");
    KILN_CHECK(is_floating(p.dtype()), Type, name_, ": parameter ", i, " of param group ",
               groups_.size(), " must be floating-point, got ", p.dtype());
    KILN_CHECK(seen.insert(p.impl()).second, Value, name_, ": parameter ", i, " of param group ",
               groups_.size(), " appears in more than one group (or twice)");
  }
  groups_.push_back(std::move(group));
}

void Optimizer::zero_grad(bool set_to_none) {
  autograd::NoGradGuard no_grad;
  for (const ParamGroup& g : groups_)
    for (const Tensor& p : g.params) {
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      if (set_to_none)
        p.set_grad(Tensor());
      else
        grad.zero_();
    }
}

const std::map<std::string, Tensor>& Optimizer::state_of(const Tensor& param) const {
  static const std::map<std::string, Tensor> kEmpty;
  auto it = state_.find(param.impl());
  return it == state_.end() ? kEmpty : it->second;
}

void Optimizer::params_with_grad(const ParamGroup& group, std::vector<Tensor>& params,
                                 std::vector<Tensor>& grads) {
  for (const Tensor& p : group.params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    params.push_back(p);
    grads.push_back(g);
  }
}

StateDict Optimizer::state_dict() const {
  StateDict sd;
  int64_t index = 0;
  for (const ParamGroup& g : groups_) {
    StateDict::Group group{g.options, {}};
    for (const Tensor& p : g.params) {
      for (const auto& [name, t] : state_of(p))
        sd.state[std::to_string(index) + "." + name] = t.detach().clone();
      group.params.push_back(index++);
    }
    sd.param_groups.push_back(std::move(group));
  }
  return sd;
}

void Optimizer::load_state_dict(const StateDict& sd) {
  KILN_CHECK(sd.param_groups.size() == groups_.size(), Value, name_, ": loaded state dict has ",
             sd.param_groups.size(), " param groups, but the optimizer has ", groups_.size());
  std::map<int64_t, const Tensor*> by_index;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const std::vector<int64_t>& ids = sd.param_groups[gi].params;
    KILN_CHECK(ids.size() == groups_[gi].params.size(), Value, name_, ": param group ", gi,
               " of the loaded state dict has ", ids.size(),
               " parameters, but the optimizer's has ", groups_[gi].params.size());
    for (size_t i = 0; i < ids.size(); ++i) by_index[ids[i]] = &groups_[gi].params[i];
  }
  std::unordered_map<const TensorImpl*, std::map<std::string, Tensor>> state;
  for (const auto& [key, t] : sd.state) {
    const size_t dot = key.find('.');
    KILN_CHECK(dot != std::string::npos && dot > 0, Value, name_, ": bad state key \"", key,
               "\" (expected <parameter index>.<name>)");
    int64_t index = -1;
    try {
      index = std::stoll(key.substr(0, dot));
    } catch (const std::exception&) {
    }
    auto it = by_index.find(index);
    KILN_CHECK(it != by_index.end(), Value, name_, ": state key \"", key,
               "\" names no parameter of the loaded param groups");
    const Tensor& p = *it->second;
    const std::string name = key.substr(dot + 1);
    autograd::NoGradGuard no_grad;
    if (name == "step") {
      state[p.impl()][name] = t.detach().clone();
      continue;
    }
    KILN_CHECK(t.sizes() == p.sizes(), Value, name_, ": state \"", key, "\" has shape ", t.sizes(),
               " but parameter ", index, " has shape ", p.sizes());
    state[p.impl()][name] = t.detach().to(p.dtype(), p.device(), /*copy=*/true);
  }
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    Options options = sd.param_groups[gi].options;
    for (const auto& [key, value] : groups_[gi].options) options.emplace(key, value);
    groups_[gi].options = std::move(options);
  }
  state_ = std::move(state);
}

}  // namespace kiln::optim
