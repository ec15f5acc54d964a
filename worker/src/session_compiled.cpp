// The worker's compiled-graph cache: a recorded step that comes again runs as one compiled graph.
//
// Note [Compiled batches]: a training step streamed by a Remote client arrives as a batch whose
// instructions are the same every step but for value ids, data and random states. A segment of
// a batch (a run of at least kMinOps instructions and Frees, none of them on DTensors, in a
// session without a memory limit) gets a key: each op with its attributes, its arguments named
// by position (a value defined earlier in the segment, or the segment's k-th outside value),
// which instructions draw random numbers (seeded ops' `seed` and `offset` left out), the Frees,
// and every outside value's dtype, layout and device. The first time a key is seen the segment runs
// as usual; the second time it is built into a compiler::CompiledGraph (one node per instruction,
// fused loops; kiln/compiler/graph.h) and runs compiled from then on, with each random node and
// seeded op given the (seed, offset) this batch recorded. The values the segment leaves bound (not
// freed within it) are the graph's outputs and are bound to this batch's ids. Anything unusual (a
// missing, poisoned or non-resident outside value, an output id that shadows a live value, a graph
// that does not build) runs the segment instruction by instruction as before, so errors read the
// same.
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>

#include "kiln/compiler/graph.h"
#include "kiln/dist/remote.h"
#include "session_state.h"

