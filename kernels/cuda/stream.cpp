// Streams, the per-thread current stream, and events (kiln/cuda/stream.h).
#include "kiln/cuda/stream.h"

#include <array>
#include <atomic>
#include <mutex>

namespace kiln::cuda {
namespace {

constexpr int kStreamsPerPool = 32;

struct StreamPool {
  std::once_flag once;
  std::array<cudaStream_t, kStreamsPerPool> streams{};
  std::atomic<uint32_t> next{0};
};
std::array<StreamPool, kMaxDevices> g_pools;

// nullptr (the legacy default stream) until set (See Note [Current stream] in kiln/cuda/stream.h).
thread_local std::array<cudaStream_t, kMaxDevices> t_current{};

int resolve(int device) {
  if (device < 0) device = current_device();
  KILN_CHECK(device < device_count(), Value, "cuda: device index ", device, " out of range (",
             device_count(), " devices)");
  return device;
}

}  // namespace

bool Stream::query() const {
  DeviceGuard g(device_);
  cudaError_t err = cudaStreamQuery(stream_);
  if (err == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  KILN_CUDA_CHECK(err);
  return true;
}

void Stream::synchronize() const {
  DeviceGuard g(device_);
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

std::ostream& operator<<(std::ostream& os, const Stream& s) {
  return os << "Stream(device=cuda:" << s.device_index() << ", stream=" << s.stream() << ")";
}

Stream getDefaultStream(int device) { return Stream(nullptr, resolve(device)); }

Stream getStreamFromPool(int device) {
  device = resolve(device);
  StreamPool& pool = g_pools[device];
  std::call_once(pool.once, [&] {
    DeviceGuard g(device);
    for (auto& s : pool.streams) KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  });
  uint32_t i = pool.next.fetch_add(1, std::memory_order_relaxed) % kStreamsPerPool;
  return Stream(pool.streams[i], device);
}

Stream getCurrentStream(int device) {
  device = resolve(device);
  return Stream(t_current[device], device);
}

void setCurrentStream(Stream stream) { t_current[stream.device_index()] = stream.stream(); }

StreamGuard::StreamGuard(Stream stream)
    : prev_stream_(getCurrentStream(stream.device_index())), prev_device_(current_device()) {
  if (prev_device_ != stream.device_index()) set_device(stream.device_index());
  setCurrentStream(stream);
}

StreamGuard::~StreamGuard() {
  setCurrentStream(prev_stream_);
  if (prev_device_ != prev_stream_.device_index()) cudaSetDevice(prev_device_);
}

Event::~Event() {
  if (event_) cudaEventDestroy(event_);  // valid from any current device; never throws
}

Event::Event(Event&& o) noexcept { *this = std::move(o); }

Event& Event::operator=(Event&& o) noexcept {
  std::swap(event_, o.event_);
  std::swap(device_, o.device_);
  std::swap(timing_, o.timing_);
  std::swap(recorded_, o.recorded_);
  return *this;
}

void Event::record(const Stream& stream) {
  DeviceGuard g(stream.device_index());
  if (!event_) {
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&event_, timing_ ? cudaEventDefault : cudaEventDisableTiming));
    device_ = stream.device_index();
  }
  KILN_CHECK(device_ == stream.device_index(), Value, "Event::record: event was created on cuda:",
             device_, " but the stream is on cuda:", stream.device_index());
  KILN_CUDA_CHECK(cudaEventRecord(event_, stream.stream()));
  recorded_ = true;
}

void Event::wait(const Stream& stream) const {
  if (!recorded()) return;
  DeviceGuard g(stream.device_index());
  KILN_CUDA_CHECK(cudaStreamWaitEvent(stream.stream(), event_, 0));
}

bool Event::query() const {
  if (!recorded()) return true;
  cudaError_t err = cudaEventQuery(event_);
  if (err == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  KILN_CUDA_CHECK(err);
  return true;
}

void Event::synchronize() const {
  if (!recorded()) return;
  KILN_CUDA_CHECK(cudaEventSynchronize(event_));
}

float Event::elapsed_time(const Event& end) const {
  KILN_CHECK(timing_ && end.timing_, Value,
             "Event::elapsed_time: both events need enable_timing=true");
  KILN_CHECK(recorded() && end.recorded(), Value,
             "Event::elapsed_time: both events must be recorded first");
  float ms = 0;
  KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, event_, end.event_));
  return ms;
}

}  // namespace kiln::cuda
