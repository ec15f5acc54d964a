// kiln/autograd/node.h: the backward graph: nodes, edges, per-tensor autograd state and saved
// variables.
//
//   auto y = kiln::exp(x.requires_grad_());      // y.grad_fn()->name() == "ExpBackward0"
//   y.grad_fn()->next_edges()[0].fn->name();     // "AccumulateGrad" (x is a leaf)
//
// Note [Graph ownership]: a tensor's AutogradMeta holds its grad_fn strongly; a node holds its
// next nodes strongly through its edges; a leaf holds its AccumulateGrad weakly (the node holds
// the leaf). Saved outputs are stored without their grad_fn (no cycle) and reattached on unpack.
// A node's destructor frees the chain behind it with a loop, not recursion, so dropping a graph
// of a million nodes does not overflow the stack.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/tensor.h"

namespace kiln::autograd {

using variable_list = std::vector<Tensor>;
class Node;
struct AutogradMeta;

// The `input_nr`-th input of `fn` (i.e. the gradient slot it receives).
struct Edge {
  std::shared_ptr<Node> fn;
  uint32_t input_nr = 0;
  bool valid() const { return fn != nullptr; }
};

// What a gradient flowing into a node's input must look like (a forward output's geometry).
struct InputMetadata {
  DimVector sizes;
  ScalarType dtype = kFloat32;
  Device device = kCPU;
  std::function<intrusive_ptr<TensorImpl>()> zeros;  // BackendHandle::zeros_maker; may be null
};

// ---- Hooks (Note [Hook order] in engine.h) ------------------------------------------------------
// A tensor hook sees the gradient of its tensor; returning a defined tensor replaces it.
using TensorHook = std::function<Tensor(const Tensor& grad)>;
// Runs after a leaf's .grad was updated, with the leaf.
using PostAccumulateGradHook = std::function<void(const Tensor& leaf)>;
// Node pre-hook: sees the node's incoming gradients; a non-empty result replaces them.
using NodePreHook = std::function<variable_list(const variable_list& grad_outputs)>;
// Node post-hook: sees what the node returned (grad_inputs) and what it got (grad_outputs); a
// non-empty result replaces grad_inputs.
using NodePostHook =
    std::function<variable_list(const variable_list& grad_inputs, const variable_list& grad_outputs)>;

// The hooks of a node (or of a leaf, kept in its AutogradMeta), allocated on first use.
struct HookTable {
  struct TensorPre {
    uint64_t id;
    uint32_t input_nr;
    TensorHook fn;
  };
  std::vector<TensorPre> tensor_pre;
  std::vector<std::pair<uint64_t, NodePreHook>> pre;
  std::vector<std::pair<uint64_t, NodePostHook>> post;
  std::vector<std::pair<uint64_t, PostAccumulateGradHook>> post_acc;  // leaves only
  bool empty() const { return tensor_pre.empty() && pre.empty() && post.empty() && post_acc.empty(); }
  void remove(uint64_t id);
  static uint64_t next_id();
};

// Returned by every register_*hook; remove() unregisters the hook (idempotent, and harmless once
// the node or tensor is gone).
class RemovableHandle {
 public:
  RemovableHandle() = default;
  RemovableHandle(std::weak_ptr<HookTable> table, uint64_t id) : table_(std::move(table)), id_(id) {}
  void remove();
  uint64_t id() const { return id_; }

 private:
  std::weak_ptr<HookTable> table_;
  uint64_t id_ = 0;
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  Node();
  virtual ~Node();  // releases long chains iteratively (Note [Graph ownership])
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // PyTorch's name: "MulBackward0", "AccumulateGrad", ...
  virtual const char* name() const = 0;
  // One gradient per forward output in, one per next edge out (undefined: no gradient).
  virtual variable_list apply(variable_list&& grads) = 0;
  // Frees saved tensors (after a backward without retain_graph).
  virtual void release_variables() {}

  const std::vector<Edge>& next_edges() const { return next_edges_; }
  std::vector<Edge>& mutable_next_edges() { return next_edges_; }
  const Edge& next_edge(size_t i) const { return next_edges_[i]; }
  size_t num_outputs() const { return next_edges_.size(); }
  // Creation order: the engine runs later nodes first among those ready.
  uint64_t sequence_nr() const { return sequence_nr_; }

