// Calls that a graph break keeps from being one program run as compiled segments between the
// breaks. See Note [Graph break segments].
#include <unordered_map>
#include <unordered_set>

#include "kiln/compiler/graph.h"
#include "kiln/default_device.h"
#include "kiln/dispatcher.h"
#include "kiln/operators.h"
#include "kiln/storage.h"
#include "kiln/tensor_impl.h"
#include "program.h"

namespace kiln::compiler::detail {

// Note [Graph break segments]: a call whose capture broke on a data read, or on an op the IR cannot
// hold (Note [Capture]), is not one program, but the ops between its breaks are. Later calls with
// the same guards run the function again under a segment recorder at the Tracing key. The recorder
// runs no kernel: an op becomes a node of a pending ir::Graph, and its results are tensors of the
// meta function's geometry over storages without memory yet (views are made for real: they read no
// data). The segment is flushed, that is computed, when anything but a kernel the recorder runs
// touches the memory of a tensor the segment makes or reads (user code's item() or numpy, a
// checkpoint, FSDP's gathers and frees, a collective's transport: Note [Storage access hook] in
// kiln/storage.h), before an op the recorder leaves to eager, and at the end of the call. Left to
// eager, after a flush: collectives, ops the meta functions cannot describe, ops on Remote values
// (handles, not memory), and ops that write part of a pending tensor. A flush keeps only the
// pending tensors something still holds (the caller, autograd's saved tensors, a .grad): their last
// values are the graph's outputs; the rest is dead. The graph gets a key as a worker's compiled
// batches do (Note [Compiled batches] in worker/src/session_compiled.cpp): its printed nodes
// without random states or seeded ops' seed and offset, its inputs' geometry and numbers, and its
// outputs. The first time a key is seen the graph runs node by node; the second time it becomes a
// CompiledGraph (fused loops) that runs from then on. Random nodes reserve their counters as they
// are recorded, in eager's order, and each run draws the (seed, offset) recorded this call, so a
// segmented call draws what the eager call would. A result's buffer is moved into its pending
// tensor's storage, or copied into new memory where the buffer is shared; dead tensors never get
// memory, so a segment holds no more than eager would. A kernel's error (an index out of range)
// surfaces at the flush, from the node's op.

namespace {

constexpr size_t kMinCompiledOps = 8;  // smaller segments run node by node
constexpr size_t kMaxKeys = 64;

struct Recorder;
thread_local Recorder* t_recorder = nullptr;

struct Recorder {
  SegmentCache& cache;
  std::vector<Event>& events;
  Recorder(SegmentCache& c, std::vector<Event>& e) : cache(c), events(e) {}

  ir::Graph graph;
  std::unordered_map<const TensorImpl*, ir::ValueId> ids;
  std::unordered_map<const Storage*, ir::ValueId> storage_values;  // latest value in a storage
  std::vector<Tensor> traced;  // results, held so that addresses stay unique
  std::vector<Tensor> inputs;  // per graph input: an alias of the tensor as it was first read
  // A storage the segment made (no memory until the flush) and the value its whole contents
  // will hold. Held only through its tensor in `traced`: autograd refuses some in-place ops on
  // a tensor whose storage has other owners.
  struct Pending {
    Storage* storage;
    TensorSpec spec;
    ir::ValueId value;
  };
  std::vector<Pending> pending;
  std::unordered_map<const Storage*, size_t> pending_of;
  // The storages of the segment's inputs: other code that reads them may see them before the
  // segment's writes, and other code that writes or frees them (FSDP) changes what it reads.
  std::unordered_set<const Storage*> outside;
  bool busy = false;                           // in a kernel or a flush: nothing to record

  ir::ValueId value_of(const Tensor& t) {
    auto it = ids.find(t.impl());
    if (it != ids.end()) return it->second;
    const Storage* st = t.impl()->storage().get();
    auto sv = storage_values.find(st);
    ir::ValueId id;
    if (sv != storage_values.end()) {  // an alias made without an op (detach(), saved outputs)
      id =
          graph
              .add_node("as_strided", {ir::ValueRef{sv->second},
                                       std::vector<int64_t>(t.sizes().begin(), t.sizes().end()),
                                       std::vector<int64_t>(t.strides().begin(), t.strides().end()),
                                       t.storage_offset()})[0]
              .id;
    } else {
      std::optional<Scalar> number;
      if (t.impl()->is_wrapped_number() && t.numel() == 1 && t.device().is_cpu())
        number = t.item();  // a Python number: never pending
      id = graph.add_input(ir::spec_of(t), number).id;
      // The tensor's geometry now: an in-place view op (t_()) may change it before the flush.
      Tensor alias(TensorImpl::make(t.impl()->storage(), t.dtype(), t.sizes(), t.strides(),
                                    t.storage_offset()));
      alias.impl()->set_wrapped_number(t.impl()->is_wrapped_number());
      inputs.push_back(std::move(alias));
      storage_values.emplace(st, id);
      outside.insert(st);
    }
    ids.emplace(t.impl(), id);
    traced.push_back(t);
    return id;
  }

