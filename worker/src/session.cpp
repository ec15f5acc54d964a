// One client's session: the value table and the executor (kiln/worker/session.h).
//
// The success path of an instruction is: an op lookup in a flat map, a Stack rebuilt in place
// (reserved once), one boxed call, and a flat-map insert per output. Strings are built only on
// failure, so a one-element op costs little more than the kernel and the dispatcher.
#include "kiln/worker/session.h"

#include <absl/container/flat_hash_map.h>
#include <absl/strings/str_cat.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "kiln/dispatcher.h"
#include "kiln/dist/process_group.h"
#include "kiln/dist/remote.h"
#include "kiln/error.h"
#include "kiln/generated/ops.h"
#include "kiln/generator.h"
#include "kiln/storage.h"
#include "kiln/proto/codec.h"
#include "reports.h"
#include "session_state.h"

namespace kiln::worker {
namespace session_detail {

ErrorPtr make_error(std::string code, std::string kind, std::string message, uint64_t seq,
                    std::string op) {
  auto e = std::make_shared<proto::Error>();
  e->set_code(std::move(code));
  e->set_kind(std::move(kind));
  e->set_message(std::move(message));
  e->set_seq(seq);
  e->set_op(std::move(op));
  return e;
}

const char* kind_name(ErrorKind k) {
  switch (k) {
    case ErrorKind::Value: return "value";
    case ErrorKind::Type: return "type";
    case ErrorKind::Index: return "index";
    case ErrorKind::NotImplemented: return "not_implemented";
    case ErrorKind::Runtime: return "runtime";
  }
  return "runtime";
}

// DESIGN.md "Errors": bad input is INVALID_ARGUMENT; an allocation failure RESOURCE_EXHAUSTED.
const char* code_of(const Error& e) {
  switch (e.kind()) {
    case ErrorKind::Value:
    case ErrorKind::Type:
    case ErrorKind::Index: return "INVALID_ARGUMENT";
    case ErrorKind::NotImplemented: return "UNIMPLEMENTED";
    case ErrorKind::Runtime:
      return std::string_view(e.what()).find("out of memory") != std::string_view::npos
                 ? "RESOURCE_EXHAUSTED"
                 : "INTERNAL";
  }
  return "INTERNAL";
}

void add_ref(State& s, const Tensor& t) {
  const Storage* st = t.impl()->storage().get();
  StorageUse& u = s.storages[st];
  if (u.refs++ == 0) {
    u.bytes = st->nbytes();
    s.in_use.fetch_add(u.bytes, std::memory_order_relaxed);
  }
}

void drop_ref(State& s, const Tensor& t) {
  auto it = s.storages.find(t.impl()->storage().get());
  if (it == s.storages.end() || --it->second.refs > 0) return;
  s.in_use.fetch_sub(it->second.bytes, std::memory_order_relaxed);
  s.released.erase(it->first);  // the address may come back for a new storage
  s.storages.erase(it);
}

void bind(State& s, int64_t id, Tensor t, ErrorPtr error) {
  if (t.defined()) add_ref(s, t);
  State::Value& v = s.values[id];
  if (v.t.defined()) drop_ref(s, v.t);
  v.t = std::move(t);
  v.error = std::move(error);
}

void forget(State& s, int64_t id) {
  auto it = s.values.find(id);
  if (it != s.values.end()) {
    if (it->second.t.defined()) drop_ref(s, it->second.t);
    s.values.erase(it);
  }
  s.pending.erase(id);
}

void fail(State& s, const ErrorPtr& e) {
  if (!s.first_failure) s.first_failure = e;
}

// Why `id` has no entry in the table: its Create is incomplete, or it is unknown.
std::string missing_value(const State& s, int64_t id) {
  auto p = s.pending.find(id);
  if (p == s.pending.end()) return absl::StrCat("unknown value id ", id);
  return absl::StrCat("value id ", id, " is incomplete: its Create has received ",
                      p->second.received, " of ", p->second.total, " bytes");
}

IValue decode_instruction_attribute(const proto::Attribute& a, const SessionOptions& opt) {
  IValue x = proto::decode_attribute(a);
  if (x.is<Device>() && x.get<Device>().type() == DeviceType::Remote) x = IValue(opt.device);
  return x;
}

const OpEntry* lookup(State& s, const std::string& name) {
  auto it = s.ops.find(name);
  if (it != s.ops.end()) return &it->second;
  const OperatorHandle* op = Dispatcher::get().find(name);
  if (op == nullptr) return nullptr;
  OpEntry e{op, -1, -1, {}, ir::seed_offset_args(*op)};
  const OpInfo& info = op->info();
  for (int i = 0; i < info.num_args; ++i) {
    const ArgInfo& arg = info.args[i];
    if (arg.is_mutable) e.mutated_args.push_back(i);  // Tensor(a!), Tensor(a!)[]
    if (arg.arg_type == ArgType::OptionalGenerator) e.generator_arg = i;
    // The generator appends out= as the last argument.
    if (arg.arg_type == ArgType::Tensor &&
        ((info.is_inplace && i == 0) || (info.is_out && i == info.num_args - 1)))
      e.written_arg = i;
  }
  return &s.ops.emplace(name, e).first->second;
}

std::string op_label(const proto::Instruction& in) {
  return absl::StrCat("op '", in.op(), "' (seq ", in.seq(), ")");
}

}  // namespace session_detail

using namespace session_detail;  // NOLINT: this file's own helpers (session_state.h)

Session::Session(SessionOptions options) : options_(std::move(options)), state_(new State) {
  state_->stack.reserve(16);
}

Session::~Session() { delete state_; }

int64_t Session::num_values() const { return static_cast<int64_t>(state_->values.size()); }
uint64_t Session::memory_in_use_bytes() const {
  return state_->in_use.load(std::memory_order_relaxed);
}
std::string Session::activity() const {
  State::Activity& a = state_->activity;
  std::lock_guard<std::mutex> lock(a.mu);
  const double for_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - a.since).count();
  const std::string what =
      a.segment > 0 ? absl::StrCat("running a compiled segment of ", a.segment,
                                   " instructions from #", a.seq)
      : a.op.empty() ? "idle (waiting for the client's next batch)"
                     : absl::StrCat("running instruction #", a.seq, " '", std::string(a.op), "'");
  return absl::StrCat(what, " for ", absl::SixDigits(for_s), " s");
}

