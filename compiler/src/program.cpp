// Running a captured program: its guards (Note [Guards]) and its replay.
#include "program.h"

#include <sstream>
#include <tuple>

#include "kiln/autocast.h"
#include "kiln/autograd/function.h"
#include "kiln/autograd/grad_mode.h"
#include "kiln/compiler/graph.h"
#include "kiln/dispatcher.h"
#include "kiln/operators.h"
#include "kiln/profiler.h"

namespace kiln::compiler::detail {

DispatchKeySet node_key(const ir::Graph& g, const ir::Node& n) {
  for (ir::ValueId v : n.inputs())  // a wrapped number stays on the CPU whatever the op's device
    if (!g.value(v).meta.wrapped_number)
      return DispatchKeySet(backend_key(g.value(v).meta.device.type()));
  const Device d = n.outputs.empty() ? Device(kCPU) : g.value(n.outputs[0]).meta.device;
  return DispatchKeySet(backend_key(d.type()));
}

void call_node(const ir::Node& n, DispatchKeySet ks, Stack& s, std::vector<Tensor>& env) {
  if (ks.empty())
    n.op->call_boxed(s);
  else
    n.op->call_boxed(ks, s);
  size_t k = 0;
  for (const IValue& v : s) {
    if (v.is_tensor())
      env[n.outputs[k++]] = v.to_tensor();
    else if (v.is_tensor_list())
      for (const Tensor& t : v.to_tensor_list()) env[n.outputs[k++]] = t;
  }
}

int earlier_alias(const std::vector<Tensor>& args, int i) {
  for (int j = 0; j < i; ++j)
    if (args[j].is_alias_of(args[i])) return j;
  return -1;
}

std::string Program::check_guards(const std::vector<Tensor>& args) const {
  if (static_cast<int>(args.size()) != num_args)
    return "the function got " + std::to_string(args.size()) + " arguments (captured with " +
           std::to_string(num_args) + ")";
  if (autograd::GradMode::is_enabled() != grad_mode)
    return std::string("grad mode is ") + (grad_mode ? "off" : "on") + " (captured " +
           (grad_mode ? "on" : "off") + ")";
  if (is_autocast_enabled(DeviceType::CPU) != autocast_cpu ||
      (autocast_cpu && get_autocast_dtype(DeviceType::CPU) != autocast_dtype))
    return "the autocast state changed";
  for (size_t i = 0; i < sources.size(); ++i) {
    const InputSource& s = sources[i];
    std::string miss;
    if (s.kind == InputSource::Kind::Arg) {
      miss = guards[i].mismatch(args[s.index]);
      if (miss.empty()) {
        const int alias = earlier_alias(args, s.index);
        if (alias != arg_alias[s.index])
          miss = "shares storage with " + (alias < 0 ? std::string("no earlier argument")
                                                     : "argument " + std::to_string(alias)) +
                 " (captured: " +
                 (arg_alias[s.index] < 0 ? std::string("none")
                                         : "argument " + std::to_string(arg_alias[s.index])) +
                 ")";
      }
      if (!miss.empty()) return "argument " + std::to_string(s.index) + " " + miss;
    } else if (s.kind == InputSource::Kind::Captured) {
      miss = guards[i].mismatch(s.tensor);
      if (!miss.empty())
        return "captured tensor %" + std::to_string(graph.inputs()[i]) + " " + miss;
    } else if (s.kind == InputSource::Kind::GradOf) {
      const InputSource& owner = sources[s.index];
      Tensor t = owner.kind == InputSource::Kind::Arg ? args[owner.index] : owner.tensor;
      miss = guards[i].mismatch(t.grad());
      if (!miss.empty())
        return "the .grad of %" + std::to_string(graph.inputs()[s.index]) + " " + miss;
    }
  }
  return "";
}

void Program::finalize() {
  const auto& nodes = graph.nodes();
  node_keys.assign(nodes.size(), DispatchKeySet());
  node_kernel.assign(nodes.size(), -1);
  frees.assign(nodes.size(), {});
  generators.resize(nodes.size());
  for (size_t k = 0; k < kernels.size(); ++k)
    for (size_t i : kernels[k].members) node_kernel[i] = static_cast<int>(k);
  std::vector<int64_t> last_use(static_cast<size_t>(graph.num_values()), -1);
  for (size_t i = 0; i < nodes.size(); ++i) {
    const ir::Node& n = nodes[i];
    const std::vector<ir::ValueId> in = n.inputs();
    node_keys[i] = node_key(graph, n);
    // A group member's reads and writes happen where the group runs: at its last member.
    const int64_t at = node_kernel[i] >= 0
                           ? static_cast<int64_t>(kernels[node_kernel[i]].members.back())
                           : static_cast<int64_t>(i);
    for (ir::ValueId v : in) last_use[v] = std::max(last_use[v], at);
    for (ir::ValueId v : n.outputs) last_use[v] = std::max(last_use[v], at);
  }
  for (ir::ValueId v : outputs)
    if (v >= 0) last_use[v] = -1;
  for (const GradWrite& w : grad_writes)
    if (w.value >= 0) last_use[w.value] = -1;
  for (ir::ValueId v : input_grads)
    if (v >= 0) last_use[v] = -1;
  for (ir::ValueId v = 0; v < graph.num_values(); ++v)
    if (last_use[v] >= 0) frees[last_use[v]].push_back(v);
  plan_buffer_reuse(last_use);
  // What the backward reads and does not make or get as a gradient (See Note [Compiled backward]).
  saved.clear();
  if (aot) {
    std::vector<bool> made_in_backward(static_cast<size_t>(graph.num_values()), false), seen = made_in_backward;
    for (size_t k = 0; k < graph.inputs().size(); ++k)
      if (sources[k].kind == InputSource::Kind::GradOutput) made_in_backward[graph.inputs()[k]] = true;
    auto need = [&](ir::ValueId v) {
      if (v < 0 || made_in_backward[v] || seen[v]) return;
      seen[v] = true;
      saved.push_back(v);
    };
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (phases[i] != Phase::Backward) continue;
      for (ir::ValueId v : nodes[i].inputs()) need(v);
      for (ir::ValueId v : nodes[i].outputs) made_in_backward[v] = true;
    }
    for (ir::ValueId v : input_grads) need(v);
  }
}