  size_t num_inputs() const { return input_metadata_.size(); }
  const InputMetadata& input_metadata(size_t i) const { return input_metadata_[i]; }
  uint32_t add_input_metadata(const Tensor& t);

  // Non-leaf tensors that asked retain_grad() and whose gradient arrives at input `nr`.
  std::vector<std::pair<uint32_t, AutogradMeta*>>& retained_grads() { return retained_; }

  // Node hooks (PyTorch's Node.register_prehook / register_hook).
  RemovableHandle register_prehook(NodePreHook fn);
  RemovableHandle register_hook(NodePostHook fn);
  // A tensor hook on this node's input `input_nr` (register_hook on a non-leaf output).
  RemovableHandle add_tensor_pre_hook(uint32_t input_nr, TensorHook fn);
  HookTable* hooks() const { return hooks_.get(); }
  // Hooks of the tensor behind this node (AccumulateGrad: the leaf's), or nullptr.
  virtual HookTable* leaf_hooks() const { return nullptr; }

  // Anomaly mode (kiln/autograd/anomaly.h): where the forward op that recorded this node was
  // called from; empty when anomaly mode was off at the time.
  const std::string& creation_stack() const;

 protected:
  bool should_compute_output(size_t i) const { return i < next_edges_.size() && next_edges_[i].valid(); }
  bool any_output_needed(size_t first, size_t n) const {
    for (size_t i = first; i < first + n; ++i)
      if (should_compute_output(i)) return true;
    return false;
  }

 private:
  HookTable& hook_table();
  std::shared_ptr<HookTable> hooks_;
  std::shared_ptr<const std::string> creation_stack_;
  std::vector<Edge> next_edges_;
  std::vector<InputMetadata> input_metadata_;
  std::vector<std::pair<uint32_t, AutogradMeta*>> retained_;
  uint64_t sequence_nr_;
};

// Accumulates the incoming gradient into a leaf's .grad.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(Tensor variable);
  const char* name() const override { return "AccumulateGrad"; }
  variable_list apply(variable_list&& grads) override;
  const Tensor& variable() const { return variable_; }
  HookTable* leaf_hooks() const override;

 private:
  Tensor variable_;
};

// Backward of an op whose derivative formula needs helpers not implemented yet.
class NotImplementedBackward final : public Node {
 public:
  NotImplementedBackward(const char* name, const char* op) : name_(name), op_(op) {}
  const char* name() const override { return name_; }
  variable_list apply(variable_list&& grads) override;

 private:
  const char* name_;
  const char* op_;
};

struct AutogradMeta final : AutogradMetaInterface {
  bool requires_grad_ = false;  // leaves: set by requires_grad_()
  bool retains_grad_ = false;
  uint32_t output_nr_ = 0;
  Tensor grad_;
  std::shared_ptr<Node> grad_fn_;
  std::weak_ptr<Node> grad_accumulator_;
  // Views: the version counter value grad_fn_ was made at; another value means the view's base
  // changed since, and grad_fn_ is made again from the base's history (Note [CopySlices] in
  // autograd/src/copy_slices.h).
  uint32_t attr_version_ = 0;
  std::shared_ptr<HookTable> leaf_hooks_;  // leaves: tensor and post-accumulate-grad hooks
  // Forward AD (Note [Forward AD levels] in forward_ad.h): the tangent, valid while level
  // fw_level_ is the active one; fw_owner_ is the impl owning this meta (its Autograd key is
  // dropped with the tangent when nothing else needs it).
  Tensor fw_grad_;
  uint64_t fw_level_ = 0;
  TensorImpl* fw_owner_ = nullptr;
  bool requires_grad() const override { return requires_grad_ || grad_fn_ != nullptr; }
  ~AutogradMeta() override;
};

// The tensor's autograd state, or nullptr when it has none.
inline AutogradMeta* meta_of(const Tensor& t) {
  return static_cast<AutogradMeta*>(t.impl()->autograd_meta());
}
AutogradMeta& materialize_meta(const Tensor& t);

