// kiln/dist/fsdp.h: the communication core of FSDP (PyTorch's FSDP2, fully_shard): a group of
// parameters sharded Shard(0) over a 1-d DeviceMesh, gathered whole for forward and backward with
// one flat all-gather, their gradients reduce-scattered (averaged) back onto the shards.
//
//   auto mesh = kiln::dist::init_device_mesh("cpu", {2});
//   auto group = kiln::dist::FSDPParamGroup::create({w, b}, mesh);  // w, b: the same on every rank
//   group->sharded_params();        // {DTensor Shard(0), ...}: leaves, give these to the optimizer
//   auto full = group->unshard();   // {w, b} whole, plain tensors; autograd links them to the
//   shards Tensor loss = kiln::linear(x, full[0], full[1]).sum();   // x: this rank's part of the
//   batch group->reshard();               // frees the whole tensors (reshard_after_forward)
//   group->pre_backward();          // gathers them again (a hook on the module's output calls it)
//   loss.backward();                // shards' .grad: the mean over the ranks, Shard(0)
//   opt.step();                     // steps on the shards
//
// The Python kiln.distributed.fsdp.fully_shard and the C++ fully_shard (below) drive it from a
// module's forward.
//
// Note [FSDP flat all-gather]: every parameter is split along dim 0 as torch.chunk splits it
// (Note [Placements]): c = ceil(rows / N) rows per rank, the last ranks possibly fewer or none.
// A rank's send buffer holds, parameter after parameter, its c rows of each (padded with zeros
// where it has fewer), so every rank sends the same number S of elements and one
// all_gather_into_tensor of N * S gathers the whole group; each parameter is then copied out of
// the N segments into its own whole tensor. The gradients go the same way backwards: the whole
// gradients are copied into N segments of S (padding zeroed) and one reduce_scatter_tensor (avg)
// leaves each rank its segment, the mean over the ranks of its shards' gradients.
//
// Note [FSDP resharding]: unshard() makes new whole tensors, the outputs of one autograd node
// (FSDPAllGatherBackward) whose inputs are the sharded parameters. Ops of the forward save those
// tensors for their backward. reshard() frees their memory (their storage is resized to zero
// bytes, which releases it) without touching the tensors, and pre_backward() refills the same
// storage with a new all-gather, so the saved tensors see the whole values again in backward
// (the version counter is not bumped: the values are the same). Reading a whole tensor while it
// is resharded is an error of the caller. When the node runs in backward (every whole tensor's
// gradient has arrived), it reduce-scatters and reshards: after backward only the shards remain.
//
// Note [FSDP reshard to k ranks]: reshard_after_forward=k (PyTorch's int form): after forward a
// rank keeps, of each whole parameter, the rows of its place j in its group of k consecutive
// ranks of the mesh (ranks [0, k), [k, 2k), ...: DeviceMesh::block_group), split over k as
// torch.chunk splits them, and frees the rest; backward's gather runs over those k ranks only
// (e.g. within a node), with the same flat layout as the main all-gather for n = k (Note [FSDP
// flat all-gather]), and its send buffer takes the kept pieces' place. Memory between forward and
// backward: about 1/k of the whole parameters instead of 1/N (True) or all (False). k must divide
// the mesh size N; k == N is True and k == 1 is False, as in PyTorch. The pieces are copies of
// the forward's whole parameters, so backward sees the same values as with True; gradients are
// reduce-scattered over the whole mesh as always. Prefetch (Note [FSDP prefetch]) starts these
// smaller gathers ahead in backward as it does the main ones.
//
// Note [FSDP gradient sync]: with set_requires_gradient_sync(false), backward reduces nothing:
// each rank adds its whole gradients into a buffer of its own (in the reduce dtype), and the
// shards get no gradient. The next backward with sync on adds the buffer to its gradients before
// the reduce-scatter, so the shards' .grad is the mean over the ranks of the summed micro-batch
// gradients, as if every micro-batch had been reduced (gradient accumulation).
//
// Note [FSDP prefetch]: between begin_root_forward() and end_root_forward() (the root module's
// forward: C++ FullyShardedModule and Python fully_shard call them), every unshard() records the
// group unsharded before it. Forward: a group's unshard() starts the all-gather of the group that
// followed it in the last root forward, so that gather runs on the comm thread while this module
// computes; that group's unshard() then only waits for it. Backward runs the groups in reverse:
// the hook that gathers a group again starts the all-gather of the group that preceded it in
// forward. A prefetch is used only within the root forward (the epoch) that started it: the
// optimizer changes the shards between steps, so a later unshard() waits for a stale one and
// gathers afresh. Every rank runs the same program, so every rank issues the same collectives
// in the same order. The cost, as in PyTorch: two groups' whole parameters live at once.
// fsdp_gather_stats() sums, over all-gathers, the time from issue to completion and the part of
// it after the caller began to wait; 1 - waited / total is the fraction hidden behind compute.
//
// Note [FSDP over TP]: 2-D FSDP × TP (a mesh ("dp", "tp")): parallelize_module over mesh["tp"]
// first, then fully_shard over mesh["dp"]. A parameter that is then a DTensor on the tp mesh
// (placement Shard(d) or Replicate) is sharded again: FSDP splits its local shard along dim 0
// over dp, and gathering over dp gives back that local shard, which unshard() returns as the
// same tensor-parallel DTensor, so the module's tensor-parallel forward runs unchanged. Its
// gradient arrives as a tp DTensor; it is redistributed to the parameter's tp placement (a
// Partial gradient is all-reduced over tp) before the dp reduce-scatter. The sharded parameter
// is a DTensor on the (tp, dp) mesh (concat_meshes: the tp dim first), placed [tp placement,
// Shard(0)]: tp splits first and dp splits each piece again (Note [Placements]), which is exactly
// this layout. (PyTorch keeps the mesh as (dp, tp) and marks dp's split as _StridedShard; the
// transposed mesh says the same with the ordinary placements, so redistribute, full_tensor and
// the rules need nothing new.) Parameters that are not DTensors stay 1-d, Shard(0) over dp.
//
// Mixed precision (MixedPrecisionPolicy): param_dtype gathers the shards cast to that dtype (the
// whole parameters, forward and backward compute in it); reduce_dtype casts the whole gradients
// before the reduce-scatter (default: param_dtype). The shards, their gradients and optimizer
// states keep the parameters' own dtype.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "kiln/dist/dtensor.h"
#include "kiln/nn/module.h"

