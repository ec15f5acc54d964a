#include "autograd_support.h"

namespace kiln::autograd {

void check_inplace(const Tensor& self, const char* op) {
  // Note [In-place and views]: PyTorch rebases a base's history when a view of it changes in
  // place (CopySlices) and regenerates views' grad_fns when the base changes. Kiln does neither
  // yet, so the cases that would give a silently wrong gradient are refused.
  AutogradMeta* m = meta_of(self);
  if (m == nullptr || !m->requires_grad()) {
    KILN_CHECK(self.impl()->storage()->use_count() <= 1, NotImplemented, op,
               ": an in-place operation that makes a tensor require grad is not supported yet when "
               "that tensor shares its storage with others (a view, or a detached alias)");
    return;
  }
  KILN_CHECK(m->live_views_ == 0, NotImplemented, op,
             ": in-place operations on a tensor whose views autograd recorded are not supported "
             "yet (", m->live_views_, " live views)");
  KILN_CHECK(m->grad_fn_ != nullptr || !m->requires_grad_, Runtime,
             "a leaf Variable that requires grad is being used in an in-place operation (", op, ")");
  if (m->base_.defined() && m->base_.requires_grad()) {
    KILN_CHECK(!m->base_.is_leaf(), Runtime,
               "a view of a leaf Variable that requires grad is being used in an in-place operation (",
               op, ")");
    // PyTorch rebases the base's history here (CopySlices); recording only the view's node would
    // give the base a silently wrong gradient, so refuse until that exists.
    KILN_FAIL(NotImplemented, op, ": in-place operations on a view of a tensor that requires grad "
              "are not supported yet (modify the base tensor, or clone the view first)");
  }
}

std::vector<Tensor> geometry_placeholders(const std::vector<InputMetadata>& geom) {
  std::vector<Tensor> out;
  out.reserve(geom.size());
  for (const InputMetadata& m : geom)
    out.push_back(kiln::zeros({}, m.dtype, m.device).expand(IntArrayRef(m.sizes)));
  return out;
}

Tensor clone_below_autograd(const Tensor& t) {
  ExcludeDispatchKeyGuard guard(DispatchKey::Autograd);
  return t.clone();
}

}  // namespace kiln::autograd