// Note [Buffer reuse]: within a step, a fused loop writes an output into the buffer of one of its
// inputs when that input dies with the loop: made by a node of the program (never a graph
// input), contiguous, not a view or an in-place result, with no view or in-place result of it
// anywhere, not a program result, and read last by this loop. The plan is made once, here; at run
// time the buffer is taken only when nothing but the program holds it (its tensor and storage have
// one owner), else the output gets a fresh one. The loop reads an element before it writes the same
// element, and its `omp simd` makes no assumption about aliasing, so writing in place is safe.
// Every other value is freed after its last use (frees), and the caching allocator hands its
// block to the next allocation of that size.
void Program::plan_buffer_reuse(const std::vector<int64_t>& last_use) {
  const auto& nodes = graph.nodes();
  const size_t nv = static_cast<size_t>(graph.num_values());
  std::vector<bool> fresh(nv, false), aliased(nv, false);
  for (const ir::Node& n : nodes)
    for (ir::ValueId o : n.outputs) {
      const int a = graph.value(o).meta.alias_of;
      fresh[o] = a < 0;
      if (a >= 0 && a < static_cast<int>(n.args.size()))
        for (ir::ValueId v : n.args[a].values()) aliased[v] = true;
    }
  for (FusedKernel& k : kernels) {
    k.reuse.assign(k.outputs.size(), -1);
    std::vector<bool> taken(k.inputs.size(), false);
    const int64_t at = static_cast<int64_t>(k.members.back());
    for (size_t j = 0; j < k.outputs.size(); ++j)
      for (size_t a = 0; a < k.inputs.size(); ++a) {
        const ir::ValueId v = k.inputs[a];
        const TensorSpec& s = graph.value(v).meta;
        if (taken[a] || !fresh[v] || aliased[v] || last_use[v] != at || s.dtype != k.dtype ||
            !flat_input(s, k.sizes) || !s.device.is_cpu())
          continue;
        taken[a] = true;
        k.reuse[j] = static_cast<int>(a);
        break;
      }
  }
}