// Where a gradient for `t` goes: its grad_fn's slot, or its (created on demand) AccumulateGrad.
// Invalid when t does not require grad.
Edge gradient_edge(const Tensor& t);
// Makes `t` the `output_nr`-th output of `fn`: sets grad_fn and the Autograd dispatch key.
void set_history(const Tensor& t, const std::shared_ptr<Node>& fn);
// `view`, an output of a view op on `self` (with its history set), views self's base (Note [View
// bases]), and its grad_fn is current at the storage's present version (Note [CopySlices]).
void set_view_base(const Tensor& view, const Tensor& self);
// The history of an in-place op's node `fn` on `self` (`self_edge`: the edge of fn that is
// self's value before the op): set_history, or for a view (Note [View bases] in
// kiln/tensor_impl.h) a CopySlices node over fn becomes the base's history (Note [CopySlices]).
void rebase_view_history(const Tensor& self, const std::shared_ptr<Node>& fn, size_t self_edge);
inline void rebase_history(const Tensor& self, const std::shared_ptr<Node>& fn,
                           size_t self_edge = 0) {
  if (self.impl()->view_base()) [[unlikely]]
    rebase_view_history(self, fn, self_edge);
  else
    set_history(self, fn);
}
// Makes a view's grad_fn again from its base's history (Note [CopySlices]).
void regenerate_view_grad_fn(const Tensor& view, AutogradMeta& m);
// Brings `m` (t's meta) up to date: a view whose storage changed since its grad_fn was made gets
// a new one. Every reader of a possibly-view tensor's grad_fn_ calls it first.
inline void refresh_grad_fn(const Tensor& t, AutogradMeta& m) {
  if (m.grad_fn_ && t.impl()->view_base() && m.attr_version_ != t.version()) [[unlikely]]
    regenerate_view_grad_fn(t, m);
}
// Adds `t`'s gradient edge to `fn` (an invalid edge when t is undefined or does not need grad).
void collect_edge(Node& fn, const Tensor& t);
void collect_edge(Node& fn, const std::optional<Tensor>& t);
void collect_edge(Node& fn, TensorList ts);

// A hook on `t`'s gradient, run before the gradient flows on (into the leaf's .grad for a leaf,
// into the node that made t otherwise); `fn` may return a replacement (same shape).
RemovableHandle register_hook(const Tensor& t, TensorHook fn);
// Leaves only: `fn(leaf)` runs after backward updated leaf.grad() (DDP/FSDP launch collectives
// from here).
RemovableHandle register_post_accumulate_grad_hook(const Tensor& t, PostAccumulateGradHook fn);

// Note [Saved variables]: a tensor saved for backward, with the version counter value at save
// time. unpack() fails if the tensor was modified in place since, or was freed by a backward
// without retain_graph. An input that is a recorded view of a tensor with history is saved
// detached, with its grad_fn: its base may later be rebased (Note [CopySlices]) onto a history
// that reaches the saving node (a forward-over-reverse tangent written through a view), and
// holding the view, which holds its base, would make that a reference cycle.
class SavedVariable {
 public:
  SavedVariable() = default;
  // `is_output`: t is an output of the node saving it (saved without its grad_fn).
  // `version_offset`: bumps still to come before the op returns (in-place ops save after the
  // kernel, before the dispatcher bumps the counter).
  SavedVariable(const Tensor& t, bool is_output, uint32_t version_offset = 0);
  // `clone`: the value of an in-place op's self before the op. With create_graph it unpacks with
  // self's history before the op, the owner's edge 0 (the clone itself has none).
  static SavedVariable before_inplace(const Tensor& clone);
  Tensor unpack(Node& owner, const char* arg) const;
  void reset();

 private:
  Tensor data_;
  uint32_t version_ = 0;
  uint32_t output_nr_ = 0;
  bool is_output_ = false;
  bool was_defined_ = false;
  bool released_ = false;
  bool output_requires_grad_ = false;
  bool before_inplace_ = false;
  // Views only (allocated then, so the common case stays small): a saved view's grad_fn (its
  // output_nr_ above), or, for an in-place op's result written through a view, the base's
  // CopySlices node (weak: it owns the node saving this), which the unpacked result's history
  // goes through (Note [CopySlices]).
  struct ViewHistory {
    std::shared_ptr<Node> grad_fn;
    std::weak_ptr<Node> copy_slices;
  };
  std::unique_ptr<ViewHistory> view_;
};

}  // namespace kiln::autograd
