// FSDP's parameter groups and FullyShardedModule (kiln/dist/fsdp.h): Note [FSDP flat all-gather],
// Note [FSDP resharding], Note [FSDP reshard to k ranks], Note [FSDP gradient sync] and Note [FSDP
// prefetch].
#include "kiln/dist/fsdp.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "kiln/autograd/grad_mode.h"
#include "kiln/autograd/node.h"
#include "kiln/dist/remote.h"
#include "kiln/kiln.h"

namespace kiln::dist {

namespace {

DimVector fsdp_strides(IntArrayRef shape) {
  DimVector s(shape.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i)
    s[i] = s[i + 1] * std::max<int64_t>(shape[i + 1], 1);
  return s;
}

char* bytes_of(const Tensor& t) { return static_cast<char*>(t.impl()->raw_data()); }

}  // namespace

// What one unshard() on a gang gathered, per parameter: the shard it gathered from (cast), its
// spec and the whole placements, and the whole tensor's shard on the workers (the local of a TP
// DTensor). Its hooks and its backward node hold it, so each call of a module refills and frees
// its own (as Gathered does on CPU).
struct FSDPParamGroup::RemoteGathered {
  struct Whole {
    Tensor src;
    DTensorSpec spec;
    Placements whole;
    Tensor local;
  };
  std::vector<Whole> wholes;
  bool resident = false;

  // Frees the workers' memory of the whole tensors, keeping them to refill.
  void release() {
    if (!resident) return;
    std::vector<Tensor> locals;
    for (const Whole& w : wholes)
      if (w.local.numel() > 0) locals.push_back(w.local);  // an empty one may alias its shard
    detail::remote_hooks().release(locals);
    resident = false;
  }
  // Refills them (before backward).
  void regather() {
    if (resident) return;
    for (const Whole& w : wholes)
      if (w.local.numel() > 0) detail::remote_hooks().redistribute(w.src, w.spec, w.whole, w.local);
    resident = true;
  }
};

// The node whose outputs are the whole parameters of one unshard() (Note [FSDP resharding]; on a
// gang, Note [FSDP on a gang]): its backward reduces their gradients onto the shards.
template <typename G>
class FSDPGatherBackward final : public autograd::Node {
 public:
  FSDPGatherBackward(const char* name, std::weak_ptr<FSDPParamGroup> group,
                     std::shared_ptr<G> gathered)
      : name_(name), group_(std::move(group)), gathered_(std::move(gathered)) {}
  const char* name() const override { return name_; }
  autograd::variable_list apply(autograd::variable_list&& grads) override {
    std::shared_ptr<FSDPParamGroup> g = group_.lock();
    KILN_CHECK(g != nullptr, Runtime,
               "FSDP: backward reached parameters whose FSDP group (module) no longer exists");
    if constexpr (std::is_same_v<G, FSDPParamGroup::Gathered>)
      return g->reduce_gradients(std::move(grads), *gathered_);
    else
      return g->reduce_remote(std::move(grads), *gathered_);
  }

