// kiln/autocast.h: automatic mixed precision (torch.autocast) through the Autocast dispatch key.
//
//   {
//     kiln::AutocastGuard amp(kiln::DeviceType::CPU, kiln::kBFloat16);
//     kiln::Tensor y = kiln::linear(x, w, b);            // bfloat16 (policy lower_precision)
//     kiln::Tensor loss = kiln::cross_entropy(y, t);     // float32 (policy fp32)
//   }
//   loss.backward();                                    // w.grad() is float32, like w
//
// Note [Autocast]: while a guard enables a device type, the Autocast key is in the thread's
// included key set, so every op reaches the Autocast kernel (one boxed kernel for all ops,
// registered as the key's fallback). It reads the row's `autocast` policy and casts the
// floating tensor arguments that live on an enabled device type:
// - lower_precision: float32 and float16/bfloat16 -> the guard's dtype (float64 is left alone);
// - fp32: float16/bfloat16 -> float32;
// - promote: every floating argument -> the widest floating dtype among them;
// - none, and every in-place or out= variant: nothing.
// Integer and bool tensors, wrapped numbers and non-tensor arguments are never cast; a tensor
// passed twice to one op is cast once. The casts are ordinary `to` calls made below Autocast
// and above Autograd, so autograd records them and gradients reach float32 leaves as float32.
// The op itself then runs with Autocast excluded, so a composite op's decomposition runs in the
// dtype chosen for the whole op (PyTorch's behaviour), and composite rows with a policy other
// than none leave their Autocast slot to this kernel (detail::register_composite).
// The state is per thread, like PyTorch's: worker threads start with autocast off.
#pragma once

#include "kiln/device.h"
#include "kiln/scalar_type.h"

namespace kiln {

// True while an AutocastGuard enables `device_type` on this thread.
bool is_autocast_enabled(DeviceType device_type = DeviceType::CPU);
// The lower-precision dtype of `device_type`'s autocast (default bfloat16).
ScalarType get_autocast_dtype(DeviceType device_type = DeviceType::CPU);

// RAII: enables (or, with enabled=false, disables) autocast for one device type on this thread
// and restores the previous state on exit; guards nest. dtype must be bfloat16 or float16.
class AutocastGuard {
 public:
  explicit AutocastGuard(DeviceType device_type, ScalarType dtype = kBFloat16, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  DeviceType device_type_;
  bool prev_enabled_;
  ScalarType prev_dtype_;
};

}  // namespace kiln
