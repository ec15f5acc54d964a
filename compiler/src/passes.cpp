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
#include <algorithm>
#include <functional>
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

// Rebuilds the node list as `order` (old indices; those left out are dropped), keeping the
// per-node tables in step.
void reorder_nodes(Program& p, const std::vector<size_t>& order) {
  std::vector<ir::Node>& nodes = p.graph.nodes();
  std::vector<size_t> new_index(nodes.size(), SIZE_MAX);
  std::vector<ir::Node> kept_nodes;
  std::vector<std::optional<Generator>> kept_gens;
  std::vector<Phase> kept_phases;
  for (size_t i : order) {
    new_index[i] = kept_nodes.size();
    kept_nodes.push_back(std::move(nodes[i]));
    kept_gens.push_back(std::move(p.generators[i]));
    kept_phases.push_back(p.phases[i]);
  }
  std::vector<Program::SeedUse> uses;
  for (Program::SeedUse u : p.seed_uses) {
    if (new_index[u.node] == SIZE_MAX) continue;
    u.node = new_index[u.node];
    uses.push_back(u);
  }
  nodes = std::move(kept_nodes);
  p.generators = std::move(kept_gens);
  p.phases = std::move(kept_phases);
  p.seed_uses = std::move(uses);
}

// Maps the values the program hands out (outputs, .grad writes, input gradients) through `f`,
// and the graph's outputs with them.
template <typename F>
void remap_results(Program& p, const F& f) {
  for (ir::ValueId& v : p.outputs)
    if (v >= 0) v = f(v);
  for (GradWrite& w : p.grad_writes)
    if (w.value >= 0) w.value = f(w.value);
  for (ir::ValueId& v : p.input_grads)
    if (v >= 0) v = f(v);
  std::vector<ir::ValueRef> outs;
  for (ir::ValueId v : p.outputs)
    if (v >= 0) outs.push_back(ir::ValueRef{v});
  p.graph.set_outputs(outs);
}

void erase_nodes(Program& p, const std::vector<bool>& keep) {
  std::vector<size_t> order;
  for (size_t i = 0; i < keep.size(); ++i)
    if (keep[i]) order.push_back(i);
  reorder_nodes(p, order);
}

}  // namespace

void replace_uses(Program& p, ir::ValueId from, ir::ValueId to) {
  auto swap = [&](ir::ValueId v) { return v == from ? to : v; };
  for (ir::Node& n : p.graph.nodes())
    for (ir::NodeArg& a : n.args)
      for (ir::ValueId& v : a.values()) v = swap(v);
  remap_results(p, swap);
}

GraphEdit::GraphEdit(Program& p)
    : p_(p), n0_(p.graph.nodes().size()), keep_(n0_, true), before_(n0_) {}

std::vector<ir::ValueId> GraphEdit::add_before(size_t at, std::string_view op,
                                               std::vector<ir::NodeArg> args, Phase phase) {
  std::vector<ir::ValueRef> outs = p_.graph.add_node(op, std::move(args));
  p_.generators.emplace_back();
  p_.phases.push_back(phase);
  before_[at].push_back(p_.graph.nodes().size() - 1);
  ++added_;
  std::vector<ir::ValueId> ids;
  for (ir::ValueRef r : outs) ids.push_back(r.id);
  return ids;
}


int GraphEdit::commit() {
  std::vector<size_t> order;
  for (size_t i = 0; i < n0_; ++i) {
    order.insert(order.end(), before_[i].begin(), before_[i].end());
    if (keep_[i]) order.push_back(i);
  }
  reorder_nodes(p_, order);
  return added_;
}

std::vector<bool> program_results(const Program& p) {
  std::vector<bool> used(static_cast<size_t>(p.graph.num_values()), false);
  for (ir::ValueId v : p.outputs)
    if (v >= 0) used[v] = true;
  for (const GradWrite& w : p.grad_writes)
    if (w.value >= 0) used[w.value] = true;
  for (ir::ValueId v : p.input_grads)
    if (v >= 0) used[v] = true;
  return used;
}

int dead_code_elimination(Program& p) {
  const auto& nodes = p.graph.nodes();
  std::vector<bool> used = program_results(p), keep(nodes.size(), true);
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
  remap_results(p, [&](ir::ValueId v) { return replace[v]; });
  erase_nodes(p, keep);
  return merged;
}