  void bind(const Tensor& t, ir::ValueId id) {
    auto [it, fresh] = ids.insert_or_assign(t.impl(), id);
    if (fresh) traced.push_back(t);
    storage_values.insert_or_assign(t.impl()->storage().get(), id);
  }

  void run_below(const OperatorHandle& op, DispatchKeySet ks, Stack& stack) {
    const bool was = busy;
    busy = true;
    try {
      ExcludeDispatchKeyGuard below(DispatchKey::Tracing);
      op.redispatch_boxed(ks & DispatchKeySet::below(DispatchKey::Tracing), stack);
    } catch (...) {
      busy = was;
      throw;
    }
    busy = was;
  }

  // An op the segment does not record: flush, then run it eagerly.
  void eager(const OperatorHandle& op, DispatchKeySet ks, Stack& stack) {
    flush();
    run_below(op, ks, stack);
  }

  void record(const OperatorHandle& op, DispatchKeySet ks, Stack& stack);
  void flush();
  void clear() {
    graph = ir::Graph();
    ids.clear();
    storage_values.clear();
    traced.clear();
    inputs.clear();
    pending.clear();
    pending_of.clear();
    outside.clear();
  }
};

bool local(Device d) { return d.is_cpu() || d.is_cuda(); }
bool plain(const Tensor& t) {
  return t.defined() && t.impl()->backend_handle() == nullptr && local(t.device());
}

// Whether `t` is a pending tensor's storage viewed other than whole.
bool part_of_pending(const Recorder& r, const Tensor& t) {
  auto p = r.pending_of.find(t.impl()->storage().get());
  return p != r.pending_of.end() && !same_geometry(r.pending[p->second].spec, t);
}

void Recorder::record(const OperatorHandle& op, DispatchKeySet ks, Stack& stack) {
  const OpInfo& info = op.info();
  const int n = info.num_args;
  const size_t base = stack.size() - static_cast<size_t>(n);
  if (info.tags.has(OpTag::Collective)) return eager(op, ks, stack);
  // Every argument a plain CPU or CUDA tensor (a Remote value is a handle, not memory) where the
  // schema wants one, every device one of those; no write to part of a pending tensor.
  for (int i = 0; i < n; ++i) {
    const IValue& v = stack[base + i];
    if (info.args[i].arg_type == ArgType::Tensor && (!v.is_tensor() || !v.to_tensor().defined()))
      return eager(op, ks, stack);
    if (v.is<Device>() && !local(v.get<Device>())) return eager(op, ks, stack);
    if (v.is_tensor() && v.to_tensor().defined() && !plain(v.to_tensor()))
      return eager(op, ks, stack);
    if (v.is_tensor_list())
      for (const Tensor& t : v.to_tensor_list())
        if (!plain(t)) return eager(op, ks, stack);
    if (!info.args[i].is_mutable || info.is_view) continue;
    if (v.is_tensor() && v.to_tensor().defined() && part_of_pending(*this, v.to_tensor()))
      return eager(op, ks, stack);
    if (v.is_tensor_list())
      for (const Tensor& t : v.to_tensor_list())
        if (part_of_pending(*this, t)) return eager(op, ks, stack);
  }
  std::vector<ir::NodeArg> args =
      node_args(info, stack, base, [this](const Tensor& t) { return value_of(t); });
  // A random op reserves its counters here, as its kernel would have (Note [Random ops in the
  // IR]); an op the meta functions cannot describe stays eager.
  std::vector<ir::ValueRef> outs;
  try {
    outs = graph.add_node(info.name, std::move(args));
  } catch (const Error&) {
    return eager(op, ks, stack);
  }
  KILN_CHECK(info.returns_list || static_cast<int>(outs.size()) == info.num_returns, Runtime,
             "op '", info.name, "': its meta function gives ", outs.size(), " results for ",
             info.num_returns, " returns");
  if (info.is_view) {  // made for real: a view reads no data
    run_below(op, ks, stack);
    const std::vector<Tensor> results = stack_tensors(stack, base);
    KILN_CHECK(results.size() == outs.size(), Runtime, "view op '", info.name, "' returned ",
               results.size(), " tensors, its meta function ", outs.size());
    for (size_t k = 0; k < outs.size(); ++k) bind(results[k], outs[k].id);
    return;
  }
  std::vector<Tensor> results;
  for (const ir::ValueRef& o : outs) {
    const TensorSpec& spec = graph.value(o.id).meta;
    Tensor t;
    if (spec.alias_of >= 0) {  // in place or out=: the argument itself
      const IValue& a = stack[base + spec.alias_of];
      KILN_CHECK(a.is_tensor(), Runtime, "op '", info.name, "': result aliases argument ",
                 spec.alias_of, ", which is not a tensor");
      t = a.to_tensor();
      auto p = pending_of.find(t.impl()->storage().get());
      if (p != pending_of.end()) pending[p->second].value = o.id;
    } else {
      t = ir::fake_tensor(spec);  // no memory until the flush
      pending_of.emplace(t.impl()->storage().get(), pending.size());
      pending.push_back({t.impl()->storage().get(), spec, o.id});
    }
    bind(t, o.id);
    results.push_back(std::move(t));
  }
  stack.resize(base);
  if (info.returns_list) {
    stack.emplace_back(std::move(results));
  } else {
    for (Tensor& t : results) stack.emplace_back(std::move(t));
  }
}

// The key of a segment (Note [Graph break segments]).
std::string segment_key(const ir::Graph& g) {
  std::string key;
  auto put = [&](int64_t v) { key.append(reinterpret_cast<const char*>(&v), sizeof v); };
  for (ir::ValueId in : g.inputs()) {  // node outputs' metas follow from these and the ops
    const ir::Value& v = g.value(in);
    put(static_cast<int64_t>(v.meta.dtype) * 2 + v.meta.wrapped_number);
    put(static_cast<int64_t>(v.meta.device.type()) * 1024 + v.meta.device.index());
    put(static_cast<int64_t>(v.meta.sizes.size()));
    for (int64_t d : v.meta.sizes) put(d);
    for (int64_t d : v.meta.strides) put(d);
    put(v.meta.offset);
    const std::string r = v.number ? IValue(*v.number).repr() : "";
    put(static_cast<int64_t>(r.size()));
    key += r;
  }
  for (const ir::Node& n : g.nodes()) {
    put(reinterpret_cast<int64_t>(n.op));
    const auto [seed, offset] = ir::seed_offset_args(*n.op);
    for (size_t a = 0; a < n.args.size(); ++a) {
      const ir::NodeArg& arg = n.args[a];
      if (!arg.is_attribute()) {
        put(arg.is_value_list() ? static_cast<int64_t>(arg.values().size()) : -1);
        for (ir::ValueId v : arg.values()) put(v);
      } else if (static_cast<int>(a) != seed && static_cast<int>(a) != offset) {
        const std::string r = arg.attribute().repr();  // a random node's generator: None
        put(static_cast<int64_t>(r.size()));
        key += r;
      }
    }
    key += n.rng ? 'R' : '-';
  }
  for (ir::ValueId o : g.outputs()) put(o);
  return key;
}

// Per node: the (seed, offset) a random node or a seeded op draws this call.
std::vector<GeneratorState> draws(const ir::Graph& g) {
  std::vector<GeneratorState> rng(g.nodes().size());
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const ir::Node& n = g.nodes()[i];
    if (n.rng) rng[i] = *n.rng;
    const auto [seed, offset] = ir::seed_offset_args(*n.op);
    if (seed >= 0)
      rng[i] = {static_cast<uint64_t>(n.args[seed].attribute().to_int()),
                static_cast<uint64_t>(n.args[offset].attribute().to_int())};
  }
  return rng;
}

void Recorder::flush() {
  if (busy) return;
  if (graph.nodes().empty()) return clear();
  busy = true;
  struct Done {
    Recorder& r;
    ~Done() {
      r.clear();
      r.busy = false;
    }
  } done{*this};
  // Let go of what only the recorder holds, latest first, until nothing more is freed (a view
  // holds its base); a pending storage still held elsewhere is a result.
  std::vector<intrusive_ptr<Storage>> held;
  for (const Pending& p : pending) held.emplace_back(p.storage);
  for (bool freed = true; freed;) {
    freed = false;
    for (auto it = traced.rbegin(); it != traced.rend(); ++it)
      if (it->defined() && it->impl()->use_count() == 1) {
        *it = Tensor();
        freed = true;
      }
  }
  std::vector<size_t> live;
  std::vector<ir::ValueRef> outs;
  for (size_t i = 0; i < pending.size(); ++i)
    if (held[i].use_count() > 1) {
      live.push_back(i);
      outs.push_back(ir::ValueRef{pending[i].value});
    }
  graph.set_outputs(outs);
  std::string key = segment_key(graph);
  if (cache.entries.size() >= kMaxKeys && !cache.entries.count(key)) cache.entries.clear();
  SegmentCache::Entry& e = cache.entries[key];
  ++e.seen;
  if (e.seen == 2 && graph.nodes().size() >= kMinCompiledOps && fusion_enabled()) {
    const size_t nodes = graph.nodes().size(), n_in = graph.inputs().size();
    try {
      e.compiled = std::make_shared<CompiledGraph>(graph);
      events.push_back({Event::Kind::Segment,
                        std::to_string(nodes) + " ops, " + std::to_string(n_in) + " inputs, " +
                            std::to_string(outs.size()) + " outputs, " +
                            std::to_string(e.compiled->num_fused_loops()) + " fused loops"});
    } catch (const Error& err) {
      events.push_back({Event::Kind::Segment, std::string("runs op by op: ") + err.what()});
    }
  }
  std::vector<Tensor> results;
  {
    ExcludeDispatchKeyGuard below(DispatchKeySet::all() - DispatchKeySet::backends());
    if (e.compiled) {
      results = e.compiled->run(inputs, draws(graph));
      ++cache.compiled_runs;
    } else {
      results = ir::run(graph, inputs);
    }
    for (size_t k = 0; k < live.size(); ++k) {
      const Tensor& r = results[k];
      const TensorSpec& spec = pending[live[k]].spec;
      Storage& dst = *held[live[k]];
      Storage& src = *r.impl()->storage();
      if (r.impl()->use_count() == 1 && r.impl()->storage().use_count() == 1 &&
          r.storage_offset() == 0 && src.nbytes() == dst.nbytes() && src.device() == dst.device() &&
          r.strides() == spec.strides.ref()) {
        dst.swap_data(src);
      } else {
        dst.swap_data(*Storage::create(dst.nbytes(), dst.device()));
        Tensor(TensorImpl::make(held[live[k]], spec.dtype, spec.sizes, spec.strides, spec.offset))
            .copy_(r);
      }
    }
  }
}

// See Note [Storage access hook] in kiln/storage.h: an access to what the segment makes or
// reads, other than by a kernel the recorder runs.
void on_storage_access(const Storage& st) {
  Recorder* r = t_recorder;
  if (r == nullptr || r->busy) return;
  if (r->pending_of.count(&st) || r->outside.count(&st)) r->flush();
}

}  // namespace