 private:
  const char* name_;
  std::weak_ptr<FSDPParamGroup> group_;
  std::shared_ptr<G> gathered_;  // storages only: no cycle
};

template <typename G>
void FSDPParamGroup::link(const std::vector<Tensor>& full, const std::shared_ptr<G>& g,
                          const char* name) {
  bool needs_grad = false;
  for (const Tensor& p : sharded_) needs_grad = needs_grad || p.requires_grad();
  if (!autograd::GradMode::is_enabled() || !needs_grad) return;
  auto node = std::make_shared<FSDPGatherBackward<G>>(name, weak_from_this(), g);
  for (const Tensor& p : sharded_) autograd::collect_edge(*node, p);
  for (const Tensor& f : full) autograd::set_history(f, node);
}

bool FSDPParamGroup::is_unsharded() const {
  return remote_ ? remote_current_ && remote_current_->resident : current_ && current_->resident;
}

FSDPParamGroup::FSDPParamGroup(const DeviceMesh& mesh, MixedPrecisionPolicy mp)
    : mesh_(mesh), mp_(mp) {
  KILN_CHECK(mesh_.defined(), Value, "fully_shard: the device mesh is undefined");
  KILN_CHECK(mesh_.ndim() == 1, Value,
             "fully_shard: the mesh must be 1-d (FSDP shards over one mesh dim; pass mesh[\"dp\"] "
             "of a larger mesh), got ",
             mesh_.str());
  KILN_CHECK(!mesh_.coordinate().empty(), Value, "fully_shard: this rank is not in ", mesh_.str());
  remote_ = mesh_.device_type().starts_with("remote");
  KILN_CHECK(mesh_.device_type() == "cpu" || remote_, NotImplemented,
             "fully_shard: only CPU meshes and a gang's (remote) meshes are supported so far, got ",
             mesh_.str());
  pg_ = mesh_.group(0);
  post_size_ = mesh_.size(0);
}

FSDPParamGroup::~FSDPParamGroup() = default;

std::shared_ptr<FSDPParamGroup> FSDPParamGroup::create(const std::vector<Tensor>& params,
                                                       const DeviceMesh& mesh,
                                                       MixedPrecisionPolicy mp,
                                                       std::vector<std::string> names) {
  std::shared_ptr<FSDPParamGroup> g(new FSDPParamGroup(mesh, mp));
  g->names_ = std::move(names);
  for (size_t i = g->names_.size(); i < params.size(); ++i)
    g->names_.push_back("param" + std::to_string(i));
  const int64_t n = mesh.size(0), r = mesh.local_rank(0);
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    const std::string& name = g->names_[i];
    KILN_CHECK(p.defined(), Value, "fully_shard: parameter '", name, "' is undefined");
    KILN_CHECK(p.dim() >= 1, Value, "fully_shard: parameter '", name,
               "' is 0-d; FSDP shards along dim 0");
    // What FSDP gathers: the parameter, or its tensor-parallel shard (Note [FSDP over TP]).
    std::optional<DTensorSpec> tp;
    Tensor whole = p.detach();
    DTensorSpec spec{mesh, {Shard(0)}, DimVector(p.sizes()), fsdp_strides(p.sizes()), p.dtype()};
    if (is_dtensor(p)) {
      tp = detail::spec_of(p);
      whole = detail::local_of(p);
      KILN_CHECK(tp->mesh != mesh, Value, "fully_shard: parameter '", name,
                 "' is already a DTensor on the FSDP mesh ", mesh.str());
      KILN_CHECK(tp->mesh.ndim() == 1, Value, "fully_shard: parameter '", name,
                 "' is a DTensor on the ", tp->mesh.ndim(), "-d mesh ", tp->mesh.str(),
                 "; FSDP shards DTensors of a 1-d (tensor-parallel) mesh only");
      KILN_CHECK(!tp->placements[0].is_partial(), Value, "fully_shard: parameter '", name, "' is ",
                 placements_str(tp->placements), "; FSDP cannot shard a Partial value");
      try {
        spec.mesh = concat_meshes(tp->mesh, mesh);
      } catch (const Error& e) {
        KILN_FAIL(Value, "fully_shard: parameter '", name, "' is already a DTensor on ",
                  tp->mesh.str(), ", which FSDP cannot shard again over ", mesh.str(), " (",
                  e.what(),
                  "); for FSDP over tensor parallel take both meshes from one "
                  "init_device_mesh: mesh[\"tp\"] and mesh[\"dp\"]");
      }
      spec.placements = {tp->placements[0], Shard(0)};
      tp->dtype = p.dtype();
    }
    if (g->remote_) {  // each worker keeps its piece (Note [FSDP on a gang])
      g->full_shape_.emplace_back(whole.sizes());
      g->tp_.push_back(tp);
      Tensor d;
      if (whole.is_meta()) {  // meta-device init: materialize() gives the workers their pieces
        spec.stride = contiguous_strides(IntArrayRef(spec.shape));
        d = detail::make_dtensor(
            empty_on(local_shape(spec.shape, spec.mesh, spec.placements), whole.dtype(), kMeta),
            spec);
      } else {
        autograd::NoGradGuard no_grad;
        DTensorSpec rep = spec;
        rep.placements.back() = Replicate();
        if (!tp) whole = whole.to(std::nullopt, Device(mesh.device_type())).contiguous();
        rep.stride = contiguous_strides(IntArrayRef(rep.shape));
        spec.stride = rep.stride;
        rep.dtype = spec.dtype = whole.dtype();
        d = detail::make_dtensor(detail::redistribute_local(whole, rep, spec.placements), spec);
      }
      if (p.requires_grad()) d.requires_grad_(true);
      g->sharded_.push_back(std::move(d));
      continue;
    }
    KILN_CHECK(whole.device() == kCPU || whole.device().type() == DeviceType::Meta, Value,
               "fully_shard: parameter '", name, "' is on ", whole.device(), ", the mesh is ",
               mesh.str());
    auto [off, len] = chunk_of(whole.size(0), n, r);
    Tensor local;
    {
      autograd::NoGradGuard no_grad;
      local = whole.device() == kCPU ? whole.narrow(0, off, len).clone()
                                     : empty_on(local_shape(whole.sizes(), mesh, {Shard(0)}),
                                                whole.dtype(), whole.device());
    }
    KILN_ASSERT(DimVector(local.sizes()) == local_shape(spec.shape, spec.mesh, spec.placements),
                "fully_shard: the shard of '", name, "' does not have its placements' shape");
    g->full_shape_.emplace_back(whole.sizes());
    g->tp_.push_back(std::move(tp));
    Tensor d = detail::make_dtensor(std::move(local), std::move(spec));
    if (p.requires_grad()) d.requires_grad_(true);
    g->sharded_.push_back(std::move(d));
  }
  if (!g->remote_) g->plan();
  return g;
}