// ---- value helpers --------------------------------------------------------------------------

std::vector<int64_t> producers(const Program& p) {
  std::vector<int64_t> prod(static_cast<size_t>(p.graph.num_values()), -1);
  const auto& nodes = p.graph.nodes();
  for (size_t i = 0; i < nodes.size(); ++i)
    for (ir::ValueId o : nodes[i].outputs) prod[o] = static_cast<int64_t>(i);
  return prod;
}

ir::ValueId aliased_arg(const Program& p, const std::vector<int64_t>& prod, ir::ValueId v) {
  if (prod[v] < 0) return -1;
  const int a = p.graph.value(v).meta.alias_of;
  const ir::Node& n = p.graph.nodes()[prod[v]];
  if (a < 0 || a >= static_cast<int>(n.args.size()) || !n.args[a].is_value()) return -1;
  return n.args[a].values()[0];
}

namespace {

// The value a view output looks into (-1: `v` is not made by a view node).
ir::ValueId view_source(const Program& p, const std::vector<int64_t>& prod, ir::ValueId v) {
  if (prod[v] < 0 || !p.graph.nodes()[prod[v]].op->info().is_view) return -1;
  return aliased_arg(p, prod, v);
}

ir::ValueId root_of(const Program& p, const std::vector<int64_t>& prod, ir::ValueId v) {
  for (ir::ValueId s = view_source(p, prod, v); s >= 0; s = view_source(p, prod, v = s)) {
  }
  return v;
}

}  // namespace

// ---- constant folding ----------------------------------------------------------------------------
//
// Note [Constant folding]: a node folds when it draws no random numbers, has no effect other
// than writing its own argument in place (ones() is empty() then fill_()), and reads only folded
// values or captured wrapped numbers: a mask built from ones() and tril() each step, an arange.
// The pass runs those nodes once, at capture, and the values other nodes read become captured
// inputs holding the results; DCE then drops the folded nodes. A storage that an unfolded effect
// touches (a buffer filled and then accumulated into), or that the program returns or assigns
// to a .grad, is never folded: each run must get its own.

int constant_folding(Program& p) {
  std::vector<ir::Node>& nodes = p.graph.nodes();
  const size_t nv = static_cast<size_t>(p.graph.num_values());
  const std::vector<int64_t> prod = producers(p);
  const std::vector<ir::ValueId>& in = p.graph.inputs();
  std::vector<bool> tainted(nv, false);
  for (ir::ValueId v : p.outputs)
    if (v >= 0) tainted[root_of(p, prod, v)] = true;
  for (const GradWrite& w : p.grad_writes)
    if (w.value >= 0) tainted[root_of(p, prod, w.value)] = true;
  for (ir::ValueId v : p.input_grads)
    if (v >= 0) tainted[root_of(p, prod, v)] = true;
  std::vector<bool> folded, in_fold;
  std::vector<size_t> fold_nodes;
  for (bool changed = true; changed;) {
    folded.assign(nv, false);
    in_fold.assign(nodes.size(), false);
    fold_nodes.clear();
    for (size_t k = 0; k < in.size(); ++k)
      if (p.graph.value(in[k]).number && p.sources[k].kind == InputSource::Kind::Captured)
        folded[in[k]] = true;
    for (size_t i = 0; i < nodes.size(); ++i) {
      const ir::Node& n = nodes[i];
      const OpInfo& info = n.op->info();
      // An in-place op may fold (filling a fresh empty tensor is how ones() is made); any
      // other effect may not.
      const bool effects = has_effects(p, i);
      if ((effects && (!info.is_inplace || info.is_out || p.generators[i])) || n.rng ||
          info.is_random || n.outputs.empty() || info.tags.has(OpTag::Nondeterministic))
        continue;
      bool ok = true;
      for (ir::ValueId u : n.inputs()) ok = ok && folded[u];
      for (ir::ValueId o : n.outputs) ok = ok && !tainted[root_of(p, prod, o)];
      if (!ok) continue;
      for (ir::ValueId o : n.outputs) folded[o] = true;
      in_fold[i] = true;
      fold_nodes.push_back(i);
    }
    // A storage that an unfolded effect writes or reads must be made fresh at every run.
    changed = false;
    for (size_t i = 0; i < nodes.size(); ++i)
      if (!in_fold[i] && has_effects(p, i))
        for (ir::ValueId u : nodes[i].inputs()) {
          const ir::ValueId r = root_of(p, prod, u);
          if (folded[u] && !tainted[r]) tainted[r] = changed = true;
        }
  }
  if (fold_nodes.empty()) return 0;
  // Evaluate the folded nodes once.
  std::vector<Tensor> env(nv);
  for (size_t k = 0; k < in.size(); ++k)
    if (folded[in[k]]) env[in[k]] = p.sources[k].tensor;
  {
    ExcludeDispatchKeyGuard below(DispatchKeySet::all() - DispatchKeySet::backends());
    for (size_t i : fold_nodes) {
      const ir::Node& n = nodes[i];
      Stack s = ir::build_stack(n, [&](ir::ValueId id) { return env[id]; });
      call_node(n, node_key(p.graph, n), s, env);
    }
  }
  // Values that unfolded nodes read become captured inputs.
  std::vector<ir::ValueId> replace(nv, -1);
  int made = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (in_fold[i]) continue;
    for (ir::NodeArg& a : nodes[i].args)
      for (ir::ValueId& u : a.values()) {
        if (!folded[u] || prod[u] < 0) continue;
        if (replace[u] < 0) {
          const Tensor& t = env[u];
          TensorSpec spec = p.graph.value(u).meta;
          spec.alias_of = -1;
          replace[u] = p.graph.add_input(spec).id;
          p.sources.push_back(InputSource{InputSource::Kind::Captured, -1, t});
          p.guards.push_back(TensorGuard::of(t));
          ++made;
        }
        u = replace[u];
      }
  }
  return made;
}

