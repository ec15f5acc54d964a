// Sequential, ModuleList, ModuleDict (kiln/nn/containers.h).
#include "kiln/nn/containers.h"

namespace kiln::nn {

static ModulePtr at_index(const Module& m, const std::vector<ModulePtr>& items, int64_t index) {
  const int64_t n = static_cast<int64_t>(items.size());
  KILN_CHECK(index >= -n && index < n, Index, m.type_name(), ": index ", index,
             " is out of range for ", n, " modules");
  return items[index < 0 ? index + n : index];
}

Sequential::Sequential(std::vector<ModulePtr> modules) : Module("Sequential") {
  for (auto& m : modules) push_back(std::move(m));
}

void Sequential::push_back(ModulePtr module) {
  add_child(std::to_string(children().size()), std::move(module));
}

ModulePtr Sequential::operator[](int64_t index) const { return at_index(*this, children(), index); }

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  for (const ModulePtr& m : children()) x = m->forward(x);
  return x;
}

ModuleList::ModuleList(std::vector<ModulePtr> modules) : Module("ModuleList") {
  for (auto& m : modules) push_back(std::move(m));
}

void ModuleList::push_back(ModulePtr module) {
  add_child(std::to_string(items_.size()), module);
  items_.push_back(std::move(module));
}

ModulePtr ModuleList::operator[](int64_t index) const { return at_index(*this, items_, index); }
std::vector<ModulePtr>::const_iterator ModuleList::begin() const { return items_.begin(); }
std::vector<ModulePtr>::const_iterator ModuleList::end() const { return items_.end(); }

ModuleDict::ModuleDict(std::vector<std::pair<std::string, ModulePtr>> modules)
    : Module("ModuleDict") {
  for (auto& [k, m] : modules) insert(k, std::move(m));
}

bool ModuleDict::contains(const std::string& key) const {
  for (const auto& c : named_children())
    if (c.first == key) return true;
  return false;
}

void ModuleDict::insert(const std::string& key, ModulePtr module) {
  if (contains(key)) {
    replace_module(key, std::move(module));
    return;
  }
  add_child(key, std::move(module));
}

std::vector<std::string> ModuleDict::keys() const {
  std::vector<std::string> out;
  for (const auto& c : named_children()) out.push_back(c.first);
  return out;
}

}  // namespace kiln::nn