namespace kiln::dist {

struct MixedPrecisionPolicy {
  std::optional<ScalarType> param_dtype;
  std::optional<ScalarType> reduce_dtype;
};

template <typename G>
class FSDPGatherBackward;

class FSDPParamGroup : public std::enable_shared_from_this<FSDPParamGroup> {
 public:
  // `params`: whole tensors, the same on every rank (or meta tensors: the shards are then meta,
  // to be initialised by the caller), each at least 1-d and on `mesh`'s device type; or DTensors
  // of a tensor-parallel mesh from the same root mesh (Note [FSDP over TP]). `names` name them
  // in errors (default "param0", ...). ValueError when the mesh is not 1-d, this rank is not in
  // it, or a parameter is 0-d, on another device, or a DTensor FSDP cannot shard again.
  static std::shared_ptr<FSDPParamGroup> create(const std::vector<Tensor>& params,
                                                const DeviceMesh& mesh,
                                                MixedPrecisionPolicy mp = {},
                                                std::vector<std::string> names = {});

  ~FSDPParamGroup();
  FSDPParamGroup(const FSDPParamGroup&) = delete;
  FSDPParamGroup& operator=(const FSDPParamGroup&) = delete;

  const DeviceMesh& mesh() const { return mesh_; }
  const MixedPrecisionPolicy& mp_policy() const { return mp_; }
  // The Shard(0) DTensor leaves (requires_grad as the given parameters; Note [FSDP over TP] for
  // those of tensor-parallel parameters).
  const std::vector<Tensor>& sharded_params() const { return sharded_; }

  // Meta-device init: replaces each shard on the meta device by a new, uninitialised CPU
  // DTensor leaf (same spec and requires_grad); sharded_params() then returns the new leaves, for
  // the caller to put into its module and initialise. Shards already on the CPU stay.
  void materialize();

