// Module: registration, listings, state dicts, modes, moves and repr (kiln/nn/module.h).
#include "kiln/nn/module.h"

#include <algorithm>
#include <sstream>

#include "kiln/autograd/grad_mode.h"

namespace kiln::nn {

// ---- StateDict ----------------------------------------------------------------------------------

void StateDict::insert(const std::string& key, Tensor value) {
  auto it = index_.find(key);
  if (it != index_.end()) {
    items_[it->second].second = std::move(value);
    return;
  }
  index_.emplace(key, items_.size());
  items_.emplace_back(key, std::move(value));
}

const Tensor& StateDict::at(const std::string& key) const {
  auto it = index_.find(key);
  KILN_CHECK(it != index_.end(), Index, "StateDict: no key \"", key, "\"");
  return items_[it->second].second;
}

std::vector<std::string> StateDict::keys() const {
  std::vector<std::string> out;
  out.reserve(items_.size());
  for (const Item& it : items_) out.push_back(it.first);
  return out;
}

// ---- registration -------------------------------------------------------------------------------

Tensor Module::forward(const Tensor&) {
  KILN_FAIL(NotImplemented, type_name_, " has no single-input forward(Tensor)");
}

static void check_name(const std::string& kind, const std::string& name) {
  KILN_CHECK(!name.empty() && name.find('.') == std::string::npos, Value, kind,
             " name must be non-empty and contain no '.', got \"", name, "\"");
}

static bool name_taken(const std::string& name, const std::vector<std::pair<std::string, ModulePtr>>& c) {
  return std::any_of(c.begin(), c.end(), [&](const auto& p) { return p.first == name; });
}

Tensor& Module::add_slot(std::vector<Slot>& table, const std::string& kind,
                         const std::string& name, Tensor value, Tensor* slot, bool persistent) {
  check_name(kind, name);
  auto same = [&](const Slot& s) { return s.name == name; };
  bool taken = std::any_of(params_.begin(), params_.end(), same) ||
               std::any_of(buffers_.begin(), buffers_.end(), same) || name_taken(name, children_);
  KILN_CHECK(!taken, Value, type_name_, ": attribute \"", name, "\" is already registered");
  if (slot == nullptr) {
    owned_.push_back(std::make_unique<Tensor>());
    slot = owned_.back().get();
  }
  *slot = std::move(value);
  table.push_back({name, slot, persistent});
  return *slot;
}

Tensor& Module::register_parameter(const std::string& name, Tensor value, Tensor* slot,
                                   bool requires_grad) {
  if (value.defined() && requires_grad) {
    KILN_CHECK(is_floating(value.dtype()), Type, type_name_, ": parameter \"", name,
               "\" must be floating point to require grad, got ", scalar_type_name(value.dtype()));
    if (!value.is_leaf()) value = value.detach();
    value.requires_grad_(true);
  }
  return add_slot(params_, "parameter", name, std::move(value), slot, true);
}

Tensor& Module::register_buffer(const std::string& name, Tensor value, Tensor* slot,
                                bool persistent) {
  return add_slot(buffers_, "buffer", name, std::move(value), slot, persistent);
}

void Module::add_child(const std::string& name, ModulePtr module) {
  check_name("module", name);
  KILN_CHECK(module != nullptr, Value, type_name_, ": child \"", name, "\" is null");
  auto same = [&](const Slot& s) { return s.name == name; };
  bool taken = std::any_of(params_.begin(), params_.end(), same) ||
               std::any_of(buffers_.begin(), buffers_.end(), same) || name_taken(name, children_);
  KILN_CHECK(!taken, Value, type_name_, ": attribute \"", name, "\" is already registered");
  children_.emplace_back(name, std::move(module));
}

void Module::replace_module(const std::string& name, ModulePtr module) {
  KILN_CHECK(module != nullptr, Value, type_name_, ": child \"", name, "\" is null");
  for (auto& c : children_) {
    if (c.first != name) continue;
    c.second = std::move(module);
    return;
  }
  KILN_FAIL(Index, type_name_, " has no child module \"", name, "\"");
}

Tensor& Module::param(const std::string& name) {
  for (Slot& s : params_)
    if (s.name == name) return *s.tensor;
  KILN_FAIL(Index, type_name_, " has no parameter \"", name, "\"");
}

Tensor& Module::buffer(const std::string& name) {
  for (Slot& s : buffers_)
    if (s.name == name) return *s.tensor;
  KILN_FAIL(Index, type_name_, " has no buffer \"", name, "\"");
}

ModulePtr Module::child(const std::string& name) const {
  for (const auto& c : children_)
    if (c.first == name) return c.second;
  KILN_FAIL(Index, type_name_, " has no child module \"", name, "\"");
}

// ---- listings -----------------------------------------------------------------------------------

void Module::collect(const std::string& prefix, bool params, bool recurse, bool persistent_only,
                     bool dedupe, std::vector<std::pair<std::string, Tensor>>& out,
                     std::vector<const TensorImpl*>& seen) const {
  for (const Slot& s : params ? params_ : buffers_) {
    if (!s.tensor->defined() || (persistent_only && !s.persistent)) continue;
    if (dedupe) {
      const TensorImpl* impl = s.tensor->impl();
      if (std::find(seen.begin(), seen.end(), impl) != seen.end()) continue;
      seen.push_back(impl);
    }
    out.emplace_back(prefix + s.name, *s.tensor);
  }
  if (!recurse) return;
  for (const auto& [name, m] : children_)
    m->collect(prefix + name + ".", params, true, persistent_only, dedupe, out, seen);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::vector<const TensorImpl*> seen;
  collect("", true, recurse, false, true, out, seen);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& p : named_parameters(recurse)) out.push_back(std::move(p.second));
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::vector<const TensorImpl*> seen;
  collect("", false, recurse, false, true, out, seen);
  return out;
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& b : named_buffers(recurse)) out.push_back(std::move(b.second));
  return out;
}

