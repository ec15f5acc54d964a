// Tensor's autograd methods: forwarded to kiln_autograd's hooks (kiln/autograd_hooks.h).
#include "kiln/autograd_hooks.h"

#include "kiln/error.h"

namespace kiln {
namespace {
const AutogradHooks* g_hooks = nullptr;

const AutogradHooks& need_hooks(const char* what) {
  KILN_CHECK(g_hooks != nullptr, Runtime, "Tensor.", what,
             " needs autograd, but kiln_autograd is not loaded (link kiln_runtime or kiln_autograd)");
  return *g_hooks;
}
}  // namespace

void set_autograd_hooks(const AutogradHooks* hooks) { g_hooks = hooks; }
const AutogradHooks* autograd_hooks() { return g_hooks; }

const Tensor& Tensor::requires_grad_(bool requires_grad) const {
  check_defined("requires_grad_()");
  if (!requires_grad && impl()->autograd_meta() == nullptr) return *this;
  need_hooks("requires_grad_()").set_requires_grad(*this, requires_grad);
  return *this;
}

Tensor Tensor::grad() const {
  if (live()->autograd_meta() == nullptr) return Tensor();
  return need_hooks("grad").grad(*this);
}

void Tensor::set_grad(const Tensor& grad) const {
  check_defined("set_grad()");
  if (detail::t_grad_set_hook != nullptr) [[unlikely]]
    detail::t_grad_set_hook(*live());
  need_hooks("set_grad()").set_grad(*this, grad);
}

std::shared_ptr<autograd::Node> Tensor::grad_fn() const {
  if (live()->autograd_meta() == nullptr) return nullptr;
  return need_hooks("grad_fn").grad_fn(*this);
}

bool Tensor::is_leaf() const {
  if (live()->autograd_meta() == nullptr) return true;
  return need_hooks("is_leaf").is_leaf(*this);
}

int64_t Tensor::output_nr() const {
  if (live()->autograd_meta() == nullptr) return 0;
  return need_hooks("output_nr").output_nr(*this);
}

void Tensor::backward(const Tensor& gradient, std::optional<bool> retain_graph,
                      bool create_graph) const {
  check_defined("backward()");
  need_hooks("backward()").backward(*this, gradient, retain_graph, create_graph);
}

void Tensor::retain_grad() const {
  check_defined("retain_grad()");
  need_hooks("retain_grad()").retain_grad(*this);
}

bool Tensor::retains_grad() const {
  if (live()->autograd_meta() == nullptr) return false;
  return need_hooks("retains_grad").retains_grad(*this);
}

Tensor Tensor::detach() const {
  const TensorImpl* src = live();
  if (const BackendHandle* h = src->backend_handle())
    if (auto d = h->detached(*src)) return Tensor(std::move(d));
  auto impl = TensorImpl::make(src->storage(), src->dtype(), src->sizes(), src->strides(),
                               src->storage_offset());
  impl->set_wrapped_number(src->is_wrapped_number());
  impl->set_backend_handle(src->backend_handle_ptr());  // a remote value id stays attached
  return Tensor(std::move(impl));
}

}  // namespace kiln
