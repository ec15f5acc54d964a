// kiln/dist/device_mesh.h: DeviceMesh, an n-d array of world ranks with one process group per
// mesh dim (PyTorch's torch.distributed.device_mesh).
//
//   auto mesh = kiln::dist::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});   // 4 ranks
//   mesh.coordinate();              // e.g. {1, 0} on rank 2
//   mesh["tp"].group(0)->size();    // 2: the ranks that differ from this one in "tp" only
//   auto dp_tp = mesh.submesh({"dp", "tp"}).flatten();   // 1-d "dp_tp" over all 4 ranks
//   mesh.size(1);  mesh.ndim();  mesh.dim_names();
//
// Note [Mesh groups]: every rank creates every group of the mesh, in the same order, because
// new_group must be called by every world rank (as in PyTorch); a rank keeps the group it is a
// member of along each mesh dim. A sub-mesh (mesh["tp"], mesh.submesh({...})) reuses its
// parent's groups and creates none. flatten() creates one group per block of the root mesh that
// the flattened dims span (all ranks again), once per name: the flattened mesh is remembered by
// the root, so flattening again, or root[name], returns it without new groups. block_group()
// likewise creates the groups of k consecutive ranks of every such block, once per (dims, k). A
// mesh whose ranks are the whole world uses the default group along a dim that spans it.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/dist/process_group.h"

namespace kiln::dist {

struct MeshState;

class DeviceMesh {
 public:
  DeviceMesh() = default;
  explicit DeviceMesh(std::shared_ptr<const MeshState> state) : state_(std::move(state)) {}

  bool defined() const { return static_cast<bool>(state_); }
  const std::string& device_type() const;
  int64_t ndim() const;
  // The size of mesh dim `dim` (negative dims wrap; IndexError when out of range).
  int64_t size(int64_t dim) const;
  int64_t size() const;  // the number of ranks in the mesh
  const std::vector<int64_t>& shape() const;
  // Empty when the mesh was made without names.
  const std::vector<std::string>& dim_names() const;
  // The world ranks of the mesh, row-major over shape().
  const std::vector<int>& ranks() const;
  // This rank's index along each mesh dim; empty when this rank is not in the mesh.
  std::vector<int64_t> coordinate() const;
  // This rank's index along one mesh dim (ValueError when not in the mesh).
  int64_t local_rank(int64_t dim) const;
  // The process group along mesh dim `dim` that holds this rank (See Note [Mesh groups]).
  ProcessGroupPtr group(int64_t dim) const;
  ProcessGroupPtr group(std::string_view dim_name) const;
  // The index of a named dim (ValueError naming the mesh's dims otherwise).
  int64_t dim_index(std::string_view name) const;
  // The process group of the `k` consecutive ranks along mesh dim `dim` that hold this rank: the
  // dim's ranks split into blocks [0, k), [k, 2k), ... (FSDP's reshard_after_forward=k). Made once
  // per root mesh, root dims and k, by every world rank (See Note [Mesh groups]); k == size(dim)
  // is group(dim). ValueError unless k is positive and divides size(dim).
  ProcessGroupPtr block_group(int64_t dim, int64_t k) const;

  // The 1-d sub-mesh along `name` through this rank (PyTorch's mesh["tp"]).
  DeviceMesh operator[](std::string_view name) const { return submesh({std::string(name)}); }
  // The sub-mesh over the named dims, in the mesh's order, through this rank.
  DeviceMesh submesh(const std::vector<std::string>& names) const;
  // This mesh as one dim named `name` (default: the dim names joined by "_"), PyTorch's
  // mesh._flatten(). Every rank of the root mesh must call it (See Note [Mesh groups]).
  DeviceMesh flatten(std::string name = "") const;

  // Where the mesh lies in the mesh init_device_mesh made (its root): the root's id, unique in
  // this process, and per mesh dim the root dims it spans (several for a flattened dim). A
  // worker rebuilds a client's mesh from them (Note [Remote DTensor] in kiln/dist/remote.h).
  int64_t root_id() const;
  const std::vector<std::vector<int64_t>>& root_dims() const;

  // Same device type, shape, ranks and dim names.
  bool operator==(const DeviceMesh& o) const;
  bool operator!=(const DeviceMesh& o) const { return !(*this == o); }
  // "DeviceMesh('cpu', [[0, 1], [2, 3]], mesh_dim_names=('dp', 'tp'))".
  std::string str() const;

 private:
  friend DeviceMesh concat_meshes(const DeviceMesh& outer, const DeviceMesh& inner);
  friend DeviceMesh mesh_on_root(const DeviceMesh& root, const std::vector<std::string>& names,
                                 const std::vector<std::vector<int64_t>>& root_dims);
  const MeshState& state() const;
  std::shared_ptr<const MeshState> state_;
};

std::ostream& operator<<(std::ostream& os, const DeviceMesh& mesh);

// A mesh of `shape` over the world ranks 0..N-1, row-major. Initialises the default process
// group from the launch environment when none exists ("cpu": UCX; "cuda": NCCL, in a build that
// has it). ValueError when the shape's product is not the world size, a size is not positive,
// the names are not one per dim, empty or repeated, or the device type is unknown.
DeviceMesh init_device_mesh(std::string_view device_type, const std::vector<int64_t>& shape,
                            const std::vector<std::string>& dim_names = {});

// The mesh whose dims are `outer`'s followed by `inner`'s, through this rank: both sliced from
// the same root mesh (or flattened from it), over disjoint root dims, each reusing its groups.
// Unlike submesh(), the order need not be the root's: 2-D FSDP over a tensor-parallel model
// places its parameters on (tp, dp) (See Note [FSDP over TP]). Such a mesh cannot be flattened.
// ValueError when the meshes come from different roots, share a root dim, or miss this rank.
DeviceMesh concat_meshes(const DeviceMesh& outer, const DeviceMesh& inner);

}  // namespace kiln::dist
