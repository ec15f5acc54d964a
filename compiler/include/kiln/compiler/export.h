// kiln/compiler/export.h: a training step captured once as a plain graph of the IR, for another
// process to replay with no caller attached (a batch job's step: DESIGN.md "Batch job").
//
//   kiln::compiler::ExportedStep s = kiln::compiler::export_step(step, {x, y});  // runs it once
//   std::vector<kiln::Tensor> in;   // per graph input: an argument, or a captured tensor's copy
//   for (size_t i = 0; i < s.captured.size(); ++i)
//     in.push_back(s.arg_of_input[i] >= 0 ? batch[s.arg_of_input[i]] : state_copy(s.captured[i]));
//   kiln::compiler::CompiledGraph(s.graph).run(in, std::vector<kiln::GeneratorState>(n_nodes));
//
// Note [Exported steps]: export_step runs `fn` once under the tracer (Note [Capture] in
// kiln/compiler/compile.h) and keeps the graph as recorded: no constant folding (the IR could not
// carry folded data), no merging, no rewrites, no fused loops; only nodes with neither an effect
// nor a use are dropped. Its inputs are the arguments, the captured tensors (parameters,
// buffers, optimizer state), held by identity, and wrapped numbers (constant_input()); the in-place
// updates the step makes to them (the fused optimizer ops) are nodes of the graph, so a replay that
// keeps the same tensors bound from one run to the next trains. `.grad` assignments are left out: a
// replay keeps no gradients. A step whose replay could differ from running it again is refused,
// naming what to change:
// - a graph break (item(), printing a traced tensor) or an op the recorder cannot describe;
// - a tensor made inside the step that outlives it (an optimizer's first step makes its state:
//   run one step eagerly first);
// - a `.grad` the step reads without making it (zero the gradients with set_to_none at the start
//   of the step);
// - outputs that need autograd from a step that runs no backward (kiln::compile would compile
//   that backward; a replay never runs one);
// - explicit generators and reseeding (not supported yet).
// Random ops drawing from the default generator (dropout, randn, ...) are kept: the step reserved
// one block of counters (rng_seed, rng_offset, rng_count; Note [Random ops in a program]), and a
// replay gives each random node, and each seeded op whose (seed, offset) fell in the block, the
// same place in a block of its own (Note [Random batch steps] in worker/src/batch.h).
#pragma once

#include <vector>

#include "kiln/compiler/compile.h"
#include "kiln/ir.h"

namespace kiln::compiler {

struct ExportedStep {
  ir::Graph graph;
  std::vector<int> arg_of_input;  // per graph input: the argument it is, or -1 (captured)
  std::vector<Tensor> captured;   // per graph input: the captured tensor (undefined for arguments)
  std::vector<int> outputs;       // per output of fn: its index in graph.outputs(), -1: undefined
  // The default generator's counters the step drew from: [rng_offset, rng_offset + rng_count) of
  // seed rng_seed (rng_count 0: no random op).
  uint64_t rng_seed = 0, rng_offset = 0, rng_count = 0;
};

// Runs fn(args) once, eagerly and with its effects, and returns the step as recorded. ValueError
// or NotImplementedError naming the problem for a step that cannot be exported (Note [Exported
// steps]).
ExportedStep export_step(const Fn& fn, const std::vector<Tensor>& args);

// Graph input `i` when it is a constant the graph itself holds: a wrapped number (a scalar the
// step used as a 0-d tensor, e.g. `1 - y * y` in tanh's backward), rebuilt from its recorded
// value; an undefined tensor for any other input. A replay binds it to every run.
Tensor constant_input(const ir::Graph& g, size_t i);

}  // namespace kiln::compiler
