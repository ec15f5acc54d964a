// kiln/compiler/graph.h: a graph of the IR compiled for repeated runs, as a worker's
// compiled-graph cache uses it (Note [Compiled batches] in worker/src/session_compiled.cpp).
//
//   kiln::compiler::CompiledGraph cg(std::move(graph));      // fused loops, last-use frees
//   std::vector<kiln::Tensor> outs = cg.run(inputs, rng);    // rng: per node, random ones only
//
// Unlike kiln::compile's programs, nodes keep their order and nothing is folded, merged or
// removed (every output is a result the caller binds), so a caller can give each random node
// the (seed, offset) it was recorded with this time.
#pragma once

#include <memory>
#include <vector>

#include "kiln/generator.h"
#include "kiln/ir.h"

namespace kiln::compiler {

namespace detail {
struct Program;
}

class CompiledGraph {
 public:
  // ValueError when the graph does not verify; RuntimeError when no C++ compiler exists and
  // the graph has loops to fuse (KILN_COMPILE_FUSE=0 replays without them).
  explicit CompiledGraph(ir::Graph g);
  ~CompiledGraph();
  // `inputs`: one per graph input, of the recorded geometry (the caller checks); `rng`: per node,
  // the (seed, offset) of each random node, and the `seed` and `offset` arguments of each seeded
  // op (dropout_seeded, _fused_attention). Returns the graph's outputs.
  std::vector<Tensor> run(const std::vector<Tensor>& inputs,
                          const std::vector<GeneratorState>& rng) const;
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