uint64_t Session::instructions_run() const {
  return state_->instructions.load(std::memory_order_relaxed);
}

uint64_t Session::compiled_runs() const {
  return state_->compiled_runs.load(std::memory_order_relaxed);
}

// ---- DTensors (Note [Remote DTensor] in kiln/dist/remote.h) -------------------------------------

static dist::DeviceMesh mesh_of(State& s, const proto::MeshRef& ref) {
  std::string key = ref.SerializeAsString();
  auto it = s.meshes.find(key);
  if (it != s.meshes.end()) return it->second;
  auto failed = s.failed_roots.find(ref.root());
  if (failed != s.failed_roots.end())
    KILN_FAIL(Value, "device mesh ", ref.root(), " could not be made: ", failed->second->message());
  auto root = s.roots.find(ref.root());
  KILN_CHECK(root != s.roots.end(), Value, "unknown device mesh ", ref.root(),
             " (no MeshCreate named it)");
  std::vector<std::string> names(ref.names().begin(), ref.names().end());
  std::vector<std::vector<int64_t>> dims;
  for (const proto::IntList& l : ref.root_dims())
    dims.emplace_back(l.values().begin(), l.values().end());
  dist::DeviceMesh m = dist::mesh_on_root(root->second, names, dims);
  return s.meshes.emplace(std::move(key), m).first->second;
}

dist::Placements session_detail::decode_placements(
    const google::protobuf::RepeatedPtrField<proto::PlacementSpec>& ps) {
  dist::Placements out;
  for (const proto::PlacementSpec& p : ps) {
    KILN_CHECK(p.kind() >= 0 && p.kind() <= 2, Value, "placement kind ", p.kind(),
               " (expected 0 Shard, 1 Replicate, 2 Partial)");
    if (p.kind() == 0) out.push_back(dist::Shard(p.dim()));
    if (p.kind() == 1) out.push_back(dist::Replicate());
    if (p.kind() == 2) {
      KILN_CHECK(p.reduce() >= 0 && p.reduce() <= static_cast<int32_t>(dist::ReduceOp::Product),
                 Value, "placement reduce op ", p.reduce(), " is out of range");
      out.push_back(dist::Partial(static_cast<dist::ReduceOp>(p.reduce())));
    }
  }
  return out;
}

