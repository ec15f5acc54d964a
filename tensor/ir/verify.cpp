// The graph verifier: every problem of a graph, each naming its node (Note [Graph IR]).
#include <set>

#include "ir_util.h"

namespace kiln::ir {
namespace {

bool same_spec(const TensorSpec& a, const TensorSpec& b) {
  return a.sizes.ref() == b.sizes.ref() && a.strides.ref() == b.strides.ref() &&
         a.offset == b.offset && a.dtype == b.dtype && a.device == b.device &&
         a.alias_of == b.alias_of;
}

}  // namespace

std::vector<std::string> verify(const Graph& g) {
  std::vector<std::string> problems;
  std::set<ValueId> defined;
  auto define = [&](ValueId id, const std::string& who) {
    if (!g.has_value(id)) {
      problems.push_back(who + ": defines %" + std::to_string(id) + ", which is not a value of the graph");
    } else if (!defined.insert(id).second) {
      problems.push_back(who + ": redefines %" + std::to_string(id) + " (value ids must be unique)");
    }
  };
  for (ValueId id : g.inputs()) define(id, "graph input");

  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    std::string who = detail::node_name(g, i);
    size_t before = problems.size();
    if (!n.op) problems.push_back(who + ": unknown op '" + n.op_name + "'");
    if (n.op && n.op_name != n.op->name())
      problems.push_back(who + ": op name differs from its handle '" + n.op->name() + "'");
    for (const std::string& p : detail::check_args(n)) problems.push_back(who + ": " + p);
    for (ValueId id : n.inputs()) {
      if (defined.count(id)) continue;
      problems.push_back(who + ": uses %" + std::to_string(id) +
                         (g.has_value(id) ? " before it is defined" : ", which is not a value of the graph"));
    }
    if (n.op) {
      bool random = n.op->info().is_random;
      if (random && !n.rng) problems.push_back(who + ": random op without a recorded (seed, offset)");
      if (!random && n.rng) problems.push_back(who + ": (seed, offset) recorded on an op that is not random");
      int gi = generator_arg(*n.op);
      if (random && gi >= 0 && gi < static_cast<int>(n.args.size()) && n.args[gi].is_attribute() &&
          !n.args[gi].attribute().is_none())
        problems.push_back(who + ": random op holds a Generator instead of its recorded (seed, offset)");
    }
    for (ValueId id : n.outputs) define(id, who);
    // Re-running the meta function needs well-formed arguments and known outputs.
    if (problems.size() != before || !n.op) continue;
    std::vector<TensorSpec> specs;
    try {
      specs = detail::run_meta(g, n);
    } catch (const Error& e) {
      problems.push_back(who + ": meta function fails: " + e.what());
      continue;
    }
    if (specs.size() != n.outputs.size()) {
      problems.push_back(who + ": has " + std::to_string(n.outputs.size()) +
                         " outputs but its meta function gives " + std::to_string(specs.size()));
      continue;
    }
    for (size_t k = 0; k < specs.size(); ++k) {
      const TensorSpec& have = g.value(n.outputs[k]).meta;
      if (same_spec(have, specs[k])) continue;
      problems.push_back(who + ": output %" + std::to_string(n.outputs[k]) + " is " + spec_str(have) +
                         " (alias_of " + std::to_string(have.alias_of) + ") but its meta function gives " +
                         spec_str(specs[k]) + " (alias_of " + std::to_string(specs[k].alias_of) + ")");
    }
  }
  for (ValueId id : g.outputs())
    if (!defined.count(id)) problems.push_back("graph output %" + std::to_string(id) + " is not defined");
  return problems;
}

void verify_or_throw(const Graph& g) {
  std::vector<std::string> problems = verify(g);
  if (problems.empty()) return;
  std::string msg = "ir: invalid graph (" + std::to_string(problems.size()) + " problems):";
  for (const std::string& p : problems) msg += "\n  " + p;
  KILN_FAIL(Value, msg);
}

}  // namespace kiln::ir
