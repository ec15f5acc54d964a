// Passes over a captured program's graph, run by a pass manager that verifies the graph after
// each one (Note [Passes]).
//
// Note [Passes]: a captured graph is SSA with effects (Note [Capture]): an in-place op gets a new
// value, but an op that writes a Tensor[] argument (a fused optimizer step) mutates values that
// keep their ids, and views share storage. So a node "has effects" when it writes an argument,
// is a collective, or draws from an explicit generator, and:
// - DCE removes nodes without effects none of whose outputs is used (by a later node, a program
//   output or a .grad write), latest first, so whole dead chains go in one sweep;
// - CSE merges a node into an earlier one with the same op, the same input values and the same
//   attributes, but only between two nodes with effects: a write may change what a value holds.
// Random nodes of the default generator are pure here: the program reserves their counters as
// one block (Note [Random ops in a program]), so dropping one changes no other draw, but two of
// them are never merged (each draws its own numbers).
#include <cstdlib>
#include <iostream>
#include <map>

#include "program.h"

namespace kiln::compiler::detail {

bool has_effects(const Program& p, size_t i) {
  const ir::Node& n = p.graph.nodes()[i];
  const OpInfo& info = n.op->info();
  if (info.is_inplace || info.is_out || info.tags.has(OpTag::Collective) || p.generators[i])
    return true;
  for (int a = 0; a < info.num_args; ++a)
    if (info.args[a].is_mutable) return true;
  return false;
}

namespace {

// Keeps the nodes with keep[i], and the per-node tables in step.
void erase_nodes(Program& p, const std::vector<bool>& keep) {
  std::vector<ir::Node>& nodes = p.graph.nodes();
  std::vector<size_t> new_index(nodes.size(), SIZE_MAX);
  std::vector<ir::Node> kept_nodes;
  std::vector<std::optional<Generator>> kept_gens;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!keep[i]) continue;
    new_index[i] = kept_nodes.size();
    kept_nodes.push_back(std::move(nodes[i]));
    kept_gens.push_back(std::move(p.generators[i]));
  }
  std::vector<Program::SeedUse> uses;
  for (Program::SeedUse u : p.seed_uses) {
    if (new_index[u.node] == SIZE_MAX) continue;
    u.node = new_index[u.node];
    uses.push_back(u);
  }
  nodes = std::move(kept_nodes);
  p.generators = std::move(kept_gens);
  p.seed_uses = std::move(uses);
}

// Values some later consumer reads.
std::vector<bool> used_values(const Program& p) {
  std::vector<bool> used(static_cast<size_t>(p.graph.num_values()), false);
  for (ir::ValueId v : p.outputs)
    if (v >= 0) used[v] = true;
  for (const GradWrite& w : p.grad_writes)
    if (w.value >= 0) used[w.value] = true;
  return used;
}

}  // namespace

int dead_code_elimination(Program& p) {
  const auto& nodes = p.graph.nodes();
  std::vector<bool> used = used_values(p), keep(nodes.size(), true);
  int removed = 0;
  for (size_t i = nodes.size(); i-- > 0;) {
    bool live = has_effects(p, i);
    for (ir::ValueId o : nodes[i].outputs) live = live || used[o];
    if (!live) {
      keep[i] = false;
      ++removed;
      continue;
    }
    for (ir::ValueId v : nodes[i].inputs()) used[v] = true;
  }
  if (removed) erase_nodes(p, keep);
  return removed;
}

int common_subexpression_elimination(Program& p) {
  std::vector<ir::Node>& nodes = p.graph.nodes();
  std::vector<ir::ValueId> replace(static_cast<size_t>(p.graph.num_values()));
  for (ir::ValueId v = 0; v < p.graph.num_values(); ++v) replace[v] = v;
  std::map<std::string, size_t> seen;  // node key -> first node
  std::vector<bool> keep(nodes.size(), true);
  int merged = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    ir::Node& n = nodes[i];
    for (ir::NodeArg& a : n.args)
      for (ir::ValueId& v : a.values()) v = replace[v];
    if (has_effects(p, i)) {
      seen.clear();
      continue;
    }
    if (n.rng || n.outputs.empty()) continue;
    std::string key = n.op_name;
    for (const ir::NodeArg& a : n.args) {
      key += a.is_attribute() ? "|" + a.attribute().repr() : "|";
      for (ir::ValueId v : a.values()) key += "%" + std::to_string(v);
    }
    auto [it, fresh] = seen.emplace(key, i);
    if (fresh) continue;
    const ir::Node& first = nodes[it->second];
    for (size_t k = 0; k < n.outputs.size(); ++k) replace[n.outputs[k]] = first.outputs[k];
    keep[i] = false;
    ++merged;
  }
  if (!merged) return 0;
  for (ir::ValueId& v : p.outputs)
    if (v >= 0) v = replace[v];
  for (GradWrite& w : p.grad_writes)
    if (w.value >= 0) w.value = replace[w.value];
  erase_nodes(p, keep);
  std::vector<ir::ValueRef> outs;
  for (ir::ValueId v : p.outputs)
    if (v >= 0) outs.push_back(ir::ValueRef{v});
  p.graph.set_outputs(outs);
  return merged;
}

std::string run_passes(Program& p) {
  struct Pass {
    const char* name;
    int (*run)(Program&);
  };
  static constexpr Pass kPasses[] = {{"cse", &common_subexpression_elimination},
                                     {"dce", &dead_code_elimination}};
  const bool print = std::getenv("KILN_COMPILE_PRINT") != nullptr;
  if (print) std::cerr << "kiln.compile: captured\n" << p.graph;
  for (const Pass& pass : kPasses) {
    const int changed = pass.run(p);
    std::vector<std::string> problems = ir::verify(p.graph);
    if (!problems.empty()) return std::string("after pass ") + pass.name + ": " + problems[0];
    if (print) std::cerr << "kiln.compile: after " << pass.name << " (" << changed << ")\n" << p.graph;
  }
  return "";
}

}  // namespace kiln::compiler::detail
