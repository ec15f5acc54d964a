// kiln/autograd/grad_mode.h: grad modes and their RAII guards (PyTorch's no_grad, enable_grad,
// inference_mode).
//
//   { kiln::autograd::NoGradGuard g; y = w * x; }      // y.requires_grad() == false
//   { kiln::autograd::InferenceModeGuard g; t = exp(x); }   // t.is_inference(): never enters autograd
#pragma once

#include "kiln/dispatch_key.h"

namespace kiln::autograd {

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