namespace kiln::worker::session_detail {
namespace {

constexpr int kMinOps = 16;

using ir::spec_of;

// One segment as the cache sees it.
struct Segment {
  int end = 0;                      // the command after it
  int ops = 0;
  std::string key;
  std::vector<int64_t> outside;     // wire ids of the outside values, in first-use order
  std::vector<int64_t> local_wire;  // wire id of each value the segment defines
  std::vector<int> bound;           // local values still bound after the segment, in order
  std::vector<int64_t> freed_outside;
  std::vector<std::pair<int, int>> seeded;  // per instruction: its seed and offset arguments
};

// The segment starting at command `i`; nullopt when it cannot be compiled.
std::optional<Segment> scan(State& s, const SessionOptions& opt, const proto::Batch& batch, int i) {
  if (opt.memory_limit_bytes != 0) return std::nullopt;
  Segment seg;
  absl::flat_hash_map<int64_t, int> local, outside;
  absl::flat_hash_map<int64_t, bool> freed;  // wire id -> freed after its last definition
  auto ref = [&](int64_t id) -> std::string {
    auto l = local.find(id);
    if (l != local.end()) return absl::StrCat("l", l->second);
    auto [o, fresh] = outside.emplace(id, static_cast<int>(seg.outside.size()));
    if (fresh) seg.outside.push_back(id);
    return absl::StrCat("x", o->second);
  };
  int j = i;
  for (; j < batch.commands_size(); ++j) {
    const proto::Command& c = batch.commands(j);
    if (c.kind_case() == proto::Command::kFree) {
      seg.key += "F";
      for (int64_t id : c.free().ids()) {
        seg.key += ref(id);
        freed[id] = true;
      }
      continue;
    }
    if (c.kind_case() != proto::Command::kOp || c.op().dtensor_args_size() > 0) break;
    const proto::Instruction& in = c.op();
    const OpEntry* e = lookup(s, in.op());
    if (e == nullptr || in.args_size() != e->op->info().num_args) return std::nullopt;
    const auto [seed_arg, offset_arg] = e->seed_offset_args;
    seg.seeded.emplace_back(seed_arg, offset_arg);
    ++seg.ops;
    absl::StrAppend(&seg.key, in.op(), "(");
    int64_t written = -1;  // the value an in-place (self) or out= (out) op returns
    for (int a = 0; a < in.args_size(); ++a) {
      const proto::Argument& arg = in.args(a);
      switch (arg.kind_case()) {
        case proto::Argument::kValue:
          if (a == e->written_arg) written = arg.value();
          seg.key += ref(arg.value());
          break;
        case proto::Argument::kValues:
          seg.key += "[";
          for (int64_t id : arg.values().ids()) seg.key += ref(id) + ",";
          seg.key += "]";
          break;
        case proto::Argument::kAttribute:
          // A seeded op's seed and offset change every step: run() passes them (see below).
          if (a == seed_arg || a == offset_arg)
            seg.key += "S";
          else
            seg.key += arg.attribute().SerializeAsString();
          break;
        default:
          return std::nullopt;
      }
      seg.key += ";";
    }
    // Seeds that are not plain integers: the instruction path reports what is wrong.
    for (int a : {seed_arg, offset_arg})
      if (a >= 0 && in.args(a).attribute().kind_case() != proto::Attribute::kIntValue)
        return std::nullopt;
    absl::StrAppend(&seg.key, ")", in.has_rng() ? "r" : "", in.outputs_size(), "\n");
    for (int64_t id : in.outputs()) {
      // An output may rebind only the value the op writes in place (check_outputs' rule).
      const bool live = local.contains(id) ? !freed[id] : s.values.contains(id);
      if (id <= 0 || s.pending.contains(id) || (live && id != written)) return std::nullopt;
      local[id] = static_cast<int>(seg.local_wire.size());
      seg.local_wire.push_back(id);
      freed[id] = false;
    }
  }
  if (seg.ops < kMinOps) return std::nullopt;
  seg.end = j;
  for (size_t k = 0; k < seg.local_wire.size(); ++k) {
    const int64_t id = seg.local_wire[k];
    if (local.at(id) == static_cast<int>(k) && !freed[id]) seg.bound.push_back(static_cast<int>(k));
  }
  for (int64_t id : seg.outside) {
    auto v = s.values.find(id);
    if (v == s.values.end() || v->second.error || !v->second.t.defined()) return std::nullopt;
    const Tensor& t = v->second.t;
    if (!t.impl()->storage()->has_data() || s.released.contains(t.impl()->storage().get()))
      return std::nullopt;
    const TensorSpec sp = spec_of(t);
    absl::StrAppend(&seg.key, "|", scalar_type_name(sp.dtype), sp.device.str(), "[",
                    absl::StrJoin(sp.sizes, ","), "/", absl::StrJoin(sp.strides, ","), "+",
                    sp.offset, sp.wrapped_number ? "w" : "", "]");
    if (freed.contains(id) && freed[id] && !local.contains(id)) seg.freed_outside.push_back(id);
  }
  return seg;
}

// The segment as a graph: outside values are its inputs, bound values its outputs.
ir::Graph build_graph(const State& s, const SessionOptions& opt, const proto::Batch& batch,
                      int i, const Segment& seg) {
  ir::Graph g;
  absl::flat_hash_map<int64_t, ir::ValueId> ids;
  for (int64_t id : seg.outside) {
    const Tensor& t = s.values.at(id).t;
    std::optional<Scalar> number;
    if (t.impl()->is_wrapped_number() && t.numel() == 1) number = t.item();
    ids[id] = g.add_input(spec_of(t), number).id;
  }
  std::vector<ir::ValueId> local_ids;
  for (int j = i; j < seg.end; ++j) {
    const proto::Command& c = batch.commands(j);
    if (c.kind_case() != proto::Command::kOp) continue;
    const proto::Instruction& in = c.op();
    std::vector<ir::NodeArg> args;
    for (const proto::Argument& a : in.args()) {
      if (a.kind_case() == proto::Argument::kValue) {
        args.emplace_back(ir::ValueRef{ids.at(a.value())});
      } else if (a.kind_case() == proto::Argument::kValues) {
        std::vector<ir::ValueRef> vs;
        for (int64_t id : a.values().ids()) vs.push_back(ir::ValueRef{ids.at(id)});
        args.emplace_back(vs);
      } else {
        args.emplace_back(decode_instruction_attribute(a.attribute(), opt));
      }
    }
    std::optional<GeneratorState> rng;
    if (in.has_rng()) rng = GeneratorState{in.rng().seed(), in.rng().offset()};
    std::vector<ir::ValueRef> outs = g.add_node(in.op(), std::move(args), rng);
    KILN_CHECK(static_cast<int>(outs.size()) == in.outputs_size(), Value, in.op(),
               ": the instruction names ", in.outputs_size(), " outputs; the op makes ", outs.size());
    for (int k = 0; k < in.outputs_size(); ++k) {
      ids[in.outputs(k)] = outs[k].id;
      local_ids.push_back(outs[k].id);
    }
  }
  std::vector<ir::ValueRef> outs;
  for (int k : seg.bound) outs.push_back(ir::ValueRef{local_ids[k]});
  g.set_outputs(outs);
  return g;
}

}  // namespace

int run_compiled_segment(State& s, const SessionOptions& opt, const proto::Batch& batch, int i,
                         int* plain_until) {
  *plain_until = i + 1;
  std::optional<Segment> seg = scan(s, opt, batch, i);
  if (!seg) return -1;
  *plain_until = seg->end;  // not compiled: the whole segment runs as usual, scanned once
  if (s.compiled.size() >= 64 && !s.compiled.contains(seg->key)) s.compiled.clear();
  State::CompiledEntry& e = s.compiled[seg->key];
  if (e.failed || ++e.seen < 2) return -1;
  if (!e.graph) {
    try {
      e.graph = std::make_shared<compiler::CompiledGraph>(build_graph(s, opt, batch, i, *seg));
    } catch (const Error&) {
      e.failed = true;  // runs instruction by instruction, which reports what is wrong
      return -1;
    }
  }
  std::vector<Tensor> inputs;
  for (int64_t id : seg->outside) inputs.push_back(s.values.at(id).t);
  std::vector<GeneratorState> rng;
  uint64_t first_seq = 0;
  for (int j = i; j < seg->end; ++j) {
    const proto::Command& c = batch.commands(j);
    if (c.kind_case() != proto::Command::kOp) continue;
    if (rng.empty()) first_seq = c.op().seq();
    GeneratorState st{c.op().rng().seed(), c.op().rng().offset()};
    const auto [seed_arg, offset_arg] = seg->seeded[rng.size()];
    auto int_arg = [&](int a) {
      return static_cast<uint64_t>(proto::decode_attribute(c.op().args(a).attribute()).to_int());
    };
    if (seed_arg >= 0) st = GeneratorState{int_arg(seed_arg), int_arg(offset_arg)};
    rng.push_back(st);
  }
  std::vector<Tensor> results;
  ErrorPtr err;
  try {
    Doing doing(s, first_seq, rng.size());
    results = e.graph->run(inputs, rng);
  } catch (const Error& x) {
    err = make_error(code_of(x), kind_name(x.kind()), x.what(), first_seq, "compiled step");
  }
  for (size_t k = 0; k < seg->bound.size(); ++k)
    bind(s, seg->local_wire[seg->bound[k]], err ? Tensor() : std::move(results[k]), err);
  if (err) fail(s, err);
  for (int64_t id : seg->freed_outside) forget(s, id);
  s.instructions.fetch_add(seg->ops, std::memory_order_relaxed);
  s.compiled_runs.fetch_add(1, std::memory_order_relaxed);
  return seg->end;
}

}  // namespace kiln::worker::session_detail
