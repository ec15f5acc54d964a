// Private: the pieces of vmap that the engine and the Batched kernels share.
#pragma once

#include <optional>

#include "kiln/autograd/batched.h"
#include "kiln/autograd/node.h"

namespace kiln::autograd {

bool any_batched(const variable_list& ts);
// autograd::grad when an output or input is a BatchedTensor (Note [Batched gradients]).
variable_list grad_of_batched(const variable_list& outputs, const variable_list& inputs,
                              const variable_list& grad_outputs, std::optional<bool> retain_graph,
                              bool create_graph, bool allow_unused);

}  // namespace kiln::autograd