std::vector<ModulePtr> Module::children() const {
  std::vector<ModulePtr> out;
  for (const auto& c : children_) out.push_back(c.second);
  return out;
}

void Module::collect_modules(const std::string& prefix,
                             std::vector<std::pair<std::string, ModulePtr>>& out,
                             std::vector<const Module*>& seen) {
  for (const auto& [name, m] : children_) {
    if (std::find(seen.begin(), seen.end(), m.get()) != seen.end()) continue;
    seen.push_back(m.get());
    std::string full = prefix.empty() ? name : prefix + "." + name;
    out.emplace_back(full, m);
    m->collect_modules(full, out, seen);
  }
}

std::vector<std::pair<std::string, ModulePtr>> Module::named_modules(const std::string& prefix) {
  std::vector<std::pair<std::string, ModulePtr>> out;
  // A module held by a shared_ptr lists itself as that pointer; one on the stack, without owning.
  ModulePtr self = weak_from_this().lock();
  if (!self) self = ModulePtr(ModulePtr(), this);
  out.emplace_back(prefix, self);
  std::vector<const Module*> seen = {this};
  collect_modules(prefix, out, seen);
  return out;
}

std::vector<ModulePtr> Module::modules() {
  std::vector<ModulePtr> out;
  for (auto& m : named_modules()) out.push_back(std::move(m.second));
  return out;
}

// ---- state dicts --------------------------------------------------------------------------------

StateDict Module::state_dict() const {
  std::vector<std::pair<std::string, Tensor>> entries;
  std::vector<const TensorImpl*> seen;
  // PyTorch's order per module: its parameters, its persistent buffers, then each child.
  std::function<void(const Module&, const std::string&)> walk = [&](const Module& m,
                                                                   const std::string& prefix) {
    m.collect(prefix, true, false, false, false, entries, seen);
    m.collect(prefix, false, false, true, false, entries, seen);
    for (const auto& [name, c] : m.children_) walk(*c, prefix + name + ".");
  };
  walk(*this, "");
  StateDict sd;
  for (auto& [k, v] : entries) sd.insert(k, v.detach());
  return sd;
}

static std::string join_keys(const std::vector<std::string>& keys) {
  std::string s;
  for (size_t i = 0; i < keys.size(); ++i) s += (i ? ", \"" : "\"") + keys[i] + "\"";
  return s;
}

