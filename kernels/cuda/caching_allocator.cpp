// The stream-aware caching device allocator (kiln/cuda/allocator.h).
//
// Note [CUDA caching allocator] and Note [Stream-ordered reuse] explain the policy. Layout: one
// DevicePool per device, each with its own mutex, a map from pointer to Block for every live
// cudaMalloc, a free set ordered by (stream, size, address), and a FIFO of (event, block) for
// freed blocks still in use on other streams.
#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_set>
#include <vector>

#include "kiln/cuda/allocator.h"
#include "kiln/cuda/device.h"
#include "kiln/profiler.h"
#include "kiln/tensor.h"

namespace kiln::cuda {
namespace {

constexpr size_t kSmallSize = size_t{1} << 20;  // requests <= 1 MiB are "small"
constexpr size_t kSmallRound = 512;
constexpr size_t kLargeRound = size_t{2} << 20;  // 2 MiB granules

size_t round_size(size_t n) {
  if (n == 0) n = 1;
  if (n <= kSmallSize) return (n + kSmallRound - 1) / kSmallRound * kSmallRound;
  return (n + kLargeRound - 1) / kLargeRound * kLargeRound;
}

struct Block {
  void* ptr;
  size_t size;
  cudaStream_t stream;  // the stream it was allocated on
  bool allocated = false;
  int pending_events = 0;                 // events to wait for before reuse
  std::unordered_set<cudaStream_t> uses;  // other streams it was used on (record_stream)
};

struct BlockLess {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return std::less<cudaStream_t>()(a->stream, b->stream);
    if (a->size != b->size) return a->size < b->size;
    return std::less<void*>()(a->ptr, b->ptr);
  }
};

std::string format_bytes(size_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

class DevicePool {
 public:
  explicit DevicePool(int device) : device_(device) {}

  void* allocate(size_t nbytes, cudaStream_t stream) {
    size_t size = round_size(nbytes);
    std::unique_lock<std::mutex> g(mu_);
    ++stats_.num_allocs;
    process_events();
    Block* b = find_free(size, stream);
    if (b) {
      ++stats_.num_cache_hits;
      stats_.cached_bytes -= b->size;
    } else {
      b = malloc_block(nbytes, size, stream);
    }
    b->allocated = true;
    stats_.in_use_bytes += b->size;
    stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
    void* ptr = b->ptr;
    const int64_t bytes = static_cast<int64_t>(b->size), in_use = stats_.in_use_bytes;
    g.unlock();
    record(ptr, bytes, in_use);
    return ptr;
  }

  void free(void* ptr) {
    int64_t bytes, in_use;
    {
      std::lock_guard<std::mutex> g(mu_);
      bytes = static_cast<int64_t>(free_locked(ptr));
      in_use = stats_.in_use_bytes;
    }
    record(ptr, -bytes, in_use);
  }

  // Returns the block's size.
  size_t free_locked(void* ptr) {
    auto it = blocks_.find(ptr);
    KILN_ASSERT(it != blocks_.end() && it->second->allocated, "CUDA free of an unknown block");
    Block* b = it->second.get();
    b->allocated = false;
    stats_.in_use_bytes -= b->size;
    stats_.cached_bytes += b->size;
    if (b->uses.empty()) {
      free_.insert(b);
      return b->size;
    }
    // Wait for every other stream that used the block
    // (See Note [Stream-ordered reuse] in kiln/cuda/allocator.h).
    DeviceGuard dg(device_);
    for (cudaStream_t s : b->uses) {
      cudaEvent_t e = get_event();
      KILN_CUDA_CHECK(cudaEventRecord(e, s));
      pending_.push_back({e, b});
      ++b->pending_events;
    }
    b->uses.clear();
    return b->size;
  }

  // An allocation (bytes > 0) or free for the profiler (Note [Profiler hook] in kiln/profiler.h).
  void record(const void* ptr, int64_t bytes, int64_t in_use) const {
    if (__builtin_expect(profiler::detail::memory_on(), 0))
      profiler::detail::record_memory(ptr, bytes, in_use, Device(DeviceType::CUDA, device_));
  }

  void record_stream(const void* ptr, cudaStream_t stream) {
    std::lock_guard<std::mutex> g(mu_);
    Block* b = find_containing(ptr);
    if (!b || !b->allocated || b->stream == stream) return;
    b->uses.insert(stream);
  }

  bool owns(const void* ptr) {
    std::lock_guard<std::mutex> g(mu_);
    return find_containing(ptr) != nullptr;
  }

  AllocatorStats stats() {
    std::lock_guard<std::mutex> g(mu_);
    return stats_;
  }

  void reset_peak() {
    std::lock_guard<std::mutex> g(mu_);
    stats_.peak_in_use_bytes = stats_.in_use_bytes;
  }

  void empty_cache() {
    std::lock_guard<std::mutex> g(mu_);
    release_cached();
  }

 private:
  Block* find_free(size_t size, cudaStream_t stream) {
    Block key{nullptr, size, stream};
    auto it = free_.lower_bound(&key);
    if (it == free_.end() || (*it)->stream != stream) return nullptr;
    Block* b = *it;
    bool fits = size <= kSmallSize ? b->size == size : b->size <= 2 * size;
    if (!fits) return nullptr;
    free_.erase(it);
    return b;
  }

  Block* malloc_block(size_t nbytes, size_t size, cudaStream_t stream) {
    DeviceGuard dg(device_);
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, size);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      release_cached();  // free everything cached, then retry once
      err = cudaMalloc(&p, size);
    }
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      size_t free_mem = 0, total = 0;
      cudaMemGetInfo(&free_mem, &total);
      cudaGetLastError();
      KILN_FAIL(Runtime, "CUDA out of memory: tried to allocate ", nbytes, " bytes (",
                format_bytes(size), " rounded) on cuda:", device_, "; the device has ",
                format_bytes(total), " in total and ", format_bytes(free_mem), " free; Kiln holds ",
                format_bytes(stats_.in_use_bytes), " in use and ",
                format_bytes(stats_.cached_bytes), " cached");
    }
    KILN_CUDA_CHECK(err);
    auto owned = std::make_unique<Block>(Block{p, size, stream});
    Block* b = owned.get();
    blocks_.emplace(p, std::move(owned));
    return b;
  }

  // The live block whose range contains `ptr` (views point into the middle of blocks).
  Block* find_containing(const void* ptr) {
    auto it = blocks_.upper_bound(const_cast<void*>(ptr));
    if (it == blocks_.begin()) return nullptr;
    --it;
    Block* b = it->second.get();
    auto* base = static_cast<const char*>(b->ptr);
    return static_cast<const char*>(ptr) < base + b->size ? b : nullptr;
  }

  // Returns blocks whose pending events have all completed to the free set.
  void process_events() {
    drain_completed_events(pending_, [this](const auto& pe) { finish_event(pe); });
  }

  void finish_event(const std::pair<cudaEvent_t, Block*>& pe) {
    event_pool_.push_back(pe.first);
    Block* b = pe.second;
    if (--b->pending_events == 0) free_.insert(b);
  }

  cudaEvent_t get_event() {
    if (!event_pool_.empty()) {
      cudaEvent_t e = event_pool_.back();
      event_pool_.pop_back();
      return e;
    }
    cudaEvent_t e;
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }

  void release_cached() {
    DeviceGuard dg(device_);
    for (auto& pe : pending_) {
      KILN_CUDA_CHECK(cudaEventSynchronize(pe.first));
      finish_event(pe);
    }
    pending_.clear();
    for (Block* b : free_) {
      cudaFree(b->ptr);
      stats_.cached_bytes -= b->size;
      blocks_.erase(b->ptr);
    }
    free_.clear();
  }

  int device_;
  std::mutex mu_;
  std::map<void*, std::unique_ptr<Block>> blocks_;  // every live cudaMalloc, by address
  std::set<Block*, BlockLess> free_;
  std::deque<std::pair<cudaEvent_t, Block*>> pending_;
  std::vector<cudaEvent_t> event_pool_;
  AllocatorStats stats_;
};

