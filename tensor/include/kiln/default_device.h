// kiln/default_device.h: the device that factory ops (empty, zeros, ones, full, rand, randn,
// randint, randperm, arange, ...) create on when they are given none: torch.set_default_device.
//
//   kiln::set_default_device(session.device());   // a thin client: parameters made on the worker
//   auto layer = std::make_shared<kiln::nn::Linear>(784, 1024);   // initialized remotely
//   { kiln::DefaultDeviceGuard cpu(kiln::kCPU); auto t = kiln::zeros({3}); }   // scoped
//
// Per thread, as PyTorch's device context, and kCPU until set: an embedded worker's threads in the
// same process keep making their temporaries on the CPU. A client-only build (KILN_CLIENT_ONLY)
// has no CPU kernels, so it cannot fill a CPU tensor: it sets a remote session's device before
// building a model. Tensors made from data (from_blob, from_numpy, wrapped numbers) stay on the
// CPU.
#pragma once

#include "kiln/device.h"

namespace kiln {

Device default_device();
void set_default_device(Device d);

class DefaultDeviceGuard {
 public:
  explicit DefaultDeviceGuard(Device d) : prev_(default_device()) { set_default_device(d); }
  ~DefaultDeviceGuard() { set_default_device(prev_); }
  DefaultDeviceGuard(const DefaultDeviceGuard&) = delete;
  DefaultDeviceGuard& operator=(const DefaultDeviceGuard&) = delete;

 private:
  Device prev_;
};

}  // namespace kiln
