// The NCCL backend (Note [NCCL backend] in nccl.h). NCCL is loaded on the first nccl_init
// (Note [Loading NCCL lazily] in nccl_lib.h).
#include "nccl.h"

#include <nccl.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <numeric>
#include <sstream>
#include <thread>

#include "kiln/cuda/allocator.h"
#include "kiln/cuda/device.h"
#include "kiln/cuda/stream.h"
#include "kiln/error.h"
#include "nccl_lib.h"

namespace kiln::dist {
namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void nccl_fail(ncclResult_t r, const char* call, ncclComm_t comm) {
  const char* last = comm ? nccl_lib().GetLastError(comm) : nullptr;
  KILN_FAIL(Runtime, "NCCL ", call, " failed: ", nccl_lib().GetErrorString(r),
            last && *last ? std::string(" (") + last + ")" : std::string());
}
// Calls nccl<fn> args, raising with NCCL's error text when it fails.
#define KILN_NCCL_CHECK(fn, args, comm)                                               \
  do {                                                                                \
    ncclResult_t kiln_nccl_r_ = nccl_lib().fn args;                                   \
    if (kiln_nccl_r_ != ncclSuccess) nccl_fail(kiln_nccl_r_, "nccl" #fn #args, comm); \
  } while (0)

// The element type NCCL reduces (bool and int16 have none).
ncclDataType_t reduce_dtype(const char* op, ScalarType t) {
  switch (t) {
    case kInt8:
      return ncclInt8;
    case kUInt8:
      return ncclUint8;
    case kInt32:
      return ncclInt32;
    case kInt64:
      return ncclInt64;
    case kFloat16:
      return ncclFloat16;
    case kBFloat16:
      return ncclBfloat16;
    case kFloat32:
      return ncclFloat32;
    case kFloat64:
      return ncclFloat64;
    default:
      KILN_FAIL(Type, op, ": the NCCL backend cannot reduce ", t, " tensors");
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return ncclSum;
    case ReduceOp::Avg:
      return ncclAvg;
    case ReduceOp::Max:
      return ncclMax;
    case ReduceOp::Min:
      return ncclMin;
    case ReduceOp::Product:
      return ncclProd;
  }
  return ncclSum;
}

std::string hex(const ncclUniqueId& id) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (unsigned char c : id.internal) (s += digits[c >> 4]) += digits[c & 15];
  return s;
}

ncclUniqueId unhex(const std::string& s) {
  ncclUniqueId id;
  KILN_CHECK(s.size() == 2 * sizeof id.internal, Runtime,
             "NCCL: malformed ncclUniqueId in the store");
  auto v = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  for (size_t i = 0; i < sizeof id.internal; ++i)
    id.internal[i] = static_cast<char>(v(s[2 * i]) << 4 | v(s[2 * i + 1]));
  return id;
}

int pick_device() {
  const int n = cuda::device_count();
  KILN_CHECK(n > 0, Runtime,
             "init_process_group(backend=\"nccl\"): no CUDA device (cudaGetDeviceCount failed or "
             "found none); use backend \"ucx\" for CPU tensors");
  return local_rank() % n;
}

class Comm final : public NcclComm {
 public:
  Comm(ncclComm_t comm, int device, int rank, int size, std::string group, Milliseconds timeout)
      : comm_(comm),
        device_(device),
        rank_(rank),
        size_(size),
        group_(std::move(group)),
        timeout_(timeout) {
    cuda::DeviceGuard g(device_);
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    KILN_CUDA_CHECK(cudaMalloc(&barrier_buf_, sizeof(float)));
    watcher_ = std::thread([this] { watch(); });
  }

  // Waits (each within its timeout) for the collectives in flight, then frees everything. CUDA
  // errors are ignored here: at process exit the runtime may be gone already.
  ~Comm() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    watcher_.join();
    cuda::DeviceGuard g(device_);
    if (comm_) nccl_lib().CommDestroy(comm_);
    cudaFree(barrier_buf_);
    cudaStreamDestroy(stream_);
  }

  ncclComm_t comm() const { return comm_; }
  int device() const { return device_; }

