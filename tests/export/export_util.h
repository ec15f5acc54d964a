// What the export and static-quantization tests share: a module's forward as the function
// export_program captures, and options with a symbolic batch and the module's weights named.
#pragma once

#include <string>
#include <vector>

#include "kiln/exported_program.h"
#include "kiln/nn/nn.h"

namespace kiln::testing {

inline compiler::Fn forward_of(const nn::ModulePtr& m) {
  return [m](const std::vector<Tensor>& in) { return std::vector<Tensor>{m->forward(in[0])}; };
}

// Inputs named `names`, dim 0 of the first one the symbol "batch"; with `m`, its parameters and
// buffers stored under their state-dict names.
inline ExportOptions batch_dynamic(const std::vector<std::string>& names,
                                   const nn::ModulePtr& m = nullptr) {
  ExportOptions o;
  o.input_names = names;
  o.dynamic_dims = {{.input = 0, .dim = 0, .name = "batch"}};
  if (m == nullptr) return o;
  for (const auto& [name, t] : m->named_parameters()) o.weight_names.emplace_back(name, t);
  for (const auto& [name, t] : m->named_buffers()) o.weight_names.emplace_back(name, t);
  return o;
}

}  // namespace kiln::testing
