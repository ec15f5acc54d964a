// kiln/nn/module.h: Module, the base of every layer (PyTorch's nn.Module): parameters, buffers,
// child modules, state dicts, train/eval, dtype/device moves and a PyTorch-style repr.
//
//   auto net = std::make_shared<kiln::nn::Sequential>(std::vector<kiln::nn::ModulePtr>{
//       std::make_shared<kiln::nn::Linear>(4, 8), std::make_shared<kiln::nn::ReLU>()});
//   kiln::Tensor y = net->forward(x);                       // or (*net)(x)
//   kiln::nn::StateDict sd = net->state_dict();             // "0.weight", "0.bias"
//   net->load_state_dict(sd);                               // strict: missing/unexpected keys raise
//   std::cout << *net;                                      // Sequential(\n  (0): Linear(...
//
// Note [Parameter slots]: a layer keeps its parameters in ordinary members (`Tensor weight;`)
// and registers their addresses: register_parameter("weight", value, &weight). The module's
// tables hold pointers to those slots, so to(), load_state_dict() and the optimizer-facing
// parameters() all see the member itself, and to() can replace it with a converted tensor.
// A parameter registered without a slot lives in storage the module owns (param(name)).
// An undefined value registers a None parameter (Linear's bias=false), skipped by every listing.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln/kiln.h"

namespace kiln::nn {

class Module;
using ModulePtr = std::shared_ptr<Module>;

// Name -> tensor, in insertion order (PyTorch's OrderedDict state dicts).
class StateDict {
 public:
  using Item = std::pair<std::string, Tensor>;
  // Adds or replaces `key`.
  void insert(const std::string& key, Tensor value);
  bool contains(const std::string& key) const { return index_.count(key) != 0; }
  // KeyError-style IndexError naming the key when absent.
  const Tensor& at(const std::string& key) const;
  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  std::vector<std::string> keys() const;
  std::vector<Item>::const_iterator begin() const { return items_.begin(); }
  std::vector<Item>::const_iterator end() const { return items_.end(); }

 private:
  std::vector<Item> items_;
  std::unordered_map<std::string, size_t> index_;
};

// What load_state_dict(strict=false) could not match.
struct LoadResult {
  std::vector<std::string> missing_keys;
  std::vector<std::string> unexpected_keys;
};

class Module : public std::enable_shared_from_this<Module> {
 public:
  // `type_name` is what repr() prints ("Linear").
  explicit Module(std::string type_name = "Module") : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  const std::string& type_name() const { return type_name_; }

  // The single-input forward of most layers; modules with other signatures add overloads.
  // The default raises NotImplementedError naming the module type.
  virtual Tensor forward(const Tensor& input);
  Tensor operator()(const Tensor& input) { return forward(input); }

  // Registration (Note [Parameter slots]). Names must be new, non-empty and free of '.'.
  Tensor& register_parameter(const std::string& name, Tensor value, Tensor* slot = nullptr,
                             bool requires_grad = true);
  Tensor& register_buffer(const std::string& name, Tensor value, Tensor* slot = nullptr,
                          bool persistent = true);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }
  // Replaces an existing child (the new module keeps its position in the listings).
  void replace_module(const std::string& name, ModulePtr module);

  // Lookup by local name; IndexError when absent.
  Tensor& param(const std::string& name);
  Tensor& buffer(const std::string& name);
  ModulePtr child(const std::string& name) const;

  // Listings in registration order, recursing into children with dotted names; a tensor or
  // module reachable twice is listed once (PyTorch's de-duplication).
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  std::vector<ModulePtr> children() const;
  std::vector<std::pair<std::string, ModulePtr>> named_children() const { return children_; }
  // This module first (named ""), then its descendants, depth first.
  std::vector<ModulePtr> modules();
  std::vector<std::pair<std::string, ModulePtr>> named_modules(const std::string& prefix = "");

  // Parameters and persistent buffers, detached (sharing storage), keyed by dotted names.
  StateDict state_dict() const;
  // Copies values into the module's tensors (no autograd; dtype converted, shapes must match).
  // strict: raises RuntimeError listing every missing and unexpected key; nothing is copied
  // unless every key matches. A shape mismatch always raises, naming the key and both shapes.
  LoadResult load_state_dict(const StateDict& state, bool strict = true);

  // Training mode, recursively (Dropout, BatchNorm read it).
  virtual void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Calls fn on every descendant, then on this module (PyTorch's order).
  Module& apply(const std::function<void(Module&)>& fn);

  // Moves parameters, buffers and gradients; dtype changes apply to floating tensors only.
  Module& to(std::optional<Device> device, std::optional<ScalarType> dtype = std::nullopt);
  Module& to(ScalarType dtype) { return to(std::nullopt, dtype); }
  Module& to(Device device) { return to(device, std::nullopt); }

  // Clears gradients (set_to_none) or zeroes them in place.
  void zero_grad(bool set_to_none = true);

  // PyTorch's repr: "Linear(in_features=2, out_features=3, bias=True)", children indented.
  std::string repr() const;
  // The text inside the parentheses; layers override it.
  virtual std::string extra_repr() const { return ""; }

 protected:
  void add_child(const std::string& name, ModulePtr module);

 private:
  struct Slot {
    std::string name;
    Tensor* tensor;
    bool persistent;  // buffers only
  };
  Tensor& add_slot(std::vector<Slot>& table, const std::string& kind, const std::string& name,
                   Tensor value, Tensor* slot, bool persistent);
  void collect(const std::string& prefix, bool params, bool recurse, bool persistent_only,
               bool dedupe, std::vector<std::pair<std::string, Tensor>>& out,
               std::vector<const TensorImpl*>& seen) const;
  void collect_modules(const std::string& prefix, std::vector<std::pair<std::string, ModulePtr>>& out,
                       std::vector<const Module*>& seen);

  std::string type_name_;
  bool training_ = true;
  std::vector<Slot> params_;
  std::vector<Slot> buffers_;
  std::vector<std::unique_ptr<Tensor>> owned_;  // slots of tensors registered without a member
  std::vector<std::pair<std::string, ModulePtr>> children_;
};

std::ostream& operator<<(std::ostream& os, const Module& m);

}  // namespace kiln::nn