  WorkPtr all_reduce(Tensor& t, ReduceOp op) override {
    check("all_reduce", t);
    const ncclDataType_t dt = reduce_dtype("all_reduce", t.dtype());
    return issue("all_reduce", {t}, [&] {
      return nccl_lib().AllReduce(t.data_ptr(), t.data_ptr(), t.numel(), dt, nccl_op(op), comm_,
                                  stream_);
    });
  }

  WorkPtr broadcast(Tensor& t, int src) override {
    check("broadcast", t);
    KILN_CHECK(src >= 0 && src < size_, Value, "broadcast: src ", src, " is not a rank of group '",
               group_, "' of size ", size_);
    return issue("broadcast", {t}, [&] {
      return nccl_lib().Broadcast(t.data_ptr(), t.data_ptr(), t.nbytes(), ncclUint8, src, comm_,
                                  stream_);
    });
  }

  WorkPtr all_gather_into_tensor(Tensor& out, const Tensor& in) override {
    check("all_gather_into_tensor", out);
    check("all_gather_into_tensor", in);
    KILN_CHECK(out.dtype() == in.dtype() && out.numel() == in.numel() * size_, Value,
               "all_gather_into_tensor: output ", out.dtype(), out.sizes(), " must hold ", size_,
               " copies of input ", in.dtype(), in.sizes());
    return issue("all_gather_into_tensor", {out, in}, [&] {
      return nccl_lib().AllGather(in.data_ptr(), out.data_ptr(), in.nbytes(), ncclUint8, comm_,
                                  stream_);
    });
  }

