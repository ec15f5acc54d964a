// The NCCL entry points the NCCL backend (nccl.cpp) calls, loaded from libnccl on first use
// rather than linked; built only where CUDA and NCCL are (KILN_HAVE_NCCL).
//
//   const NcclLib& nccl = nccl_lib();  // Runtime error naming the library if it cannot load
//   nccl.AllReduce(buf, buf, n, ncclFloat32, ncclSum, comm, stream);
//
// Note [Loading NCCL lazily]: `import kiln` must not bring Kiln's libnccl into the process.
// PyTorch's CUDA wheel ships its own libnccl.so.2, and the dynamic loader reuses a library already
// loaded under the same soname: with the system NCCL linked into libkiln_sharding, `import kiln`
// before `import torch` made torch fail to load (libtorch_cuda.so: undefined symbol
// ncclCommResume, a symbol the older system NCCL lacks). So nothing links libnccl: the first
// init_process_group(backend="nccl") dlopens it, RTLD_LOCAL (its symbols stay out of the global
// namespace), by soname first, so a process that already holds an NCCL (PyTorch's) shares it,
// then by the path CMake found. tests/python/test_pytorch_parity.py checks that importing kiln
// maps no libnccl.
#pragma once

#include <nccl.h>

namespace kiln::dist {

// clang-format off
#define KILN_NCCL_FUNCTIONS(X)                                                         \
  X(GetLastError) X(GetErrorString) X(GetUniqueId) X(CommInitRank) X(CommSplit)        \
  X(CommCount) X(CommDestroy) X(CommAbort) X(CommGetAsyncError) X(AllReduce)           \
  X(Broadcast) X(AllGather) X(ReduceScatter) X(Send) X(Recv) X(GroupStart) X(GroupEnd)
// clang-format on

// One pointer per NCCL function, named without the "nccl" prefix.
struct NcclLib {
#define KILN_NCCL_MEMBER(name) decltype(&nccl##name) name = nullptr;
  KILN_NCCL_FUNCTIONS(KILN_NCCL_MEMBER)
#undef KILN_NCCL_MEMBER
};

// Loads libnccl once (thread-safe); every later call returns the same table.
const NcclLib& nccl_lib();

}  // namespace kiln::dist
