// Note [DDP buckets] in kiln/dist/ddp.h.
#include "kiln/dist/ddp.h"

#include <algorithm>
#include <sstream>

#include "kiln/autograd/engine.h"
#include "kiln/autograd/grad_mode.h"

namespace kiln::dist {

namespace {

// PyTorch's first bucket: small, so that the first all-reduce starts early in backward.
constexpr double kFirstBucketBytes = 1024 * 1024;

void check_local(const Tensor& t, const std::string& name) {
  KILN_CHECK(t.device() == kCPU && t.is_contiguous(), Value, "DistributedDataParallel: ", name,
             " must be a contiguous CPU tensor (got ", t.device(), ", strides ", t.strides(), ")");
}

}  // namespace

void broadcast_tensors(ProcessGroup& pg, const std::vector<Tensor>& tensors, int src) {
  if (pg.size() == 1) return;
  for (Tensor t : tensors) pg.broadcast(t, src)->wait();
}

Reducer::Reducer(const std::vector<std::pair<std::string, Tensor>>& params, ProcessGroupPtr pg,
                 double bucket_cap_mb, bool find_unused_parameters)
    : pg_(std::move(pg)), find_unused_(find_unused_parameters) {
  KILN_CHECK(pg_ != nullptr, Value, "DistributedDataParallel: process group is null");
  KILN_CHECK(bucket_cap_mb > 0, Value, "DistributedDataParallel: bucket_cap_mb must be > 0 (got ",
             bucket_cap_mb, ")");
  for (auto it = params.rbegin(); it != params.rend(); ++it) {
    if (!it->second.requires_grad()) continue;
    check_local(it->second, it->first);
    params_.push_back(Param{it->first, it->second, 0, 0});
  }
  build_buckets(bucket_cap_mb);
  for (size_t i = 0; i < params_.size(); ++i)
    hooks_.push_back(autograd::register_post_accumulate_grad_hook(
        params_[i].tensor, [this, i](const Tensor&) { on_grad_ready(i); }));
}

Reducer::~Reducer() {
  for (auto& h : hooks_) h.remove();
  reset_backward_state();  // waits for all-reduces still writing into the buckets
}

DistributedDataParallel::DistributedDataParallel(nn::ModulePtr module, DDPOptions options)
    : nn::Module("DistributedDataParallel"),
      module_(std::move(module)),
      pg_(options.process_group ? options.process_group : default_group()),
      broadcast_buffers_(options.broadcast_buffers) {
  KILN_CHECK(module_ != nullptr, Value, "DistributedDataParallel: module is null");
  register_module("module", module_);
  // Every replica starts from rank 0's state.
  std::vector<Tensor> state = module_->parameters();
  for (auto& [name, t] : module_->named_buffers()) {
    check_local(t, name);
    state.push_back(t);
  }
  auto named = module_->named_parameters();
  for (auto& [name, t] : named) check_local(t, name);
  broadcast_tensors(*pg_, state, 0);
  reducer_ = std::make_unique<Reducer>(named, pg_, options.bucket_cap_mb,
                                       options.find_unused_parameters);
}

Tensor DistributedDataParallel::forward(const Tensor& input) {
  reducer_->prepare_for_forward();
  if (broadcast_buffers_) broadcast_tensors(*pg_, module_->buffers(), 0);
  return module_->forward(input);
}

void Reducer::build_buckets(double cap_mb) {
  const double cap_bytes = cap_mb * 1024 * 1024;
  std::vector<ScalarType> dtypes;  // of each bucket
  std::vector<int64_t> sizes;      // elements of each bucket
  std::vector<double> bytes;
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = params_[i];
    ScalarType dt = p.tensor.dtype();
    // Open buckets are the last one of each dtype; a bucket closes once it reaches the cap.
    size_t b = buckets_.size();
    for (size_t j = buckets_.size(); j-- > 0;)
      if (dtypes[j] == dt) {
        if (bytes[j] < (j == 0 ? std::min(cap_bytes, kFirstBucketBytes) : cap_bytes)) b = j;
        break;
      }
    if (b == buckets_.size()) {
      buckets_.emplace_back();
      dtypes.push_back(dt);
      sizes.push_back(0);
      bytes.push_back(0);
    }
    p.bucket = b;
    p.offset = sizes[b];
    sizes[b] += p.tensor.numel();
    bytes[b] += static_cast<double>(p.tensor.numel() * p.tensor.element_size());
    buckets_[b].params.push_back(i);
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    buckets_[b].flat = empty({sizes[b]}, dtypes[b]);
    buckets_[b].pending = buckets_[b].params.size();
  }
}

