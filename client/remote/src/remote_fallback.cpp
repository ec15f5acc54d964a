// The Remote backend: one boxed fallback records any op from its schema and meta function into
// the connection's pending Batch (DESIGN.md "The dispatcher"; Note [Remote values] in
// kiln/client/connection.h). No per-op code, except that copy_ between a Remote tensor and a
// tensor with data is the transfer itself (upload with Create, download with Fetch).
#include <optional>

#include "kiln/client/connection.h"
#include "kiln/default_device.h"
#include "kiln/dispatcher.h"
#include "kiln/generated/ops.h"
#include "kiln/generated/ops/copy.h"
#include "kiln/generator.h"
#include "kiln/proto/codec.h"
#include "record.h"

namespace kiln::client {
namespace {

bool is_remote(const Tensor& t) { return t.device().type() == DeviceType::Remote; }

// The remote device an op runs on: that of its first Remote tensor (or Device argument).
Device op_device(const OperatorHandle& op, const Stack& s, size_t base) {
  const OpInfo& info = op.info();
  for (int i = 0; i < info.num_args; ++i) {
    const IValue& v = s[base + i];
    if (v.is_tensor() && v.to_tensor().defined() && is_remote(v.to_tensor()))
      return v.to_tensor().device();
    if (v.is_tensor_list())
      for (const Tensor& t : v.to_tensor_list())
        if (is_remote(t)) return t.device();
    if (v.is<Device>() && v.get<Device>().type() == DeviceType::Remote) return v.get<Device>();
  }
  KILN_FAIL(Runtime, op.name(), ": the Remote backend was called without a remote tensor");
}

void set_rng(const OperatorHandle& op, const Stack& s, size_t base,
             const std::vector<TensorSpec>& specs, proto::Instruction* ins) {
  const OpInfo& info = op.info();
  for (int i = 0; i < info.num_args; ++i) {
    if (info.args[i].arg_type != ArgType::OptionalGenerator) continue;
    const IValue& g = s[base + i];
    Generator gen = g.is_none() ? default_generator() : g.get<Generator>();
    KILN_ASSERT(!specs.empty(), op.name(), ": a random op without outputs");
    // Reserve exactly what the eager call would (Note [Random ops in the IR]).
    auto [seed, offset] =
        gen.reserve(random_op_counters(info.name, numel_of(specs[0].sizes), specs[0].dtype));
    ins->mutable_rng()->set_seed(seed);
    ins->mutable_rng()->set_offset(offset);
    return;
  }
  KILN_ASSERT(false, "random op without a Generator? argument: ", op.name());
}

// copy_(dst, src) with exactly one side Remote (or two different remote devices).
void transfer(const OperatorHandle& op, DispatchKeySet, Stack& s) {
  size_t base = s.size() - op.info().num_args;
  Tensor dst = s[base].to_tensor();
  Tensor src = s[base + 1].to_tensor();
  IValue non_blocking = s[base + 2];
  op.run_meta(s);  // shapes and dtypes checked here, not at the next read
  if (is_remote(src)) {
    // Download, then finish the copy where dst lives (which may itself be remote).
    Tensor fetched = connection_for(src.device())->fetch(remote_value(src, "copy_").id);
    Stack inner{dst, fetched, non_blocking};
    if (is_remote(dst)) {
      transfer(op, DispatchKeySet(), inner);
    } else {
      op.redispatch_boxed(DispatchKeySet(backend_key(dst.device().type())), inner);
    }
  } else {
    auto conn = connection_for(dst.device());
    std::lock_guard<std::mutex> lock(conn->mutex());
    conn->check_open();
    int64_t tmp = conn->new_id();
    conn->add_create(tmp, src);
    proto::Instruction* ins = conn->add_instruction();
    ins->set_seq(conn->new_seq());
    ins->set_op("copy_");
    ins->add_args()->set_value(remote_value(dst, "copy_").id);
    ins->add_args()->set_value(tmp);
    *ins->add_args()->mutable_attribute() = proto::encode_attribute(non_blocking);
    ins->add_outputs(remote_value(dst, "copy_").id);
    conn->release(tmp);
    conn->maybe_flush();
  }
  dst.impl()->bump_version();
  s.erase(s.end() - op.info().num_args, s.end());
  s.emplace_back(dst);
}

void remote_fallback(const OperatorHandle& op, DispatchKeySet ks, Stack& s) {
  const OpInfo& info = op.info();
  size_t base = s.size() - info.num_args;
  if (&op == &ops::copy_::handle()) {
    const Tensor& dst = s[base].to_tensor();
    const Tensor& src = s[base + 1].to_tensor();
    if (dst.device() != src.device()) return transfer(op, ks, s);
  }
  // A factory op (no tensor arguments) given no device is here because the default device is
  // remote (kiln/default_device.h): name that device, so that the worker makes the result on its
  // own device. An op with tensor arguments keeps None (a *_like row: its input's device).
  bool factory = true;
  for (int i = 0; i < info.num_args; ++i)
    factory = factory && !s[base + i].is_tensor() && !s[base + i].is_tensor_list();
  for (int i = 0; factory && i < info.num_args; ++i)
    if (info.args[i].arg_type == ArgType::OptionalDevice && s[base + i].is_none())
      s[base + i] = IValue(default_device());
  std::shared_ptr<Connection> conn = connection_for(op_device(op, s, base));
  std::vector<TensorSpec> specs = op.run_meta(s);

  std::lock_guard<std::mutex> lock(conn->mutex());
  conn->check_open();
  std::vector<Tensor> outs;
  {
    detail::ArgEncoder enc(op, conn);
    // Built aside and queued last: uploads of its CPU inputs must precede it in the batch.
    proto::Instruction instruction;
    proto::Instruction* ins = &instruction;
    ins->set_seq(conn->new_seq());
    if (CallSiteFn site = call_site_provider()) conn->note_call_site(ins->seq(), site());
    ins->set_op(info.name);
    for (int i = 0; i < info.num_args; ++i) enc.encode(s[base + i], info.args[i], ins->add_args());
    if (info.is_random) set_rng(op, s, base, specs, ins);
    outs.reserve(specs.size());
    for (const TensorSpec& spec : specs) {
      if (spec.alias_of >= 0 && !info.is_view) {
        // In-place and out=: the result is the argument itself; the worker re-binds its id.
        Tensor t = s[base + spec.alias_of].to_tensor();
        if (info.is_out && t.sizes() != spec.sizes.ref()) t.impl()->resize(spec.sizes);
        ins->add_outputs(remote_value(t, info.name).id);
        outs.push_back(std::move(t));
        continue;
      }
      int64_t id = conn->new_id();
      ins->add_outputs(id);
      if (spec.alias_of >= 0) {
        // A view shares its base's storage here, as the worker's view shares the base's data.
        const Tensor& b = s[base + spec.alias_of].to_tensor();
        auto impl = TensorImpl::make(b.impl()->storage(), b.dtype(), spec.sizes, spec.strides,
                                     spec.offset);
        impl->set_view_of(b.impl_ptr());  // Note [View bases]
        impl->set_backend_handle(std::make_shared<RemoteValue>(conn, id));
        outs.emplace_back(std::move(impl));
      } else {
        outs.push_back(make_remote_tensor(conn, id, spec.dtype, spec.sizes, spec.strides,
                                          spec.offset));
      }
    }
    if (info.is_inplace && s[base].is_tensor()) s[base].to_tensor().impl()->bump_version();
    conn->add_instruction()->Swap(ins);
  }
  conn->maybe_flush();
  s.erase(s.end() - info.num_args, s.end());
  if (info.returns_list) {
    s.emplace_back(std::move(outs));
  } else {
    for (Tensor& t : outs) s.emplace_back(std::move(t));
  }
}

// A *_like row (See below): recorded, unless its result goes to a device with data (x.to("cpu")
// goes through empty_like(x, device="cpu")), which the row makes here from x's geometry.
void remote_like(const OperatorHandle& op, DispatchKeySet ks, Stack& s) {
  const OpInfo& info = op.info();
  const size_t base = s.size() - info.num_args;
  for (int i = 0; i < info.num_args; ++i) {
    const IValue& v = s[base + i];
    if (std::string_view(info.args[i].name) != "device" || !v.is<Device>() ||
        v.get<Device>().type() == DeviceType::Remote)
      continue;
    const Tensor self = s[base].to_tensor();
    s[base] = empty_strided(self.sizes(), self.strides(), self.dtype(), kMeta);
    return op.call_boxed(s);
  }
  remote_fallback(op, ks, s);
}

// The *_like rows are composite, but Remote records them as themselves: their decomposition
// would write this client's sizes into the program, and on a gang a shard's sizes can differ from
// worker to worker (Note [Remote DTensor]); so .to(), clone and contiguous, which decompose
// through empty_like, make each worker's tensor in its own shape.
KILN_LIBRARY(Remote, m) {
  m.fallback(&remote_fallback);
  for (OperatorHandle* op : Dispatcher::get().ops()) {
    const OpInfo& info = op->info();
    if (info.sharding == ShardingRule::Creation && info.kind == OpKind::Composite &&
        info.num_args > 0 && info.args[0].arg_type == ArgType::Tensor)
      Dispatcher::get().register_kernel(*op, m.key(), nullptr, &remote_like);
  }
}

}  // namespace
}  // namespace kiln::client