// ---- recomputation (the partitioner's role) --------------------------------------------------
//
// Note [Recompute]: a captured step knows which ops ran in the forward, which in the backward the
// engine ran, and which after it (the optimizer). The saved activations are the storages the
// forward makes and the backward reads: eager autograd keeps exactly these alive between the two.
// This pass makes such a storage again in the backward, right before its first use there, when
// one cheap node made it from storages the backward keeps anyway (graph inputs, one-element
// values, or saved storages that are not themselves made again). Its forward copy then dies
// after its last forward use. Cheap means pointwise, or layer_norm (a normalization: its output
// is as large as its input, and it costs a pass over it). Matmuls, convolutions, shrinking
// reductions and random ops are never made again; nor are chains (the inputs stay what the
// forward made), so the backward never keeps more than it did.

ir::ValueId storage_root(const Program& p, ir::ValueId v) { return root_of(p, producers(p), v); }

int64_t saved_activation_bytes(const Program& p) {
  const auto& nodes = p.graph.nodes();
  const std::vector<int64_t> prod = producers(p);
  std::vector<bool> counted(static_cast<size_t>(p.graph.num_values()), false);
  int64_t bytes = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (p.phases[i] != Phase::Backward) continue;
    for (ir::ValueId u : nodes[i].inputs()) {
      if (prod[u] < 0 || p.phases[prod[u]] != Phase::Forward) continue;
      const ir::ValueId r = root_of(p, prod, u);
      if (prod[r] < 0 || counted[r]) continue;  // a graph input is no activation
      counted[r] = true;
      const TensorSpec& s = p.graph.value(r).meta;
      bytes += numel_of(s.sizes) * static_cast<int64_t>(element_size(s.dtype));
    }
  }
  return bytes;
}

