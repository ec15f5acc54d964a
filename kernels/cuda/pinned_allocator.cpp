// The caching pinned host allocator (kiln/cuda/pinned.h, Note [Pinned host cache]).
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kiln/cuda/device.h"
#include "kiln/cuda/pinned.h"

namespace kiln::cuda {
namespace {

size_t round_pow2(size_t n) {
  if (n <= 512) return 512;
  return size_t{1} << (64 - __builtin_clzll(n - 1));
}

struct HostBlock {
  void* ptr;
  size_t size;
  bool allocated = false;
  int pending_events = 0;
  std::unordered_set<cudaStream_t> streams;  // streams with async work on this block
  std::unordered_map<cudaStream_t, int> stream_device;
};

class PinnedAllocator final : public Allocator {
 public:
  DataPtr allocate(size_t nbytes) override {
    size_t size = round_pow2(nbytes);
    std::lock_guard<std::mutex> g(mu_);
    ++stats_.num_allocs;
    process_events();
    HostBlock* b = nullptr;
    auto& list = free_[size];
    if (!list.empty()) {
      b = list.back();
      list.pop_back();
      stats_.cached_bytes -= size;
      ++stats_.num_cache_hits;
    } else {
      void* p = nullptr;
      cudaError_t err = cudaHostAlloc(&p, size, cudaHostAllocDefault);
      if (err == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        release_cached();
        err = cudaHostAlloc(&p, size, cudaHostAllocDefault);
      }
      if (err == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        KILN_FAIL(Runtime, "pinned host out of memory: tried to allocate ", nbytes, " bytes");
      }
      KILN_CUDA_CHECK(err);
      auto owned = std::make_unique<HostBlock>(HostBlock{p, size});
      b = owned.get();
      blocks_.emplace(p, std::move(owned));
    }
    b->allocated = true;
    stats_.in_use_bytes += size;
    stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
    return DataPtr(b->ptr, this, &PinnedAllocator::release, Device(DeviceType::CPU));
  }

  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> g(mu_);
    return stats_;
  }

  void reset_peak_stats() override {
    std::lock_guard<std::mutex> g(mu_);
    stats_.peak_in_use_bytes = stats_.in_use_bytes;
  }

  void empty_cache() override {
    std::lock_guard<std::mutex> g(mu_);
    release_cached();
  }

  void record_use(const void* ptr, const Stream& stream) {
    std::lock_guard<std::mutex> g(mu_);
    HostBlock* b = find_containing(ptr);
    if (!b || !b->allocated) return;
    b->streams.insert(stream.stream());
    b->stream_device[stream.stream()] = stream.device_index();
  }

  bool owns(const void* ptr) {
    std::lock_guard<std::mutex> g(mu_);
    return find_containing(ptr) != nullptr;
  }

  static PinnedAllocator* instance() {
    static PinnedAllocator* a = device_count() > 0 ? new PinnedAllocator() : nullptr;
    return a;
  }

 private:
  static void release(void* ctx, void* data) {
    auto* a = static_cast<PinnedAllocator*>(ctx);
    std::lock_guard<std::mutex> g(a->mu_);
    HostBlock* b = a->blocks_.at(data).get();
    b->allocated = false;
    a->stats_.in_use_bytes -= b->size;
    a->stats_.cached_bytes += b->size;
    if (b->streams.empty()) {
      a->free_[b->size].push_back(b);
      return;
    }
    for (cudaStream_t s : b->streams) {
      DeviceGuard dg(b->stream_device[s]);
      cudaEvent_t e;
      KILN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      KILN_CUDA_CHECK(cudaEventRecord(e, s));
      a->pending_.push_back({e, b});
      ++b->pending_events;
    }
    b->streams.clear();
    b->stream_device.clear();
  }

  HostBlock* find_containing(const void* ptr) {
    auto it = blocks_.upper_bound(const_cast<void*>(ptr));
    if (it == blocks_.begin()) return nullptr;
    --it;
    HostBlock* b = it->second.get();
    return static_cast<const char*>(ptr) < static_cast<const char*>(b->ptr) + b->size ? b : nullptr;
  }

  // Returns blocks whose pending events have all completed to the free set.
  void process_events() {
    drain_completed_events(pending_, [this](const auto& pe) { finish(pe); });
  }

  void finish(const std::pair<cudaEvent_t, HostBlock*>& pe) {
    cudaEventDestroy(pe.first);
    HostBlock* b = pe.second;
    if (--b->pending_events == 0) free_[b->size].push_back(b);
  }

  void release_cached() {
    for (auto& pe : pending_) {
      KILN_CUDA_CHECK(cudaEventSynchronize(pe.first));
      finish(pe);
    }
    pending_.clear();
    for (auto& [size, list] : free_) {
      for (HostBlock* b : list) {
        cudaFreeHost(b->ptr);
        stats_.cached_bytes -= size;
        blocks_.erase(b->ptr);
      }
      list.clear();
    }
  }

  mutable std::mutex mu_;
  std::map<void*, std::unique_ptr<HostBlock>> blocks_;
  std::unordered_map<size_t, std::vector<HostBlock*>> free_;
  std::deque<std::pair<cudaEvent_t, HostBlock*>> pending_;
  AllocatorStats stats_;
};

}  // namespace

Allocator* pinned_allocator() { return PinnedAllocator::instance(); }

Tensor pinned_empty(IntArrayRef sizes, ScalarType dtype) {
  PinnedAllocator* a = PinnedAllocator::instance();
  KILN_CHECK(a != nullptr, Runtime,
             "pinned_empty: pinned memory needs a CUDA device, and none is present");
  size_t nbytes = static_cast<size_t>(numel_of(sizes)) * element_size(dtype);
  DataPtr p = nbytes ? a->allocate(nbytes) : DataPtr();
  auto storage = Storage::wrap(std::move(p), nbytes);
  return Tensor(TensorImpl::make(std::move(storage), dtype, sizes));
}

bool is_pinned(const void* ptr) {
  if (!ptr || device_count() == 0) return false;
  if (PinnedAllocator* a = PinnedAllocator::instance(); a && a->owns(ptr)) return true;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeHost;
}

bool is_pinned(const Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.numel() > 0 && is_pinned(t.impl()->raw_data());
}

void record_host_use(const void* ptr, const Stream& stream) {
  if (PinnedAllocator* a = PinnedAllocator::instance()) a->record_use(ptr, stream);
}

void empty_pinned_cache() {
  if (PinnedAllocator* a = PinnedAllocator::instance()) a->empty_cache();
}

}  // namespace kiln::cuda