void FSDPParamGroup::materialize() {
  for (Tensor& p : sharded_) {
    const Tensor& local = detail::local_of(p);
    if (local.device().type() != DeviceType::Meta) continue;
    const DTensorSpec& spec = detail::spec_of(p);
    // On a gang, zeros that each worker makes in its own shape.
    Tensor mine = remote_ ? detail::zeros_shard(spec, Device(mesh_.device_type()))
                          : empty_on(local.sizes(), local.dtype(), kCPU);
    Tensor d = detail::make_dtensor(std::move(mine), spec);
    if (p.requires_grad()) d.requires_grad_(true);
    p = std::move(d);
  }
}

FSDPParamGroup::Layout FSDPParamGroup::layout(int64_t n) const {
  Layout l;
  l.n = n;
  for (size_t i = 0; i < sharded_.size(); ++i) {
    l.chunk_rows.push_back((full_shape_[i][0] + n - 1) / n);
    l.seg_offset.push_back(l.seg_numel);
    l.seg_numel += l.chunk_rows.back() * row_numel_[i];
  }
  return l;
}

void FSDPParamGroup::copy_rows(const Layout& l, size_t i, char* whole, char* flat, size_t es,
                               bool to_whole) const {
  const int64_t rows = full_shape_[i][0];
  const size_t row_bytes = row_numel_[i] * es;
  for (int64_t q = 0; q < l.n; ++q) {
    auto [off, len] = chunk_of(rows, l.n, q);
    char* w = whole + off * row_bytes;
    char* f = flat + (q * l.seg_numel + l.seg_offset[i]) * es;
    if (to_whole) {
      if (len) std::memcpy(w, f, len * row_bytes);
      continue;
    }
    if (len) std::memcpy(f, w, len * row_bytes);
    std::memset(f + len * row_bytes, 0, (l.chunk_rows[i] - len) * row_bytes);  // the padding
  }
}

void FSDPParamGroup::plan() {
  std::optional<ScalarType> dtype;
  for (size_t i = 0; i < sharded_.size(); ++i) {
    const DTensorSpec& s = detail::spec_of(sharded_[i]);
    const DimVector& shape = full_shape_[i];
    int64_t row = 1;
    for (size_t d = 1; d < shape.size(); ++d) row *= shape[d];
    row_numel_.push_back(row);
    KILN_CHECK(mp_.param_dtype || !dtype || *dtype == s.dtype, Value,
               "fully_shard: the parameters of one FSDP group must share a dtype (one flat "
               "all-gather), but '",
               names_[i], "' is ", s.dtype, " and others ", *dtype,
               "; set mp_policy.param_dtype or shard them separately");
    dtype = s.dtype;
  }
  layout_ = layout(mesh_.size(0));
}

void FSDPParamGroup::set_reshard_after_forward(std::variant<bool, int64_t> value) {
  const int64_t n = mesh_.size(0);
  if (const bool* on = std::get_if<bool>(&value)) {
    post_size_ = *on ? n : 1;
    post_pg_ = nullptr;
    return;
  }
  const int64_t k = std::get<int64_t>(value);
  KILN_CHECK(k >= 1 && k <= n && n % k == 0, Value, "fully_shard: reshard_after_forward=", k,
             " must be a divisor of the FSDP mesh size ", n,
             " (the size of the groups the parameters stay sharded over after forward)");
  post_size_ = k;
  if (remote_) return;  // no resharding on a gang (Note [FSDP on a gang])
  post_pg_ = k > 1 && k < n ? mesh_.block_group(0, k) : nullptr;
  post_layout_ = layout(k);
}

