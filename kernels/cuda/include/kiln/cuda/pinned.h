// kiln/cuda/pinned.h: page-locked (pinned) host memory for fast and asynchronous copies.
//
//   kiln::Tensor h = kiln::cuda::pinned_empty({1024}, kiln::kFloat32);   // a CPU tensor
//   kiln::Tensor d = kiln::empty({1024}, std::nullopt, kiln::Device("cuda"));
//   d.copy_(h, /*non_blocking=*/true);          // async H2D on the current stream
//   h.copy_(d, /*non_blocking=*/true);          // async D2H: synchronize before reading h
//
// Note [Pinned host cache]: cudaHostAlloc/cudaFreeHost are slow and synchronizing, so freed
// pinned blocks (power-of-two sizes) are cached. A block used by an asynchronous copy is marked
// with record_host_use(ptr, stream); when freed, it is reused only after an event recorded on
// each such stream has completed, so a pending copy never reads or writes recycled memory.
#pragma once

#include "kiln/allocator.h"
#include "kiln/cuda/stream.h"
#include "kiln/tensor.h"

namespace kiln::cuda {

// The pinned host allocator (DataPtrs on kCPU), or nullptr when no device is present.
Allocator* pinned_allocator();
// A contiguous CPU tensor in pinned memory. RuntimeError when no device is present.
Tensor pinned_empty(IntArrayRef sizes, ScalarType dtype = kFloat32);
// True when `ptr` is page-locked host memory known to CUDA (this allocator or cudaHostRegister).
bool is_pinned(const void* ptr);
bool is_pinned(const Tensor& t);
// Marks pinned memory at `ptr` (any pointer into a block) as used by work on `stream`.
void record_host_use(const void* ptr, const Stream& stream);
void empty_pinned_cache();

}  // namespace kiln::cuda