int recompute_in_backward(Program& p) {
  std::vector<ir::Node>& nodes = p.graph.nodes();
  const size_t n0 = nodes.size();
  const std::vector<int64_t> prod = producers(p);
  const size_t nv = static_cast<size_t>(p.graph.num_values());
  auto forward = [&](ir::ValueId v) { return prod[v] >= 0 && p.phases[prod[v]] == Phase::Forward; };
  // Storages the backward reads anyway.
  std::vector<bool> kept(nv, false);
  for (size_t i = 0; i < n0; ++i)
    if (p.phases[i] == Phase::Backward)
      for (ir::ValueId u : nodes[i].inputs())
        if (forward(u) || prod[u] < 0) kept[root_of(p, prod, u)] = true;
  // A kept storage made by one cheap pointwise node from kept storages, graph inputs or
  // one-element values can be made again in the backward instead of being kept.
  std::vector<bool> again(nv, false);
  for (ir::ValueId r = 0; r < static_cast<ir::ValueId>(nv); ++r) {
    if (!kept[r] || !forward(r)) continue;
    const size_t i = static_cast<size_t>(prod[r]);
    const ir::Node& n = nodes[i];
    const bool cheap = (n.op->info().tags.has(OpTag::Pointwise) && n.outputs.size() == 1) ||
                       n.op_name == "_layer_norm";
    if (!cheap || n.rng || has_effects(p, i)) continue;
    bool ok = true;
    for (ir::ValueId w : n.inputs()) {
      const ir::ValueId rw = root_of(p, prod, w);
      ok = ok && (prod[rw] < 0 || numel_of(p.graph.value(w).meta.sizes) <= 1 || kept[rw]);
    }
    again[r] = ok;
  }
  for (bool changed = true; changed;) {  // no chains: inputs stay what the forward made
    changed = false;
    for (ir::ValueId r = 0; r < static_cast<ir::ValueId>(nv); ++r) {
      if (!again[r]) continue;
      for (ir::ValueId w : nodes[prod[r]].inputs())
        if (again[root_of(p, prod, w)]) {
          again[r] = false;
          changed = true;
        }
    }
  }
  // Clone each such storage (and the views the backward reads of it) before its first use.
  std::vector<ir::ValueId> clone(nv, -1);
  GraphEdit edit(p);
  std::function<ir::ValueId(ir::ValueId, size_t)> remake = [&](ir::ValueId v, size_t at) {
    if (clone[v] >= 0) return clone[v];
    const ir::ValueId src = view_source(p, prod, v);
    const ir::Node n = nodes[prod[v]];  // a copy: add_before grows the list
    std::vector<ir::NodeArg> args = n.args;
    if (src >= 0) {
      const int a = p.graph.value(v).meta.alias_of;
      args[a] = ir::NodeArg(ir::ValueRef{remake(src, at)});
    }
    std::vector<ir::ValueId> outs =
        edit.add_before(at, n.op_name, std::move(args), Phase::Backward);
    for (size_t k = 0; k < outs.size(); ++k) clone[n.outputs[k]] = outs[k];
    return clone[v];
  };
  for (size_t i = 0; i < n0; ++i) {
    if (p.phases[i] != Phase::Backward) continue;
    for (size_t a = 0; a < nodes[i].args.size(); ++a)
      for (size_t k = 0; k < nodes[i].args[a].values().size(); ++k) {
        const ir::ValueId u = nodes[i].args[a].values()[k];
        if (!forward(u) || !again[root_of(p, prod, u)]) continue;
        const ir::ValueId c = remake(u, i);  // may grow `nodes`: index again after
        nodes[i].args[a].values()[k] = c;
      }
  }
  return edit.commit();
}

std::string run_passes(Program& p) {
  struct Pass {
    const char* name;
    int (*run)(Program&);
  };
  static constexpr Pass kPasses[] = {{"functionalize", &functionalize},
                                     {"fold", &constant_folding},
                                     {"cse", &common_subexpression_elimination},
                                     {"rewrite", &rewrite_patterns},
                                     {"dce", &dead_code_elimination},
                                     {"recompute", &recompute_in_backward}};
  p.saved_before = saved_activation_bytes(p);
  const bool print = std::getenv("KILN_COMPILE_PRINT") != nullptr;
  if (print) std::cerr << "kiln.compile: captured\n" << p.graph;
  for (const Pass& pass : kPasses) {
    const int changed = pass.run(p);
    std::vector<std::string> problems = ir::verify(p.graph);
    if (!problems.empty()) return std::string("after pass ") + pass.name + ": " + problems[0];
    if (print) std::cerr << "kiln.compile: after " << pass.name << " (" << changed << ")\n" << p.graph;
  }
  p.saved_after = saved_activation_bytes(p);
  return "";
}

}  // namespace kiln::compiler::detail