bool segment_record(const OperatorHandle& op, DispatchKeySet ks, Stack& stack) {
  Recorder* r = t_recorder;
  if (r == nullptr) return false;
  if (r->busy) {
    r->run_below(op, ks, stack);
    return true;
  }
  r->record(op, ks, stack);
  return true;
}

bool is_recording_segments() { return t_recorder != nullptr; }

std::vector<Tensor> run_in_segments(SegmentCache& cache, std::vector<Event>& events, const Fn& fn,
                                    const std::vector<Tensor>& args) {
  // Factory ops would make Remote values, which are handles rather than memory: stay eager.
  if (!local(default_device())) return fn(args);
  Recorder rec(cache, events);
  struct Scope {
    Recorder* saved = t_recorder;
    kiln::detail::StorageHook saved_hook = kiln::detail::t_storage_hook;
    IncludeDispatchKeyGuard include{DispatchKey::Tracing};
    explicit Scope(Recorder* r) {
      t_recorder = r;
      kiln::detail::t_storage_hook = &on_storage_access;
    }
    ~Scope() {
      t_recorder = saved;
      kiln::detail::t_storage_hook = saved_hook;
    }
  } scope(&rec);
  std::vector<Tensor> out;
  try {
    out = fn(args);
  } catch (...) {
    // What ran before the error has taken effect in eager; it does here too.
    try {
      rec.flush();
    } catch (...) {
    }
    throw;
  }
  rec.flush();
  return out;
}

}  // namespace kiln::compiler::detail
