// The NCCL backend of ProcessGroup (init_process_group with backend "nccl"); built only where
// CUDA and NCCL are (KILN_HAVE_NCCL).
//
// Note [NCCL backend]: one communicator per group, on the device LOCAL_RANK % device_count, with
// its own non-blocking CUDA stream. A collective first makes that stream wait for the current
// stream of the device (so it sees the caller's pending writes), enqueues the NCCL call, marks
// its tensors as used on the group's stream (allocator.h, Note [Stream-ordered reuse]) and records
// a cudaEvent. A watcher thread per group polls the events and finishes each Work when its event
// completes, so Work::wait blocks the host until the result is in device memory. When an event
// misses the group's timeout, or NCCL reports an asynchronous error, the communicator is aborted
// (ncclCommAbort): that Work and every later one fail with kiln::Error (Runtime). Tensors must be
// contiguous CUDA tensors on the group's device. NCCL has no tags: send/recv pair in issue order.
//
// Only world size 1 is run here (one GPU cannot host two NCCL ranks), so multi-rank NCCL is
// compiled and linked but unverified.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/dist/process_group.h"

namespace kiln::dist {

// A group's NCCL communicator (the ProcessGroup methods of the same names forward to it).
class NcclComm {
 public:
  virtual ~NcclComm() = default;
  virtual WorkPtr all_reduce(Tensor& tensor, ReduceOp op) = 0;
  virtual WorkPtr broadcast(Tensor& tensor, int src) = 0;
  virtual WorkPtr all_gather_into_tensor(Tensor& output, const Tensor& input) = 0;
  virtual WorkPtr reduce_scatter_tensor(Tensor& output, const Tensor& input, ReduceOp op) = 0;
  virtual WorkPtr all_to_all_single(Tensor& output, const Tensor& input,
                                    std::vector<int64_t> output_split_sizes,
                                    std::vector<int64_t> input_split_sizes) = 0;
  virtual WorkPtr send(const Tensor& tensor, int dst) = 0;
  virtual WorkPtr recv(Tensor& tensor, int src) = 0;
  virtual WorkPtr barrier() = 0;
};

// Creates the communicator of rank `rank` in a world of `world`: rank 0 puts the ncclUniqueId
// under `key` in `store` (null when world == 1), the others read it. Runtime error "no CUDA
// device" without a GPU.
std::shared_ptr<NcclComm> nccl_init(TCPStore* store, const std::string& key, int rank, int world,
                                    const std::string& group, Milliseconds timeout);
// ncclCommSplit of `parent` (every member of the parent calls it, in the same order); null on
// non-members. `rank` orders the members.
std::shared_ptr<NcclComm> nccl_split(NcclComm& parent, bool member, int rank,
                                     const std::string& group, Milliseconds timeout);

}  // namespace kiln::dist
