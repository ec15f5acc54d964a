// The tracer: the Tracing key's fallback records every op into the program's graph and runs it
// below Tracing. See Note [Capture] in kiln/compiler/compile.h.
#include <algorithm>
#include <sstream>
#include <unordered_map>

#include "kiln/autocast.h"
#include "kiln/autograd/engine.h"
#include "kiln/autograd/grad_mode.h"
#include "kiln/dispatcher.h"
#include "kiln/operators.h"
#include "kiln/storage.h"
#include "kiln/tensor_impl.h"
#include "program.h"

namespace kiln::compiler {
namespace detail {

using ir::spec_of;

namespace {

struct Tracer {
  Program prog;
  std::unordered_map<const TensorImpl*, ir::ValueId> ids;
  // The latest value written to each storage the trace has seen.
  std::unordered_map<const Storage*, ir::ValueId> storage_values;
  std::vector<Tensor> traced;     // node outputs, each once: kept alive so addresses stay unique
  std::vector<Tensor> inputs;     // per graph input: the tensor (an argument or a captured one)
  std::vector<Tensor> entry_grads;  // per graph input: its .grad when it was first seen
  // Tensors not yet seen whose .grad the function replaced (held, so addresses stay unique).
  std::unordered_map<const TensorImpl*, Tensor> grads_before;
  bool in_kernel = false;
  bool segmentable = false;  // the refusal is a graph break segments may split at (see break_at)
  std::string reason;             // the first refusal; the rest of the call runs untraced
  Event::Kind refusal = Event::Kind::GraphBreak;

  // A graph break that later calls may split into segments (Note [Graph break segments]): a data
  // read, or an op the IR cannot hold, which segments leave to eager.
  void break_at(std::string why) {
    if (reason.empty()) segmentable = true;
    refuse(Event::Kind::GraphBreak, std::move(why));
  }

  void refuse(Event::Kind kind, std::string why) {
    if (!reason.empty()) return;
    refusal = kind;
    reason = std::move(why);
  }

  ir::ValueId add_input(const Tensor& t, InputSource src) {
    std::optional<Scalar> number;
    if (t.impl()->is_wrapped_number() && t.numel() == 1 && t.device().is_cpu()) {
      in_kernel = true;  // the tracer's own read (Note [Data-read hook])
      number = t.item();
      in_kernel = false;
    }
    ir::ValueId id = prog.graph.add_input(spec_of(t), number).id;
    ids.emplace(t.impl(), id);
    prog.sources.push_back(std::move(src));
    prog.guards.push_back(TensorGuard::of(t));
    inputs.push_back(t);
    entry_grads.push_back(t.requires_grad() ? t.grad() : Tensor());
    // A .grad the function replaced before it first used the tensor (zero_grad(set_to_none) at
    // the start of a step): the program does not depend on the .grad the call began with.
    if (grads_before.count(t.impl())) prog.guards.back().check_grad = false;
    return id;
  }

  // The value of `t`. A tensor the trace has not seen is either an alias of a storage it has
  // seen, made without an op (detach(), autograd's saved outputs): an as_strided of the latest
  // value written there; or else a captured input.
  ir::ValueId value_of(const Tensor& t) {
    auto it = ids.find(t.impl());
    if (it != ids.end()) return it->second;
    auto st = storage_values.find(t.impl()->storage().get());
    if (st != storage_values.end()) {
      ir::ValueId id =
          prog.graph
              .add_node("as_strided", {ir::ValueRef{st->second}, std::vector<int64_t>(t.sizes().begin(), t.sizes().end()),
                                       std::vector<int64_t>(t.strides().begin(), t.strides().end()),
                                       t.storage_offset()})[0]
              .id;
      added_node(std::nullopt);
      ids.emplace(t.impl(), id);
      traced.push_back(t);
      return id;
    }
    ir::ValueId id = add_input(t, InputSource{InputSource::Kind::Captured, -1, t});
    storage_values.emplace(t.impl()->storage().get(), id);
    return id;
  }

  void record(const OperatorHandle& op, DispatchKeySet ks, Stack& stack);