std::vector<std::vector<std::string>> Reducer::bucket_parameter_names() const {
  std::vector<std::vector<std::string>> out;
  for (const Bucket& b : buckets_) {
    out.emplace_back();
    for (size_t i : b.params) out.back().push_back(params_[i].name);
  }
  return out;
}

void Reducer::on_grad_ready(size_t i) {
  if (!sync_) return;
  if (!callback_queued_) {
    callback_queued_ = true;
    autograd::queue_callback([this] { finish_backward(); });
  }
  Param& p = params_[i];
  KILN_CHECK(!p.ready, Runtime, "DistributedDataParallel: parameter '", p.name,
             "' received its gradient twice in one backward pass. Reentrant backward or a "
             "parameter shared between DDP instances is not supported.");
  mark_ready(i, p.tensor.grad());
}

void Reducer::mark_ready(size_t i, const Tensor& grad) {
  Param& p = params_[i];
  Bucket& b = buckets_[p.bucket];
  Tensor slot = b.flat.narrow(0, p.offset, p.tensor.numel());
  {
    autograd::NoGradGuard no_grad;
    if (grad.defined()) slot.copy_(grad.reshape({-1}));
    else slot.zero_();
  }
  p.ready = true;
  if (--b.pending == 0) launch_ready_buckets();
}

void Reducer::launch_ready_buckets() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    Bucket& b = buckets_[next_bucket_++];
    b.work = pg_->all_reduce(b.flat, ReduceOp::Avg);
  }
}

void Reducer::finish_backward() {
  std::vector<size_t> unused;
  for (size_t i = 0; i < params_.size(); ++i)
    if (!params_[i].ready) unused.push_back(i);
  if (!unused.empty() && !find_unused_) {
    std::ostringstream names;
    for (size_t k = 0; k < unused.size(); ++k) names << (k ? ", " : "") << params_[unused[k]].name;
    reset_backward_state();
    KILN_FAIL(Runtime,
               "DistributedDataParallel: parameters that require grad received no gradient in "
               "this backward pass: ", names.str(), ". Every rank must produce a gradient for "
               "every parameter: make the loss depend on all of them, set requires_grad=false "
               "on the unused ones, or pass find_unused_parameters=true.");
  }
  for (size_t i : unused) mark_ready(i, Tensor());
  std::exception_ptr error;
  for (Bucket& b : buckets_) {
    try {
      b.work->wait();
    } catch (...) {
      if (!error) error = std::current_exception();
    }
    b.work.reset();
  }
  if (!error) {
    autograd::NoGradGuard no_grad;
    for (Param& p : params_) {
      Tensor avg = buckets_[p.bucket].flat.narrow(0, p.offset, p.tensor.numel()).view(p.tensor.sizes());
      Tensor g = p.tensor.grad();
      if (g.defined()) g.copy_(avg);
      else p.tensor.set_grad(avg.clone());
    }
  }
  reset_backward_state();
  if (error) std::rethrow_exception(error);
}

void Reducer::reset_backward_state() {
  callback_queued_ = false;
  next_bucket_ = 0;
  for (Param& p : params_) p.ready = false;
  for (Bucket& b : buckets_) {
    if (b.work) {  // still in flight after an error: the comm thread may write into b.flat
      try {
        b.work->wait();
      } catch (...) {
      }
      b.work.reset();
    }
    b.pending = b.params.size();
  }
}

}  // namespace kiln::dist