// ---- Gathering (Note [FSDP flat all-gather], Note [FSDP prefetch]) ---------------------------

namespace {

using Clock = std::chrono::steady_clock;

std::mutex stats_mu;
FSDPGatherStats stats;

// The root forward now running on this thread (0: none), and the group unsharded last in it.
thread_local uint64_t t_epoch = 0;
thread_local std::weak_ptr<FSDPParamGroup> t_last;
std::atomic<uint64_t> next_epoch{1};

}  // namespace

struct FSDPParamGroup::Pending {
  Tensor send, recv;
  const Layout* layout = nullptr;  // the group's layout_ or post_layout_
  WorkPtr work;
  Clock::time_point issued;
  bool ahead = false;
  ~Pending() {  // an unused prefetch: the buffers must outlive the collective
    if (work) try {
        work->wait();
      } catch (...) {  // the error reaches whoever waits on the next collective
      }
  }
};

FSDPGatherStats fsdp_gather_stats(bool reset) {
  std::lock_guard<std::mutex> lock(stats_mu);
  FSDPGatherStats s = stats;
  if (reset) stats = {};
  return s;
}

void FSDPParamGroup::begin_root_forward() {
  t_epoch = next_epoch.fetch_add(1);
  t_last.reset();
}

void FSDPParamGroup::end_root_forward() {
  t_epoch = 0;
  t_last.reset();
}

std::shared_ptr<FSDPParamGroup::Gathered> FSDPParamGroup::make_gathered(
    std::vector<Tensor>& full) const {
  auto g = std::make_shared<Gathered>();
  g->dtype =
      sharded_.empty() ? kFloat32 : mp_.param_dtype.value_or(detail::spec_of(sharded_[0]).dtype);
  g->epoch = t_epoch;
  full.clear();
  for (size_t i = 0; i < sharded_.size(); ++i) {
    Tensor local = empty(full_shape_[i], g->dtype);
    g->storages.push_back(local.impl()->storage());
    g->nbytes.push_back(local.numel() * local.element_size());
    if (!tp_[i]) {
      full.push_back(std::move(local));
      continue;
    }
    DTensorSpec spec = *tp_[i];
    spec.dtype = g->dtype;
    full.push_back(detail::make_dtensor(std::move(local), std::move(spec)));
  }
  return g;
}

void FSDPParamGroup::start_gather(Gathered& g, bool ahead) {
  if (g.pending || g.resident || sharded_.empty()) return;
  const ScalarType dt = g.dtype;
  const size_t es = element_size(dt);
  autograd::NoGradGuard no_grad;
  // From the shards over the mesh, or from the pieces kept over k ranks (Note [FSDP reshard to k
  // ranks]), which the send buffer then replaces.
  const bool post = !g.kept.empty();
  KILN_CHECK(!post || g.kept_k == post_size_, Runtime, "FSDP: reshard_after_forward changed from ",
             g.kept_k, " to ", post_size_, " between a forward and its backward");
  auto p = std::make_shared<Pending>();
  p->layout = post ? &post_layout_ : &layout_;
  p->send = empty({p->layout->seg_numel}, dt);
  for (size_t i = 0; i < sharded_.size(); ++i) {
    Tensor local = post ? g.kept[i] : detail::local_of(sharded_[i]);
    KILN_CHECK(local.device() == kCPU, Value, "FSDP: the shard of parameter '", names_[i],
               "' is on ", local.device(),
               " (a meta parameter must be initialised on the CPU before the first forward)");
    local = local.to(dt).contiguous();
    char* seg = bytes_of(p->send) + p->layout->seg_offset[i] * es;
    const size_t bytes = local.numel() * es;
    if (bytes) std::memcpy(seg, bytes_of(local), bytes);
    std::memset(seg + bytes, 0, p->layout->chunk_rows[i] * row_numel_[i] * es - bytes);
  }
  g.kept.clear();
  p->recv = empty({p->layout->n * p->layout->seg_numel}, dt);
  p->issued = Clock::now();
  p->ahead = ahead;
  p->work = (post ? post_pg_ : pg_)->all_gather_into_tensor(p->recv, p->send);
  g.pending = std::move(p);
}