namespace {

void run_kernel(const FusedKernel& k, std::vector<Tensor>& env) {
  std::vector<const void*> ins;
  ins.reserve(k.inputs.size());
  for (ir::ValueId v : k.inputs) ins.push_back(env[v].impl()->raw_data());
  std::vector<void*> outs;
  outs.reserve(k.outputs.size());
  for (size_t j = 0; j < k.outputs.size(); ++j) {
    const ir::ValueId v = k.outputs[j];
    const Tensor* in = k.reuse[j] >= 0 ? &env[k.inputs[k.reuse[j]]] : nullptr;
    if (in != nullptr && in->impl()->use_count() == 1 && in->impl()->storage().use_count() == 1)
      env[v] = *in;  // See Note [Buffer reuse]
    else
      env[v] = kiln::empty(k.sizes, k.dtype);
    outs.push_back(env[v].impl()->raw_data());
  }
  profiler::RecordFunction range(k.label);  // nothing unless the profiler records
  k.fn(ins.data(), outs.data(), k.numel);
}

}  // namespace

int64_t Program::find_block_uses() {
  seed_uses.clear();
  const auto& nodes = graph.nodes();
  for (size_t i = 0; i < nodes.size(); ++i) {
    const ir::Node& n = nodes[i];
    if (n.rng && !generators[i] && !in_block(n.rng->seed, n.rng->offset))
      return static_cast<int64_t>(i);
    const auto [seed_arg, offset_arg] = ir::seed_offset_args(*n.op);
    if (seed_arg < 0) continue;
    if (in_block(static_cast<uint64_t>(n.args[seed_arg].attribute().to_int()),
                 static_cast<uint64_t>(n.args[offset_arg].attribute().to_int())))
      seed_uses.push_back({i, seed_arg, offset_arg});
  }
  return -1;
}

void Program::run_nodes(std::vector<Tensor>& env, std::optional<Phase> only, uint64_t seed,
                        uint64_t base, const std::vector<GeneratorState>* rng) const {
  // See Note [Random ops in a program].
  auto rebase = [&](uint64_t offset) { return base + (offset - rng_offset); };
  size_t next_seed_use = 0;
  const auto& nodes = graph.nodes();
  for (size_t i = 0; i < nodes.size(); ++i) {
    const ir::Node& n = nodes[i];
    if (only && phases[i] != *only) continue;
    if (node_kernel[i] >= 0) {  // Note [Fusion]
      const FusedKernel& k = kernels[node_kernel[i]];
      if (k.members.back() == i) run_kernel(k, env);
      for (ir::ValueId v : frees[i]) env[v] = Tensor();
      continue;
    }
    Stack s = ir::build_stack(n, [&](ir::ValueId id) { return env[id]; });
    if (n.rng) {
      GeneratorState st;
      if (rng != nullptr) {
        st = (*rng)[i];
      } else if (generators[i]) {
        const TensorSpec& o = graph.value(n.outputs[0]).meta;
        std::tie(st.seed, st.offset) = const_cast<Generator&>(*generators[i])
            .reserve(random_op_counters(n.op->info().name, numel_of(o.sizes), o.dtype));
      } else {
        st = GeneratorState{seed, rebase(n.rng->offset)};
      }
      Generator g(st.seed);
      g.set_state(st);
      s[ir::generator_arg(*n.op)] = IValue(g);
    }
    while (next_seed_use < seed_uses.size() && seed_uses[next_seed_use].node < i) ++next_seed_use;
    for (; next_seed_use < seed_uses.size() && seed_uses[next_seed_use].node == i; ++next_seed_use) {
      const SeedUse& u = seed_uses[next_seed_use];
      if (rng != nullptr) {  // CompiledGraph: this run's own (seed, offset)
        s[u.seed_arg] = IValue(static_cast<int64_t>((*rng)[i].seed));
        s[u.offset_arg] = IValue(static_cast<int64_t>((*rng)[i].offset));
        continue;
      }
      s[u.seed_arg] = IValue(static_cast<int64_t>(seed));
      s[u.offset_arg] = IValue(static_cast<int64_t>(
          rebase(static_cast<uint64_t>(s[u.offset_arg].to_int()))));
    }
    call_node(n, node_keys[i], s, env);
    for (ir::ValueId v : frees[i]) env[v] = Tensor();
  }
}

