// kiln._C's distributed part (kiln/dist/process_group.h, kiln/dist/ddp.h, kiln/dist/device_mesh.h,
// kiln/dist/dtensor.h): process groups, Work, the TCP store, DDP's gradient reducer, device meshes
// and DTensor. kiln/distributed/__init__.py builds PyTorch's torch.distributed API on these;
// kiln/nn/parallel.py builds DistributedDataParallel; kiln/distributed/device_mesh.py and
// kiln/distributed/tensor/ build device meshes and DTensor.
//
//   pg = _C._init_process_group("ucx", "env://", -1, -1, None, 60.0, "world")
//   pg.all_reduce(t, "sum").wait(None)
//   r = _C._DdpReducer([("0.weight", w), ...], pg, 25.0, False)
// Blocking calls (wait, barrier, init) release the GIL.
#include <nanobind/stl/chrono.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include "kiln/dist/checkpoint.h"
#include "kiln/dist/ddp.h"
#include "kiln/dist/dtensor.h"
#include "kiln/dist/fsdp.h"
#include "kiln/dist/process_group.h"
#include "python_args.h"

namespace kiln::python {
namespace {

using namespace kiln::dist;
using Release = nb::call_guard<nb::gil_scoped_release>;

// kiln.distributed.checkpoint's flattened state dict, (names, tensors), as a TensorMap.
TensorMap state_map(const std::vector<std::string>& names, const std::vector<Tensor>& tensors) {
  TensorMap state;
  for (size_t i = 0; i < names.size() && i < tensors.size(); ++i) state[names[i]] = tensors[i];
  return state;
}

std::optional<Milliseconds> to_ms(std::optional<double> seconds) {
  if (!seconds) return std::nullopt;
  KILN_CHECK(*seconds > 0, Value, "timeout must be > 0 seconds, got ", *seconds);
  return Milliseconds(static_cast<int64_t>(*seconds * 1000));
}

DTensor as_dtensor(const Tensor& t) { return DTensor(t); }

void bind_dtensor(nb::module_& m) {
  nb::class_<Placement>(m, "_Placement")
      .def_prop_ro("dim", [](const Placement& p) { return p.dim; })
      .def_prop_ro("reduce_op",
                   [](const Placement& p) { return std::string(reduce_op_name(p.reduce)); })
      .def(
          "is_shard",
          [](const Placement& p, std::optional<int64_t> dim) {
            return dim ? p.is_shard(*dim) : p.is_shard();
          },
          nb::arg("dim") = nb::none())
      .def("is_replicate", &Placement::is_replicate)
      .def("is_partial", &Placement::is_partial)
      .def("__eq__", [](const Placement& a, const Placement& b) { return a == b; })
      .def("__hash__", [](const Placement& p) { return std::hash<std::string>()(p.str()); })
      .def("__repr__", &Placement::str);
  m.def("_shard", &Shard);
  m.def("_replicate", &Replicate);
  m.def("_partial", [](std::string_view op) { return Partial(parse_reduce_op(op)); });

  nb::class_<DeviceMesh>(m, "_DeviceMesh")
      .def_prop_ro("device_type", &DeviceMesh::device_type)
      .def_prop_ro("ndim", &DeviceMesh::ndim)
      .def_prop_ro("shape", &DeviceMesh::shape)
      .def_prop_ro("dim_names", &DeviceMesh::dim_names)
      .def_prop_ro("ranks", &DeviceMesh::ranks)
      .def("size", nb::overload_cast<int64_t>(&DeviceMesh::size, nb::const_))
      .def("numel", nb::overload_cast<>(&DeviceMesh::size, nb::const_))
      .def("coordinate", &DeviceMesh::coordinate)
      .def("local_rank", &DeviceMesh::local_rank)
      .def("group", nb::overload_cast<int64_t>(&DeviceMesh::group, nb::const_))
      .def("dim_index", &DeviceMesh::dim_index)
      .def("submesh", &DeviceMesh::submesh)
      .def("flatten", &DeviceMesh::flatten, Release())
      .def("__eq__", [](const DeviceMesh& a, const DeviceMesh& b) { return a == b; })
      .def("__repr__", &DeviceMesh::str);
  m.def("_init_device_mesh", &init_device_mesh, nb::arg("device_type"), nb::arg("shape"),
        nb::arg("dim_names"), Release());

  m.def("_is_dtensor", &is_dtensor);
  // kiln.distributed.checkpoint: the flattened state dict as (names, tensors).
  m.def(
      "_dcp_save",
      [](const std::vector<std::string>& names, const std::vector<Tensor>& tensors,
         const std::string& dir, const std::string& extra) {
        checkpoint::save(state_map(names, tensors), dir, extra);
      },
      Release());
  m.def("_dcp_to_safetensors", &checkpoint::to_safetensors, Release());
  m.def("_dcp_from_safetensors", &checkpoint::from_safetensors, Release());
  nb::class_<checkpoint::SaveFuture>(m, "_DcpFuture")
      .def("wait", &checkpoint::SaveFuture::wait, Release())
      .def("done", &checkpoint::SaveFuture::done);
  m.def(
      "_dcp_async_save",
      [](const std::vector<std::string>& names, const std::vector<Tensor>& tensors,
         const std::string& dir, const std::string& extra) {
        return checkpoint::async_save(state_map(names, tensors), dir, extra);
      },
      Release());
  m.def("_dcp_load", [](const std::vector<std::string>& names, const std::vector<Tensor>& tensors,
                        const std::string& dir, bool strict) {
    const TensorMap state = state_map(names, tensors);
    checkpoint::LoadResult r;
    {
      nb::gil_scoped_release release;
      r = checkpoint::load(state, dir, strict);
    }
    return nb::make_tuple(r.missing_keys, r.unexpected_keys, r.extra);
  });
  m.def("_distribute_tensor", [](const Tensor& t, const DeviceMesh& mesh, Placements p) -> Tensor {
    return distribute_tensor(t, mesh, std::move(p));
  });
  m.def(
      "_dtensor_from_local",
      [](const Tensor& local, const DeviceMesh& mesh, Placements p,
         std::optional<std::vector<int64_t>> shape,
         std::optional<std::vector<int64_t>> stride) -> Tensor {
        auto dims = [](const std::optional<std::vector<int64_t>>& v) -> std::optional<DimVector> {
          if (!v) return std::nullopt;
          return DimVector(IntArrayRef(*v));
        };
        return DTensor::from_local(local, mesh, std::move(p), dims(shape), dims(stride));
      },
      nb::arg("local"), nb::arg("mesh"), nb::arg("placements"), nb::arg("shape").none(),
      nb::arg("stride").none());
  m.def("_dtensor_to_local", [](const Tensor& t) { return as_dtensor(t).to_local(); });
  m.def("_dtensor_full_tensor", [](const Tensor& t) { return as_dtensor(t).full_tensor(); });
  m.def("_dtensor_redistribute",
        [](const Tensor& t, const DeviceMesh& mesh, Placements p) -> Tensor {
          return as_dtensor(t).redistribute(mesh, std::move(p));
        });
  m.def("_dtensor_placements", [](const Tensor& t) { return as_dtensor(t).placements(); });
  m.def("_dtensor_mesh", [](const Tensor& t) { return as_dtensor(t).device_mesh(); });
  m.def("_dtensor_fallback_ops", &fallback_ops);
}

std::optional<ScalarType> opt_dtype_of(nb::handle dtype, const char* what) {
  if (dtype.is_none()) return std::nullopt;
  ScalarType st = kFloat32;
  KILN_CHECK(dtype_from_object(dtype.ptr(), st), Type, "MixedPrecisionPolicy: ", what,
             " must be a kiln dtype or None");
  return st;
}

// FSDP's parameter groups (kiln/dist/fsdp.h); kiln/distributed/fsdp/ builds fully_shard on them.
void bind_fsdp(nb::module_& m) {
  nb::class_<FSDPParamGroup>(m, "_FSDPParamGroup")
      .def_static(
          "create",
          [](const std::vector<Tensor>& params, const DeviceMesh& mesh, nb::handle param_dtype,
             nb::handle reduce_dtype, std::vector<std::string> names) {
            MixedPrecisionPolicy mp{opt_dtype_of(param_dtype, "param_dtype"),
                                    opt_dtype_of(reduce_dtype, "reduce_dtype")};
            return FSDPParamGroup::create(params, mesh, mp, std::move(names));
          },
          nb::arg("params"), nb::arg("mesh"), nb::arg("param_dtype").none(),
          nb::arg("reduce_dtype").none(), nb::arg("names"))
      .def_prop_ro("sharded_params", &FSDPParamGroup::sharded_params)
      .def_prop_ro("unsharded_params", &FSDPParamGroup::unsharded_params)
      .def_prop_ro("is_unsharded", &FSDPParamGroup::is_unsharded)
      .def("unshard", &FSDPParamGroup::unshard, Release())
      .def("reshard", &FSDPParamGroup::reshard, Release())
      // bool before int: Python's True is an int too.
      .def(
          "set_reshard_after_forward",
          [](FSDPParamGroup& g, bool on) { g.set_reshard_after_forward(on); }, Release())
      .def(
          "set_reshard_after_forward",
          [](FSDPParamGroup& g, int64_t k) { g.set_reshard_after_forward(k); }, Release())
      .def_prop_ro("reshard_after_forward_size", &FSDPParamGroup::reshard_after_forward_size)
      .def("post_forward_reshard", &FSDPParamGroup::post_forward_reshard, Release())
      .def("materialize", &FSDPParamGroup::materialize)
      .def("pre_backward", &FSDPParamGroup::pre_backward, Release())
      .def("register_pre_backward_hooks", &FSDPParamGroup::register_pre_backward_hooks)
      .def_static("begin_root_forward", &FSDPParamGroup::begin_root_forward)
      .def_static("end_root_forward", &FSDPParamGroup::end_root_forward)
      .def_prop_rw("requires_gradient_sync", &FSDPParamGroup::requires_gradient_sync,
                   &FSDPParamGroup::set_requires_gradient_sync);
  m.def(
      "_fsdp_gather_stats",
      [](bool reset) {
        FSDPGatherStats st = fsdp_gather_stats(reset);
        nb::dict d;
        d["count"] = st.count;
        d["prefetched"] = st.prefetched;
        d["post_forward"] = st.post_forward;
        d["total_s"] = st.total_s;
        d["waited_s"] = st.waited_s;
        return d;
      },
      nb::arg("reset") = false);
}

}  // namespace

void bind_dist(nb::module_& m) {
  nb::class_<Work>(m, "_Work")
      .def("is_completed", &Work::is_completed)
      .def(
          "wait",
          [](Work& w, std::optional<double> timeout_s) {
            w.wait(to_ms(timeout_s));
            return true;
          },
          nb::arg("timeout") = nb::none(), Release());

  nb::class_<TCPStore>(m, "_TCPStore")
      .def(
          "__init__",
          [](TCPStore* self, std::string host, int port, bool is_master, double timeout_s) {
            new (self) TCPStore(std::move(host), port, is_master, *to_ms(timeout_s));
          },
          nb::arg("host_name"), nb::arg("port"), nb::arg("is_master") = false,
          nb::arg("timeout") = 300.0, Release())
      .def("set", [](TCPStore& s, const std::string& k,
                     nb::bytes v) { s.set(k, std::string(v.c_str(), v.size())); })
      .def("get",
           [](TCPStore& s, const std::string& k) {
             std::string v;
             {
               nb::gil_scoped_release r;
               v = s.get(k);
             }
             return nb::bytes(v.data(), v.size());
           })
      .def("add", &TCPStore::add, Release())
      .def(
          "wait", [](TCPStore& s, const std::vector<std::string>& keys) { s.wait(keys); },
          Release())
      .def("check", &TCPStore::check)
      .def("delete_key", &TCPStore::delete_key)
      .def_prop_ro("host", &TCPStore::host)
      .def_prop_ro("port", &TCPStore::port);

  nb::class_<ProcessGroup>(m, "_ProcessGroup")
      .def("rank", &ProcessGroup::rank)
      .def("size", &ProcessGroup::size)
      .def_prop_ro("name", &ProcessGroup::name)
      .def_prop_ro("ranks", &ProcessGroup::ranks)
      .def("all_reduce", [](ProcessGroup& g, Tensor& t,
                            const std::string& op) { return g.all_reduce(t, parse_reduce_op(op)); })
      .def("broadcast", &ProcessGroup::broadcast)
      .def("all_gather_into_tensor", &ProcessGroup::all_gather_into_tensor)
      .def("reduce_scatter_tensor",
           [](ProcessGroup& g, Tensor& out, const Tensor& in, const std::string& op) {
             return g.reduce_scatter_tensor(out, in, parse_reduce_op(op));
           })
      .def("all_to_all_single", &ProcessGroup::all_to_all_single)
      .def("send", &ProcessGroup::send)
      .def("recv", &ProcessGroup::recv)
      .def("barrier", &ProcessGroup::barrier)
      .def("dump_recent", &ProcessGroup::dump_recent);

  m.def(
      "_init_process_group",
      [](std::string backend, std::string init_method, int rank, int world_size,
         std::shared_ptr<TCPStore> store, std::optional<double> timeout_s, std::string name) {
        InitOptions o;
        o.backend = std::move(backend);
        o.init_method = std::move(init_method);
        o.rank = rank;
        o.world_size = world_size;
        o.store = std::move(store);
        o.timeout = to_ms(timeout_s);
        o.group_name = std::move(name);
        return init_process_group(o);
      },
      nb::arg("backend"), nb::arg("init_method"), nb::arg("rank"), nb::arg("world_size"),
      nb::arg("store").none(), nb::arg("timeout").none(), nb::arg("group_name"), Release());
  m.def("_is_initialized", &is_initialized);
  m.def("_default_group", &default_group);
  m.def(
      "_new_group",
      [](const std::vector<int>& ranks, std::optional<double> timeout_s, std::string name) {
        return new_group(ranks, to_ms(timeout_s), std::move(name));
      },
      nb::arg("ranks"), nb::arg("timeout").none(), nb::arg("name"), Release());
  m.def("_new_local_group", &new_local_group, nb::arg("name"));
  m.def("_destroy_process_group", &destroy_process_group, Release());
  m.def("_broadcast_tensors", &broadcast_tensors, nb::arg("group"), nb::arg("tensors"),
        nb::arg("src") = 0, Release());

  bind_dtensor(m);
  bind_fsdp(m);

  nb::class_<Reducer>(m, "_DdpReducer")
      .def(nb::init<const std::vector<std::pair<std::string, Tensor>>&, ProcessGroupPtr, double,
                    bool>(),
           nb::arg("params"), nb::arg("group"), nb::arg("bucket_cap_mb") = 25.0,
           nb::arg("find_unused_parameters") = false)
      .def_prop_rw("sync", &Reducer::sync, &Reducer::set_sync)
      .def("bucket_parameter_names", &Reducer::bucket_parameter_names)
      .def("prepare_for_forward", &Reducer::prepare_for_forward, Release());
}

}  // namespace kiln::python