  // Gathers the whole parameters (one all-gather, Note [FSDP flat all-gather]) into new tensors
  // of param_dtype; under grad mode, their gradients flow back to the shards
  // (Note [FSDP resharding]).
  std::vector<Tensor> unshard();
  // Frees the whole tensors of the last unshard() (no-op when already freed or none).
  void reshard();
  // What post_forward_reshard() does: reshard_after_forward as in PyTorch: true frees the whole
  // tensors (the default), false keeps them, an int k keeps this rank's 1/k of them (Note [FSDP
  // reshard to k ranks]). k == N is true, k == 1 false; ValueError naming k and the mesh size N
  // unless k is positive and divides N. The first use of a k creates its groups (collective:
  // every world rank calls it, in the same order, as for fully_shard).
  void set_reshard_after_forward(std::variant<bool, int64_t> value);
  // The size of the groups the parameters stay sharded over after forward: N (true), 1 (false)
  // or k.
  int64_t reshard_after_forward_size() const { return post_size_; }
  // The group of the k ranks that gather in backward (null unless 1 < k < N).
  const ProcessGroupPtr& post_forward_group() const { return post_pg_; }
  // After forward: reshard() (true), nothing (false), or keep this rank's 1/k pieces and free the
  // whole tensors (k); pre_backward() and the hooks gather them again.
  void post_forward_reshard();
  // Gathers into the whole tensors of the last unshard() again when reshard() freed them.
  void pre_backward();
  // Hooks on `outputs` (those that require grad) that gather the whole tensors of the last
  // unshard() again when the first of their gradients arrives, before the module's backward
  // (reshard_after_forward). Each unshard() keeps its own tensors, so a module run twice before
  // one backward is gathered correctly for each run.
  void register_pre_backward_hooks(const std::vector<Tensor>& outputs);
  // Whether the last unshard()'s whole tensors hold their values now.
  bool is_unsharded() const;
  // The last unshard()'s whole tensors (empty before the first).
  const std::vector<Tensor>& unsharded_params() const { return full_; }

  // Note [FSDP gradient sync].
  void set_requires_gradient_sync(bool on) { sync_ = on; }
  bool requires_gradient_sync() const { return sync_; }
  // The root module's forward calls these around itself (See Note [FSDP prefetch]).
  static void begin_root_forward();
  static void end_root_forward();

  struct Pending;  // an all-gather in flight
  // The memory of one unshard()'s whole tensors (Note [FSDP resharding]).
  struct Gathered {
    std::vector<intrusive_ptr<Storage>> storages;
    std::vector<size_t> nbytes;  // each storage's size when resident
    ScalarType dtype = kFloat32;
    bool resident = false;
    std::shared_ptr<Pending> pending;  // an all-gather into these storages, in flight
    uint64_t epoch = 0;                // the root forward it belongs to (Note [FSDP prefetch])
    // This rank's rows of each whole tensor, kept over a group of k (Note [FSDP reshard to k
    // ranks]); empty otherwise.
    std::vector<Tensor> kept;
    int64_t kept_k = 0;
  };
  // Called by backward (FSDPAllGatherBackward) with the whole gradients of `g`'s parameters;
  // frees g.
  std::vector<Tensor> reduce_gradients(std::vector<Tensor> grads, Gathered& g);

 private:
  FSDPParamGroup(const DeviceMesh& mesh, MixedPrecisionPolicy mp);
  // Where each parameter's rows go in a flat buffer of n segments (Note [FSDP flat all-gather]).
  struct Layout {
    int64_t n = 1;
    std::vector<int64_t> chunk_rows, seg_offset;  // per parameter: rows per rank (c), offset
    int64_t seg_numel = 0;                        // S
  };
  Layout layout(int64_t n) const;
  // Copies parameter i's rows between a whole tensor and the n segments of a flat buffer.
  void copy_rows(const Layout& l, size_t i, char* whole, char* flat, size_t es,
                 bool to_whole) const;
  void plan();
  // A new Gathered with whole tensors `full` (uninitialised) of this group's parameters.
  std::shared_ptr<Gathered> make_gathered(std::vector<Tensor>& full) const;
  // Issues the all-gather (no-op when one is in flight); `ahead`: by a prefetch.
  void start_gather(Gathered& g, bool ahead = false);
  void finish_gather(Gathered& g);  // waits for it (starting it if needed) and fills g
  // Fills g again for backward, then prefetches the group that preceded this one in forward.
  void regather(Gathered& g);
  void free(Gathered& g);
  void keep_pieces(Gathered& g);  // Note [FSDP reshard to k ranks]
  // A gang's group (Note [FSDP on a gang]): unshard() and backward by DTensor redistributions.
  std::vector<Tensor> unshard_remote();
  template <typename G>
  friend class FSDPGatherBackward;
  // Makes `full` the outputs of an FSDPGatherBackward named `name` whose inputs are the shards
  // (in grad mode, when a shard requires grad).
  template <typename G>
  void link(const std::vector<Tensor>& full, const std::shared_ptr<G>& g, const char* name);
  struct RemoteGathered;
  std::vector<Tensor> reduce_remote(std::vector<Tensor> grads, RemoteGathered& gathered);
  bool remote_ = false;
  std::shared_ptr<RemoteGathered> remote_current_;  // the last unshard()'s