std::vector<Tensor> Program::run(const std::vector<Tensor>& args) const {
  std::vector<Tensor> env(static_cast<size_t>(graph.num_values()));
  const std::vector<ir::ValueId>& in = graph.inputs();
  std::vector<Tensor> input_tensors(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    const InputSource& s = sources[i];
    if (s.kind == InputSource::Kind::Arg) input_tensors[i] = args[s.index];
    if (s.kind == InputSource::Kind::Captured) input_tensors[i] = s.tensor;
  }
  for (size_t i = 0; i < in.size(); ++i)
    if (sources[i].kind == InputSource::Kind::GradOf)
      input_tensors[i] = input_tensors[sources[i].index].grad();
  for (size_t i = 0; i < in.size(); ++i) env[in[i]] = input_tensors[i];
  uint64_t seed = 0, base = 0;
  if (rng_count > 0) std::tie(seed, base) = default_generator().reserve(rng_count);
  {
    // The program holds the backward and optimizer ops explicitly: nothing above the backends
    // (autograd, autocast, tracing) may act again.
    ExcludeDispatchKeyGuard below(DispatchKeySet::all() - DispatchKeySet::backends());
    run_nodes(env, aot ? std::optional<Phase>(Phase::Forward) : std::nullopt, seed, base);
  }
  for (const GradWrite& w : grad_writes)
    input_tensors[w.input].set_grad(w.value >= 0 ? env[w.value] : Tensor());
  std::vector<Tensor> out;
  out.reserve(outputs.size());
  for (ir::ValueId v : outputs) out.push_back(v >= 0 ? env[v] : Tensor());
  if (!aot) return out;
  std::vector<Tensor> saved_tensors;
  for (ir::ValueId v : saved) saved_tensors.push_back(env[v]);
  return attach_backward(input_tensors, std::move(out), std::move(saved_tensors), seed, base);
}

std::vector<Tensor> Program::attach_backward(const std::vector<Tensor>& input_tensors,
                                             std::vector<Tensor> out,
                                             std::vector<Tensor> saved_tensors, uint64_t seed,
                                             uint64_t base) const {
  std::shared_ptr<const Program> self = shared_from_this();
  auto backward = [self, saved_tensors = std::move(saved_tensors), seed, base](
                      autograd::AutogradContext*, autograd::variable_list grads) {
    const Program& p = *self;
    std::vector<Tensor> env(static_cast<size_t>(p.graph.num_values()));
    for (size_t k = 0; k < p.saved.size(); ++k) env[p.saved[k]] = saved_tensors[k];
    const std::vector<ir::ValueId>& in = p.graph.inputs();
    for (size_t i = 0; i < in.size(); ++i) {
      const InputSource& s = p.sources[i];
      if (s.kind != InputSource::Kind::GradOutput) continue;
      const Tensor& g = static_cast<size_t>(s.index) < grads.size() ? grads[s.index] : Tensor();
      const TensorSpec& spec = p.graph.value(in[i]).meta;
      env[in[i]] = g.defined() ? g.contiguous() : kiln::zeros(spec.sizes, spec.dtype, spec.device);
    }
    {
      ExcludeDispatchKeyGuard below(DispatchKeySet::all() - DispatchKeySet::backends());
      p.run_nodes(env, Phase::Backward, seed, base);
    }
    autograd::variable_list result;
    for (ir::ValueId v : p.input_grads) result.push_back(v >= 0 ? env[v] : Tensor());
    return result;
  };
  auto node =
      std::make_shared<autograd::CustomFunctionNode>("CompiledFunctionBackward", std::move(backward));
  autograd::variable_list diff;
  for (int k : diff_inputs) diff.push_back(input_tensors[k]);
  node->collect_inputs(diff, true);
  for (Tensor& t : out)
    if (t.defined()) t = t.detach();
  return node->wrap_outputs(diff, std::move(out), true);
}

}  // namespace kiln::compiler::detail

