// kiln/allocator.h: raw memory for tensors, one Allocator per device type.
//
//   kiln::Allocator* a = kiln::get_allocator(kiln::DeviceType::CPU);
//   kiln::DataPtr p = a->allocate(1024);          // 64-byte aligned; freed when p dies
//   a->stats().in_use_bytes;                       // bytes handed out and not yet freed
//   kiln::set_allocator(kiln::DeviceType::CUDA, &my_cuda_allocator);   // from kernels/cuda
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "kiln/device.h"

namespace kiln {

// Owns one allocation. The deleter receives `ctx` (the allocator chooses it) and the data.
class DataPtr {
 public:
  using Deleter = void (*)(void* ctx, void* data);
  DataPtr() = default;
  DataPtr(void* data, void* ctx, Deleter deleter, Device device)
      : data_(data), ctx_(ctx), deleter_(deleter), device_(device) {}
  DataPtr(const DataPtr&) = delete;
  DataPtr& operator=(const DataPtr&) = delete;
  DataPtr(DataPtr&& o) noexcept { *this = std::move(o); }
  DataPtr& operator=(DataPtr&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(ctx_, o.ctx_);
    std::swap(deleter_, o.deleter_);
    std::swap(device_, o.device_);
    return *this;
  }
  ~DataPtr() {
    if (deleter_) deleter_(ctx_, data_);
  }
  void* get() const { return data_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  void* ctx_ = nullptr;
  Deleter deleter_ = nullptr;
  Device device_;
};

struct AllocatorStats {
  size_t in_use_bytes = 0;   // handed out, not yet freed (rounded to the block size)
  size_t cached_bytes = 0;   // freed and kept for reuse
  size_t peak_in_use_bytes = 0;
  size_t num_allocs = 0;     // calls to allocate()
  size_t num_cache_hits = 0;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual DataPtr allocate(size_t nbytes) = 0;
  virtual AllocatorStats stats() const = 0;
  // Sets peak_in_use_bytes to the current in_use_bytes (to measure the peak of one phase).
  virtual void reset_peak_stats() = 0;
  virtual void empty_cache() {}
};

// Returns the allocator registered for `type`; throws RuntimeError when none is (e.g. CUDA
// in a build without kernels/cuda).
Allocator* get_allocator(DeviceType type);
void set_allocator(DeviceType type, Allocator* allocator);

// The CPU allocator: 64-byte aligned blocks, cached by power-of-two size class.
Allocator* cpu_allocator();

}  // namespace kiln