void FSDPParamGroup::finish_gather(Gathered& g) {
  if (g.resident) return;
  start_gather(g);
  if (std::shared_ptr<Pending> p = std::move(g.pending)) {
    const Clock::time_point t0 = Clock::now();
    p->work->wait();
    // Waited: the part of the collective's run after the caller began to wait (not the thread's
    // wake-up after it), so waited <= total for every gather.
    const Clock::time_point done = std::max(p->work->finish_time(), p->issued);
    {
      std::lock_guard<std::mutex> lock(stats_mu);
      stats.count += 1;
      stats.prefetched += p->ahead;
      stats.post_forward += p->layout == &post_layout_;
      stats.total_s += std::chrono::duration<double>(done - p->issued).count();
      stats.waited_s += std::chrono::duration<double>(std::max(done, t0) - t0).count();
    }
    const size_t es = element_size(g.dtype);
    for (size_t i = 0; i < sharded_.size(); ++i) {
      if (g.storages[i]->nbytes() != g.nbytes[i]) g.storages[i]->resize(g.nbytes[i]);
      copy_rows(*p->layout, i, static_cast<char*>(g.storages[i]->data()), bytes_of(p->recv), es,
                /*to_whole=*/true);
    }
  }
  g.resident = true;
}

void FSDPParamGroup::regather(Gathered& g) {
  finish_gather(g);
  std::shared_ptr<FSDPParamGroup> prev = prev_.lock();
  if (g.epoch == 0 || !prev || !prev->current_) return;
  Gathered& pg = *prev->current_;
  if (pg.epoch == g.epoch && !pg.resident) prev->start_gather(pg, /*ahead=*/true);
}

void FSDPParamGroup::free(Gathered& g) {
  g.pending.reset();                                // waits for an all-gather still in flight
  for (const auto& st : g.storages) st->resize(0);  // releases the memory
  g.kept.clear();
  g.resident = false;
}

void FSDPParamGroup::keep_pieces(Gathered& g) {
  if (!g.resident) return free(g);
  const int64_t j = post_pg_->rank();  // this rank's place in its k ranks
  const size_t es = element_size(g.dtype);
  std::vector<Tensor> kept;
  for (size_t i = 0; i < sharded_.size(); ++i) {
    auto [off, len] = chunk_of(full_shape_[i][0], post_size_, j);
    DimVector shape = full_shape_[i];
    shape[0] = len;
    Tensor piece = empty(shape, g.dtype);
    if (piece.numel())
      std::memcpy(bytes_of(piece),
                  static_cast<char*>(g.storages[i]->data()) + off * row_numel_[i] * es,
                  piece.numel() * es);
    kept.push_back(std::move(piece));
  }
  free(g);
  g.kept = std::move(kept);
  g.kept_k = post_size_;
}

std::vector<Tensor> FSDPParamGroup::unshard() {
  if (remote_) return unshard_remote();
  std::vector<Tensor> full;
  std::shared_ptr<Gathered> g;
  if (prefetched_ && t_epoch != 0 && prefetched_->epoch == t_epoch) {
    g = std::move(prefetched_);
    full = std::move(prefetched_full_);
  } else {
    g = make_gathered(full);
  }
  prefetched_.reset();  // a stale one waits for its all-gather here
  prefetched_full_.clear();
  start_gather(*g);
  // Record the order and start the next group's all-gather (See Note [FSDP prefetch]).
  std::shared_ptr<FSDPParamGroup> self = shared_from_this();
  prev_.reset();
  if (t_epoch != 0) {
    if (std::shared_ptr<FSDPParamGroup> last = t_last.lock(); last && last != self) {
      last->next_ = self;
      prev_ = last;
    }
    t_last = self;
    std::shared_ptr<FSDPParamGroup> next = next_.lock();
    if (next && next != self && !next->prefetched_) {
      next->prefetched_ = next->make_gathered(next->prefetched_full_);
      next->start_gather(*next->prefetched_, /*ahead=*/true);
    }
  }
  finish_gather(*g);
  link(full, g, "FSDPAllGatherBackward");
  full_ = full;
  current_ = std::move(g);
  return full;
}

void FSDPParamGroup::reshard() {
  if (remote_) {  // no backward will come: nothing needs them again
    if (remote_current_) remote_current_->release();
    remote_current_.reset();
    full_.clear();
    return;
  }
  if (current_) free(*current_);
}

