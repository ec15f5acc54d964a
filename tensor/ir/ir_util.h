// tensor/ir/ir_util.h: helpers shared by the graph builder, the verifier and the interpreter.
#pragma once

#include <string>
#include <vector>

#include "kiln/ir.h"

namespace kiln::ir::detail {

// "node 2 'add'": how messages name a node.
std::string node_name(const Graph& g, size_t index);
// True when `v` is a valid attribute for schema type `type` ("int", "Scalar?", ...).
bool attribute_matches(std::string_view type, const IValue& v);
// Problems with the node's arguments against its op's schema: arity, which arguments must be
// Values, attribute types. Empty when they fit (or when the op is unknown).
std::vector<std::string> check_args(const Node& node);
// The node's arguments as a Stack, with `tensor(id)` for each referenced value.
template <typename F>
Stack build_stack(const Node& node, const F& tensor) {
  Stack s;
  s.reserve(node.args.size());
  for (const NodeArg& a : node.args) {
    if (a.is_attribute()) {
      s.push_back(a.attribute());
    } else if (a.is_value()) {
      s.emplace_back(tensor(a.values()[0]));
    } else {
      std::vector<Tensor> ts;
      for (ValueId id : a.values()) ts.push_back(tensor(id));
      s.emplace_back(std::move(ts));
    }
  }
  return s;
}
// Index of the node's `Generator?` argument, or -1.
int generator_arg(const OperatorHandle& op);
// Output specs of the node from its op's meta function on fake inputs.
std::vector<TensorSpec> run_meta(const Graph& g, const Node& node);

}  // namespace kiln::ir::detail
