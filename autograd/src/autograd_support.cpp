#include "autograd_support.h"

namespace kiln::autograd {

void check_inplace(const Tensor& self, const char* op) {
  AutogradMeta* m = meta_of(self);
  KILN_CHECK(m == nullptr || m->grad_fn_ != nullptr || !m->requires_grad_, Runtime,
             "a leaf Variable that requires grad is being used in an in-place operation (", op, ")");
}

Tensor clone_below_autograd(const Tensor& t) {
  ExcludeDispatchKeyGuard guard(DispatchKey::Autograd);
  return t.clone();
}

}  // namespace kiln::autograd