  WorkPtr reduce_scatter_tensor(Tensor& out, const Tensor& in, ReduceOp op) override {
    check("reduce_scatter_tensor", out);
    check("reduce_scatter_tensor", in);
    KILN_CHECK(out.dtype() == in.dtype() && in.numel() == out.numel() * size_, Value,
               "reduce_scatter_tensor: input ", in.dtype(), in.sizes(), " must hold ", size_,
               " blocks of output ", out.dtype(), out.sizes());
    const ncclDataType_t dt = reduce_dtype("reduce_scatter_tensor", in.dtype());
    return issue("reduce_scatter_tensor", {out, in}, [&] {
      return nccl_lib().ReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(), dt, nccl_op(op),
                                      comm_, stream_);
    });
  }

  WorkPtr all_to_all_single(Tensor& out, const Tensor& in, std::vector<int64_t> out_splits,
                            std::vector<int64_t> in_splits) override {
    const char* op = "all_to_all_single";
    check(op, out);
    check(op, in);
    KILN_CHECK(out.dtype() == in.dtype() && in.dim() >= 1 && out.dim() >= 1, Value, op,
               ": expected input and output of one dtype with at least one dim, got ", in.sizes(),
               " and ", out.sizes());
    // Byte offsets of the blocks along dim 0 (empty splits: equal blocks).
    auto blocks = [&](std::vector<int64_t>& s, const Tensor& t, const char* which) {
      if (s.empty()) {
        KILN_CHECK(t.size(0) % size_ == 0, Value, op, ": dim 0 of the ", which, " ", t.sizes(),
                   " must be divisible by the group size ", size_, " for equal splits");
        s.assign(size_, t.size(0) / size_);
      }
      KILN_CHECK(static_cast<int>(s.size()) == size_ &&
                     std::accumulate(s.begin(), s.end(), int64_t{0}) == t.size(0),
                 Value, op, ": expected ", size_, " ", which, " split sizes summing to dim 0 of ",
                 t.sizes(), ", got ", IntArrayRef(s));
      const size_t row = t.size(0) ? t.nbytes() / t.size(0) : 0;
      std::vector<size_t> off(size_ + 1, 0);
      for (int i = 0; i < size_; ++i) off[i + 1] = off[i] + s[i] * row;
      return off;
    };
    const std::vector<size_t> ioff = blocks(in_splits, in, "input");
    const std::vector<size_t> ooff = blocks(out_splits, out, "output");
    return issue(op, {out, in}, [&] {
      auto* src = static_cast<const char*>(in.data_ptr());
      auto* dst = static_cast<char*>(out.data_ptr());
      ncclResult_t r = nccl_lib().GroupStart();
      for (int p = 0; p < size_ && r == ncclSuccess; ++p) {
        r = nccl_lib().Send(src + ioff[p], ioff[p + 1] - ioff[p], ncclUint8, p, comm_, stream_);
        if (r == ncclSuccess)
          r = nccl_lib().Recv(dst + ooff[p], ooff[p + 1] - ooff[p], ncclUint8, p, comm_, stream_);
      }
      const ncclResult_t end = nccl_lib().GroupEnd();
      return r == ncclSuccess ? end : r;
    });
  }

  WorkPtr send(const Tensor& t, int dst) override {
    check("send", t);
    KILN_CHECK(dst >= 0 && dst < size_ && dst != rank_, Value, "send: dst ", dst,
               " must be another rank of group '", group_, "' of size ", size_);
    return issue("send", {t}, [&] {
      return nccl_lib().Send(t.data_ptr(), t.nbytes(), ncclUint8, dst, comm_, stream_);
    });
  }

  WorkPtr recv(Tensor& t, int src) override {
    check("recv", t);
    KILN_CHECK(src >= 0 && src < size_ && src != rank_, Value, "recv: src ", src,
               " must be another rank of group '", group_, "' of size ", size_);
    return issue("recv", {t}, [&] {
      return nccl_lib().Recv(t.data_ptr(), t.nbytes(), ncclUint8, src, comm_, stream_);
    });
  }

  // An all_reduce of one float on the group's device (as PyTorch's NCCL barrier).
  WorkPtr barrier() override {
    return issue("barrier", {}, [&] {
      return nccl_lib().AllReduce(barrier_buf_, barrier_buf_, 1, ncclFloat32, ncclSum, comm_,
                                  stream_);
    });
  }

 private:
  struct Pending {
    cudaEvent_t done;
    WorkPtr work;
    Clock::time_point deadline;
    std::string what;
  };

  void check(const char* op, const Tensor& t) const {
    KILN_CHECK(t.defined(), Value, op, ": expected a tensor, got an undefined one");
    KILN_CHECK(t.device().is_cuda() && t.device().index() == device_, Value, op,
               ": the NCCL backend of group '", group_, "' takes tensors on cuda:", device_,
               ", got one on ", t.device());
    KILN_CHECK(t.is_contiguous(), Value, op, ": expected a contiguous tensor, got shape ",
               t.sizes(), " strides ", t.strides());
    (void)t.impl()->storage()->data();  // deferred ops first (Note [Storage access hook])
  }

  // Enqueues `call` on the group's stream after the device's current stream, and hands its
  // completion to the watcher.
  template <typename Call>
  WorkPtr issue(const char* op, std::vector<Tensor> tensors, Call call) {
    std::lock_guard<std::mutex> lock(mu_);
    std::ostringstream what;
    what << op << " #" << ++seq_ << " on group '" << group_ << "' (rank " << rank_ << " of "
         << size_ << ", NCCL)";
    if (std::string_view(op) != "send" &&
        std::string_view(op) != "recv") {  // Note [Collective observer]
      std::ostringstream shape;
      if (!tensors.empty()) shape << tensors.back().dtype() << tensors.back().sizes();
      detail::observe_collective({group_, rank_, size_, seq_, op, shape.str()});
    }
    auto work = std::make_shared<Work>(what.str());
    if (!comm_) {
      work->finish(std::make_exception_ptr(Error(
          ErrorKind::Runtime, what.str() + ": the communicator was aborted: " + abort_reason_)));
      return work;
    }
    cuda::DeviceGuard g(device_);
    cuda::Event ready;
    ready.record(cuda::getCurrentStream(device_));
    ready.wait(cuda::Stream(stream_, device_));
    if (const ncclResult_t r = call(); r != ncclSuccess) nccl_fail(r, op, comm_);
    for (const Tensor& t : tensors) cuda::record_stream(t, cuda::Stream(stream_, device_));
    cudaEvent_t done;
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    KILN_CUDA_CHECK(cudaEventRecord(done, stream_));
    pending_.push_back({done, work, Clock::now() + timeout_, what.str()});
    cv_.notify_all();
    return work;
  }

  // The watcher thread: finishes Works as their events complete (in stream order), and aborts
  // the communicator on a timeout or an asynchronous NCCL error.
  void watch() {
    cudaSetDevice(device_);
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (pending_.empty()) {
        if (stop_) return;
        cv_.wait(lock, [&] { return stop_ || !pending_.empty(); });
        continue;
      }
      Pending& p = pending_.front();
      const cudaError_t e = cudaEventQuery(p.done);
      if (e == cudaSuccess) {
        finish_front(nullptr);
        continue;
      }
      cudaGetLastError();  // clear the sticky error
      ncclResult_t async = ncclSuccess;
      nccl_lib().CommGetAsyncError(comm_, &async);
      if (e != cudaErrorNotReady) {
        abort(p.what + " failed: " + cudaGetErrorString(e));
      } else if (async != ncclSuccess && async != ncclInProgress) {
        abort(p.what + " failed: " + nccl_lib().GetErrorString(async));
      } else if (Clock::now() > p.deadline) {
        abort(p.what + " timed out after " + std::to_string(timeout_.count()) +
              " ms (a dead, stuck or desynchronised peer)");
      } else {
        cv_.wait_for(lock, std::chrono::microseconds(50));
      }
    }
  }

  void finish_front(std::exception_ptr error) {
    Pending p = std::move(pending_.front());
    pending_.pop_front();
    cudaEventDestroy(p.done);
    p.work->finish(std::move(error));
  }

  // With mu_ held: ncclCommAbort, then every Work in flight fails with `reason`.
  void abort(const std::string& reason) {
    abort_reason_ = reason + "; the NCCL communicator was aborted (ncclCommAbort)";
    nccl_lib().CommAbort(comm_);
    comm_ = nullptr;
    while (!pending_.empty())
      finish_front(std::make_exception_ptr(
          Error(ErrorKind::Runtime, pending_.front().what + ": " + abort_reason_)));
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  bool stop_ = false;
  std::string abort_reason_;
  ncclComm_t comm_;
  int device_, rank_, size_;
  std::string group_;
  Milliseconds timeout_;
  cudaStream_t stream_ = nullptr;
  void* barrier_buf_ = nullptr;
  uint64_t seq_ = 0;
  std::thread watcher_;
};

}  // namespace