class CudaCachingAllocator final : public Allocator {
 public:
  CudaCachingAllocator() {
    for (int d = 0; d < device_count(); ++d) pools_.push_back(std::make_unique<DevicePool>(d));
  }

  DataPtr allocate(size_t nbytes) override {
    int device = current_device();
    cudaStream_t stream = getCurrentStream(device).stream();
    void* p = pools_[device]->allocate(nbytes, stream);
    return DataPtr(p, reinterpret_cast<void*>(static_cast<intptr_t>(device)),
                   &CudaCachingAllocator::release, Device(DeviceType::CUDA, device));
  }

  AllocatorStats stats() const override {
    AllocatorStats sum;
    for (auto& p : pools_) {
      AllocatorStats s = p->stats();
      sum.in_use_bytes += s.in_use_bytes;
      sum.cached_bytes += s.cached_bytes;
      sum.peak_in_use_bytes += s.peak_in_use_bytes;
      sum.num_allocs += s.num_allocs;
      sum.num_cache_hits += s.num_cache_hits;
    }
    return sum;
  }

  void reset_peak_stats() override {
    for (auto& p : pools_) p->reset_peak();
  }

  void empty_cache() override {
    for (auto& p : pools_) p->empty_cache();
  }

  DevicePool& pool(int device) {
    KILN_CHECK(device >= 0 && device < static_cast<int>(pools_.size()), Value,
               "cuda: device index ", device, " out of range (", pools_.size(), " devices)");
    return *pools_[device];
  }
  int num_devices() const { return static_cast<int>(pools_.size()); }