LoadResult Module::load_state_dict(const StateDict& state, bool strict) {
  std::vector<std::pair<std::string, Tensor*>> targets;
  std::function<void(Module&, const std::string&)> walk = [&](Module& m, const std::string& p) {
    for (Slot& s : m.params_)
      if (s.tensor->defined()) targets.emplace_back(p + s.name, s.tensor);
    for (Slot& s : m.buffers_)
      if (s.tensor->defined() && s.persistent) targets.emplace_back(p + s.name, s.tensor);
    for (auto& [name, c] : m.children_) walk(*c, p + name + ".");
  };
  walk(*this, "");

  LoadResult result;
  std::vector<std::string> expected;
  for (auto& [key, t] : targets) {
    expected.push_back(key);
    if (!state.contains(key)) {
      result.missing_keys.push_back(key);
      continue;
    }
    const Tensor& src = state.at(key);
    KILN_CHECK(src.sizes() == t->sizes(), Runtime, "Error(s) in loading state_dict for ",
               type_name_, ": size mismatch for ", key, ": copying a param with shape ",
               src.sizes(), " from checkpoint, the shape in current model is ", t->sizes());
  }
  for (const auto& [key, v] : state)
    if (std::find(expected.begin(), expected.end(), key) == expected.end())
      result.unexpected_keys.push_back(key);
  if (strict && (!result.missing_keys.empty() || !result.unexpected_keys.empty())) {
    std::string msg;
    if (!result.missing_keys.empty())
      msg += " Missing key(s) in state_dict: " + join_keys(result.missing_keys) + ".";
    if (!result.unexpected_keys.empty())
      msg += " Unexpected key(s) in state_dict: " + join_keys(result.unexpected_keys) + ".";
    KILN_FAIL(Runtime, "Error(s) in loading state_dict for ", type_name_, ":", msg);
  }
  autograd::NoGradGuard no_grad;
  for (auto& [key, t] : targets)
    if (state.contains(key)) t->copy_(state.at(key));
  return result;
}

// ---- modes, moves -------------------------------------------------------------------------------

void Module::train(bool on) {
  training_ = on;
  for (auto& c : children_) c.second->train(on);
}

Module& Module::apply(const std::function<void(Module&)>& fn) {
  for (auto& c : children_) c.second->apply(fn);
  fn(*this);
  return *this;
}

static Tensor moved(const Tensor& t, std::optional<Device> device, std::optional<ScalarType> dtype) {
  std::optional<ScalarType> dt = dtype && is_floating(t.dtype()) ? dtype : std::nullopt;
  return t.to(dt, device);
}

Module& Module::to(std::optional<Device> device, std::optional<ScalarType> dtype) {
  autograd::NoGradGuard no_grad;
  for (Slot& s : params_) {
    Tensor& p = *s.tensor;
    if (!p.defined()) continue;
    Tensor grad = p.grad();
    Tensor np = moved(p, device, dtype);
    if (np.is_same(p)) continue;
    np = np.detach();
    np.requires_grad_(p.requires_grad());
    if (grad.defined()) np.set_grad(moved(grad, device, dtype));
    p = np;
  }
  for (Slot& s : buffers_)
    if (s.tensor->defined()) *s.tensor = moved(*s.tensor, device, dtype);
  for (auto& c : children_) c.second->to(device, dtype);
  return *this;
}

void Module::zero_grad(bool set_to_none) {
  for (Tensor& p : parameters()) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (set_to_none) {
      p.set_grad(Tensor());
    } else {
      autograd::NoGradGuard no_grad;
      g.zero_();
    }
  }
}

// ---- repr ---------------------------------------------------------------------------------------

static std::string indent_tail(const std::string& s) {
  std::string out;
  for (char c : s) {
    out += c;
    if (c == '\n') out += "  ";
  }
  return out;
}

std::string Module::repr() const {
  std::string extra = extra_repr();
  if (children_.empty()) return type_name_ + "(" + extra + ")";
  std::ostringstream os;
  os << type_name_ << "(";
  if (!extra.empty()) os << "\n  " << indent_tail(extra);
  for (const auto& [name, c] : children_) os << "\n  (" << name << "): " << indent_tail(c->repr());
  os << "\n)";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Module& m) { return os << m.repr(); }

}  // namespace kiln::nn