std::shared_ptr<NcclComm> nccl_init(TCPStore* store, const std::string& key, int rank, int world,
                                    const std::string& group, Milliseconds timeout) {
  const int device = pick_device();
  ncclUniqueId id;
  if (rank == 0) {
    KILN_NCCL_CHECK(GetUniqueId, (&id), nullptr);
    if (store) store->set(key, hex(id));
  } else {
    KILN_CHECK(store, Value,
               "init_process_group(backend=\"nccl\"): a store is needed for world_size ", world);
    id = unhex(store->get(key));
  }
  cuda::DeviceGuard g(device);
  ncclComm_t comm = nullptr;
  KILN_NCCL_CHECK(CommInitRank, (&comm, world, id, rank), nullptr);
  return std::make_shared<Comm>(comm, device, rank, world, group, timeout);
}

std::shared_ptr<NcclComm> nccl_split(NcclComm& parent, bool member, int rank,
                                     const std::string& group, Milliseconds timeout) {
  auto& p = static_cast<Comm&>(parent);
  KILN_CHECK(p.comm(), Runtime, "new_group: the NCCL communicator of the parent group was aborted");
  cuda::DeviceGuard g(p.device());
  ncclComm_t comm = nullptr;
  KILN_NCCL_CHECK(CommSplit, (p.comm(), member ? 0 : NCCL_SPLIT_NOCOLOR, rank, &comm, nullptr),
                  p.comm());
  if (!member) return nullptr;
  int size = 0;
  KILN_NCCL_CHECK(CommCount, (comm, &size), comm);
  return std::make_shared<Comm>(comm, p.device(), rank, size, group, timeout);
}

}  // namespace kiln::dist