// The spec of a DTensor whose shard on this worker is `local`; ValueError when they disagree.
dist::DTensorSpec session_detail::decode_spec(State& s, const proto::DTensorSpec& p,
                                              const Tensor& local) {
  dist::DTensorSpec spec;
  spec.mesh = mesh_of(s, p.mesh());
  spec.shape = DimVector(IntArrayRef(p.shape().data(), p.shape().size()));
  spec.stride = DimVector(IntArrayRef(p.stride().data(), p.stride().size()));
  KILN_CHECK(spec.shape.size() == spec.stride.size(), Value, "DTensor spec: shape ",
             IntArrayRef(spec.shape), " and stride ", IntArrayRef(spec.stride), " differ in rank");
  // Sizes and strides a client sent: none negative, and the bytes they span fit in int64.
  int64_t extent = 1;
  for (size_t d = 0; d < spec.shape.size(); ++d) {
    const int64_t n = spec.shape[d], st = spec.stride[d];
    KILN_CHECK(n >= 0 && st >= 0, Value, "DTensor spec: negative size or stride in shape ",
               IntArrayRef(spec.shape), ", stride ", IntArrayRef(spec.stride));
    int64_t span = 0;
    KILN_CHECK(n == 0 || (!__builtin_mul_overflow(n - 1, st, &span) &&
                          !__builtin_add_overflow(extent, span, &extent) &&
                          !__builtin_mul_overflow(extent, int64_t{16}, &span)),
               Value, "DTensor spec: shape ", IntArrayRef(spec.shape), " with stride ",
               IntArrayRef(spec.stride), " spans more elements than int64 counts");
  }
  int64_t numel = 1;
  for (int64_t n : spec.shape)
    KILN_CHECK(!__builtin_mul_overflow(numel, n, &numel), Value, "DTensor spec: shape ",
               IntArrayRef(spec.shape), " has more elements than int64 counts");
  KILN_CHECK(p.placements_size() == spec.mesh.ndim(), Value, "DTensor spec: ", p.placements_size(),
             " placements for a mesh of ", spec.mesh.ndim(), " dims");
  spec.placements =
      dist::detail::check_placements("DTensor spec", spec.mesh, decode_placements(p.placements()),
                                     static_cast<int64_t>(spec.shape.size()));
  spec.dtype = local.dtype();
  const DimVector expect = dist::local_shape(IntArrayRef(spec.shape), spec.mesh, spec.placements);
  KILN_CHECK(IntArrayRef(expect) == local.sizes(), Value, "rank ", dist::default_group()->rank(),
             " holds a shard of shape ", local.sizes(), " but ",
             dist::placements_str(spec.placements), " of global shape ", IntArrayRef(spec.shape),
             " give it ", IntArrayRef(expect));
  return spec;
}

// Wraps the DTensor arguments of `in` around this worker's shards on the stack.
static void wrap_dtensors(State& s, const proto::Instruction& in, Stack& st) {
  for (const proto::DTensorArg& d : in.dtensor_args()) {
    KILN_CHECK(d.arg() >= 0 && d.arg() < static_cast<int>(st.size()), Value, in.op(),
               ": DTensor argument ", d.arg(), " is out of range");
    IValue& v = st[d.arg()];
    if (d.elem() < 0) {
      KILN_CHECK(v.is_tensor() && v.to_tensor().defined() && !dist::is_dtensor(v.to_tensor()),
                 Value, in.op(), ": DTensor argument ", d.arg(),
                 " is not a tensor, or is named twice");
      Tensor t = v.to_tensor();
      v = dist::detail::make_dtensor(t, decode_spec(s, d.spec(), t));
    } else {
      KILN_CHECK(v.is_tensor_list() && d.elem() < static_cast<int>(v.to_tensor_list().size()) &&
                     v.to_tensor_list()[d.elem()].defined() &&
                     !dist::is_dtensor(v.to_tensor_list()[d.elem()]),
                 Value, in.op(), ": DTensor argument ", d.arg(), "[", d.elem(),
                 "] is not a tensor of a tensor list, or is named twice");
      std::vector<Tensor> l = v.to_tensor_list();
      l[d.elem()] = dist::detail::make_dtensor(l[d.elem()], decode_spec(s, d.spec(), l[d.elem()]));
      v = std::move(l);
    }
  }
}

