// kiln/autograd/checkpoint.h: activation checkpointing (torch.utils.checkpoint, reentrant flavor).
//
//   Tensor y = kiln::autograd::checkpoint(
//       [&](const variable_list& in) { return variable_list{block(in[0])}; }, {x});
//   y.sum().backward();     // block runs again here, with grad mode on
//
// Note [Checkpointing]: the forward runs fn under no_grad, so none of its intermediates are kept;
// the recorded CheckpointFunctionBackward node keeps only the inputs (version-checked like any
// saved tensor) and the default CPU generator's state (seed, offset) from before fn ran. Its
// backward restores that state, runs fn again with grad enabled on detached copies of the inputs,
// puts the generator back, and backpropagates through the recomputed graph: random ops inside fn
// (dropout masks from bernoulli/rand) draw the same numbers, so the gradients are bit for bit
// those of the plain call. Tensors fn captures (parameters) get their .grad accumulated by that
// inner backward, as PyTorch's reentrant checkpoint does; for the same reason it is not
// compatible with autograd::grad() (captured parameters would get .grad as a side effect) nor
// with create_graph (the recomputed backward is not recorded). With no input requiring grad
// (or grad mode off) fn simply runs. Only the default CPU generator is replayed.
#pragma once

#include <functional>

#include "kiln/autograd/node.h"

namespace kiln::autograd {

using CheckpointFn = std::function<variable_list(const variable_list& inputs)>;

// fn's outputs (defined tensors); `preserve_rng_state` false skips the generator replay.
variable_list checkpoint(const CheckpointFn& fn, const variable_list& inputs,
                         bool preserve_rng_state = true);

}  // namespace kiln::autograd
