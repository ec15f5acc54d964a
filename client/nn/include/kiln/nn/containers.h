// kiln/nn/containers.h: Sequential, ModuleList and ModuleDict (torch.nn's containers). Children
// are named "0", "1", ... (or by key), so state-dict keys match PyTorch's ("0.weight").
//
//   auto mlp = std::make_shared<kiln::nn::Sequential>(std::vector<kiln::nn::ModulePtr>{
//       std::make_shared<kiln::nn::Linear>(784, 128), std::make_shared<kiln::nn::ReLU>(),
//       std::make_shared<kiln::nn::Linear>(128, 10)});
//   kiln::Tensor logits = mlp->forward(x);
//   auto blocks = std::make_shared<kiln::nn::ModuleList>();  blocks->push_back(layer);
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "kiln/nn/module.h"

namespace kiln::nn {

// Runs its children in order, each on the previous one's output.
class Sequential : public Module {
 public:
  explicit Sequential(std::vector<ModulePtr> modules = {});
  Tensor forward(const Tensor& input) override;
  void push_back(ModulePtr module);
  size_t size() const { return children().size(); }
  // Python-style index (negative counts from the end); IndexError when out of range.
  ModulePtr operator[](int64_t index) const;
};

// Holds modules by position; has no forward.
class ModuleList : public Module {
 public:
  explicit ModuleList(std::vector<ModulePtr> modules = {});
  void push_back(ModulePtr module);
  size_t size() const { return children().size(); }
  ModulePtr operator[](int64_t index) const;
  std::vector<ModulePtr>::const_iterator begin() const;
  std::vector<ModulePtr>::const_iterator end() const;

 private:
  std::vector<ModulePtr> items_;
};

// Holds modules by key, in insertion order; has no forward.
class ModuleDict : public Module {
 public:
  explicit ModuleDict(std::vector<std::pair<std::string, ModulePtr>> modules = {});
  // Adds `key`, or replaces its module in place.
  void insert(const std::string& key, ModulePtr module);
  bool contains(const std::string& key) const;
  ModulePtr operator[](const std::string& key) const { return child(key); }
  size_t size() const { return named_children().size(); }
  std::vector<std::string> keys() const;
};

}  // namespace kiln::nn