void FSDPParamGroup::post_forward_reshard() {
  if (remote_) {
    if (remote_current_ && post_size_ != 1) remote_current_->release();
    return;
  }
  if (!current_ || post_size_ == 1) return;
  if (post_pg_) return keep_pieces(*current_);
  free(*current_);
}

void FSDPParamGroup::pre_backward() {
  if (remote_) {
    if (remote_current_) remote_current_->regather();
    return;
  }
  if (current_) regather(*current_);
}

void FSDPParamGroup::register_pre_backward_hooks(const std::vector<Tensor>& outputs) {
  if (remote_) {
    std::shared_ptr<RemoteGathered> g = remote_current_;
    if (!g) return;
    for (const Tensor& out : outputs) {
      if (!out.defined() || !out.requires_grad()) continue;
      autograd::register_hook(out, [g](const Tensor&) {
        g->regather();
        return Tensor();
      });
    }
    return;
  }
  if (!current_) return;
  std::weak_ptr<FSDPParamGroup> self = weak_from_this();
  std::shared_ptr<Gathered> g = current_;
  for (const Tensor& out : outputs) {
    if (!out.defined() || !out.requires_grad()) continue;
    autograd::register_hook(out, [self, g](const Tensor&) {
      if (auto group = self.lock()) group->regather(*g);
      return Tensor();
    });
  }
}

std::vector<Tensor> FSDPParamGroup::reduce_gradients(std::vector<Tensor> grads,
                                                     Gathered& gathered) {
  KILN_CHECK(grads.size() == sharded_.size(), Runtime, "FSDP: backward got ", grads.size(),
             " gradients for ", sharded_.size(), " parameters");
  const int64_t r = mesh_.local_rank(0);
  autograd::NoGradGuard no_grad;
  std::vector<Tensor> g(grads.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    const DTensorSpec& s = detail::spec_of(sharded_[i]);
    const ScalarType rd = mp_.reduce_dtype.value_or(mp_.param_dtype.value_or(s.dtype));
    Tensor grad = grads[i];
    if (grad.defined() && tp_[i]) {  // its TP placement (a Partial gradient is reduced over tp)
      KILN_CHECK(is_dtensor(grad) && detail::spec_of(grad).mesh == tp_[i]->mesh, Runtime,
                 "FSDP: the gradient of parameter '", names_[i], "' is not a DTensor on ",
                 tp_[i]->mesh.str());
      grad = detail::redistribute_local(detail::local_of(grad), detail::spec_of(grad),
                                        tp_[i]->placements);
    }
    g[i] = grad.defined() ? grad.to(rd).contiguous() : zeros(full_shape_[i], rd);
    if (!acc_.empty()) g[i] = (g[i] + acc_[i].to(rd)).contiguous();
  }
  free(gathered);
  std::vector<Tensor> out(grads.size());
  if (!sync_) {        // Note [FSDP gradient sync]
    if (acc_.empty())  // g may alias the engine's gradients; a sum with acc_ is new
      for (Tensor& t : g) t = t.clone();
    acc_ = std::move(g);
    return out;
  }
  acc_.clear();
  if (sharded_.empty()) return out;
  const ScalarType rd = g[0].dtype();
  const size_t es = element_size(rd);
  for (const Tensor& t : g)
    KILN_CHECK(
        t.dtype() == rd, Value,
        "FSDP: gradients of one group must share the reduce dtype; set mp_policy.reduce_dtype");
  Tensor send = empty({layout_.n * layout_.seg_numel}, rd);
  for (size_t i = 0; i < g.size(); ++i)
    copy_rows(layout_, i, bytes_of(g[i]), bytes_of(send), es, /*to_whole=*/false);
  Tensor recv = empty({layout_.seg_numel}, rd);
  pg_->reduce_scatter_tensor(recv, send, ReduceOp::Avg)->wait();
  for (size_t i = 0; i < g.size(); ++i) {
    const DTensorSpec& s = detail::spec_of(sharded_[i]);
    const int64_t len = chunk_of(full_shape_[i][0], layout_.n, r).second;
    Tensor local = recv.narrow(0, layout_.seg_offset[i], len * row_numel_[i])
                       .view(local_shape(s.shape, s.mesh, s.placements))
                       .to(s.dtype)
                       .clone();
    out[i] = detail::make_dtensor(std::move(local), s);
  }
  return out;
}

// ---- On a gang ----------------------------------------------------------------------------

