// kiln/compiler/compile.h: kiln::compile, which captures a function once under the Tracing key
// and replays the captured program on later calls whose guards hold.
//
//   auto step = kiln::compile([&](const std::vector<kiln::Tensor>& in) {
//     kiln::Tensor loss = kiln::cross_entropy(model.forward(in[0]), in[1]);
//     loss.backward();
//     opt.step();
//     opt.zero_grad();
//     return std::vector<kiln::Tensor>{loss.detach()};
//   });
//   for (auto& [x, y] : batches) step({x, y});   // call 1 captures, later calls replay
//   for (const auto& e : step.explain()) std::cout << e.kind << ": " << e.reason << "\n";
//
// Note [Capture]: a capture runs the function for real, with the Tracing key in the thread's
// included set. Autograd sits above Tracing, so the forward ops, the backward ops the engine
// runs, and the optimizer's ops all reach the Tracing fallback, which records each op into an
// ir::Graph and then runs it below Tracing. Composite rows run their decomposition at every key,
// so the graph holds primitives only. Tensors map to graph values by TensorImpl: the function's
// arguments are the first inputs; any other tensor an op reads (a parameter, a buffer, an
// optimizer state, a gradient) becomes a captured input, held by identity. Besides its outputs,
// a step has two kinds of effect, and the program replays both: ops that write their arguments
// (in-place updates of parameters and states run in place again), and `.grad` assignments,
// compared before and after the call. A capture is refused, and the call simply stays eager,
// when replaying could differ from running the function again:
// - user code read a traced tensor's data (`item()`, printing, numpy): a graph break; later
//   calls with these guards run as compiled segments split at the reads (Note [Graph break
//   segments] in compiler/src/segments.cpp);
// - a tensor made inside the function outlives it without being an output (new optimizer
//   state: the next call captures again, after the state exists);
// - an op the recorder cannot describe (no meta function: a graph break, split into segments as
//   a read is), or whose kernel disagrees with it;
// - an output that needs autograd from a function that ran a backward itself, or whose forward
//   writes tensors it did not make (otherwise the backward is captured too: Note [Compiled
//   backward] in compiler/src/program.h).
// Each refusal is an explain() event that names the op, value or tensor involved.
//
// Note [Guards]: a program is replayed only when, for every argument and captured input, the
// sizes, strides, offset, dtype, device, requires_grad and whether `.grad` is defined equal the
// capture's (not the last where the function replaced the .grad before reading the tensor, as
// zero_grad(set_to_none) at the start of a step does), and grad mode and autocast are as they
// were. A miss captures again (a recompile),
// up to Options::recompile_limit programs; past it, calls run eagerly with one warning. A
// captured tensor is held by identity: a parameter updated in place is seen, but a parameter
// replaced by another tensor is not (call reset()). Python values the function reads (a
// learning rate) are constants of the program; kiln.compile guards its non-tensor arguments.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/tensor.h"

namespace kiln::compiler {

using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

struct Options {
  int recompile_limit = 8;  // programs per compiled function (Note [Guards])
};

// One line of a compiled function's history (explain()).
struct Event {
  enum class Kind { Capture, Recompile, GraphBreak, Retry, Fallback, Segment };
  Kind kind;
  std::string reason;
};
const char* event_kind_name(Event::Kind k);

class CompiledFunction {
 public:
  CompiledFunction(Fn fn, Options options);
  ~CompiledFunction();
  CompiledFunction(CompiledFunction&&) noexcept;
  CompiledFunction& operator=(CompiledFunction&&) noexcept;

  std::vector<Tensor> operator()(const std::vector<Tensor>& args);

  // Captures, recompiles (with the guard that failed), graph breaks, fallbacks and compiled
  // segments, in order.
  const std::vector<Event>& explain() const;
  int num_programs() const;   // programs captured and kept
  int num_recompiles() const; // captures after the first one (guard misses)
  int64_t num_replays() const;
  // Runs of compiled segments, in calls split at graph breaks (Note [Graph break segments]).
  int64_t num_segment_runs() const;
  // The printed graph of program i (ir::Graph's printer), with its fused loops.
  std::string graph_str(int i) const;
  // Program i's saved activations (bytes the forward makes and the backward reads), as eager
  // keeps them and as the program does after recomputation.
  std::pair<int64_t, int64_t> saved_activation_bytes(int i) const;
  // Forgets every program and counter.
  void reset();

 private:
  struct State;
  std::unique_ptr<State> s_;
};

CompiledFunction compile(Fn fn, Options options = {});

// True while this thread is capturing (kiln.compile's Python wrapper asks, to collect cycles).
bool is_capturing();

}  // namespace kiln::compiler

namespace kiln {
using compiler::compile;
}  // namespace kiln
