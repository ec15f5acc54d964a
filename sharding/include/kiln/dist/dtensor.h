// kiln/dist/dtensor.h: DTensor, a tensor sharded over a DeviceMesh (PyTorch's
// torch.distributed.tensor): placements, distribute_tensor, from_local, to_local, full_tensor
// and redistribute.
//
//   auto mesh = kiln::dist::init_device_mesh("cpu", {2});
//   DTensor x = distribute_tensor(kiln::randn({5, 4}), mesh, {Shard(0)});   // rows 3 + 2
//   Tensor y = x * x + 1.0;                     // runs on the shards (the DTensor key)
//   DTensor(y).placements();                    // {Shard(0)}
//   Tensor full = DTensor(y).full_tensor();     // (5, 4) on every rank
//   DTensor r = x.redistribute(mesh, {Replicate()});
//
// Note [DTensor]: a DTensor is a storage-less TensorImpl (Note [Data-less tensors]) whose key
// set is {DTensor, the local shard's backend key}, whose sizes and strides are the global ones,
// and whose backend handle holds the local shard and the DTensorSpec. Autograd sits above the
// DTensor key, so it records DTensors themselves: gradients are DTensors, and backward ops reach
// the DTensor key like any other op. The DTensor key's kernels (sharding/dtensor/dispatch.cpp)
// run ops on the local shards (Note [DTensor dispatch]).
//
// Note [Placements]: along each mesh dim a DTensor is Shard(d) (tensor dim d is split over the
// ranks of that mesh dim as torch.chunk splits it: every rank gets ceil(n / size) elements until
// they run out, so later ranks may get fewer or none), Replicate() (every rank holds the same
// values) or Partial(op) (the value is the reduction with `op` of the ranks' local values).
// Several mesh dims may shard the same tensor dim: the earlier mesh dim splits first, the later
// one splits each piece again.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "kiln/dist/device_mesh.h"
#include "kiln/generated/op_enums.h"

namespace kiln::dist {

struct Placement {
  enum class Kind : uint8_t { Shard, Replicate, Partial };
  Kind kind = Kind::Replicate;
  int64_t dim = 0;                  // Shard
  ReduceOp reduce = ReduceOp::Sum;  // Partial

  bool is_shard() const { return kind == Kind::Shard; }
  bool is_shard(int64_t d) const { return kind == Kind::Shard && dim == d; }
  bool is_replicate() const { return kind == Kind::Replicate; }
  bool is_partial() const { return kind == Kind::Partial; }
  bool operator==(const Placement& o) const {
    return kind == o.kind && (kind != Kind::Shard || dim == o.dim) &&
           (kind != Kind::Partial || reduce == o.reduce);
  }
  bool operator!=(const Placement& o) const { return !(*this == o); }
  std::string str() const;  // "Shard(0)", "Replicate()", "Partial(sum)"
};
using Placements = std::vector<Placement>;

// PyTorch's placement class names.
inline Placement Shard(int64_t dim) { return {Placement::Kind::Shard, dim, ReduceOp::Sum}; }
inline Placement Replicate() { return {}; }
// sum, avg, max or min (ValueError for product).
Placement Partial(ReduceOp op = ReduceOp::Sum);
std::string placements_str(const Placements& p);  // "[Shard(0), Replicate()]"

// What a DTensor is: where its pieces live and the global tensor they make up.
struct DTensorSpec {
  DeviceMesh mesh;
  Placements placements;  // one per mesh dim
  DimVector shape;        // global
  DimVector stride;       // global
  ScalarType dtype = kFloat32;

  std::string str() const;
};

// The piece of a tensor dim of `size` that index `index` of `n` gets (See Note [Placements]):
// {offset, length}, length possibly 0.
std::pair<int64_t, int64_t> chunk_of(int64_t size, int64_t n, int64_t index);
// The local shape on this rank of a tensor of global `shape` placed by `placements` on `mesh`.
DimVector local_shape(IntArrayRef shape, const DeviceMesh& mesh, const Placements& placements);

class DTensor : public Tensor {
 public:
  // `t` must be a DTensor (ValueError otherwise).
  explicit DTensor(Tensor t);