// Note [FSDP on a gang]: when the mesh is a gang's (Note [Remote DTensor]), the workers hold the
// shards and the client records; the flat buffers of Note [FSDP flat all-gather], filled byte by
// byte on the comm thread, cannot be recorded. So each parameter goes on its own, with DTensor
// redistributions that every worker runs on its own pieces, uneven ones included:
//  - create: the parameter (or its tensor-parallel shard) is sent whole to every worker and each
//    keeps its Shard(0) piece (Replicate -> Shard: no communication);
//  - unshard(): Shard(0) -> Replicate along the FSDP mesh dim (an all-gather per parameter), cast
//    to param_dtype first; the whole tensors are the outputs of one autograd node, as on CPU;
//  - backward: each whole gradient (brought to its TP placement first) is cast to the reduce dtype
//    and taken as Partial(avg) along the FSDP mesh dim, then redistributed to Shard(0): a
//    reduce-scatter that leaves each worker the mean of its rows (Note [FSDP gradient sync]
//    works the same, with the sums kept on the workers).
// Resharding after forward (reshard_after_forward=True, or any k > 1: a gang reshards fully) is
// a Release of the whole tensors' memory on the workers, which keep the values' ids and shapes;
// a hook on the module's outputs refills them before backward with a redistribute `into` them,
// so the tensors autograd saved see their values again (as Note [FSDP resharding] does with
// storages). The workers run the instructions in order, so there is no prefetch.

std::vector<Tensor> FSDPParamGroup::unshard_remote() {
  std::vector<Tensor> full;
  auto g = std::make_shared<RemoteGathered>();
  {
    autograd::NoGradGuard no_grad;
    for (size_t i = 0; i < sharded_.size(); ++i) {
      DTensorSpec spec = detail::spec_of(sharded_[i]);
      Tensor src = detail::local_of(sharded_[i]);
      if (mp_.param_dtype) src = src.to(*mp_.param_dtype);
      spec.dtype = src.dtype();
      Placements whole = spec.placements;
      whole.back() = Replicate();
      Tensor w = detail::redistribute_local(src, spec, whole);
      g->wholes.push_back({src, spec, whole, w});
      if (tp_[i]) {
        DTensorSpec t = *tp_[i];
        t.dtype = w.dtype();
        w = detail::make_dtensor(std::move(w), std::move(t));
      }
      full.push_back(std::move(w));
    }
  }
  g->resident = true;
  link(full, g, "FSDPRemoteGatherBackward");
  full_ = full;
  remote_current_ = std::move(g);
  return full;
}

std::vector<Tensor> FSDPParamGroup::reduce_remote(std::vector<Tensor> grads,
                                                  RemoteGathered& gathered) {
  KILN_CHECK(grads.size() == sharded_.size(), Runtime, "FSDP: backward got ", grads.size(),
             " gradients for ", sharded_.size(), " parameters");
  autograd::NoGradGuard no_grad;
  acc_.resize(sharded_.size());
  std::vector<Tensor> out(grads.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    const DTensorSpec& spec = detail::spec_of(sharded_[i]);
    const RemoteGathered::Whole& w = gathered.wholes[i];
    const ScalarType rd = mp_.reduce_dtype.value_or(mp_.param_dtype.value_or(spec.dtype));
    Tensor g;
    if (!grads[i].defined()) {  // zeros, as on CPU: every parameter gets its (reduced) gradient
      DTensorSpec z = w.spec;
      z.placements = w.whole;
      z.dtype = rd;
      g = detail::zeros_shard(z, w.src.device());
    } else if (tp_[i]) {  // its TP placement (a Partial gradient is reduced over tp)
      g = detail::redistribute_local(detail::local_of(grads[i]), detail::spec_of(grads[i]),
                                     tp_[i]->placements);
    } else {
      g = grads[i];
    }
    g = g.to(rd);
    const bool had = acc_[i].defined();
    if (had) g = g + acc_[i].to(rd);
    if (!sync_) {  // Note [FSDP gradient sync]: kept on the workers, never the engine's tensor
      acc_[i] = had ? g : g.clone();
      continue;
    }
    acc_[i] = Tensor();
    DTensorSpec partial = spec;
    partial.placements.back() = Partial(ReduceOp::Avg);
    partial.dtype = g.dtype();
    Tensor mine = detail::redistribute_local(g.contiguous(), partial, spec.placements);
    out[i] = detail::make_dtensor(mine.to(spec.dtype), spec);
  }
  // Backward is done with the whole tensors: drop this group's handles (the engine drops the
  // graph's), so the workers free them.
  gathered.wholes.clear();
  gathered.resident = false;
  if (remote_current_.get() == &gathered) full_.clear();
  return out;
}

