// kiln/cuda/stream.h: CUDA streams (per-device current stream, pooled streams) and events.
//
//   kiln::cuda::Stream s = kiln::cuda::getStreamFromPool(0);
//   {
//     kiln::cuda::StreamGuard g(s);                      // kernels on device 0 now go to s
//     y = x + 1;                                         // enqueued on s
//   }
//   kiln::cuda::Event e;  e.record(s);  e.wait(kiln::cuda::getDefaultStream(0));  e.synchronize();
//
// Note [Current stream]: each thread has, per device, a current stream (initially the device's
// default, legacy null stream). Every Kiln CUDA kernel and copy is enqueued on the current stream
// of its tensors' device; the caching allocator hands out memory ordered on that stream
// (Note [Stream-ordered reuse] in allocator.h). Pool streams are created non-blocking, 32 per
// device, handed out round-robin, and never destroyed.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <ostream>

#include "kiln/cuda/device.h"
#include "kiln/device.h"

namespace kiln::cuda {

class Stream {
 public:
  Stream(cudaStream_t stream, int device) : stream_(stream), device_(static_cast<int16_t>(device)) {}
  cudaStream_t stream() const { return stream_; }
  operator cudaStream_t() const { return stream_; }  // NOLINT: pass straight to the runtime
  int device_index() const { return device_; }
  Device device() const { return Device(DeviceType::CUDA, device_); }
  bool is_default() const { return stream_ == nullptr; }
  // True when all work enqueued so far has completed.
  bool query() const;
  void synchronize() const;
  friend bool operator==(const Stream& a, const Stream& b) {
    return a.stream_ == b.stream_ && a.device_ == b.device_;
  }
  friend bool operator!=(const Stream& a, const Stream& b) { return !(a == b); }

 private:
  cudaStream_t stream_;
  int16_t device_;
};

std::ostream& operator<<(std::ostream& os, const Stream& s);

// device < 0 means the current device.
Stream getDefaultStream(int device = -1);
Stream getStreamFromPool(int device = -1);
Stream getCurrentStream(int device = -1);
void setCurrentStream(Stream stream);

// Makes `stream` current on its device (and its device current) for a scope.
class StreamGuard {
 public:
  explicit StreamGuard(Stream stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream prev_stream_;
  int prev_device_;
};

// A CUDA event, created lazily on the device of the first stream it is recorded on.
class Event {
 public:
  explicit Event(bool enable_timing = false) : timing_(enable_timing) {}
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& o) noexcept;
  Event& operator=(Event&& o) noexcept;

  void record(const Stream& stream);
  void record() { record(getCurrentStream()); }
  // Makes future work on `stream` wait for this event (no host blocking). No-op if never recorded.
  void wait(const Stream& stream) const;
  // True when the recorded work has completed (or the event was never recorded).
  bool query() const;
  void synchronize() const;
  // Milliseconds between this event and `end` (both recorded, created with timing enabled).
  float elapsed_time(const Event& end) const;
  bool recorded() const { return event_ != nullptr && recorded_; }
  cudaEvent_t event() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
  int device_ = -1;
  bool timing_ = false;
  bool recorded_ = false;
};

}  // namespace kiln::cuda
