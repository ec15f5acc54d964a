// The graph interpreter: replays a Graph through the dispatcher (Note [Graph IR]).
#include "ir_util.h"

namespace kiln::ir {

std::vector<Tensor> run(const Graph& g, const std::vector<Tensor>& inputs) {
  return run(g, inputs, NodeObserver());
}

std::vector<Tensor> run(const Graph& g, const std::vector<Tensor>& inputs,
                        const NodeObserver& on_node) {
  KILN_CHECK(inputs.size() == g.inputs().size(), Value, "ir::run: the graph takes ",
             g.inputs().size(), " inputs, got ", inputs.size());
  std::vector<Tensor> env(static_cast<size_t>(g.num_values()));
  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorSpec& s = g.value(g.inputs()[i]).meta;
    const Tensor& t = inputs[i].check_defined("ir::run input");
    KILN_CHECK(t.sizes() == s.sizes.ref() && t.dtype() == s.dtype && t.device() == s.device, Value,
               "ir::run: input ", i, " is ", t.dtype(), t.sizes(), " on ", t.device(),
               " but the graph expects ", spec_str(s));
    env[g.inputs()[i]] = t;
  }
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    KILN_CHECK(n.op != nullptr, Value, "ir::run: ", detail::node_name(g, i), ": unknown op");
    Stack s = build_stack(n, [&](ValueId id) {
      KILN_CHECK(g.has_value(id) && env[id].defined(), Value, "ir::run: ",
                 detail::node_name(g, i), " uses %", id, ", which has no value yet");
      return env[id];
    });
    if (n.rng) {  // Note [Random ops in the IR]
      int gi = generator_arg(*n.op);
      KILN_CHECK(gi >= 0 && gi < static_cast<int>(s.size()), Value, "ir::run: ",
                 detail::node_name(g, i), " has a (seed, offset) but no generator argument");
      Generator gen(n.rng->seed);
      gen.set_state(*n.rng);
      s[gi] = IValue(gen);
    }
    n.op->call_boxed(s);
    std::vector<Tensor> outs;
    for (const IValue& v : s) {
      if (v.is_tensor()) outs.push_back(v.to_tensor());
      if (v.is_tensor_list())
        for (const Tensor& t : v.to_tensor_list()) outs.push_back(t);
    }
    KILN_CHECK(outs.size() == n.outputs.size(), Runtime, "ir::run: ", detail::node_name(g, i),
               " produced ", outs.size(), " outputs, the graph records ", n.outputs.size());
    for (size_t k = 0; k < outs.size(); ++k) env[n.outputs[k]] = outs[k];
    if (on_node) on_node(i, outs);
  }
  std::vector<Tensor> result;
  for (ValueId id : g.outputs()) {
    KILN_CHECK(g.has_value(id) && env[id].defined(), Value, "ir::run: graph output %", id,
               " is not defined");
    result.push_back(env[id]);
  }
  return result;
}

}  // namespace kiln::ir