// Result `k` of a DTensor instruction against the client's spec of it: the same placements and
// global shape, or the client's program would go on from a DTensor that is not what it thinks.
static void check_result(const proto::Instruction& in, int k, const Tensor& t) {
  KILN_CHECK(k < in.results_size(), Runtime, in.op(), ": the client sent ", in.results_size(),
             " DTensor result specs, the op returned more DTensors");
  const proto::DTensorSpec& want = in.results(k);
  const dist::DTensorSpec& got = dist::detail::spec_of(t);
  const dist::Placements p = decode_placements(want.placements());
  const IntArrayRef shape(want.shape().data(), want.shape().size());
  KILN_CHECK(p == got.placements && shape == IntArrayRef(got.shape), Runtime, in.op(),
             ": this worker's DTensor dispatch gave result ", k, " ",
             dist::placements_str(got.placements), " of shape ", IntArrayRef(got.shape),
             ", the client's ", dist::placements_str(p), " of shape ", shape,
             " (a worker and its client disagree on a sharding rule: are they the same build?)");
}

// ValueError when `t`'s memory was Released and not refilled.
void session_detail::check_resident(const State& s, const std::string& what, int64_t id,
                                    const Tensor& t) {
  if (s.released.empty() || !t.defined()) return;
  KILN_CHECK(!s.released.contains(t.impl()->storage().get()), Value, what, ": value id ", id,
             " was released (FSDP resharded it after forward) and not gathered again");
}

// Ends the stream (StreamError) when an output id is taken: a new id may not shadow a live value
// except where the op writes that very argument in place and returns it (add_'s self, add.out's
// out): the result aliases it and is rebound.
static void check_outputs(State& s, const proto::Instruction& in, const OpEntry* e) {
  int64_t written = -1;
  if (e && e->written_arg >= 0 && e->written_arg < in.args_size() &&
      in.args(e->written_arg).has_value())
    written = in.args(e->written_arg).value();
  for (int k = 0; k < in.outputs_size(); ++k) {
    int64_t id = in.outputs(k);
    if (id <= 0) throw StreamError{absl::StrCat(op_label(in), ": output id ", id, " is not > 0")};
    for (int j = 0; j < k; ++j)
      if (in.outputs(j) == id)
        throw StreamError{absl::StrCat(op_label(in), ": output id ", id, " appears twice")};
    if (s.pending.contains(id) || (s.values.contains(id) && !(k == 0 && id == written)))
      throw StreamError{absl::StrCat(op_label(in), ": output id ", id, " is already in use")};
  }
}

std::string session_detail::memory_message(uint64_t limit, const std::string& what, uint64_t need,
                                           uint64_t in_use) {
  return absl::StrCat("worker memory limit ", limit, " bytes exceeded: ", what, " needs ", need,
                      " bytes with ", in_use, " in use");
}

