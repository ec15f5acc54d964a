// kiln/autograd/engine.h: runs backward graphs.
//
//   kiln::autograd::backward({loss});                                // accumulates into .grad
//   auto g = kiln::autograd::grad({y}, {x}, {}, std::nullopt, true);    // dy/dx, recorded
//
// Note [Engine]: nodes reachable from the roots are counted by their number of incoming edges
// and run once all their gradients have arrived, later-created nodes first among ready ones.
// Gradients for one slot from several edges are summed. Without retain_graph each node frees its
// saved tensors after running; without create_graph backward runs with grad mode off.
//
// Note [Hook order] (PyTorch's): when a node runs, first the tensor hooks of the tensors whose
// gradients it receives (register_hook; for AccumulateGrad, the leaf's), each seeing the previous
// one's result, then retain_grad() and grad()'s captures see that gradient, then the node's
// pre-hooks, the node itself (AccumulateGrad: .grad updated, then the post-accumulate-grad hooks),
// then its post-hooks. A tensor hook registered before an in-place op sees the gradient of the
// value before the op (it stays on the old node).
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "kiln/autograd/node.h"

namespace kiln::autograd {

// Accumulates d(tensors)/d(leaf) into every leaf's .grad. grad_tensors may be empty (implicit
// ones for one-element outputs only) or hold one entry per tensor (undefined: implicit).
void backward(const variable_list& tensors, const variable_list& grad_tensors = {},
              std::optional<bool> retain_graph = std::nullopt, bool create_graph = false);

// The gradients of `outputs` with respect to `inputs` (nothing is accumulated into .grad).
// An input the outputs do not depend on is an error unless allow_unused (then undefined).
variable_list grad(const variable_list& outputs, const variable_list& inputs,
                   const variable_list& grad_outputs = {},
                   std::optional<bool> retain_graph = std::nullopt, bool create_graph = false,
                   bool allow_unused = false);

// Runs `fn` on this thread once the backward() or grad() now running here has run its last
// node (PyTorch's Variable._execution_engine.queue_callback); callbacks run in the order queued
// and may queue more. Called from a hook: DDP waits for its gradient all-reduces this way.
// RuntimeError when no backward is running on this thread.
void queue_callback(std::function<void()> fn);

}  // namespace kiln::autograd
