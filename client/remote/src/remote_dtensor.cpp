// The Remote backend's DTensor hooks (kiln/dist/remote.h, See Note [Remote DTensor]): meshes over
// a gang, ops on remote DTensors recorded for the workers' DTensor key, and redistribute as a
// command.
#include <nlohmann/json.hpp>

#include <optional>

#include "kiln/client/connection.h"
#include "kiln/dist/process_group.h"
#include "kiln/dist/remote.h"
#include "kiln/generator.h"
#include "kiln/kiln.h"
#include "record.h"

namespace kiln::client {
namespace {

using namespace kiln::dist;
namespace dd = kiln::dist::detail;

void encode_placements(const Placements& p,
                       google::protobuf::RepeatedPtrField<proto::PlacementSpec>* out) {
  for (const Placement& pl : p) {
    proto::PlacementSpec* e = out->Add();
    e->set_kind(static_cast<int32_t>(pl.kind));
    e->set_dim(pl.dim);
    e->set_reduce(static_cast<int32_t>(pl.reduce));
  }
}

void encode_spec(const DTensorSpec& s, proto::DTensorSpec* out) {
  proto::MeshRef* ref = out->mutable_mesh();
  ref->set_root(s.mesh.root_id());
  for (const std::string& n : s.mesh.dim_names()) ref->add_names(n);
  for (const std::vector<int64_t>& rd : s.mesh.root_dims())
    ref->add_root_dims()->mutable_values()->Add(rd.begin(), rd.end());
  encode_placements(s.placements, out->mutable_placements());
  out->mutable_shape()->Add(s.shape.begin(), s.shape.end());
  out->mutable_stride()->Add(s.stride.begin(), s.stride.end());
}

bool is_remote(const Tensor& t) { return t.defined() && t.device().type() == DeviceType::Remote; }

DeviceMesh init_mesh(std::string_view device_type, const std::vector<int64_t>& shape,
                     const std::vector<std::string>& names) {
  const Device dev{std::string(device_type)};
  KILN_CHECK(dev.type() == DeviceType::Remote, Value, "init_device_mesh: '", device_type,
             "' is not a remote device (expected 'remote:N', a kiln.connect session's device)");
  std::shared_ptr<Connection> conn = connection_for(dev);
  const int n = conn->transport().world_size();
  int64_t ranks = 1;
  for (int64_t s : shape)
    KILN_CHECK(s > 0 && !__builtin_mul_overflow(ranks, s, &ranks), Value,
               "init_device_mesh: mesh sizes must be positive and their product fit in int64, got ",
               IntArrayRef(shape));
  KILN_CHECK(ranks == n, Value, "init_device_mesh: mesh shape ", IntArrayRef(shape), " has ", ranks,
             " ranks but the session on ", dev, " has ", n, " workers");
  // The client plays rank 0 of a fake world of the gang's size (See Note [Remote DTensor]).
  if (!is_initialized()) {
    InitOptions o;
    o.backend = "fake";
    o.init_method = "";
    o.rank = 0;
    o.world_size = n;
    init_process_group(o);
  }
  KILN_CHECK(default_group()->fake() && default_group()->size() == n, Value, "init_device_mesh('",
             device_type, "'): this process already has a process group of ",
             default_group()->size(), " ranks ('", default_group()->name(),
             "'); a client that records for a gang of ", n,
             " workers must not be a rank itself, nor drive gangs of different sizes");
  DeviceMesh mesh = dd::make_root_mesh(dev.str(), shape, names);
  {
    std::lock_guard<std::mutex> lock(conn->mutex());
    conn->check_open();
    proto::MeshCreate* m = conn->add_command()->mutable_mesh();
    m->set_root(mesh.root_id());
    m->mutable_shape()->Add(shape.begin(), shape.end());
    for (const std::string& name : names) m->add_names(name);
    conn->maybe_flush();
  }
  return mesh;
}

// A meta tensor with `t`'s geometry (the shadow of a remote shard).
Tensor meta_like(const Tensor& t) {
  return empty_strided(t.sizes(), t.strides(), t.dtype(), kMeta);
}

void run_op(const OperatorHandle& op, Stack& args, Stack& out) {
  const OpInfo& info = op.info();
  const int n = info.num_args;
  // The shadow call (See Note [Remote DTensor]).
  std::shared_ptr<Connection> conn;
  auto shade = [&](const Tensor& t) -> Tensor {
    if (!t.defined()) return t;
    if (is_dtensor(t)) {
      const Tensor& l = dd::local_of(t);
      if (!conn && is_remote(l)) conn = connection_for(l.device());
      Tensor d = dd::make_dtensor(is_remote(l) ? meta_like(l) : l, dd::spec_of(t));
      dd::set_view_kind(d, dd::view_kind(t));
      if (t.requires_grad()) d.requires_grad_();  // the kernel's checks read it
      return d;
    }
    if (!is_remote(t)) return t;
    Tensor m = meta_like(t);
    if (t.requires_grad()) m.requires_grad_();  // the kernel's checks read it (plain_allowed)
    return m;
  };
  Stack shadow = args;
  for (IValue& v : shadow) {
    if (v.is_tensor()) {
      v = shade(v.to_tensor());
    } else if (v.is_tensor_list()) {
      std::vector<Tensor> l = v.to_tensor_list();
      for (Tensor& t : l) t = shade(t);
      v = std::move(l);
    }
  }
  KILN_ASSERT(conn != nullptr, op.name(), ": remote DTensor call without a remote shard");
  // A random op draws from a copy of the caller's generator state here; the caller's generator
  // then reserves what the eager op reserves, and the workers start from the same state.
  int gen_arg = -1;
  for (int i = 0; i < n; ++i)
    if (info.args[i].arg_type == ArgType::OptionalGenerator) gen_arg = i;
  std::optional<Generator> caller;
  if (info.is_random && gen_arg >= 0) {
    caller = args[gen_arg].is_none() ? default_generator() : args[gen_arg].get<Generator>();
    Generator copy(caller->get_state().seed);
    copy.set_state(caller->get_state());
    shadow[gen_arg] = IValue(std::move(copy));
  }
  Stack work = shadow;
  dd::run_dtensor_kernel(op, work);

  std::lock_guard<std::mutex> lock(conn->mutex());
  conn->check_open();
  Stack results;
  {
    detail::ArgEncoder enc(op, conn);
    proto::Instruction ins;
    ins.set_seq(conn->new_seq());
    if (CallSiteFn site = call_site_provider()) conn->note_call_site(ins.seq(), site());
    ins.set_op(info.name);
    auto add_dtensor = [&](int i, int elem, const Tensor& t) {
      proto::DTensorArg* d = ins.add_dtensor_args();
      d->set_arg(i);
      d->set_elem(elem);
      encode_spec(dd::spec_of(t), d->mutable_spec());
      return remote_value(dd::local_of(t), info.name).id;
    };
    for (int i = 0; i < n; ++i) {
      const IValue& v = args[i];
      proto::Argument* a = ins.add_args();
      if (v.is_tensor() && is_dtensor(v.to_tensor())) {
        a->set_value(add_dtensor(i, -1, v.to_tensor()));
      } else if (v.is_tensor_list()) {
        const std::vector<Tensor>& l = v.to_tensor_list();
        auto* ids = a->mutable_values()->mutable_ids();
        for (size_t k = 0; k < l.size(); ++k)
          ids->Add(is_dtensor(l[k]) ? add_dtensor(i, static_cast<int>(k), l[k]) : enc.id_of(l[k]));
      } else {
        enc.encode(v, info.args[i], a);
      }
    }
    if (caller) {
      const TensorSpec spec = op.run_meta(shadow).at(0);
      auto [seed, offset] =
          caller->reserve(random_op_counters(info.name, numel_of(spec.sizes), spec.dtype));
      ins.mutable_rng()->set_seed(seed);
      ins.mutable_rng()->set_offset(offset);
    }
    // A result that is an argument's shadow (in-place, out=) is that argument: its shards are
    // rebound on the workers. Any other gets a new id.
    auto result = [&](const Tensor& r) -> Tensor {
      if (!r.defined()) {  // the workers bind their undefined result to it too
        ins.add_outputs(conn->new_id());
        return r;
      }
      if (is_dtensor(r)) encode_spec(dd::spec_of(r), ins.add_results());
      for (int i = 0; i < n; ++i)
        if (info.args[i].is_mutable && shadow[i].is_tensor() && shadow[i].to_tensor().is_same(r)) {
          const Tensor& orig = args[i].to_tensor();
          ins.add_outputs(remote_value(dd::local_of(orig), info.name).id);
          return orig;
        }
      KILN_ASSERT(is_dtensor(r), op.name(), ": the DTensor kernel returned a plain tensor");
      const Tensor& l = dd::local_of(r);
      const int64_t id = conn->new_id();
      ins.add_outputs(id);
      Tensor d = dd::make_dtensor(
          make_remote_tensor(conn, id, l.dtype(), l.sizes(), l.strides(), l.storage_offset()),
          dd::spec_of(r));
      dd::set_view_kind(d, dd::view_kind(r));
      return d;
    };
    for (const IValue& v : work) {
      if (v.is_tensor()) {
        results.emplace_back(result(v.to_tensor()));
      } else if (v.is_tensor_list()) {
        std::vector<Tensor> l;
        for (const Tensor& t : v.to_tensor_list()) l.push_back(result(t));
        results.emplace_back(std::move(l));
      } else {
        results.push_back(v);
      }
    }
    for (int i = 0; i < n; ++i)
      if (info.args[i].is_mutable && args[i].is_tensor() && args[i].to_tensor().defined())
        args[i].to_tensor().impl()->bump_version();
    conn->add_instruction()->Swap(&ins);
  }
  conn->maybe_flush();
  for (IValue& v : results) out.push_back(std::move(v));
}

Tensor redistribute(const Tensor& local, const DTensorSpec& spec, const Placements& to,
                    const Tensor& into) {
  std::shared_ptr<Connection> conn = connection_for(local.device());
  const DimVector shape = local_shape(IntArrayRef(spec.shape), spec.mesh, to);
  std::lock_guard<std::mutex> lock(conn->mutex());
  conn->check_open();
  const int64_t id = into.defined() ? remote_value(into, "redistribute").id : conn->new_id();
  proto::Redistribute* r = conn->add_command()->mutable_redistribute();
  r->set_seq(conn->new_seq());
  r->set_input(remote_value(local, "redistribute").id);
  r->set_output(id);
  r->set_into(into.defined());
  encode_spec(spec, r->mutable_from());
  encode_placements(to, r->mutable_to());
  if (into.defined()) {
    conn->maybe_flush();
    return into;
  }
  Tensor out = make_remote_tensor(conn, id, local.dtype(), IntArrayRef(shape),
                                  IntArrayRef(contiguous_strides(IntArrayRef(shape))), 0);
  conn->maybe_flush();
  return out;
}

void release(const std::vector<Tensor>& values) {
  if (values.empty()) return;
  std::shared_ptr<Connection> conn = connection_for(values[0].device());
  std::lock_guard<std::mutex> lock(conn->mutex());
  conn->check_open();
  proto::Release* r = conn->add_command()->mutable_release();
  for (const Tensor& v : values) r->add_ids(remote_value(v, "release").id);
  conn->maybe_flush();
}

// See Note [Gang checkpoints] in kiln/dist/remote.h.
checkpoint::LoadResult run_checkpoint(const TensorMap& state, const std::string& dir,
                                      const std::string& extra, bool load, bool strict) {
  const char* what = load ? "checkpoint.load" : "checkpoint.save";
  KILN_CHECK(!state.empty(), Value, what, ": the state has no tensors");
  std::shared_ptr<Connection> conn;
  int64_t out = 0;
  {
    const Tensor& first = state.begin()->second;
    conn = connection_for((is_dtensor(first) ? dd::local_of(first) : first).device());
    std::lock_guard<std::mutex> lock(conn->mutex());
    conn->check_open();
    out = conn->new_id();
    proto::Checkpoint* c = conn->add_command()->mutable_checkpoint();
    c->set_seq(conn->new_seq());
    c->set_dir(dir);
    c->set_load(load);
    c->set_strict(strict);
    c->set_extra(extra);
    c->set_output(out);
    for (const auto& [name, t] : state) {
      const bool dt = is_dtensor(t);
      const Tensor& local = dt ? dd::local_of(t) : t;
      KILN_CHECK(local.device() == conn->device(), Value, what, ": '", name, "' lives on ",
                 local.device(), " and '", state.begin()->first, "' on ", conn->device(),
                 "; a checkpoint's tensors must all be on one gang");
      proto::CheckpointEntry* e = c->add_entries();
      e->set_name(name);
      e->set_id(remote_value(local, what).id);
      e->set_dtensor(dt);
      if (dt) encode_spec(dd::spec_of(t), e->mutable_spec());
      if (load) local.impl()->bump_version();  // written in place on the workers
    }
  }
  // A value the client does not keep: the fetch below is the call's wait, and raises its error.
  Tensor report = make_remote_tensor(conn, out, kUInt8, {0}, {1}, 0);
  Tensor bytes = conn->fetch(out);
  const std::string text(static_cast<const char*>(bytes.data_ptr()),
                         static_cast<size_t>(bytes.numel()));
  checkpoint::LoadResult r;
  if (!load) return r;
  const auto j = nlohmann::json::parse(text);
  r.missing_keys = j.at("missing").get<std::vector<std::string>>();
  r.unexpected_keys = j.at("unexpected").get<std::vector<std::string>>();
  r.extra = j.at("extra").get<std::string>();
  return r;
}

const bool g_registered = [] {
  dd::set_remote_hooks({&init_mesh, &run_op, &redistribute, &release, &run_checkpoint});
  return true;
}();

}  // namespace
}  // namespace kiln::client