// Runs one instruction; throws kiln::Error (or std::exception) for its own failure. Returns the
// poison of an input when one is poisoned (the op does not run).
static ErrorPtr execute(State& s, const SessionOptions& opt, const proto::Instruction& in,
                        const OpEntry* e) {
  KILN_CHECK(e != nullptr, Value, "unknown op '", in.op(), "' (not in the op table)");
  const OpInfo& info = e->op->info();
  KILN_CHECK(in.args_size() == info.num_args, Value, in.op(), ": expected ", info.num_args,
             " arguments (schema order, defaults included), got ", in.args_size());
  KILN_CHECK(info.returns_list || in.outputs_size() == info.num_returns, Value, in.op(),
             ": returns ", info.num_returns, " tensors but the instruction names ",
             in.outputs_size(), " output ids");
  // Every worker makes the groups a new mesh needs here, poisoned inputs or not: group creation
  // is collective (See Note [Mesh groups]).
  for (const proto::DTensorArg& d : in.dtensor_args()) mesh_of(s, d.spec().mesh());
  Stack& st = s.stack;
  st.clear();
  auto value = [&](int64_t id) -> const State::Value& {
    auto it = s.values.find(id);
    KILN_CHECK(it != s.values.end(), Value, in.op(), ": ", missing_value(s, id));
    return it->second;
  };
  for (int i = 0; i < in.args_size(); ++i) {
    const proto::Argument& a = in.args(i);
    switch (a.kind_case()) {
      case proto::Argument::kValue: {
        const State::Value& v = value(a.value());
        if (v.error) return v.error;
        check_resident(s, in.op(), a.value(), v.t);
        st.emplace_back(v.t);
        break;
      }
      case proto::Argument::kValues: {
        std::vector<Tensor> ts;
        ts.reserve(a.values().ids_size());
        for (int64_t id : a.values().ids()) {
          const State::Value& v = value(id);
          if (v.error) return v.error;
          check_resident(s, in.op(), id, v.t);
          ts.push_back(v.t);
        }
        st.emplace_back(std::move(ts));
        break;
      }
      case proto::Argument::kAttribute:
        st.push_back(decode_instruction_attribute(a.attribute(), opt));
        break;
      case proto::Argument::KIND_NOT_SET:
        KILN_FAIL(Value, in.op(), ": argument ", i, " (", info.args[i].name, ") has no value");
    }
  }
  if (in.has_rng()) {  // Note [Random ops in the IR]: replay the client's draw
    KILN_CHECK(e->generator_arg >= 0, Value, in.op(), ": has a (seed, offset) but no generator "
               "argument");
    Generator g(in.rng().seed());
    g.set_state({in.rng().seed(), in.rng().offset()});
    st[e->generator_arg] = IValue(std::move(g));
  }
  const bool dtensor = in.dtensor_args_size() > 0;
  if (dtensor) wrap_dtensors(s, in, st);
  const uint64_t limit = opt.memory_limit_bytes;
  if (limit && !dtensor) {  // refuse before allocating what cannot fit (a DTensor's: after)
    uint64_t need = 0;
    for (const TensorSpec& spec : e->op->run_meta(st)) {
      if (spec.alias_of >= 0) continue;
      int64_t n = 1;
      for (int64_t d : spec.sizes) n *= d;
      need += static_cast<uint64_t>(n) * element_size(spec.dtype);
    }
    uint64_t used = s.in_use.load(std::memory_order_relaxed);
    if (used + need > limit)
      return make_error("RESOURCE_EXHAUSTED", "runtime",
                        memory_message(limit, absl::StrCat("op '", in.op(), "'"), need, used),
                        in.seq(), in.op());
  }
  e->op->call_boxed(st);
  std::vector<Tensor>& out = s.results;
  out.clear();
  int checked = 0;  // of in.results(), the client's specs of the DTensor results
  auto shard = [&](const Tensor& t) {
    if (!dtensor || !dist::is_dtensor(t)) return t;
    check_result(in, checked++, t);
    return dist::detail::local_of(t);
  };
  for (IValue& v : st) {
    if (v.is_tensor())
      out.push_back(shard(v.to_tensor()));
    else if (v.is_tensor_list())
      for (const Tensor& t : v.to_tensor_list()) out.push_back(shard(t));
  }
  KILN_CHECK(out.size() == static_cast<size_t>(in.outputs_size()), Value, in.op(), ": returned ",
             out.size(), " tensors but the instruction names ", in.outputs_size(), " output ids");
  if (limit) {  // the authoritative count: distinct storages new to the table
    uint64_t need = 0;
    for (size_t k = 0; k < out.size(); ++k) {
      const Storage* sto = out[k].impl()->storage().get();
      bool seen = s.storages.contains(sto);
      for (size_t j = 0; j < k && !seen; ++j) seen = out[j].impl()->storage().get() == sto;
      if (!seen) need += sto->nbytes();
    }
    uint64_t used = s.in_use.load(std::memory_order_relaxed);
    if (used + need > limit)
      return make_error("RESOURCE_EXHAUSTED", "runtime",
                        memory_message(limit, absl::StrCat("op '", in.op(), "'"), need, used),
                        in.seq(), in.op());
  }
  for (int k = 0; k < in.outputs_size(); ++k) bind(s, in.outputs(k), std::move(out[k]), nullptr);
  st.clear();
  return nullptr;
}

