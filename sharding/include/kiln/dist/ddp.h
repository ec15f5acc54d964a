// kiln/dist/ddp.h: DistributedDataParallel (PyTorch's torch.nn.parallel.DistributedDataParallel):
// every rank holds a replica of the model, trains on its own share of the batch, and backward
// averages the gradients across ranks, so every replica takes the same optimizer step.
//
//   kiln::dist::init_process_group();                    // env:// (kiln run --nproc N ...)
//   auto ddp = std::make_shared<kiln::dist::DistributedDataParallel>(model);
//   kiln::optim::AdamW opt(ddp->parameters(), {});
//   Tensor loss = cross_entropy(ddp->forward(x), y);     // x: this rank's share of the batch
//   loss.backward();                                     // .grad: the mean over the ranks
//   opt.step();
//   { auto guard = ddp->no_sync(); ddp->forward(x2).sum().backward(); }  // accumulate locally
//
// Note [DDP buckets]: the construction broadcasts rank 0's parameters and buffers to every rank.
// The parameters that require grad are then grouped, in reverse registration order (roughly the
// order backward produces their gradients), into buckets of about bucket_cap_mb of one dtype
// (the first one 1 MB at most, as in PyTorch, so that communication starts early), each with a
// flat buffer. A post-accumulate-grad hook on every parameter copies its gradient
// into its bucket; when a bucket is full it starts an asynchronous all-reduce (average) of the
// buffer, so communication overlaps the rest of backward. Buckets start strictly in bucket order
// (a full bucket waits for the ones before it), so every rank issues the same collectives in the
// same order. A callback queued on the engine (autograd::queue_callback) runs when backward ends:
// it waits for the all-reduces and copies the averages back into the parameters' .grad, so
// opt.step() right after backward() sees the reduced gradients.
//
// Unused parameters: a parameter that gets no gradient in a backward would leave its bucket
// unfinished. By default that is a RuntimeError at the end of backward naming the parameters
// (PyTorch raises the same at the next forward); with find_unused_parameters the end-of-backward
// callback contributes zeros for them instead (their buckets then start only at that point) and
// they receive the average of the other ranks' gradients.
//
// no_sync(): while the guard lives, backward only accumulates into .grad; the first backward
// after it all-reduces the accumulated gradients.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/autograd/node.h"
#include "kiln/dist/process_group.h"
#include "kiln/nn/module.h"

namespace kiln::dist {

// Broadcasts `tensors` (contiguous CPU tensors, in place) from group rank `src`, one at a time.
void broadcast_tensors(ProcessGroup& pg, const std::vector<Tensor>& tensors, int src = 0);

// The gradient side of DDP (PyTorch's Reducer; Note [DDP buckets]): hooks on `params`, buckets,
// all-reduces, the end-of-backward wait. The Python DistributedDataParallel uses it directly.
class Reducer {
 public:
  // `params`: (name, parameter) in registration order; those not requiring grad are skipped.
  Reducer(const std::vector<std::pair<std::string, Tensor>>& params, ProcessGroupPtr pg,
          double bucket_cap_mb = 25, bool find_unused_parameters = false);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Whether backward synchronises (false inside no_sync()).
  bool sync() const { return sync_; }
  void set_sync(bool on) { sync_ = on; }
  // The buckets as lists of parameter names, in all-reduce order.
  std::vector<std::vector<std::string>> bucket_parameter_names() const;
  // Called by every forward: drops what a backward that failed midway left behind (it never
  // reached the end-of-backward callback), after waiting for its all-reduces.
  void prepare_for_forward() {
    if (callback_queued_) reset_backward_state();
  }

 private:
  struct Param {
    std::string name;
    Tensor tensor;
    size_t bucket;
    int64_t offset;  // in the bucket's flat buffer
    bool ready = false;
  };
  struct Bucket {
    std::vector<size_t> params;  // indices into params_
    Tensor flat;
    size_t pending = 0;
    WorkPtr work;
  };

  void build_buckets(double cap_mb);
  void on_grad_ready(size_t param);
  void mark_ready(size_t param, const Tensor& grad);
  void launch_ready_buckets();
  void finish_backward();
  void reset_backward_state();

  ProcessGroupPtr pg_;
  bool find_unused_;
  bool sync_ = true;
  bool callback_queued_ = false;
  size_t next_bucket_ = 0;  // the first bucket not yet started
  std::vector<Param> params_;
  std::vector<Bucket> buckets_;
  std::vector<autograd::RemovableHandle> hooks_;
};

struct DDPOptions {
  ProcessGroupPtr process_group;  // default: default_group()
  double bucket_cap_mb = 25;
  bool find_unused_parameters = false;
  // Broadcast rank 0's buffers (BatchNorm statistics) before every forward.
  bool broadcast_buffers = true;
};

class DistributedDataParallel : public nn::Module {
 public:
  // `module`'s parameters and buffers must be contiguous CPU tensors; it is registered as child
  // "module", so state-dict keys gain a "module." prefix (as in PyTorch).
  explicit DistributedDataParallel(nn::ModulePtr module, DDPOptions options = {});

  // Broadcasts buffers (broadcast_buffers) and runs the wrapped module.
  Tensor forward(const Tensor& input) override;
  const nn::ModulePtr& module() const { return module_; }
  const ProcessGroupPtr& process_group() const { return pg_; }

  // Disables gradient synchronisation while alive (Note [DDP buckets]).
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(Reducer& r) : reducer_(r), prev_(r.sync()) { r.set_sync(false); }
    ~NoSyncGuard() { reducer_.set_sync(prev_); }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    Reducer& reducer_;
    bool prev_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*reducer_); }
  bool require_backward_grad_sync() const { return reducer_->sync(); }
  // Bucket contents by parameter name (relative to the wrapped module), in all-reduce order.
  std::vector<std::vector<std::string>> bucket_parameter_names() const {
    return reducer_->bucket_parameter_names();
  }

 private:
  nn::ModulePtr module_;
  ProcessGroupPtr pg_;
  bool broadcast_buffers_;
  std::unique_ptr<Reducer> reducer_;
};

}  // namespace kiln::dist