  // The per-node tables of the node just added: its generator, and the phase of the step it
  // belongs to (the engine runs backward ops; what follows the first backward is the rest).
  bool seen_backward = false;
  void added_node(std::optional<Generator> gen) {
    prog.generators.push_back(std::move(gen));
    Phase ph = Phase::Forward;
    if (autograd::is_backward_running()) {
      ph = Phase::Backward;
      seen_backward = true;
    } else if (seen_backward) {
      ph = Phase::After;
    }
    prog.phases.push_back(ph);
  }
};

thread_local Tracer* t_tracer = nullptr;

void run_below(Tracer* tr, const OperatorHandle& op, DispatchKeySet ks, Stack& stack) {
  const bool was = tr != nullptr && tr->in_kernel;
  if (tr) tr->in_kernel = true;
  try {
    ExcludeDispatchKeyGuard below(DispatchKey::Tracing);
    op.redispatch_boxed(ks & DispatchKeySet::below(DispatchKey::Tracing), stack);
  } catch (...) {
    if (tr) tr->in_kernel = was;
    throw;
  }
  if (tr) tr->in_kernel = was;
}

void Tracer::record(const OperatorHandle& op, DispatchKeySet ks, Stack& stack) {
  const OpInfo& info = op.info();
  const int n = info.num_args;
  const size_t base = stack.size() - static_cast<size_t>(n);
  std::optional<GeneratorState> rng;
  std::optional<Generator> gen;
  for (int i = 0; i < n; ++i) {
    const IValue& v = stack[base + i];
    const ArgType type = info.args[i].arg_type;
    if (type == ArgType::Tensor && (!v.is_tensor() || !v.to_tensor().defined())) {
      break_at(std::string("op '") + info.name + "' got no tensor for argument '" +
               info.args[i].name + "'");
      return run_below(this, op, ks, stack);
    }
    if (type == ArgType::OptionalGenerator && info.is_random) {
      gen = v.is_none() ? std::nullopt : std::optional<Generator>(v.get<Generator>());
      rng = (gen ? *gen : default_generator()).get_state();
    }
  }
  std::vector<ir::NodeArg> args =
      node_args(info, stack, base, [this](const Tensor& t) { return value_of(t); });
  std::vector<ir::ValueRef> outs;
  try {
    outs = prog.graph.add_node(info.name, std::move(args), rng);
  } catch (const Error& e) {
    // Bad arguments raise the same error from the kernel below; anything else (an op without
    // a meta function) leaves the program unrecordable.
    break_at(std::string("op '") + info.name + "' cannot be recorded: " + e.what());
    return run_below(this, op, ks, stack);
  }
  added_node(gen);
  run_below(this, op, ks, stack);

  const std::vector<Tensor> results = stack_tensors(stack, base);
  if (results.size() != outs.size()) {
    refuse(Event::Kind::GraphBreak, std::string("op '") + info.name + "' returned " +
                                        std::to_string(results.size()) + " tensors, its meta " +
                                        std::to_string(outs.size()));
    return;
  }
  for (size_t k = 0; k < outs.size(); ++k) {
    const Tensor& t = results[k];
    const TensorSpec& s = prog.graph.value(outs[k].id).meta;
    if (!t.defined() || !same_geometry(s, t)) {
      std::ostringstream os;
      os << "op '" << info.name << "' output " << k << ": its meta function gives "
         << ir::spec_str(s) << ", the kernel ";
      if (t.defined()) os << ir::spec_str(spec_of(t));
      else os << "an undefined tensor";
      refuse(Event::Kind::GraphBreak, os.str());
      return;
    }
    auto [it, fresh] = ids.insert_or_assign(t.impl(), outs[k].id);
    if (fresh) traced.push_back(t);
    storage_values.insert_or_assign(t.impl()->storage().get(), outs[k].id);
  }
}

void tracing_fallback(const OperatorHandle& op, DispatchKeySet ks, Stack& stack) {
  Tracer* tr = t_tracer;
  if (tr == nullptr && segment_record(op, ks, stack)) return;
  if (tr == nullptr || tr->in_kernel || !tr->reason.empty()) return run_below(tr, op, ks, stack);
  tr->record(op, ks, stack);
}

// See Note [Data-read hook] in kiln/tensor_impl.h.
void on_data_read(const TensorImpl& impl) {
  Tracer* tr = t_tracer;
  if (tr == nullptr || tr->in_kernel || !tr->reason.empty()) return;
  auto it = tr->ids.find(&impl);
  if (it == tr->ids.end()) return;
  tr->break_at("the function read the data of %" + std::to_string(it->second) + " (" +
               ir::spec_str(tr->prog.graph.value(it->second).meta) +
               "), e.g. with item() or print: a program cannot replay a decision taken on a "
               "value, so these calls run in segments split at such reads");
}

void on_grad_set(const TensorImpl& impl) {
  Tracer* tr = t_tracer;
  if (tr == nullptr || tr->ids.count(&impl) || tr->grads_before.count(&impl)) return;
  tr->grads_before.emplace(&impl, Tensor(intrusive_ptr<TensorImpl>(const_cast<TensorImpl*>(&impl))));
}

KILN_LIBRARY(Tracing, m) { m.fallback(&tracing_fallback); }

// Installs the tracer on this thread for one call.
class TraceScope {
 public:
  explicit TraceScope(Tracer* tr)
      : saved_read_(kiln::detail::t_data_read_hook),
        saved_grad_(kiln::detail::t_grad_set_hook),
        include_(DispatchKey::Tracing) {
    t_tracer = tr;
    kiln::detail::t_data_read_hook = &on_data_read;
    kiln::detail::t_grad_set_hook = &on_grad_set;
  }
  ~TraceScope() {
    t_tracer = nullptr;
    kiln::detail::t_data_read_hook = saved_read_;
    kiln::detail::t_grad_set_hook = saved_grad_;
  }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  kiln::detail::DataReadHook saved_read_, saved_grad_;
  IncludeDispatchKeyGuard include_;
};

// Finds the nodes whose randomness comes from the default generator's block `before`..`after`
// (Note [Random ops in a program]).
void rebase_random(Tracer& tr, GeneratorState before, GeneratorState after) {
  Program& p = tr.prog;
  if (after.seed != before.seed) {
    tr.refuse(Event::Kind::Fallback, "the function reseeds the default generator");
    return;
  }
  p.rng_seed = before.seed;
  p.rng_offset = before.offset;
  p.rng_count = after.offset - before.offset;
  const int64_t outside = p.find_block_uses();
  if (outside >= 0)
    tr.refuse(Event::Kind::Fallback, "random op '" + p.graph.nodes()[outside].op_name +
                                         "' drew from the default generator outside this call");
}

// Outputs that need autograd, from a function that ran no backward itself: the backward is
// captured too (Note [Compiled backward]). It runs eagerly here, once, with ones as output
// gradients (each one a graph input), and consumes the eager graph, so nothing the forward
// saved stays held. A forward with effects (BatchNorm's running statistics) is not compiled
// this way: the program's first run repeats the forward, which would repeat its effects.
std::vector<size_t> need_autograd(const std::vector<Tensor>& outputs) {
  std::vector<size_t> need;
  for (size_t k = 0; k < outputs.size(); ++k)
    if (outputs[k].defined() && outputs[k].requires_grad() && !outputs[k].is_leaf()) need.push_back(k);
  return need;
}

// The rewritten forward `fwd`, run op by op through the whole dispatcher on the call's tensors
// (Note [Rewrites before the backward] in rewrite.cpp).
Fn interpret(std::shared_ptr<const Program> fwd) {
  return [fwd](const std::vector<Tensor>& args) {
    const Program& p = *fwd;
    std::vector<Tensor> env(static_cast<size_t>(p.graph.num_values()));
    for (size_t k = 0; k < p.sources.size(); ++k) {
      const InputSource& s = p.sources[k];
      env[p.graph.inputs()[k]] = s.kind == InputSource::Kind::Arg ? args[s.index] : s.tensor;
    }
    for (const ir::Node& n : p.graph.nodes()) {
      Stack s = ir::build_stack(n, [&](ir::ValueId id) { return env[id]; });
      call_node(n, DispatchKeySet(), s, env);
    }
    std::vector<Tensor> out;
    for (ir::ValueId v : p.outputs) out.push_back(v >= 0 ? env[v] : Tensor());
    return out;
  };
}

void trace_backward(Tracer& tr, const std::vector<Tensor>& outputs) {
  Program& p = tr.prog;
  const std::vector<size_t> need = need_autograd(outputs);
  if (need.empty()) return;
  auto refuse = [&](const std::string& why) {
    tr.refuse(Event::Kind::Fallback, "output " + std::to_string(need[0]) +
                                         " needs autograd, and " + why +
                                         ": compile the whole training step, or run under no_grad");
  };
  if (tr.seen_backward) return refuse("the function ran a backward itself");
  // Writing a tensor the forward made itself (copy_ into a fresh buffer) repeats harmlessly.
  const std::vector<ir::ValueId>& graph_inputs = p.graph.inputs();
  for (size_t i = 0; i < p.graph.nodes().size(); ++i) {
    if (!has_effects(p, i)) continue;
    const ir::Node& n = p.graph.nodes()[i];
    const OpInfo& info = n.op->info();
    bool outside = info.tags.has(OpTag::Collective) || p.generators[i].has_value();
    for (int a = 0; a < info.num_args && !outside; ++a) {
      if (!info.args[a].is_mutable) continue;
      for (ir::ValueId v : n.args[a].values()) {
        const ir::ValueId r = storage_root(p, v);
        outside = outside ||
                  std::find(graph_inputs.begin(), graph_inputs.end(), r) != graph_inputs.end();
      }
    }
    if (outside)
      return refuse("the forward has effects ('" + n.op_name + "' writes a tensor it did not make)");
  }
  std::vector<Tensor> outs, gouts;
  for (size_t k : need) {
    outs.push_back(outputs[k]);
    gouts.push_back(kiln::ones(outputs[k].sizes(), outputs[k].dtype(), outputs[k].device()));
    tr.add_input(gouts.back(), InputSource{InputSource::Kind::GradOutput, static_cast<int>(k), {}});
  }
  std::vector<Tensor> diff;
  for (size_t i = 0; i < tr.inputs.size(); ++i)
    if (p.sources[i].kind != InputSource::Kind::GradOutput && tr.inputs[i].requires_grad()) {
      p.diff_inputs.push_back(static_cast<int>(i));
      diff.push_back(tr.inputs[i]);
    }
  autograd::variable_list grads;
  {
    TraceScope scope(&tr);
    grads = autograd::grad(outs, diff, gouts, /*retain_graph=*/false, /*create_graph=*/false,
                           /*allow_unused=*/true);
  }
  if (!tr.reason.empty()) return;
  for (const Tensor& g : grads) p.input_grads.push_back(g.defined() ? tr.value_of(g) : -1);
  p.aot = true;
}

// A captured tensor that is some input's `.grad` reads that input's grad at replay.
void resolve_grads(Tracer& tr) {
  std::unordered_map<const TensorImpl*, int> grad_owner;
  for (size_t i = 0; i < tr.inputs.size(); ++i) {
    if (tr.entry_grads[i].defined()) grad_owner.emplace(tr.entry_grads[i].impl(), static_cast<int>(i));
  }
  for (size_t i = 0; i < tr.prog.sources.size(); ++i) {
    InputSource& s = tr.prog.sources[i];
    if (s.kind != InputSource::Kind::Captured) continue;
    auto it = grad_owner.find(tr.inputs[i].impl());
    if (it == grad_owner.end()) continue;
    s.kind = InputSource::Kind::GradOf;
    s.index = it->second;
    s.tensor = Tensor();
  }
}

// The `.grad` assignments the call made (Note [Capture]).
void record_grad_writes(Tracer& tr) {
  for (size_t i = 0; i < tr.inputs.size(); ++i) {
    const Tensor& t = tr.inputs[i];
    if (!t.requires_grad()) continue;
    Tensor now = t.grad();
    const Tensor& before = tr.entry_grads[i];
    if (!now.defined()) {
      if (before.defined()) tr.prog.grad_writes.push_back({static_cast<int>(i), -1});
      continue;
    }
    if (before.defined() && before.impl() == now.impl()) continue;
    auto it = tr.ids.find(now.impl());
    if (it == tr.ids.end()) {
      tr.refuse(Event::Kind::Fallback, "input %" + std::to_string(tr.prog.graph.inputs()[i]) +
                                           " got a .grad that no op of the function made");
      return;
    }
    tr.prog.grad_writes.push_back({static_cast<int>(i), it->second});
  }
}

// A tensor made inside the function that something still holds, other than its outputs and the
// gradients it assigned, is state the program would not update (Note [Capture]). The tracer's
// own references keep autograd graphs alive (a node that never ran in the backward still holds
// what it saved), so it lets go of everything only it holds, latest first, until nothing more
// is freed; what is left is held from outside.
void check_escapes(Tracer& tr, const std::vector<Tensor>& outputs) {
  std::unordered_map<const TensorImpl*, int> expected;
  auto keep = [&](const TensorImpl* t) {  // a view holds its base
    for (; t != nullptr; t = t->view_base().get()) ++expected[t];
  };
  for (const Tensor& o : outputs)
    if (o.defined()) keep(o.impl());
  for (const Tensor& t : tr.inputs)
    if (t.requires_grad()) keep(t.grad().impl());
  auto allowed = [&](const Tensor& t) {
    auto it = expected.find(t.impl());
    return it == expected.end() ? 0 : it->second;
  };
  for (bool freed = true; freed;) {
    freed = false;
    for (auto it = tr.traced.rbegin(); it != tr.traced.rend(); ++it) {
      if (it->defined() && it->impl()->use_count() - 1 <= allowed(*it)) {
        *it = Tensor();
        freed = true;
      }
    }
  }
  // A collective's result may stay referenced by its process group's finished work for a
  // while after the op returned (the communication thread drops it): that is not state.
  std::unordered_map<ir::ValueId, bool> collective;
  for (const ir::Node& n : tr.prog.graph.nodes())
    if (n.op->info().tags.has(OpTag::Collective))
      for (ir::ValueId o : n.outputs) collective[o] = true;
  for (const Tensor& t : tr.traced) {
    if (!t.defined()) continue;
    auto id = tr.ids.find(t.impl());
    if (id != tr.ids.end() && collective.count(id->second)) continue;
    std::string name = id == tr.ids.end() ? "a tensor" : "%" + std::to_string(id->second);
    for (const ir::Node& n : tr.prog.graph.nodes())
      for (ir::ValueId o : n.outputs)
        if (id != tr.ids.end() && o == id->second) name += ", made by '" + n.op_name + "'";
    tr.refuse(Event::Kind::Retry,
              name + " (" + ir::spec_str(spec_of(t)) +
                  ") was made inside the function and outlives it without being returned "
                  "(new state, such as an optimizer's first step); the next call captures again");
    return;
  }
}

}  // namespace

TensorGuard TensorGuard::of(const Tensor& t) {
  TensorGuard g;
  g.spec = spec_of(t);
  g.requires_grad = t.requires_grad();
  g.has_grad = g.requires_grad && t.grad().defined();
  return g;
}

std::string TensorGuard::mismatch(const Tensor& t) const {
  std::ostringstream os;
  if (!t.defined()) return "is undefined";
  const TensorSpec& s = spec;
  if (t.sizes() != s.sizes.ref())
    os << "sizes " << t.sizes() << " (captured: " << s.sizes.ref() << ")";
  else if (t.strides() != s.strides.ref())
    os << "strides " << t.strides() << " (captured: " << s.strides.ref() << ")";
  else if (t.storage_offset() != s.offset)
    os << "storage offset " << t.storage_offset() << " (captured: " << s.offset << ")";
  else if (t.dtype() != s.dtype)
    os << "dtype " << t.dtype() << " (captured: " << s.dtype << ")";
  else if (t.device() != s.device)
    os << "device " << t.device() << " (captured: " << s.device << ")";
  else if (t.requires_grad() != requires_grad)
    os << "requires_grad " << t.requires_grad() << " (captured: " << requires_grad << ")";
  else if (requires_grad && check_grad && t.grad().defined() != has_grad)
    os << (has_grad ? "has no .grad (captured with one)" : "has a .grad (captured without)");
  return os.str();
}

CaptureResult capture(const Fn& fn, const std::vector<Tensor>& args, bool rewrite_first, bool raw) {
  Tracer tr;
  Program& p = tr.prog;
  p.num_args = static_cast<int>(args.size());
  p.grad_mode = autograd::GradMode::is_enabled();
  p.autocast_cpu = is_autocast_enabled(DeviceType::CPU);
  p.autocast_dtype = get_autocast_dtype(DeviceType::CPU);
  for (size_t i = 0; i < args.size(); ++i) {
    const Tensor& a = args[i];
    KILN_CHECK(a.defined(), Value, "kiln.compile: argument ", i, " is an undefined tensor");
    const int alias = earlier_alias(args, static_cast<int>(i));
    p.arg_alias.push_back(alias);
    ir::ValueId id = tr.add_input(a, InputSource{InputSource::Kind::Arg, static_cast<int>(i), {}});
    tr.storage_values.emplace(a.impl()->storage().get(), id);
    if (alias >= 0) tr.ids[a.impl()] = id;
  }
  CaptureResult r;
  const GeneratorState rng_before = default_generator().get_state();
  {
    TraceScope scope(&tr);
    r.outputs = fn(args);
  }
  if (tr.reason.empty()) rebase_random(tr, rng_before, default_generator().get_state());
  if (tr.reason.empty()) resolve_grads(tr);
  for (size_t k = 0; k < r.outputs.size() && tr.reason.empty(); ++k) {
    const Tensor& o = r.outputs[k];
    p.outputs.push_back(o.defined() ? tr.value_of(o) : -1);
  }
  if (tr.reason.empty() && rewrite_first && !raw && !tr.seen_backward &&
      !need_autograd(r.outputs).empty()) {
    auto fwd = std::make_shared<Program>(p);
    std::string what;
    if (rewrite_forward(*fwd, &what) > 0) {
      r.outputs.clear();  // this run's autograd graph is not the one the program keeps
      CaptureResult again = capture(interpret(fwd), args, /*rewrite_first=*/false);
      if (again.program)
        again.program->rewrites =
            what + (again.program->rewrites.empty() ? "" : ", ") + again.program->rewrites;
      return again;
    }
  }
  if (tr.reason.empty() && !(raw && tr.seen_backward)) trace_backward(tr, r.outputs);
  if (tr.reason.empty()) record_grad_writes(tr);
  if (p.aot) r.outputs.clear();  // their graph is spent: the caller runs the program instead
  if (tr.reason.empty()) check_escapes(tr, r.outputs);
  if (!tr.reason.empty()) {
    r.refusal = tr.refusal;
    r.reason = std::move(tr.reason);
    r.segmentable = tr.segmentable;
    return r;
  }
  std::vector<ir::ValueRef> outs;
  for (ir::ValueId id : p.outputs)
    if (id >= 0) outs.push_back(ir::ValueRef{id});
  p.graph.set_outputs(outs);
  if (raw) {
    r.program = std::make_shared<Program>(std::move(tr.prog));
    return r;
  }
  if (std::string bad = run_passes(p); !bad.empty()) {
    r.refusal = Event::Kind::Fallback;
    r.reason = "the captured graph does not verify " + bad;
    return r;
  }
  if (std::string why = fuse(p); !why.empty()) p.cache_note = "runs unfused: " + why;
  p.finalize();
  r.program = std::make_shared<Program>(std::move(tr.prog));
  return r;
}

}  // namespace detail

bool is_capturing() { return detail::t_tracer != nullptr; }

}  // namespace kiln::compiler
