// kiln/cuda/allocator.h: the stream-aware caching device allocator behind CUDA tensors.
//
//   kiln::Tensor x = kiln::empty({1 << 20}, std::nullopt, kiln::Device("cuda"));   // cached block
//   kiln::cuda::record_stream(x, side_stream);    // x is also used on side_stream
//   kiln::cuda::device_stats(0).in_use_bytes;     // per device; get_allocator(CUDA)->stats() sums
//   kiln::cuda::empty_cache();                    // returns cached blocks to the driver
//
// Note [CUDA caching allocator]: cudaMalloc and cudaFree synchronize the device, so freed blocks
// are cached per device and reused. Requests of at most 1 MiB round up to 512 B ("small"),
// larger ones to 2 MiB granules ("large"). A small request reuses a free block of exactly its
// size, a large one the best fit up to twice its size. On cudaMalloc failure the allocator frees
// every cached block and retries once, then raises kiln::Error (Runtime) "CUDA out of memory".
//
// Note [Stream-ordered reuse]: a block belongs to the stream that was current when it was
// allocated, and is reused only by requests on that stream, where kernel order makes reuse
// safe. If the block was also used on other streams (record_stream), freeing it records an
// event on each of those streams, and the block returns to the cache only once all of these
// events have completed. This is PyTorch's CUDACachingAllocator contract, without splitting.
#pragma once

#include "kiln/allocator.h"
#include "kiln/cuda/stream.h"

namespace kiln {
class Tensor;
}

namespace kiln::cuda {

// The process-wide CUDA allocator, or nullptr when no device is present (Note [No device]).
Allocator* cuda_allocator();

// Marks the memory of `ptr` (a block from this allocator, or any pointer into one) as used by
// `stream`. No-op for pointers the allocator does not own.
void record_stream(const DataPtr& ptr, const Stream& stream);
void record_stream(const void* ptr, const Stream& stream);
void record_stream(const Tensor& t, const Stream& stream);

// Stats of one device's pool (device < 0: the current device).
AllocatorStats device_stats(int device = -1);
// Resets peak_in_use_bytes to the current in_use_bytes (all devices).
void reset_peak_stats();
// Waits for pending frees and returns every cached block to the driver.
void empty_cache();

}  // namespace kiln::cuda