  static CudaCachingAllocator* instance() {
    // Never destroyed: tensors may be freed during static destruction.
    static CudaCachingAllocator* a = device_count() > 0 ? new CudaCachingAllocator() : nullptr;
    return a;
  }

 private:
  static void release(void* ctx, void* data) {
    int device = static_cast<int>(reinterpret_cast<intptr_t>(ctx));
    instance()->pools_[device]->free(data);
  }

  std::vector<std::unique_ptr<DevicePool>> pools_;
};

// Register only when a device is present; otherwise stay silent
// (See Note [No device] in kiln/cuda/device.h).
const int g_registered = [] {
  if (Allocator* a = CudaCachingAllocator::instance()) set_allocator(DeviceType::CUDA, a);
  return 0;
}();

}  // namespace

Allocator* cuda_allocator() { return CudaCachingAllocator::instance(); }

void record_stream(const void* ptr, const Stream& stream) {
  CudaCachingAllocator* a = CudaCachingAllocator::instance();
  if (!a || !ptr) return;
  a->pool(stream.device_index()).record_stream(ptr, stream.stream());
}

void record_stream(const DataPtr& ptr, const Stream& stream) { record_stream(ptr.get(), stream); }

void record_stream(const Tensor& t, const Stream& stream) {
  if (!t.defined() || !t.device().is_cuda()) return;
  record_stream(t.impl()->storage()->data(), stream);
}

AllocatorStats device_stats(int device) {
  CudaCachingAllocator* a = CudaCachingAllocator::instance();
  if (!a) return {};
  return a->pool(device < 0 ? current_device() : device).stats();
}

void reset_peak_stats() {
  CudaCachingAllocator* a = CudaCachingAllocator::instance();
  if (!a) return;
  for (int d = 0; d < a->num_devices(); ++d) a->pool(d).reset_peak();
}

void empty_cache() {
  if (CudaCachingAllocator* a = CudaCachingAllocator::instance()) a->empty_cache();
}

}  // namespace kiln::cuda
