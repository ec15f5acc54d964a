// kiln/compiler/graph.h: a graph of the IR compiled for repeated runs, as a worker's
// compiled-graph cache uses it (Note [Compiled batches] in worker/src/session_compiled.cpp).
//
//   kiln::compiler::CompiledGraph cg(std::move(graph));      // fused loops, last-use frees
//   std::vector<kiln::Tensor> outs = cg.run(inputs, rng);    // rng: per node, random ones only
//
//   kiln::compiler::CompiledGraph step(std::move(graph), {seed, offset, count});  // its block
//   outs = step.run(inputs, new_seed, new_base);             // draws moved to a new block
//
// Unlike kiln::compile's programs, nodes keep their order and nothing is folded, merged or
// removed (every output is a result the caller binds), so a caller can give each random node
// the (seed, offset) it was recorded with this time, or, for a graph that drew from one block
// of the default generator's counters (an exported step), move the whole block as
// kiln::compile does (Note [Random ops in a program] in compiler/src/program.h).
#pragma once

#include <memory>
#include <vector>

#include "kiln/generator.h"
#include "kiln/ir.h"

namespace kiln::compiler {

namespace detail {
struct Program;
}

// The block of the default generator's counters a graph drew from: offsets [offset, offset +
// count) of `seed`. count 0: none.
struct RandomBlock {
  uint64_t seed = 0, offset = 0, count = 0;
};

class CompiledGraph {
 public:
  // ValueError when the graph does not verify, or when `block` is given and a random node drew
  // outside it; RuntimeError when no C++ compiler exists and the graph has loops to fuse
  // (KILN_COMPILE_FUSE=0 replays without them).
  explicit CompiledGraph(ir::Graph g, RandomBlock block = {});
  ~CompiledGraph();
  // `inputs`: one per graph input, of the recorded geometry (the caller checks); `rng`: per node,
  // the (seed, offset) of each random node, and the `seed` and `offset` arguments of each seeded
  // op (dropout_seeded, _fused_attention). Returns the graph's outputs.
  std::vector<Tensor> run(const std::vector<Tensor>& inputs,
                          const std::vector<GeneratorState>& rng) const;
  // As above, with every draw in the block moved to the same place in the block of `seed` that
  // starts at `base`; seeded ops whose seed and offset lie outside the block keep them. A graph
  // with random nodes needs a block for this (ValueError).
  std::vector<Tensor> run(const std::vector<Tensor>& inputs, uint64_t seed, uint64_t base) const;
  int num_fused_loops() const;
  // The graph's fusion groups as CUDA kernels (Note [CUDA fusion]), whatever the graph's
  // device, and their PTX for `arch` through NVRTC: "" and *ptx, or why not (no NVRTC, a
  // compile error with NVRTC's log). Launching them is not wired yet.
  static std::string cuda_source(const ir::Graph& g);
  static std::string compile_cuda(const std::string& source, const std::string& arch,
                                  std::string* ptx);

 private:
  std::shared_ptr<detail::Program> p_;
};

}  // namespace kiln::compiler
