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
// Output specs of the node from its op's meta function on fake inputs.
std::vector<TensorSpec> run_meta(const Graph& g, const Node& node);

}  // namespace kiln::ir::detail