  DeviceMesh mesh_;
  ProcessGroupPtr pg_;
  MixedPrecisionPolicy mp_;
  std::vector<std::string> names_;
  std::vector<Tensor> sharded_;
  // Per parameter: the spec of its unsharded DTensor, for a tensor-parallel one (Note [FSDP over
  // TP]); the shape FSDP gathers (the whole parameter or its TP shard); elements per row.
  std::vector<std::optional<DTensorSpec>> tp_;
  std::vector<DimVector> full_shape_;
  std::vector<int64_t> row_numel_;
  Layout layout_;  // over the mesh
  // reshard_after_forward (Note [FSDP reshard to k ranks]): k, the k-rank group, its layout.
  int64_t post_size_ = 0;  // the constructor sets N
  ProcessGroupPtr post_pg_;
  Layout post_layout_;
  std::vector<Tensor> full_;
  std::shared_ptr<Gathered> current_;
  // See Note [FSDP prefetch]. The groups unsharded after and before this one in the last root
  // forward, and the gather prefetched for this group's next unshard() (with its tensors).
  std::weak_ptr<FSDPParamGroup> next_, prev_;
  std::shared_ptr<Gathered> prefetched_;
  std::vector<Tensor> prefetched_full_;
  bool sync_ = true;
  std::vector<Tensor> acc_;  // Note [FSDP gradient sync]
};
using FSDPParamGroupPtr = std::shared_ptr<FSDPParamGroup>;

// Sums over this process's FSDP all-gathers (Note [FSDP prefetch]); `reset` zeroes them after
// reading.
struct FSDPGatherStats {
  int64_t count = 0;
  int64_t prefetched = 0;    // of them, started ahead by a prefetch
  int64_t post_forward = 0;  // of them, over k ranks (Note [FSDP reshard to k ranks])
  double total_s = 0;        // issue to completion
  double waited_s = 0;       // of that, the part after the caller began to wait
  double hidden_fraction() const { return total_s > 0 ? 1.0 - waited_s / total_s : 0.0; }
};
FSDPGatherStats fsdp_gather_stats(bool reset = false);

// C++ modules have no forward hooks, so C++ FSDP wraps: FullyShardedModule holds `module`, whose
// parameters (those not already inside a FullyShardedModule below it) it replaced by Shard(0)
// DTensors on `mesh`; its forward gathers them into the module's parameter slots, runs the
// module, puts the shards back (reshard_after_forward: frees the whole tensors, or keeps 1/k of
// them, and registers a hook on the output that gathers them again for backward). Apply it per
// block, then to the root:
//
//   for (auto& [name, block] : blocks->named_children())
//     blocks->replace_module(name, kiln::dist::fully_shard(block, mesh));
//   auto model = kiln::dist::fully_shard(net, mesh, {.reshard_after_forward = false});
//   kiln::optim::SGD opt(model->parameters(), {.lr = 0.1});   // DTensor shards
//
// As DDP, it is registered as child "module": state-dict keys gain a "module." prefix.
struct FSDPOptions {
  // true, false or an int k (FSDPParamGroup::set_reshard_after_forward).
  std::variant<bool, int64_t> reshard_after_forward = true;
  MixedPrecisionPolicy mp_policy;
};

class FullyShardedModule : public nn::Module {
 public:
  FullyShardedModule(nn::ModulePtr module, DeviceMesh mesh, FSDPOptions options = {});
  Tensor forward(const Tensor& input) override;
  const nn::ModulePtr& module() const { return module_; }
  const FSDPParamGroupPtr& param_group() const { return group_; }
  void set_requires_gradient_sync(bool on, bool recurse = true);

 private:
  struct Slot {
    nn::Module* owner;
    std::string name;
  };
  nn::ModulePtr module_;
  FSDPOptions options_;
  FSDPParamGroupPtr group_;
  std::vector<Slot> slots_;
};

std::shared_ptr<FullyShardedModule> fully_shard(nn::ModulePtr module, DeviceMesh mesh = {},
                                                FSDPOptions options = {});

}  // namespace kiln::dist
