#include "autograd_support.h"

#include "copy_slices.h"

namespace kiln::autograd {

void check_inplace(const Tensor& self, const char* op) {
  if (self.impl()->view_base()) [[unlikely]] {  // See Note [CopySlices]
    check_inplace_view(self, op);
    return;
  }
  AutogradMeta* m = meta_of(self);
  if (m == nullptr || !m->requires_grad()) {
    // Views of self, or a detached alias, would not see the history self gains.
    KILN_CHECK(self.impl()->storage()->use_count() <= 1, NotImplemented, op,
               ": an in-place operation that makes a tensor require grad (shape ", self.sizes(),
               ") is not supported while other tensors share its storage (its views, or a "
               "detached alias), because those would not see its new history; make the write "
               "before taking views of it, or clone it first");
    return;
  }
  KILN_CHECK(m->grad_fn_ != nullptr || !m->requires_grad_, Runtime,
             "a leaf Variable that requires grad is being used in an in-place operation (", op, ")");
}

std::vector<Tensor> geometry_placeholders(const std::vector<InputMetadata>& geom) {
  std::vector<Tensor> out;
  out.reserve(geom.size());
  for (const InputMetadata& m : geom)
    out.push_back(kiln::zeros({}, m.dtype, m.device).expand(IntArrayRef(m.sizes)));
  return out;
}

Tensor clone_below_autograd(const Tensor& t) {
  Tensor c;
  {
    ExcludeDispatchKeyGuard guard(DispatchKey::Autograd);
    c = t.clone();
  }
  // Forward-over-reverse (hessian): the backward formulas reading this value need its tangent
  // before the op too (fw then changes t's tangent in place).
  if (Tensor tangent = tangent_of(t); tangent.defined()) [[unlikely]] {
    ForwardADDisabledGuard off;
    forward::detail::set_tangent(c, tangent.clone());
  }
  return c;
}

}  // namespace kiln::autograd
