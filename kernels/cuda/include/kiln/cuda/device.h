// kiln/cuda/device.h: CUDA devices, checked runtime calls and the device guard.
//
//   if (!kiln::cuda::is_available()) return;          // no GPU or no driver: skip, never throw
//   KILN_CUDA_CHECK(cudaMemsetAsync(p, 0, n, s));       // failure -> kiln::Error (Runtime)
//   { kiln::cuda::DeviceGuard g(1); ... }               // cudaSetDevice(1), restored on exit
//   int n = kiln::cuda::device_count();                 // 0 when cudaGetDeviceCount fails
//
// Note [No device]: with no GPU (or a driver older than the toolkit) cudaGetDeviceCount returns
// an error such as "CUDA driver version is insufficient", not 0. Kiln treats any error there as
// "no CUDA device": the library still loads, registers its kernels, and registers no allocator,
// so creating a CUDA tensor raises "no allocator for device type 'cuda'".
#pragma once

#include <cuda_runtime_api.h>

#include "kiln/error.h"

namespace kiln::cuda {

// Most devices Kiln tracks per process (streams, allocator pools). Larger indices are errors.
constexpr int kMaxDevices = 16;

namespace detail {
[[noreturn]] void cuda_fail(cudaError_t err, const char* call, const char* file, int line);
}  // namespace detail

// Number of usable CUDA devices; 0 when the runtime reports any error (Note [No device]).
int device_count();
inline bool is_available() { return device_count() > 0; }
int current_device();
void set_device(int device);
// Multiprocessor count of `device` (cached): sizes grid-stride launches.
int sm_count(int device);

// Sets the current device for a scope and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
  int device_ = -1;
};

}  // namespace kiln::cuda

// Turns a failed CUDA runtime call into kiln::Error(Runtime, "<cuda error string> (<call>)").
// The sticky error state is cleared (cudaGetLastError) so later calls are not poisoned.
#define KILN_CUDA_CHECK(call)                                                       \
  do {                                                                              \
    cudaError_t kiln_cuda_err_ = (call);                                            \
    if (__builtin_expect(kiln_cuda_err_ != cudaSuccess, 0))                         \
      ::kiln::cuda::detail::cuda_fail(kiln_cuda_err_, #call, __FILE__, __LINE__);   \
  } while (0)

// Checks the last kernel launch.
#define KILN_CUDA_CHECK_LAUNCH() KILN_CUDA_CHECK(cudaGetLastError())

namespace kiln::cuda {

// Hands each (event, block) entry of `pending` whose event has completed to `done` and removes
// it; entries still running stay. Events complete in order on one stream but not across
// streams, so the whole queue is scanned. The caching allocators use it.
template <typename Queue, typename Done>
void drain_completed_events(Queue& pending, Done done) {
  for (auto it = pending.begin(); it != pending.end();) {
    cudaError_t err = cudaEventQuery(it->first);
    if (err == cudaErrorNotReady) {
      cudaGetLastError();  // clear the sticky "not ready"
      ++it;
      continue;
    }
    KILN_CUDA_CHECK(err);
    done(*it);
    it = pending.erase(it);
  }
}

}  // namespace kiln::cuda