  // A DTensor from this rank's shard (PyTorch's DTensor.from_local). Without `shape`, the global
  // shape assumes even shards (local size times the mesh size along each Shard); pass `shape`
  // (and `stride`) for uneven ones. The local shape must be the one `placements` give this rank
  // (ValueError otherwise). Differentiable: the gradient of `local` is the gradient's local shard.
  static DTensor from_local(const Tensor& local, const DeviceMesh& mesh, Placements placements,
                            std::optional<DimVector> shape = std::nullopt,
                            std::optional<DimVector> stride = std::nullopt);

  const DTensorSpec& spec() const;
  const DeviceMesh& device_mesh() const { return spec().mesh; }
  const Placements& placements() const { return spec().placements; }
  // This rank's shard (differentiable).
  Tensor to_local() const;
  // The global tensor on every rank (redistribute to Replicate, then the local; differentiable).
  Tensor full_tensor() const;
  // The same values placed by `placements` on `mesh` (the DTensor's own mesh; Note
  // [Redistribute]). Differentiable: the gradient goes back to this DTensor's placements.
  DTensor redistribute(const DeviceMesh& mesh, Placements placements) const;
};

bool is_dtensor(const Tensor& t);

// Splits `t` (the same global tensor on every rank) by `placements` on `mesh` and keeps this
// rank's piece. Fewer placements than mesh dims are padded with Replicate(). Partial(op): rank 0
// of that mesh dim keeps the values and the others hold zeros for sum (avg, max, min: the values).
// As in PyTorch, a sharded DTensor's local tensor is a copy (writing into the DTensor leaves `t`
// as is), and an all-Replicate one's is `t` itself (made contiguous).
DTensor distribute_tensor(const Tensor& t, const DeviceMesh& mesh, Placements placements);

// The ops that took the replicate-compute-reshard path (no sharding rule), sorted by name
// (Note [DTensor dispatch]).
std::vector<std::string> fallback_ops();
void clear_fallback_ops();  // for tests

// Counts of the DTensor key's placement-decision cache (Note [DTensor dispatch]).
struct DispatchStats {
  int64_t hits = 0;
  int64_t misses = 0;
  // Calls that took the replicate path: no rule, rule "replicate", a rule that could not shard the
  // call, or an out= variant.
  int64_t replicated = 0;
};
DispatchStats dispatch_stats();

// Whether the DTensor key implements `rule` (sharding/dtensor/rules.h); the ops of a rule it does
// not implement take the replicate path and are listed by fallback_ops().
bool has_sharding_rule(ShardingRule rule);

// Below autograd (the DTensor key's kernels and the differentiable wrappers use these).
namespace detail {
// A DTensor over `local` with `spec` (no checks).
Tensor make_dtensor(Tensor local, DTensorSpec spec);
const Tensor& local_of(const Tensor& dtensor);
const DTensorSpec& spec_of(const Tensor& dtensor);
// `local`, placed by spec.placements, placed by `to` instead (Note [Redistribute]).
Tensor redistribute_local(const Tensor& local, const DTensorSpec& spec, const Placements& to);
// What a DTensor made by a view op views (Note [DTensor views] in sharding/dtensor/dispatch.cpp).
enum class ViewKind : uint8_t { None, Local, Copy };
ViewKind view_kind(const Tensor& dtensor);
void set_view_kind(const Tensor& dtensor, ViewKind kind);
// This rank's shard of zeros of `spec.shape` placed by `spec.placements` (Partial as Replicate),
// contiguous, of `spec.dtype`, on `device`. On a gang's mesh each worker makes its own shape
// from a scalar (See Note [Remote DTensor]).
Tensor zeros_shard(const DTensorSpec& spec, Device device);
// Checks that `placements` fit `mesh` and a tensor of `ndim` dims; normalizes negative dims.
Placements check_placements(const char* what, const DeviceMesh& mesh, Placements placements,
                            int64_t ndim);
}  // namespace detail

}  // namespace kiln::dist
