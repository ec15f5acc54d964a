// kiln/optim/optimizer.h: the Optimizer base class (PyTorch's torch.optim.Optimizer): param
// groups with their own options, per-parameter state, zero_grad, state_dict/load_state_dict.
//
//   std::vector<kiln::Tensor> params = {w, b};             // leaf tensors that require grad
//   kiln::optim::SGD opt(params, {.lr = 0.1, .momentum = 0.9});
//   loss.backward();
//   opt.step();                                            // updates w and b in place
//   opt.zero_grad();                                       // clears their .grad
#pragma once

#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/tensor.h"

namespace kiln::optim {

// The options of a param group, by PyTorch's names (lr, momentum, weight_decay, ...; Adam's betas
// are beta1 and beta2; booleans are 0 or 1). Numbers only, so a checkpoint stores them as JSON.
using Options = std::map<std::string, double>;

// Parameters with options of their own; a key the group leaves out takes the optimizer's default.
struct ParamGroup {
  std::vector<Tensor> params;
  Options options;
};

// Note [Optimizer state dict]: an optimizer's state as flat tensors plus options, as a checkpoint
// stores them. Parameters are numbered in group order, as PyTorch does; `state` holds
// "<index>.<name>" (for example "0.momentum_buffer", "3.exp_avg", "3.step"), and each group lists
// its options and the indices of its parameters.
struct StateDict {
  struct Group {
    Options options;
    std::vector<int64_t> params;
  };
  std::map<std::string, Tensor> state;
  std::vector<Group> param_groups;

  // The param groups as JSON ({"param_groups": [{"lr": 0.1, ..., "params": [0, 1]}]}), and back.
  std::string groups_to_json() const;
  static std::vector<Group> groups_from_json(const std::string& json);
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient (those without are skipped), as under
  // no_grad.
  virtual void step() = 0;
  // Clears the parameters' gradients: undefined (set_to_none), or zero-filled.
  void zero_grad(bool set_to_none = true);

  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // Appends a group; its options must be known keys of this optimizer, and none of its parameters
  // may already be in a group.
  void add_param_group(ParamGroup group);
  const Options& defaults() const { return defaults_; }

  // The state tensors of one parameter (empty before its first step).
  const std::map<std::string, Tensor>& state_of(const Tensor& param) const;

  // Note [Optimizer state dict]. load_state_dict checks that the group and parameter counts match
  // and copies each state tensor (cast to the parameter's dtype and device, except "step").
  StateDict state_dict() const;
  void load_state_dict(const StateDict& sd);

 protected:
  Optimizer(std::vector<ParamGroup> groups, Options defaults, const char* name);
  // The state of `param`, created on first use.
  std::map<std::string, Tensor>& state(const Tensor& param) { return state_[param.impl()]; }
  bool has_state(const Tensor& param) const { return state_.count(param.impl()) != 0; }
  // The parameters of `group` that have a gradient, and those gradients.
  static void params_with_grad(const ParamGroup& group, std::vector<Tensor>& params,
                               std::vector<Tensor>& grads);
  const char* name_;

 private:
  Options defaults_;
  std::vector<ParamGroup> groups_;
  std::unordered_map<const TensorImpl*, std::map<std::string, Tensor>> state_;
};

}  // namespace kiln::optim
