// The CPU caching allocator and the per-device allocator registry.
//
// Note [CPU caching allocator]: requests round up to a size class (powers of two up to 1 MiB,
// then multiples of 2 MiB). Freed blocks go to a per-class free list and are reused by the
// next request of the same class, so steady-state training allocates nothing from the OS.
// The cache is bounded (kMaxCachedBytes); beyond it, frees go back to the OS.
#include "kiln/allocator.h"

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "kiln/error.h"
#include "kiln/profiler.h"
#include "profiler_flags.h"

namespace kiln {
namespace {

constexpr size_t kAlign = 64;
constexpr size_t kSmallLimit = size_t{1} << 20;
constexpr size_t kLargeGranule = size_t{2} << 20;
constexpr size_t kMaxCachedBytes = size_t{4} << 30;

// The allocator's critical sections are a few loads and stores: a spinlock (one atomic exchange
// to enter, a plain release store to leave) costs less than a mutex on this hot path.
class SpinLock {
 public:
  void lock() {
    while (flag_.exchange(true, std::memory_order_acquire))
      while (flag_.load(std::memory_order_relaxed)) {
      }
  }
  void unlock() { flag_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> flag_{false};
};

size_t round_size(size_t n) {
  if (n <= kAlign) return kAlign;
  if (n <= kSmallLimit) return size_t{1} << (64 - __builtin_clzll(n - 1));
  return (n + kLargeGranule - 1) / kLargeGranule * kLargeGranule;
}

class CpuCachingAllocator final : public Allocator {
 public:
  DataPtr allocate(size_t nbytes) override {
    size_t size = round_size(nbytes);
    void* p = nullptr;
    size_t in_use = 0;
    {
      std::lock_guard<SpinLock> g(mu_);
      ++stats_.num_allocs;
      auto& list = free_list(size);
      if (!list.empty()) {
        p = list.back();
        list.pop_back();
        stats_.cached_bytes -= size;
        ++stats_.num_cache_hits;
      }
      stats_.in_use_bytes += size;
      if (stats_.in_use_bytes > stats_.peak_in_use_bytes)
        stats_.peak_in_use_bytes = stats_.in_use_bytes;
      in_use = stats_.in_use_bytes;
    }
    if (!p) {
      p = std::aligned_alloc(kAlign, size);
      if (!p) {
        empty_cache();
        p = std::aligned_alloc(kAlign, size);
      }
      if (!p) {
        std::lock_guard<SpinLock> g(mu_);
        stats_.in_use_bytes -= size;
        KILN_FAIL(Runtime, "CPU out of memory: failed to allocate ", nbytes, " bytes");
      }
    }
    // See Note [Profiler hook] in kiln/profiler.h (memory events).
    if (__builtin_expect(profiler::detail::recording_memory(), 0))
      profiler::detail::record_memory(p, static_cast<int64_t>(size), static_cast<int64_t>(in_use),
                                      Device(DeviceType::CPU));
    return DataPtr(p, reinterpret_cast<void*>(size), &CpuCachingAllocator::release,
                   Device(DeviceType::CPU));
  }

  AllocatorStats stats() const override {
    std::lock_guard<SpinLock> g(mu_);
    return stats_;
  }

  void reset_peak_stats() override {
    std::lock_guard<SpinLock> g(mu_);
    stats_.peak_in_use_bytes = stats_.in_use_bytes;
  }

  void empty_cache() override {
    std::lock_guard<SpinLock> g(mu_);
    auto drain = [&](size_t size, std::vector<void*>& list) {
      for (void* p : list) std::free(p);
      stats_.cached_bytes -= size * list.size();
      list.clear();
    };
    for (int c = 0; c < kNumSmallClasses; ++c) drain(size_t{1} << c, small_[c]);
    for (auto& [size, list] : large_) drain(size, list);
  }

  static CpuCachingAllocator& instance() {
    static auto* a = new CpuCachingAllocator();  // never destroyed: frees may run at exit
    return *a;
  }

 private:
  static void release(void* ctx, void* data) {
    auto size = reinterpret_cast<size_t>(ctx);
    CpuCachingAllocator& a = instance();
    if (__builtin_expect(profiler::detail::recording_memory(), 0)) {
      size_t in_use;
      {
        std::lock_guard<SpinLock> g(a.mu_);
        in_use = a.stats_.in_use_bytes - size;
      }
      profiler::detail::record_memory(data, -static_cast<int64_t>(size),
                                      static_cast<int64_t>(in_use), Device(DeviceType::CPU));
    }
    {
      std::lock_guard<SpinLock> g(a.mu_);
      a.stats_.in_use_bytes -= size;
      if (a.stats_.cached_bytes + size <= kMaxCachedBytes) {
        a.free_list(size).push_back(data);
        a.stats_.cached_bytes += size;
        return;
      }
    }
    std::free(data);
  }

  // Small classes are powers of two, indexed by log2; large ones are keyed by size.
  static constexpr int kNumSmallClasses = 21;  // up to 1 MiB
  std::vector<void*>& free_list(size_t size) {
    if (size <= kSmallLimit) return small_[63 - __builtin_clzll(size)];
    return large_[size];
  }
  mutable SpinLock mu_;
  std::vector<void*> small_[kNumSmallClasses];
  std::unordered_map<size_t, std::vector<void*>> large_;
  AllocatorStats stats_;
};

Allocator* g_allocators[kNumDeviceTypes] = {};

}  // namespace

Allocator* cpu_allocator() { return &CpuCachingAllocator::instance(); }

Allocator* get_allocator(DeviceType type) {
  if (type == DeviceType::CPU) return cpu_allocator();
  Allocator* a = g_allocators[static_cast<int>(type)];
  KILN_CHECK(a != nullptr, Runtime, "no allocator for device type '", device_type_name(type),
             "' (is this build without its backend, or is no device present?)");
  return a;
}

void set_allocator(DeviceType type, Allocator* allocator) {
  g_allocators[static_cast<int>(type)] = allocator;
}

}  // namespace kiln