// ---- FullyShardedModule --------------------------------------------------------------------

namespace {

// (owner, name, dotted name) of `m`'s parameters, not descending into FullyShardedModules.
void collect_slots(nn::Module& m, const std::string& prefix,
                   std::vector<std::tuple<nn::Module*, std::string, std::string>>& out,
                   std::vector<const TensorImpl*>& seen) {
  for (auto& [name, p] : m.named_parameters(false)) {
    if (std::find(seen.begin(), seen.end(), p.impl()) != seen.end()) continue;
    seen.push_back(p.impl());
    out.emplace_back(&m, name, prefix + name);
  }
  for (auto& [name, child] : m.named_children()) {
    if (!child || dynamic_cast<FullyShardedModule*>(child.get())) continue;
    collect_slots(*child, prefix + name + ".", out, seen);
  }
}

}  // namespace

FullyShardedModule::FullyShardedModule(nn::ModulePtr module, DeviceMesh mesh, FSDPOptions options)
    : nn::Module("FullyShardedModule"), module_(std::move(module)), options_(options) {
  KILN_CHECK(module_ != nullptr, Value, "fully_shard: module is null");
  if (!mesh.defined()) mesh = init_device_mesh("cpu", {default_group()->size()});
  std::vector<std::tuple<nn::Module*, std::string, std::string>> slots;
  std::vector<const TensorImpl*> seen;
  collect_slots(*module_, "", slots, seen);
  std::vector<Tensor> params;
  std::vector<std::string> names;
  for (auto& [owner, name, dotted] : slots) {
    params.push_back(owner->param(name));
    names.push_back(dotted);
    slots_.push_back({owner, name});
  }
  group_ = FSDPParamGroup::create(params, mesh, options.mp_policy, names);
  group_->set_reshard_after_forward(options.reshard_after_forward);
  for (size_t i = 0; i < slots_.size(); ++i)
    slots_[i].owner->param(slots_[i].name) = group_->sharded_params()[i];
  register_module("module", module_);
}

namespace {
thread_local int t_forward_depth = 0;  // FullyShardedModule forwards running on this thread
}

Tensor FullyShardedModule::forward(const Tensor& input) {
  // The outermost one is the root (Note [FSDP prefetch]).
  struct Depth {
    Depth() {
      if (t_forward_depth++ == 0) FSDPParamGroup::begin_root_forward();
    }
    ~Depth() {
      if (--t_forward_depth == 0) FSDPParamGroup::end_root_forward();
    }
  } depth;
  std::vector<Tensor> full = group_->unshard();
  auto restore = [this] {
    for (size_t i = 0; i < slots_.size(); ++i)
      slots_[i].owner->param(slots_[i].name) = group_->sharded_params()[i];
  };
  for (size_t i = 0; i < slots_.size(); ++i) slots_[i].owner->param(slots_[i].name) = full[i];
  Tensor x = input;
  if (options_.mp_policy.param_dtype && is_floating(x.dtype()))
    x = x.to(*options_.mp_policy.param_dtype);
  Tensor out;
  try {
    out = module_->forward(x);
  } catch (...) {
    restore();
    group_->reshard();
    throw;
  }
  restore();
  const bool graph = autograd::GradMode::is_enabled() && out.defined() && out.requires_grad();
  if (!graph) {
    group_->reshard();
  } else if (group_->reshard_after_forward_size() != 1) {
    group_->post_forward_reshard();
    group_->register_pre_backward_hooks({out});
  }
  return out;
}

void FullyShardedModule::set_requires_gradient_sync(bool on, bool recurse) {
  group_->set_requires_gradient_sync(on);
  if (!recurse) return;
  for (const nn::ModulePtr& m : module_->modules())
    if (auto* f = dynamic_cast<FullyShardedModule*>(m.get()); f && f != this)
      f->group_->set_requires_gradient_sync(on);
}

std::shared_ptr<FullyShardedModule> fully_shard(nn::ModulePtr module, DeviceMesh mesh,
                                                FSDPOptions options) {
  return std::make_shared<FullyShardedModule>(std::move(module), std::move(mesh), options);
}

}  // namespace kiln::dist
