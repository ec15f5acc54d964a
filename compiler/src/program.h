// compiler/src/program.h: a captured program (Note [Capture] in kiln/compiler/compile.h): the
// graph, where each of its inputs comes from, its guards and its effects; and the capture and
// replay entry points that compile.cpp drives.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/compiler/compile.h"
#include "kiln/compiler/graph.h"
#include "kiln/generator.h"
#include "kiln/ir.h"

namespace kiln::compiler::detail {

// Where a graph input comes from when the program runs.
struct InputSource {
  enum class Kind { Arg, Captured, GradOf, GradOutput };
  Kind kind = Kind::Arg;
  // Arg: the argument; GradOf: the input whose `.grad` this is; GradOutput: the output whose
  // gradient this is (Note [Compiled backward])
  int index = -1;
  Tensor tensor;   // Captured: the tensor itself (held by identity)
};

enum class Phase : uint8_t { Forward, Backward, After };

// What a tensor must look like for a program to be replayed (Note [Guards]).
struct TensorGuard {
  TensorSpec spec;  // sizes, strides, offset, dtype, device
  bool requires_grad = false;
  bool has_grad = false;
  bool check_grad = true;  // false: the function replaces .grad before it reads the tensor

  static TensorGuard of(const Tensor& t);
  // "" when `t` passes; otherwise what differs, e.g. "sizes [16, 10] (captured: [32, 10])".
  std::string mismatch(const Tensor& t) const;
};

// The backend key node `n` runs at: its first input's device (wrapped numbers aside), else its
// first output's.
DispatchKeySet node_key(const ir::Graph& g, const ir::Node& n);
// Calls node `n` at `ks` (empty: through the whole dispatcher) on stack `s` (its arguments)
// and stores its outputs into `env`.
void call_node(const ir::Node& n, DispatchKeySet ks, Stack& s, std::vector<Tensor>& env);

// The first argument before `i` that shares argument i's storage, or -1 (Note [Guards]).
int earlier_alias(const std::vector<Tensor>& args, int i);

// A `.grad` assignment the function made: input `input`'s grad becomes `value` (-1: cleared).
struct GradWrite {
  int input = -1;
  ir::ValueId value = -1;
};

// A fusion group compiled to one loop (Note [Fusion] in codegen.cpp).
struct FusedKernel {
  using Fn = void (*)(const void* const* ins, void* const* outs, int64_t n);
  std::vector<size_t> members;        // node indices, in order; the group runs at the last one
  std::vector<ir::ValueId> inputs, outputs;
  DimVector sizes;                    // every member's output shape (contiguous)
  ScalarType dtype = kFloat32;
  int64_t numel = 0;
  std::string name;
  std::string label;  // the name and the members' ops, "kiln_fused_0(add,relu)": the profiler's
  Fn fn = nullptr;
  // Per output: the input whose buffer it is written into (Note [Buffer reuse] in program.cpp),
  // or -1 for a fresh one. Set by Program::finalize().
  std::vector<int> reuse;
};

struct Program : std::enable_shared_from_this<Program> {
  ir::Graph graph;
  int num_args = 0;
  std::vector<InputSource> sources;   // one per graph input, in order
  std::vector<TensorGuard> guards;    // one per graph input
  std::vector<int> arg_alias;         // per argument: the earlier argument sharing its storage, or -1
  bool grad_mode = true;
  bool autocast_cpu = false;
  ScalarType autocast_dtype = kBFloat16;
  std::vector<ir::ValueId> outputs;   // -1: an undefined tensor
  std::vector<GradWrite> grad_writes;
  // Per node: the explicit generator a random node draws from (nullopt: the default one).
  std::vector<std::optional<Generator>> generators;
  // Per node: the part of a training step it was recorded in (Note [Recompute] in passes.cpp).
  std::vector<Phase> phases;
  // Note [Random ops in a program]: the default generator's counters the call reserved, as one
  // block [rng_offset, rng_offset + rng_count) of seed rng_seed: a random node's (seed, offset)
  // and a seeded op's `seed` and `offset` attributes (dropout_seeded, _fused_attention, ...,
  // which a composite such as dropout reserved for) that fall in it are rebased at every run
  // onto a block of the same size reserved then, so each run draws fresh numbers, exactly the
  // ones the eager call would have drawn. Explicit generators reserve per node.
  uint64_t rng_seed = 0, rng_offset = 0, rng_count = 0;
  struct SeedUse {
    size_t node;
    int seed_arg, offset_arg;
  };
  std::vector<SeedUse> seed_uses;
  bool in_block(uint64_t seed, uint64_t offset) const {
    return rng_count > 0 && seed == rng_seed && offset >= rng_offset &&
           offset - rng_offset < rng_count;
  }
  // Fills seed_uses with the seeded ops whose seed and offset lie in the block (the others were
  // given constants: dropout_seeded called directly); returns the first node drawing from the
  // default generator outside the block, or -1.
  int64_t find_block_uses();
  // Fused groups and the shared object holding their code (fuse()).
  std::vector<FusedKernel> kernels;
  std::shared_ptr<void> library;
  std::string cache_note;  // a cache entry that had to be rebuilt
  std::string rewrites;    // the pattern rewrites that applied ("attention x2"), for explain()
  int64_t saved_before = 0, saved_after = 0;  // saved_activation_bytes before and after the passes
  // Filled by finalize(): the backend key each node runs at, its group (-1: none), and the
  // values dead after it.
  std::vector<DispatchKeySet> node_keys;
  std::vector<int> node_kernel;
  std::vector<std::vector<ir::ValueId>> frees;

