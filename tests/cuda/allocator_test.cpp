// The CUDA caching allocator, checked calls and the no-device path (kernels/cuda).
#include "kiln/cuda/allocator.h"

#include <atomic>
#include <chrono>
#include <thread>

#include "cuda/gpu_util.h"
#include "cuda/harness.h"
#include "kiln/cuda/device.h"
#include "kiln/cuda/pinned.h"
#include "kiln/profiler.h"

using namespace kiln;
using namespace kiln::gputest;

namespace {

// A host function that holds a stream until `flag` is set (or 5 s pass, so nothing can hang).
void CUDART_CB hold_stream(void* arg) {
  auto* flag = static_cast<std::atomic<bool>*>(arg);
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!flag->load() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::microseconds(100));
}

DataPtr alloc_on(const cuda::Stream& s, size_t n) {
  cuda::StreamGuard g(s);
  return cuda::cuda_allocator()->allocate(n);
}

}  // namespace

GPU_TEST(CudaCheck, ErrorNamesCallAndCudaMessage) {
  // Needs no device: the macro only formats the error.
  try {
    KILN_CUDA_CHECK(cudaErrorInvalidValue);
    EXPECT_TRUE(false);
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::Runtime);
    EXPECT_TRUE(m.find("cudaErrorInvalidValue") != std::string::npos);
    EXPECT_TRUE(m.find(cudaGetErrorString(cudaErrorInvalidValue)) != std::string::npos);
  }
}

GPU_TEST(NoDevice, NothingRegisteredAndClearErrors) {
  if (gpu_available()) throw Skip{"a CUDA device is present"};
  EXPECT_EQ(cuda::device_count(), 0);
  EXPECT_TRUE(cuda::cuda_allocator() == nullptr);
  EXPECT_TRUE(cuda::pinned_allocator() == nullptr);
  EXPECT_ERROR(ErrorKind::Runtime, "needs a CUDA device", { cuda::pinned_empty({4}); });
  EXPECT_ERROR(ErrorKind::Runtime, "no allocator for device type 'cuda'",
               { kiln::empty({4}, kFloat32, Device("cuda")); });
  EXPECT_ERROR(ErrorKind::Runtime, "no allocator for device type 'cuda'",
               { kiln::ones({3}, std::nullopt, Device("cuda")); });
}

GPU_TEST(Allocator, SmallBlocksRoundAndReuse) {
  REQUIRE_GPU();
  cuda::empty_cache();
  cuda::reset_peak_stats();
  AllocatorStats s0 = cuda::device_stats(0);
  void* first = nullptr;
  {
    DataPtr p = cuda::cuda_allocator()->allocate(1000);  // -> 1024 bytes
    first = p.get();
    AllocatorStats s = cuda::device_stats(0);
    EXPECT_EQ(s.in_use_bytes - s0.in_use_bytes, size_t{1024});
    EXPECT_EQ(s.num_allocs - s0.num_allocs, size_t{1});
  }
  AllocatorStats s1 = cuda::device_stats(0);
  EXPECT_EQ(s1.in_use_bytes, s0.in_use_bytes);
  EXPECT_EQ(s1.cached_bytes - s0.cached_bytes, size_t{1024});
  DataPtr q = cuda::cuda_allocator()->allocate(1024);  // same class: the cached block
  EXPECT_EQ(q.get(), first);
  AllocatorStats s2 = cuda::device_stats(0);
  EXPECT_EQ(s2.num_cache_hits - s1.num_cache_hits, size_t{1});
  EXPECT_EQ(s2.cached_bytes, s0.cached_bytes);
  DataPtr r = cuda::cuda_allocator()->allocate(1025);  // a different class: a new block
  EXPECT_NE(r.get(), first);
  EXPECT_EQ(cuda::device_stats(0).peak_in_use_bytes - s0.in_use_bytes, size_t{1024 + 1536});
}

// The profiler's memory events come from the CUDA allocator too, on the device's timeline
// (Note [Profiler hook] in kiln/profiler.h).
GPU_TEST(Allocator, ProfilerSeesAllocationsAndFrees) {
  REQUIRE_GPU();
  profiler::ProfilerOptions o;
  o.profile_memory = true;
  profiler::Profile prof(o);
  prof.start();
  void* p = nullptr;
  {
    DataPtr d = cuda::cuda_allocator()->allocate(3000);  // -> 3072 bytes
    p = d.get();
  }
  prof.stop();
  int allocs = 0, frees = 0;
  for (const profiler::MemoryEvent& m : prof.trace().memory_events()) {
    if (m.addr != reinterpret_cast<uint64_t>(p)) continue;
    EXPECT_EQ(m.device, Device(DeviceType::CUDA, 0));
    allocs += m.bytes == 3072;
    frees += m.bytes == -3072;
  }
  EXPECT_EQ(allocs, 1);
  EXPECT_EQ(frees, 1);
}

