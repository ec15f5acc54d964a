// kiln/dist/remote.h: DTensors whose shards live on the workers of a gang (the seam between
// kiln::dist and the client's Remote backend, which fills in the hooks).
//
//   auto s = kiln::connect(COORDINATOR, {.workers = 4});
//   auto mesh = kiln::dist::init_device_mesh("remote:0", {2, 2}, {"dp", "tp"});  // s's gang
//   DTensor w = distribute_tensor(kiln::randn({8, 8}), mesh, {Replicate(), Shard(0)});
//   Tensor y = w.mm(w);                  // one recorded instruction; every worker runs it
//   y.full_tensor().item();              // rank 0's copy of the whole value
//
// Note [Remote DTensor]: the client records one SPMD program and every worker of the gang runs
// the DTensor dispatch itself, on its own shards, with its own rank: uneven shards, the pieces
// a rank keeps and the collectives between workers are all worked out there, by the same code an
// embedded run uses.
//  - A mesh: init_device_mesh("remote:N") builds the client's mesh on a fake process group of the
//    gang's size, at rank 0 (Note [Fake process group]), and records a MeshCreate: each worker
//    makes the same root mesh over the gang's group "world" (Note [Gang process group]). A
//    sub-mesh, a flattened mesh or a concat_meshes result needs no command: an instruction names
//    it by its root's id and the root dims of each of its dims (DeviceMesh::root_dims), and a
//    worker rebuilds it with mesh_on_root, making its groups then (every worker runs the same
//    instructions in the same order: Note [Mesh groups]).
//  - On the client a remote DTensor's local tensor is a Remote tensor naming each worker's shard,
//    shaped as rank 0's. An op at the DTensor key whose DTensors are remote is run first on a
//    shadow: the same DTensors over meta shards, through the DTensor kernel itself, which gives
//    the results' placements and rank 0's local shapes, and reserves a random op's counters as
//    the eager call does; then it is recorded as one instruction with each DTensor argument's
//    spec (proto DTensorArg), which a worker wraps around its shards and runs at its DTensor key.
//    Rules decide the same way on every rank (Note [DTensor dispatch]), so the shadow agrees.
//  - redistribute_local on a remote shard records a Redistribute command: the worker runs it.
//  - Autograd runs on the client, above the DTensor key, so backward ops are recorded the same way.
//  - Reads fetch rank 0's value: full_tensor() of a remote DTensor is read like any remote tensor.
//
// Note [Gang checkpoints]: dcp.save and dcp.load of a state whose tensors live on a gang (remote
// DTensors, and remote plain tensors: each worker holds its own copy of those) record one
// Checkpoint command. Each worker wraps its shards in DTensors of the recorded specs and runs the
// embedded save or load (Note [Distributed checkpoint format] in kiln/dist/checkpoint.h) over the
// gang's group, so the files are the same as an embedded run of that mesh writes, and either can
// load the other's, resharded to any mesh. The directory is the workers' (one they all see); the
// client never touches it. The workers first agree, by one all-reduce, that each has every value,
// so a missing or failed value fails the command on all of them rather than leaving the others in
// a collective. Each binds a small JSON report (load's missing and unexpected keys and `extra`),
// which the client fetches from rank 0: that fetch is the call's wait, and raises the
// checkpoint's error. A state that mixes a gang's tensors with this process's is a ValueError.
#pragma once

#include <string_view>
#include <vector>

#include "kiln/dispatcher.h"
#include "kiln/dist/checkpoint.h"
#include "kiln/dist/dtensor.h"

namespace kiln::dist {

// The mesh over `root`'s dims `root_dims` (per mesh dim, increasing root dims: several for a
// flattened dim, named by `names`), through this rank, as the client made it from its root with
// sub-meshes, flatten() and concat_meshes. Creates the groups a flattened dim needs, once per name
// (every rank must call it: See Note [Mesh groups]). ValueError for a description that does not
// fit.
DeviceMesh mesh_on_root(const DeviceMesh& root, const std::vector<std::string>& names,
                        const std::vector<std::vector<int64_t>>& root_dims);

namespace detail {

// Filled in by the client's Remote backend (client/remote/src/remote_dtensor.cpp); each is called
// only for a remote mesh or shard (See Note [Remote DTensor]).
struct RemoteHooks {
  // init_device_mesh("remote:N", shape, names).
  DeviceMesh (*init_mesh)(std::string_view device_type, const std::vector<int64_t>& shape,
                          const std::vector<std::string>& names) = nullptr;
  // An op at the DTensor key whose DTensors have remote shards: `args` in schema order; pushes
  // the results onto `out`.
  void (*run_op)(const OperatorHandle& op, Stack& args, Stack& out) = nullptr;
  // redistribute_local of a remote shard; with `into` defined (a released remote value of the
  // result's shape), the result refills it and is returned.
  Tensor (*redistribute)(const Tensor& local, const DTensorSpec& spec, const Placements& to,
                         const Tensor& into) = nullptr;
  // Frees the workers' memory of remote values, keeping them for a redistribute `into` them.
  void (*release)(const std::vector<Tensor>& values) = nullptr;
  // checkpoint::save (`load` false: `strict` unused, the result empty) or checkpoint::load of a
  // state whose tensors all live on one gang (See Note [Gang checkpoints]).
  checkpoint::LoadResult (*checkpoint)(const TensorMap& state, const std::string& dir,
                                       const std::string& extra, bool load, bool strict) = nullptr;
};
void set_remote_hooks(const RemoteHooks& hooks);
// The hooks; RuntimeError when no Remote backend is linked.
const RemoteHooks& remote_hooks();

// A root mesh of `shape` over the default group's ranks 0..N-1 (init_device_mesh after its checks).
DeviceMesh make_root_mesh(std::string device_type, const std::vector<int64_t>& shape,
                          const std::vector<std::string>& dim_names);

// The DTensor key's kernel, called directly (the client's shadow run: See Note [Remote DTensor]).
// `stack` ends with the op's arguments, which are replaced by its results.
void run_dtensor_kernel(const OperatorHandle& op, Stack& stack);

}  // namespace detail
}  // namespace kiln::dist