  // "" when `args` and the thread's state pass every guard; otherwise the first failure.
  std::string check_guards(const std::vector<Tensor>& args) const;
  // Computes node_keys, frees and each fused loop's buffer reuse; call after capture and after
  // every pass.
  void finalize();
  void plan_buffer_reuse(const std::vector<int64_t>& last_use);
  // Runs the program on `args` (whose guards hold): the outputs, with the effects applied.
  // A program with a compiled backward runs its forward and returns outputs whose grad_fn runs
  // the backward nodes (Note [Compiled backward]).
  std::vector<Tensor> run(const std::vector<Tensor>& args) const;

  // Note [Compiled backward]: a function whose outputs need autograd (a module's forward in
  // training) is captured with its backward: after the call, the tracer runs autograd::grad
  // from the outputs, with a graph input (GradOutput) per output gradient, to every input that
  // requires grad. Its nodes are the backward phase; `saved` are the values the backward reads
  // that the forward made or got. Each run executes the forward nodes and wraps the outputs in
  // a CustomFunctionNode whose edges are those inputs; backward() runs the backward nodes on the
  // saved values and returns `input_grads` (-1: no gradient). Random draws of the forward are
  // replayed in the backward from the same block.
  bool aot = false;
  std::vector<int> diff_inputs;          // graph-input indices that get gradients, edge order
  std::vector<ir::ValueId> input_grads;  // per diff input
  std::vector<ir::ValueId> saved;
  std::vector<Tensor> attach_backward(const std::vector<Tensor>& input_tensors,
                                      std::vector<Tensor> out, std::vector<Tensor> saved_tensors,
                                      uint64_t seed, uint64_t base) const;
  // Runs the nodes of phase `only` (all when empty), drawing from the block at (seed, base), or
  // where `rng` is given, each random node from its own state there (CompiledGraph).
  void run_nodes(std::vector<Tensor>& env, std::optional<Phase> only, uint64_t seed,
                 uint64_t base, const std::vector<GeneratorState>* rng = nullptr) const;
};

// The result of one capture: the eager outputs, and the program, or why there is none.
struct CaptureResult {
  std::vector<Tensor> outputs;  // of a program with a compiled backward: none (run it instead)
  std::shared_ptr<Program> program;
  Event::Kind refusal = Event::Kind::GraphBreak;
  std::string reason;  // why program is empty
  // A data read or an op the IR cannot hold broke the capture: later calls may run in segments
  // (Note [Graph break segments] in segments.cpp).
  bool segmentable = false;
};

// Runs `fn(args)` eagerly under the tracer (Note [Capture]). With `rewrite_first`, a forward
// whose backward is to be captured is rewritten first (Note [Rewrites before the backward]).
// With `raw` (export_step: See Note [Exported steps] in kiln/compiler/export.h) the program is
// the graph as recorded: no rewrites, passes or fused loops, and outputs that still need
// autograd after a backward the function ran itself are plain values.
CaptureResult capture(const Fn& fn, const std::vector<Tensor>& args, bool rewrite_first = true,
                      bool raw = false);

// Whether two tensors (a spec, or a spec and a tensor) have the same sizes, strides, offset,
// dtype and device.
inline bool same_geometry(const TensorSpec& a, const TensorSpec& b) {
  return a.sizes.ref() == b.sizes.ref() && a.strides.ref() == b.strides.ref() &&
         a.offset == b.offset && a.dtype == b.dtype && a.device == b.device;
}
inline bool same_geometry(const TensorSpec& s, const Tensor& t) {
  return s.sizes.ref() == t.sizes() && s.strides.ref() == t.strides() &&
         s.offset == t.storage_offset() && s.dtype == t.dtype() && s.device == t.device();
}

// The tensors an op left on `stack` from `base` (its results), lists flattened.
inline std::vector<Tensor> stack_tensors(const Stack& stack, size_t base) {
  std::vector<Tensor> out;
  for (size_t i = base; i < stack.size(); ++i) {
    if (stack[i].is_tensor()) out.push_back(stack[i].to_tensor());
    if (stack[i].is_tensor_list())
      for (const Tensor& t : stack[i].to_tensor_list()) out.push_back(t);
  }
  return out;
}

// The node arguments of the op whose `info.num_args` arguments are on `stack` from `base`: each
// tensor as `value_of(tensor)`, an absent optional one and everything else as an attribute.
// Every Tensor (not optional) argument must be a defined tensor.
template <typename ValueOf>
std::vector<ir::NodeArg> node_args(const OpInfo& info, const Stack& stack, size_t base,
                                   ValueOf&& value_of) {
  std::vector<ir::NodeArg> args;
  args.reserve(info.num_args);
  for (int i = 0; i < info.num_args; ++i) {
    const IValue& v = stack[base + i];
    const ArgType type = info.args[i].arg_type;
    if (type == ArgType::Tensor ||
        (type == ArgType::OptionalTensor && v.is_tensor() && v.to_tensor().defined())) {
      args.emplace_back(ir::ValueRef{value_of(v.to_tensor())});
    } else if (type == ArgType::TensorList) {
      std::vector<ir::ValueRef> vs;
      for (const Tensor& t : v.to_tensor_list()) vs.push_back(ir::ValueRef{value_of(t)});
      args.emplace_back(vs);
    } else if (type == ArgType::OptionalTensor) {
      args.emplace_back(IValue());
    } else {
      args.emplace_back(v);
    }
  }
  return args;
}

// A compiled function's segments (Note [Graph break segments] in segments.cpp), by key.
struct SegmentCache {
  struct Entry {
    int seen = 0;
    std::shared_ptr<CompiledGraph> compiled;
  };
  std::unordered_map<std::string, Entry> entries;
  int64_t compiled_runs = 0;
};
// Runs `fn(args)` as segments split at its data reads, each compiled once its key repeats (a
// "segment" event in `events`, the compiled function's history).
std::vector<Tensor> run_in_segments(SegmentCache& cache, std::vector<Event>& events, const Fn& fn,
                                    const std::vector<Tensor>& args);
// The Tracing key's work while segments record on this thread: records or runs the op and
// returns true; false when no segment records.
bool segment_record(const OperatorHandle& op, DispatchKeySet ks, Stack& stack);
bool is_recording_segments();

// Whether node i writes an argument, is a collective or draws from an explicit generator.
bool has_effects(const Program& p, size_t i);
// The values the program hands out after its nodes: outputs, .grad writes, input gradients.
std::vector<bool> program_results(const Program& p);
// The value whose storage `v` looks into (through view nodes): a graph input or a node output.
ir::ValueId storage_root(const Program& p, ir::ValueId v);
// Value -> the index of the node that makes it (-1: a graph input).
std::vector<int64_t> producers(const Program& p);
// The argument value that output `v` of its node aliases (a view or an in-place result), or -1.
ir::ValueId aliased_arg(const Program& p, const std::vector<int64_t>& prod, ir::ValueId v);
// Compiles the program's fusion groups (Note [Fusion], Note [Compile cache]): "" or why the
// program runs unfused.
std::string fuse(Program& p);
// The program's groups as CUDA source (Note [CUDA fusion] in codegen.cpp); "" when none.
std::string cuda_source(Program& p);
// Compiles CUDA source to PTX for `arch` ("compute_90") with NVRTC: "" and *ptx, or the error.
std::string nvrtc_compile(const std::string& src, const std::string& arch, std::string* ptx);
// Whether a fused loop reads `s` element for element (in[i]): it has the group's `shape` and is
// contiguous. Only such an input's buffer may take the loop's output (Note [Buffer reuse]);
// others are read in runs (Note [Broadcast inputs]).
bool flat_input(const TensorSpec& s, const DimVector& shape);
// False when KILN_COMPILE_FUSE=0.
bool fusion_enabled();
// "" when a C++ compiler exists; otherwise the error to raise, naming what to install.
std::string compiler_problem();

// Every read of `from` (by a node, a program output, a .grad write, an input gradient) reads
// `to` instead.
void replace_uses(Program& p, ir::ValueId from, ir::ValueId to);

// Edits a program's node list for a pass: nodes added to run right before an existing one,
// nodes dropped. commit() puts the new nodes in place and keeps the
// per-node tables (generators, phases, seed uses) in step; indices are those before the edit.
class GraphEdit {
 public:
  explicit GraphEdit(Program& p);
  // Records `op` on `args` to run right before node `at` (in `phase`); its outputs.
  std::vector<ir::ValueId> add_before(size_t at, std::string_view op, std::vector<ir::NodeArg> args,
                                      Phase phase);
  void remove(size_t i) { keep_[i] = false; }
  // Applies the edit; how many nodes it added.
  int commit();

 private:
  Program& p_;
  size_t n0_;
  std::vector<bool> keep_;
  std::vector<std::vector<size_t>> before_;
  int added_ = 0;
};

// The passes (Note [Passes]); each returns how many nodes it removed or merged.
int dead_code_elimination(Program& p);
int common_subexpression_elimination(Program& p);
int recompute_in_backward(Program& p);
int constant_folding(Program& p);
int functionalize(Program& p);     // Note [Functionalization] in rewrite.cpp
int rewrite_patterns(Program& p);  // Note [Pattern rewrites] in rewrite.cpp
// The forward of a program whose backward is still to be captured, rewritten (Note [Rewrites
// before the backward] in rewrite.cpp): how many rewrites applied, and what they were.
int rewrite_forward(Program& p, std::string* what);
// Bytes of the distinct storages the forward makes and the backward reads (See Note [Recompute]).
int64_t saved_activation_bytes(const Program& p);
// Runs every pass, verifying the graph after each (KILN_COMPILE_PRINT=1 prints the graph
// before and after each); "" or the first problem the verifier found.
std::string run_passes(Program& p);

}  // namespace kiln::compiler::detail