GPU_TEST(Allocator, LargeBlocksUseTwoMiBGranules) {
  REQUIRE_GPU();
  cuda::empty_cache();  // no cached block of the sizes below from earlier tests
  size_t before = cuda::device_stats(0).in_use_bytes;
  void* first = nullptr;
  {
    DataPtr p = cuda::cuda_allocator()->allocate(3 << 20);  // -> 4 MiB
    first = p.get();
    EXPECT_EQ(cuda::device_stats(0).in_use_bytes - before, size_t{4} << 20);
  }
  DataPtr q = cuda::cuda_allocator()->allocate((3 << 20) + 5);  // best fit: the 4 MiB block
  EXPECT_EQ(q.get(), first);
  DataPtr big = cuda::cuda_allocator()->allocate(size_t{9} << 20);  // 10 MiB: not the 4 MiB one
  EXPECT_NE(big.get(), first);
}

GPU_TEST(Allocator, EmptyCacheReleasesFreeBlocks) {
  REQUIRE_GPU();
  { Tensor t = kiln::empty({1 << 20}, kFloat32, Device("cuda")); }
  EXPECT_TRUE(cuda::device_stats(0).cached_bytes > 0);
  cuda::empty_cache();
  EXPECT_EQ(cuda::device_stats(0).cached_bytes, size_t{0});
  AllocatorStats total = get_allocator(DeviceType::CUDA)->stats();
  EXPECT_EQ(total.cached_bytes, size_t{0});
}

GPU_TEST(Allocator, BlocksAreReusedOnlyOnTheirStream) {
  REQUIRE_GPU();
  cuda::empty_cache();  // no cached block of the sizes below from earlier tests
  cuda::Stream a = cuda::getStreamFromPool(0), b = cuda::getStreamFromPool(0);
  ASSERT_TRUE(a != b);
  void* pa = nullptr;
  { pa = alloc_on(a, 4096).get(); }
  DataPtr on_b = alloc_on(b, 4096);
  EXPECT_NE(on_b.get(), pa);  // freed on a: never handed to b
  DataPtr on_a = alloc_on(a, 4096);
  EXPECT_EQ(on_a.get(), pa);  // but a reuses it at once (stream order makes that safe)
}

GPU_TEST(Allocator, RecordStreamDefersReuseUntilTheEventCompletes) {
  REQUIRE_GPU();
  cuda::empty_cache();  // no cached block of the sizes below from earlier tests
  cuda::Stream a = cuda::getStreamFromPool(0), side = cuda::getStreamFromPool(0);
  std::atomic<bool> release{false};
  KILN_CUDA_CHECK(cudaLaunchHostFunc(side, hold_stream, &release));  // side is busy
  void* pa = nullptr;
  {
    DataPtr p = alloc_on(a, 8192);
    pa = p.get();
    cuda::record_stream(p, side);  // p is also in use on side
  }  // freed: an event is recorded on side, which has not reached it yet
  DataPtr while_busy = alloc_on(a, 8192);
  EXPECT_NE(while_busy.get(), pa);
  release = true;
  side.synchronize();
  DataPtr after = alloc_on(a, 8192);
  EXPECT_EQ(after.get(), pa);
}

GPU_TEST(Allocator, RecordStreamOnTensorViews) {
  REQUIRE_GPU();
  cuda::empty_cache();  // no cached block of the sizes below from earlier tests
  cuda::Stream side = cuda::getStreamFromPool(0);
  std::atomic<bool> release{false};
  KILN_CUDA_CHECK(cudaLaunchHostFunc(side, hold_stream, &release));
  void* base = nullptr;
  {
    Tensor t = kiln::empty({4096}, kFloat32, Device("cuda"));
    base = t.data_ptr();
    cuda::record_stream(t.slice(0, 100, 200), side);  // a pointer inside the block
  }
  Tensor u = kiln::empty({4096}, kFloat32, Device("cuda"));
  EXPECT_NE(u.data_ptr(), base);
  release = true;
  side.synchronize();
}

GPU_TEST(Allocator, OutOfMemoryIsAKilnError) {
  REQUIRE_GPU();
  EXPECT_ERROR(ErrorKind::Runtime, "CUDA out of memory: tried to allocate 1125899906842624 bytes",
               { kiln::empty({int64_t{1} << 50}, kUInt8, Device("cuda")); });
  Tensor ok = kiln::empty({16}, kFloat32, Device("cuda"));  // the allocator still works
  ok.fill_(2);
  EXPECT_EQ(values(ok)[15], 2.0);
}

GPU_TEST(Allocator, DeviceGuardRestores) {
  REQUIRE_GPU();
  int before = cuda::current_device();
  {
    cuda::DeviceGuard g(0);
    EXPECT_EQ(cuda::current_device(), 0);
  }
  EXPECT_EQ(cuda::current_device(), before);
  EXPECT_ERROR(ErrorKind::Value, "out of range", { cuda::DeviceGuard g(cuda::kMaxDevices + 1); });
}