static void run_instruction(State& s, const SessionOptions& opt, const proto::Instruction& in) {
  const OpEntry* e = lookup(s, in.op());
  Doing doing(s, in.op(), in.seq());
  check_outputs(s, in, e);
  s.instructions.fetch_add(1, std::memory_order_relaxed);
  ErrorPtr err;
  try {
    err = execute(s, opt, in, e);
  } catch (const Error& x) {
    err = make_error(code_of(x), kind_name(x.kind()), x.what(), in.seq(), in.op());
  } catch (const std::bad_alloc&) {
    err = make_error("RESOURCE_EXHAUSTED", "runtime", absl::StrCat(in.op(), ": out of memory"),
                     in.seq(), in.op());
  } catch (const std::exception& x) {
    err = make_error("INTERNAL", "runtime", x.what(), in.seq(), in.op());
  }
  if (!err) return;
  s.stack.clear();
  s.results.clear();
  for (int64_t id : in.outputs()) bind(s, id, Tensor(), err);
  // What the op would have written is unknown now (Note [Poisoned values]): an optimizer step
  // skipped for a poisoned gradient poisons its parameters, so no read returns stale values.
  if (e) {
    auto poison = [&](int64_t id) {
      if (s.values.contains(id)) bind(s, id, Tensor(), err);
    };
    for (int i : e->mutated_args) {
      if (i >= in.args_size()) continue;
      const proto::Argument& a = in.args(i);
      if (a.has_value()) poison(a.value());
      if (a.has_values())
        for (int64_t id : a.values().ids()) poison(id);
    }
  }
  fail(s, err);
}

static void run_create(State& s, const SessionOptions& opt, const proto::Create& c) {
  const int64_t id = c.id();
  auto where = [&] { return absl::StrCat("create of value id ", id); };
  if (id <= 0) throw StreamError{absl::StrCat(where(), ": ids are > 0")};
  if (s.values.contains(id)) throw StreamError{absl::StrCat(where(), ": the id is already in use")};
  auto [it, fresh] = s.pending.try_emplace(id);
  PendingCreate& p = it->second;
  try {
    if (fresh) {
      p.total = proto::wire_bytes(c.data());
      uint64_t used = s.in_use.load(std::memory_order_relaxed);
      if (opt.memory_limit_bytes && used + p.total > opt.memory_limit_bytes)
        p.rejected = make_error("RESOURCE_EXHAUSTED", "runtime",
                                memory_message(opt.memory_limit_bytes, where(), p.total, used), 0,
                                "create");
    }
    if (p.rejected) {  // follow the pieces without keeping them
      KILN_CHECK(c.data().offset() == p.received && c.data().data().size() <= p.total - p.received,
                 Value, "tensor data: piece at byte ", c.data().offset(), " of ",
                 c.data().data().size(), " bytes does not continue at byte ", p.received);
      p.received += c.data().data().size();
      if (p.received < p.total) return;
      ErrorPtr err = std::move(p.rejected);
      s.pending.erase(it);
      bind(s, id, Tensor(), err);
      fail(s, err);
      return;
    }
    p.assembler.add(c.data());
    p.received += c.data().data().size();
    if (!p.assembler.complete()) return;
    Tensor t = p.assembler.take();
    s.pending.erase(it);
    Device d = c.device().empty() ? opt.device : Device(c.device());
    if (d.type() == DeviceType::Remote) d = opt.device;
    if (d != kCPU) t = t.to(std::nullopt, d);
    // A wrapped number (a Python scalar become a 0-dim tensor) keeps its weak dtype in
    // promotion, as on the client.
    t.impl()->set_wrapped_number(c.wrapped_number());
    bind(s, id, std::move(t), nullptr);
  } catch (const Error& x) {
    s.pending.erase(id);
    throw StreamError{absl::StrCat(where(), ": ", x.what())};
  }
}

static void run_fetch(State& s, const proto::Fetch& f,
                      const std::function<void(proto::WorkerMessage&&)>& reply) {
  auto it = s.values.find(f.id());
  ErrorPtr err;
  if (it == s.values.end()) {
    err = make_error("INVALID_ARGUMENT", "value", absl::StrCat("fetch: ", missing_value(s, f.id())),
                     0, "fetch");
  } else if (it->second.error) {
    err = it->second.error;
  } else {
    try {
      check_resident(s, "fetch", f.id(), it->second.t);
      for (proto::TensorData& piece : proto::encode_tensor(it->second.t)) {
        proto::WorkerMessage m;
        m.mutable_fetch()->set_request(f.request());
        *m.mutable_fetch()->mutable_data() = std::move(piece);
        reply(std::move(m));
      }
      return;
    } catch (const Error& x) {
      err = make_error(code_of(x), kind_name(x.kind()), x.what(), 0, "fetch");
    }
  }
  proto::WorkerMessage m;
  m.mutable_fetch()->set_request(f.request());
  *m.mutable_fetch()->mutable_error() = *err;
  reply(std::move(m));
}

