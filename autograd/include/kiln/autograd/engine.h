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

// Note [Split backward]: ZeroBubble pipeline schedules split a stage's backward in two.
// backward_input() runs only the nodes on paths from `outputs` to `inputs` and returns the
// inputs' gradients; at each of those nodes it computes only the gradients bound for those
// paths, and keeps the node and its incoming gradients (and its saved tensors) in `deferred`.
// backward_weight() later computes, at each kept node, the gradients it skipped (the ones bound
// for parameters), then runs the rest of the graph from there, accumulating into .grad as
// backward() does. Together they compute what backward(outputs, grad_outputs) would (with the
// inputs' gradients returned rather than accumulated), each node's work done once. The kept
// nodes run without their node hooks in the second half (tensor hooks and AccumulateGrad's
// hooks run as usual). Saved tensors of nodes not kept are freed by backward_input.
struct DeferredWeightGrad {
  struct Item {
    std::shared_ptr<Node> node;
    variable_list grads;               // what arrived at the node
    std::vector<size_t> weight_edges;  // the outputs backward_input skipped
  };
  std::vector<Item> items;
  bool empty() const { return items.empty(); }
};
variable_list backward_input(const variable_list& outputs, const variable_list& inputs,
                             const variable_list& grad_outputs, DeferredWeightGrad& deferred);
void backward_weight(DeferredWeightGrad& deferred);

// Runs `fn` on this thread once the backward() or grad() now running here has run its last
// node (PyTorch's Variable._execution_engine.queue_callback); callbacks run in the order queued
// and may queue more. Called from a hook: DDP waits for its gradient all-reduces this way.
// RuntimeError when no backward is running on this thread.
void queue_callback(std::function<void()> fn);

// True while a backward pass runs on this thread (the compiler's capture tells forward from
// backward ops with it).
bool is_backward_running();

}  // namespace kiln::autograd
