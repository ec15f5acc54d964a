// Private: autograd of in-place writes through views, for the generated Autograd kernels, custom
// Functions, SavedVariable and forward AD.
//
// Note [CopySlices]: an in-place op on a view V changes its base B too (Note [View bases] in
// kiln/tensor_impl.h). As in PyTorch:
// - Shapes: B and V are (sizes, strides, storage offset) geometries over one storage; the nodes
//   below keep only those (no tensor: no version check, no reference cycle).
// - Rebase: the op's node fn (input: V's new value; edge `self_edge`: V's old value) goes inside
//   a CopySlices node that becomes B's grad_fn, with fn's edges but B's old history at self_edge.
//   Backward lays B's gradient out in a buffer spanning both geometries, runs fn on V's slice of
//   it, writes fn's gradient for V's old value (zeros if none) back into the slice, and sends the
//   buffer, read with B's geometry, to B's old history; fn's other gradients pass through.
// - Versions: a view's AutogradMeta::attr_version_ is the storage's version counter when its
//   grad_fn was made. Every in-place op, on B or any view, bumps that one counter, so
//   refresh_grad_fn() (gradient_edge, grad_fn(), hooks, grad()) sees the change and makes the view
//   AsStridedBackward0 over B's current history. Saved tensors keep their own version checks.
// - B without history gains one from a write of a value that requires grad; views of B taken
//   before were not recorded, so this is refused while another tensor shares the storage. Leaf
//   views and no_grad views get PyTorch's errors when the op reaches autograd (an operand has
//   autograd state; a write of plain values into a no_grad view is untracked, as under no_grad).
// - Under create_graph, vmap or forward AD the nodes gather/scatter storage positions instead.
#pragma once

#include <memory>

#include "kiln/autograd/node.h"

namespace kiln::autograd {

// Where a tensor's elements sit in its storage.
struct StridedGeometry {
  DimVector sizes;
  DimVector strides;
  int64_t offset = 0;
};
StridedGeometry strided_geometry(const Tensor& t);

class CopySlices final : public Node {
 public:
  // `fn`: the in-place op's node on `view`; its edge `self_edge` is the view's old value.
  CopySlices(const Tensor& base, const Tensor& view, std::shared_ptr<Node> fn, size_t self_edge);
  const char* name() const override { return "CopySlices"; }
  variable_list apply(variable_list&& grads) override;
  void release_variables() override { fn_->release_variables(); }
  const std::shared_ptr<Node>& fn() const { return fn_; }
  const StridedGeometry& base_geometry() const { return base_; }

 private:
  StridedGeometry base_, view_;
  std::shared_ptr<Node> fn_;
  size_t self_edge_;
};

// The grad_fn a view gets from its base's history: the view's gradient placed at the view's
// storage positions, read with the base's geometry (as_strided's backward).
class AsStridedViewBackward final : public Node {
 public:
  AsStridedViewBackward(StridedGeometry base, StridedGeometry view)
      : base_(std::move(base)), view_(std::move(view)) {}
  const char* name() const override { return "AsStridedBackward0"; }
  variable_list apply(variable_list&& grads) override;

 private:
  StridedGeometry base_, view_;
};

// The CopySlices node of `view`'s base when `view`'s grad_fn is that node's fn (the result of
// an in-place op through the view, before it is refreshed); nullptr otherwise.
std::shared_ptr<Node> copy_slices_writing(const Tensor& view);
// An AsStridedBackward0 node for `view` over the base history `copy_slices` (input metadata set).
std::shared_ptr<Node> view_of_copy_slices(const std::shared_ptr<Node>& copy_slices,
                                          const Tensor& view);

// check_inplace() of a view: PyTorch's errors for views of leaves and views made under no_grad,
// and the storage-sharing refusal above.
void check_inplace_view(const Tensor& self, const char* op);

// True when no tensor but `t` reaches t's memory: its storage is held by t alone, or by t and a
// base that nothing else holds (Note [View bases]).
inline bool owns_storage(const Tensor& t) {
  const TensorImpl* impl = t.impl();
  const int holders = impl->view_base() && impl->view_base().use_count() == 1 ? 2 : 1;
  return impl->storage().use_count() == holders;
}

}  // namespace kiln::autograd
