// Devices, checked calls and the device guard (kiln/cuda/device.h).
#include "kiln/cuda/device.h"

#include <array>
#include <atomic>
#include <mutex>

namespace kiln::cuda {

namespace detail {
void cuda_fail(cudaError_t err, const char* call, const char* file, int line) {
  cudaGetLastError();  // clear the sticky error of a failed launch or allocation
  KILN_FAIL(Runtime, "CUDA error: ", cudaGetErrorString(err), " (", cudaGetErrorName(err),
            ") in ", call, " at ", file, ":", line);
}
}  // namespace detail

int device_count() {
  static const int n = [] {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return count < kMaxDevices ? count : kMaxDevices;
  }();
  return n;
}

int current_device() {
  int d = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

void set_device(int device) {
  KILN_CHECK(device >= 0 && device < device_count(), Value, "cuda: device index ", device,
             " out of range (", device_count(), " devices)");
  KILN_CUDA_CHECK(cudaSetDevice(device));
}

int sm_count(int device) {
  static std::array<std::atomic<int>, kMaxDevices> cache{};
  KILN_ASSERT(device >= 0 && device < kMaxDevices);
  int n = cache[device].load(std::memory_order_relaxed);
  if (n > 0) return n;
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
  cache[device].store(n, std::memory_order_relaxed);
  return n;
}

DeviceGuard::DeviceGuard(int device) : device_(device) {
  prev_ = current_device();
  if (prev_ != device_) set_device(device_);
}

DeviceGuard::~DeviceGuard() {
  if (prev_ != device_) cudaSetDevice(prev_);  // no throw from a destructor
}

}  // namespace kiln::cuda
