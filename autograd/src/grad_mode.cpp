#include "kiln/autograd/grad_mode.h"

namespace kiln::autograd {
namespace {
thread_local detail::AutogradTLS tls_state;
}

detail::AutogradTLS& detail::autograd_tls() { return tls_state; }

bool GradMode::is_enabled() { return tls_state.grad_enabled; }
void GradMode::set_enabled(bool enabled) { tls_state.grad_enabled = enabled; }

InferenceModeGuard::InferenceModeGuard(bool enabled)
    : prev_grad_(GradMode::is_enabled()), prev_tls_(tls_local_dispatch_key_set()) {
  LocalDispatchKeySet& tls = tls_local_dispatch_key_set();
  tls.inference_mode = enabled;
  if (enabled) {
    tls.excluded = tls.excluded.add(DispatchKey::Autograd);
    GradMode::set_enabled(false);
  } else {
    tls.excluded = tls.excluded.remove(DispatchKey::Autograd);
  }
}

InferenceModeGuard::~InferenceModeGuard() {
  tls_local_dispatch_key_set() = prev_tls_;
  GradMode::set_enabled(prev_grad_);
}

bool InferenceModeGuard::is_enabled() { return tls_local_dispatch_key_set().inference_mode; }

}  // namespace kiln::autograd
