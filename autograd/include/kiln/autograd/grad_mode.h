// kiln/autograd/grad_mode.h: grad modes and their RAII guards (PyTorch's no_grad, enable_grad,
// inference_mode).
//
//   { kiln::autograd::NoGradGuard g; y = w * x; }      // y.requires_grad() == false
//   { kiln::autograd::InferenceModeGuard g; t = exp(x); }   // t.is_inference(): never enters autograd
#pragma once

#include <cstdint>

#include "kiln/dispatch_key.h"

namespace kiln::autograd {

namespace detail {
// Note [Autograd thread-local state]: grad mode and the forward-AD state share one thread-local
// struct, so a generated Autograd kernel learns both with one call and one TLS access (the
// reverse-mode path costs no more than it did before forward AD existed).
struct AutogradTLS {
  bool grad_enabled = true;
  // A forward AD level is active and forward AD is not disabled (forward_ad.h): the kernels
  // propagate tangents. Kept equal to `fw_level != 0 && fw_disabled == 0`.
  bool forward_ad = false;
  uint32_t fw_disabled = 0;  // ForwardADDisabledGuard nesting
  uint64_t fw_level = 0;     // id of the active DualLevel, 0 when none
  void refresh() { forward_ad = fw_level != 0 && fw_disabled == 0; }
};
AutogradTLS& autograd_tls();
}  // namespace detail

struct GradMode {
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

class AutoGradMode {
 public:
  explicit AutoGradMode(bool enabled) : prev_(GradMode::is_enabled()) { GradMode::set_enabled(enabled); }
  ~AutoGradMode() { GradMode::set_enabled(prev_); }
  AutoGradMode(const AutoGradMode&) = delete;
  AutoGradMode& operator=(const AutoGradMode&) = delete;

 private:
  bool prev_;
};

class NoGradGuard : public AutoGradMode {
 public:
  NoGradGuard() : AutoGradMode(false) {}
};

class EnableGradGuard : public AutoGradMode {
 public:
  EnableGradGuard() : AutoGradMode(true) {}
};

// Note [Inference tensors]: under inference mode grad mode is off, the Autograd key is excluded
// from dispatch, and every TensorImpl created is marked is_inference(). Such a tensor cannot
// require grad or be saved for backward later (RuntimeError).
class InferenceModeGuard {
 public:
  explicit InferenceModeGuard(bool enabled = true);
  ~InferenceModeGuard();
  InferenceModeGuard(const InferenceModeGuard&) = delete;
  InferenceModeGuard& operator=(const InferenceModeGuard&) = delete;
  static bool is_enabled();

 private:
  bool prev_grad_;
  LocalDispatchKeySet prev_tls_;
};

}  // namespace kiln::autograd