// See Note [Step telemetry] in reports.h. A loss that is not a one-element value of the table
// (unknown, poisoned, bigger) is left out of the record; the mark itself never fails.
static void run_step_mark(State& s, const SessionOptions& opt, const proto::StepMark& m) {
  const auto now = std::chrono::steady_clock::now();
  const double waited = dist::collective_wait_seconds();
  const double seconds = std::chrono::duration<double>(now - s.last_mark).count();
  const double ran =
      std::chrono::duration<double>(s.ran_since_mark + (now - s.batch_began)).count();
  const double busy = std::clamp(ran - (waited - s.waited_at_mark), 0.0, seconds);
  s.last_mark = now;
  s.waited_at_mark = waited;
  s.ran_since_mark = {};
  s.batch_began = now;  // the rest of this batch belongs to the next step
  if (opt.session_id.empty()) return;
  proto::StepRecord r;
  r.set_session_id(opt.session_id);
  r.set_step(m.step());
  r.set_rank(opt.rank);
  r.set_unix_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count());
  r.set_seconds(seconds);
  r.set_busy_seconds(busy);
  r.set_tokens(m.tokens());
  if (m.has_loss()) {
    auto it = s.values.find(m.loss());
    if (it != s.values.end() && !it->second.error && it->second.t.defined() &&
        it->second.t.numel() == 1) {
      try {
        r.set_loss(it->second.t.to(kFloat64, Device(kCPU)).item<double>());
      } catch (const Error&) {
      }
    }
  }
  report_step(std::move(r));
}

absl::Status Session::run(const proto::Batch& batch,
                          const std::function<void(proto::WorkerMessage&&)>& reply) {
  State& s = *state_;
  // The client recorded autograd, autocast, vmap and tracing already: run the kernels only, and
  // the DTensor key, which only the DTensors of a DTensor instruction have (Note [Remote DTensor]).
  ExcludeDispatchKeyGuard below(DispatchKeySet::all() - DispatchKeySet::backends() -
                                DispatchKeySet(DispatchKey::DTensor));
  int i = 0, plain_until = 0;
  s.batch_began = std::chrono::steady_clock::now();  // See Note [Step telemetry] in reports.h
  struct Ran {
    State& s;
    ~Ran() { s.ran_since_mark += std::chrono::steady_clock::now() - s.batch_began; }
  } ran{s};
  try {
    for (; i < batch.commands_size(); ++i) {
      const proto::Command& c = batch.commands(i);
      switch (c.kind_case()) {
        case proto::Command::kOp:
          if (i >= plain_until) {  // See Note [Compiled batches]
            if (int next = run_compiled_segment(s, options_, batch, i, &plain_until); next >= 0) {
              i = next - 1;
              break;
            }
          }
          run_instruction(s, options_, c.op());
          break;
        case proto::Command::kCreate: run_create(s, options_, c.create()); break;
        case proto::Command::kFetch: run_fetch(s, c.fetch(), reply); break;
        case proto::Command::kMesh:
          run_mesh(s, options_, c.mesh());
          break;
        case proto::Command::kRedistribute:
          run_redistribute(s, options_, c.redistribute());
          break;
        case proto::Command::kRelease:
          run_release(s, c.release());
          break;
        case proto::Command::kFree:
          for (int64_t id : c.free().ids()) forget(s, id);
          break;
        case proto::Command::kTransfer:
          run_transfer(s, options_, c.transfer());
          break;
        case proto::Command::kCheckpoint:
          run_checkpoint(s, c.checkpoint());
          break;
        case proto::Command::kStepMark:
          run_step_mark(s, options_, c.step_mark());
          break;
        case proto::Command::kSync: {
          proto::WorkerMessage m;
          m.mutable_sync()->set_request(c.sync().request());
          if (s.first_failure) *m.mutable_sync()->mutable_error() = *s.first_failure;
          s.first_failure.reset();
          reply(std::move(m));
          break;
        }
        case proto::Command::KIND_NOT_SET:
          return absl::InvalidArgumentError(
              absl::StrCat("command ", i, " of the batch has no kind (empty command)"));
      }
    }
  } catch (const StreamError& e) {
    return absl::InvalidArgumentError(absl::StrCat("command ", i, " of the batch: ", e.message));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("command ", i, " of the batch: ", e.what()));
  }
  return absl::OkStatus();
}

}  // namespace kiln::worker