namespace kiln::compiler {

CompiledGraph::CompiledGraph(ir::Graph g, RandomBlock block)
    : p_(std::make_shared<detail::Program>()) {
  ir::verify_or_throw(g);
  detail::Program& p = *p_;
  p.graph = std::move(g);
  p.num_args = static_cast<int>(p.graph.inputs().size());
  for (int i = 0; i < p.num_args; ++i) {
    p.sources.push_back(detail::InputSource{detail::InputSource::Kind::Arg, i, {}});
    p.guards.emplace_back();
    p.arg_alias.push_back(-1);
  }
  p.generators.assign(p.graph.nodes().size(), std::nullopt);
  p.phases.assign(p.graph.nodes().size(), detail::Phase::Forward);
  p.outputs = p.graph.outputs();
  std::tie(p.rng_seed, p.rng_offset, p.rng_count) =
      std::tuple(block.seed, block.offset, block.count);
  if (block.count > 0) {
    const int64_t outside = p.find_block_uses();
    KILN_CHECK(outside < 0, Value, "CompiledGraph: node ", outside, " '",
               outside < 0 ? "" : p.graph.nodes()[outside].op_name,
               "' draws outside the graph's block of random numbers");
  } else {
    // Seeded ops (dropout_seeded, ...) take this run's seed and offset too (run()'s `rng`).
    for (size_t i = 0; i < p.graph.nodes().size(); ++i) {
      const auto [seed_arg, offset_arg] = ir::seed_offset_args(*p.graph.nodes()[i].op);
      if (seed_arg >= 0) p.seed_uses.push_back({i, seed_arg, offset_arg});
    }
  }
  if (detail::fusion_enabled()) {
    std::string problem = detail::compiler_problem();
    KILN_CHECK(problem.empty(), Runtime, problem);
    detail::fuse(p);  // a group that does not build leaves the graph unfused
  }
  p.finalize();
}

CompiledGraph::~CompiledGraph() = default;

namespace {

// A CompiledGraph's run: per-node random states when `rng` is given, else the block moved to
// (seed, base).
std::vector<Tensor> run_graph(const detail::Program& p, const std::vector<Tensor>& inputs,
                              uint64_t seed, uint64_t base,
                              const std::vector<GeneratorState>* rng) {
  KILN_CHECK(inputs.size() == p.graph.inputs().size(), Value, "CompiledGraph: ", inputs.size(),
             " inputs for a graph of ", p.graph.inputs().size());
  std::vector<Tensor> env(static_cast<size_t>(p.graph.num_values()));
  for (size_t i = 0; i < inputs.size(); ++i) env[p.graph.inputs()[i]] = inputs[i];
  {
    ExcludeDispatchKeyGuard below(DispatchKeySet::all() - DispatchKeySet::backends());
    p.run_nodes(env, std::nullopt, seed, base, rng);
  }
  std::vector<Tensor> out;
  for (ir::ValueId v : p.outputs) out.push_back(env[v]);
  return out;
}

}  // namespace

std::vector<Tensor> CompiledGraph::run(const std::vector<Tensor>& inputs,
                                       const std::vector<GeneratorState>& rng) const {
  KILN_CHECK(rng.size() == p_->graph.nodes().size(), Value, "CompiledGraph: ", rng.size(),
             " random states for ", p_->graph.nodes().size(), " nodes");
  return run_graph(*p_, inputs, 0, 0, &rng);
}

std::vector<Tensor> CompiledGraph::run(const std::vector<Tensor>& inputs, uint64_t seed,
                                       uint64_t base) const {
  if (p_->rng_count == 0)
    for (const ir::Node& n : p_->graph.nodes())
      KILN_CHECK(!n.rng && ir::seed_offset_args(*n.op).first < 0, Value, "CompiledGraph: node '",
                 n.op_name, "' draws random numbers, and the graph was built without its block");
  return run_graph(*p_, inputs, seed, base, nullptr);
}

int CompiledGraph::num_fused_loops() const { return static_cast<int>(p_->kernels.size()); }

std::string CompiledGraph::cuda_source(const ir::Graph& g) {
  detail::Program p;
  p.graph = g;
  p.generators.assign(g.nodes().size(), std::nullopt);
  p.phases.assign(g.nodes().size(), detail::Phase::Forward);
  p.outputs = g.outputs();
  return detail::cuda_source(p);
}

std::string CompiledGraph::compile_cuda(const std::string& source, const std::string& arch,
                                        std::string* ptx) {
  return detail::nvrtc_compile(source, arch, ptx);
}

}  // namespace kiln::compiler
