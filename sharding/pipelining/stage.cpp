// Pipeline stages and the runner of their schedule's actions. See Note [Pipeline schedules] and
// Note [Pipeline shapes] in kiln/dist/pipelining.h.
#include <chrono>
#include <map>
#include <sstream>

#include "kiln/autograd/grad_mode.h"
#include "kiln/dist/pipelining.h"
#include "kiln/error.h"

namespace kiln::dist::pipelining {
namespace {

// p2p tags: activations into stage s, gradients out of stage s+1 into s, shapes into s.
int fwd_tag(int s) { return 3 * s; }
int bwd_tag(int s) { return 3 * s + 1; }
int shape_tag(int s) { return 3 * s + 2; }

// Shapes travel as one int64 tensor: [status, count, then dtype, ndim, dims... per tensor].
// status 0: fine; 1: an earlier stage failed (nothing more to infer).
constexpr int64_t kShapeWords = 512;

std::string describe(const std::vector<Tensor>& ts) {
  std::ostringstream os;
  for (size_t i = 0; i < ts.size(); ++i)
    os << (i ? ", " : "") << ts[i].sizes() << " " << scalar_type_name(ts[i].dtype());
  return os.str();
}

Tensor encode_shapes(const std::vector<Tensor>* metas) {
  Tensor t = kiln::zeros({kShapeWords}, kInt64);
  int64_t* w = t.data_ptr<int64_t>();
  if (metas == nullptr) {
    w[0] = 1;
    return t;
  }
  int64_t k = 2;
  w[1] = static_cast<int64_t>(metas->size());
  for (const Tensor& m : *metas) {
    KILN_CHECK(k + 2 + m.dim() <= kShapeWords, Value,
               "pipeline: a stage's outputs have too many dimensions to describe (",
               describe(*metas), ")");
    w[k++] = static_cast<int64_t>(m.dtype());
    w[k++] = m.dim();
    for (int64_t d : m.sizes()) w[k++] = d;
  }
  return t;
}

// nullopt when an earlier stage failed.
std::optional<std::vector<Tensor>> decode_shapes(const Tensor& t) {
  const int64_t* w = t.data_ptr<int64_t>();
  if (w[0] != 0) return std::nullopt;
  std::vector<Tensor> out;
  int64_t k = 2;
  for (int64_t i = 0; i < w[1]; ++i) {
    auto dtype = static_cast<ScalarType>(w[k++]);
    const int64_t nd = w[k++];
    std::vector<int64_t> sizes(w + k, w + k + nd);
    k += nd;
    out.push_back(kiln::empty(sizes, dtype, kMeta));
  }
  return out;
}

std::vector<Tensor> meta_like(const std::vector<Tensor>& ts) {
  std::vector<Tensor> out;
  for (const Tensor& t : ts) out.push_back(kiln::empty(t.sizes(), t.dtype(), kMeta));
  return out;
}

// Rows [start, start + n) of every tensor, for microbatch `i` of `m` (torch.tensor_split's
// sizes: the first rows % m microbatches get one row more).
std::vector<Tensor> microbatch(const std::vector<Tensor>& ts, int i, int m, const char* what) {
  std::vector<Tensor> out;
  for (const Tensor& t : ts) {
    KILN_CHECK(t.dim() >= 1 && t.size(0) >= m, Value, "pipeline step: ", what, " of shape ",
               t.sizes(), " cannot be split in ", m, " microbatches along dim 0");
    const int64_t rows = t.size(0), base = rows / m, extra = rows % m;
    const int64_t start = i * base + std::min<int64_t>(i, extra);
    out.push_back(t.narrow(0, start, base + (i < extra ? 1 : 0)));
  }
  return out;
}

// A module whose forward takes and returns one tensor, as a stage's functions; on meta, the
// module's own parameters and buffers are swapped for meta tensors for the call.
StageFunctions module_functions(nn::ModulePtr module) {
  auto forward = [module](const std::vector<Tensor>& in) {
    KILN_CHECK(in.size() == 1, Value, "PipelineStage of a ", module->type_name(),
               ": its forward takes one tensor, got ", in.size());
    return std::vector<Tensor>{module->forward(in[0])};
  };
  auto forward_meta = [module, forward](const std::vector<Tensor>& in) {
    std::vector<std::pair<Tensor*, Tensor>> swapped;
    struct Restore {
      std::vector<std::pair<Tensor*, Tensor>>& s;
      ~Restore() {
        for (auto& [slot, t] : s) *slot = t;
      }
    } restore{swapped};
    for (auto& m : module->modules()) {
      for (auto& [name, t] : m->named_parameters(false)) swapped.push_back({&m->param(name), t});
      for (auto& [name, t] : m->named_buffers(false)) swapped.push_back({&m->buffer(name), t});
    }
    for (auto& [slot, t] : swapped) *slot = kiln::empty(t.sizes(), t.dtype(), kMeta);
    autograd::NoGradGuard ng;
    return forward(in);
  };
  return {forward, forward_meta, {}, {}};
}

}  // namespace

// ---- PipelineStage ---------------------------------------------------------------------------

PipelineStage::PipelineStage(StageFunctions fns, int stage_index, int num_stages,
                             ProcessGroupPtr group, Device device)
    : fns_(std::move(fns)),
      index_(stage_index),
      num_stages_(num_stages),
      group_(std::move(group)),
      device_(device) {
  KILN_CHECK(num_stages_ >= 1 && index_ >= 0 && index_ < num_stages_, Value,
             "PipelineStage: stage_index ", index_, " is not in [0, num_stages=", num_stages_, ")");
  KILN_CHECK(fns_.forward && fns_.forward_meta, Value, "PipelineStage: forward functions missing");
  if (group_ == nullptr) return;  // a controller's stage (Note [Pipeline controller])
  KILN_CHECK(num_stages_ % group_->size() == 0, Value, "PipelineStage: ", num_stages_,
             " stages do not spread evenly over the ", group_->size(), " ranks of group '",
             group_->name(), "'");
  KILN_CHECK(index_ % group_->size() == group_->rank(), Value, "PipelineStage: stage ", index_,
             " belongs on rank ", index_ % group_->size(), " of group '", group_->name(),
             "' (stage s runs on rank s % ", group_->size(), "), not on rank ", group_->rank());
}

PipelineStage::PipelineStage(nn::ModulePtr module, int stage_index, int num_stages,
                             ProcessGroupPtr group, Device device)
    : PipelineStage(module_functions(std::move(module)), stage_index, num_stages, std::move(group),
                    device) {}

// ---- The runner ------------------------------------------------------------------------------

class ScheduleRunner {
 public:
  ScheduleRunner(std::vector<PipelineStage*> stages, ScheduleKind kind, int m, LossFn loss_fn,
                 bool fsdp, std::optional<Controller> controller)
      : m_(m), loss_fn_(std::move(loss_fn)), controller_(std::move(controller)) {
    KILN_CHECK(!stages.empty(), Value, "pipeline schedule: no stages");
    group_ = stages[0]->group();
    n_stages_ = stages[0]->num_stages();
    device_ = stages[0]->device();
    for (auto* s : stages) {
      KILN_CHECK(s->group().get() == group_.get() && s->num_stages() == n_stages_ &&
                     s->device() == device_,
                 Value,
                 "pipeline schedule: this rank's stages must share one group, one stage count and "
                 "one device");
      KILN_CHECK(by_index_.emplace(s->stage_index(), s).second, Value, "pipeline schedule: stage ",
                 s->stage_index(), " given twice");
    }
    int v = static_cast<int>(stages.size());
    if (controller_) {  // Note [Pipeline controller]
      p_ = controller_->ranks;
      KILN_CHECK(group_ == nullptr && v == n_stages_, Value, "pipeline schedule ",
                 schedule_kind_name(kind), ": a controller runs all ", n_stages_,
                 " stages, with no process group; got ", v);
      KILN_CHECK(p_ >= 1 && n_stages_ % p_ == 0, Value, "pipeline schedule: ", n_stages_,
                 " stages do not spread evenly over ", p_, " ranks");
      KILN_CHECK(
          controller_->enter && controller_->leave && controller_->send && controller_->receive,
          Value, "pipeline schedule: the controller's functions are missing");
      v = n_stages_ / p_;
    } else {
      KILN_CHECK(group_ != nullptr, Value,
                 "pipeline schedule: stages without a process group "
                 "run under a controller only");
      p_ = group_->size();
      KILN_CHECK(n_stages_ == p_ * v, Value, "pipeline schedule ", schedule_kind_name(kind), ": ",
                 n_stages_, " stages over ", p_, " ranks need ", n_stages_ / std::max(p_, 1),
                 " stages on each rank, this rank passed ", v);
    }
    actions_ = make_schedule({kind, p_, m, v, fsdp});
    if (controller_) {
      // Every rank's compute actions in the order the simulated step starts them.
      std::vector<TimedAction> order = simulate(actions_);
      std::stable_sort(order.begin(), order.end(), [](const TimedAction& a, const TimedAction& b) {
        return a.start < b.start || (a.start == b.start && a.rank < b.rank);
      });
      for (const TimedAction& t : order)
        if (is_compute(t.action.op)) order_.push_back(t.action);
    }
  }

  const std::vector<ActionList>& actions() const { return actions_; }

  std::vector<Tensor> run(const std::vector<Tensor>& inputs, const std::optional<Tensor>& target,
                          std::vector<Tensor>* losses, bool train);

  std::vector<TimedAction> timeline;
  double seconds = 0;

 private:
  // What one microbatch leaves at one stage between its actions.
  struct Slot {
    std::vector<Tensor> inputs, outputs, grad_outputs, grad_inputs;
    Tensor raw_loss, loss;  // the last stage's, and that scaled by 1/m
    std::vector<WorkPtr> recvs;
    autograd::DeferredWeightGrad deferred;
  };

  PipelineStage& local(int s) { return *by_index_.at(s); }
  bool is_local(int s) const { return by_index_.count(s) != 0; }
  int rank_of(int s) const { return s % p_; }
  void infer_shapes(const std::vector<Tensor>& first_inputs);
  void forward(int s, int mb, Slot& slot, bool train);
  void backward(Op op, int s, int mb, Slot& slot);

  std::map<int, PipelineStage*> by_index_;
  int m_;
  LossFn loss_fn_;
  ProcessGroupPtr group_;
  int p_ = 1, n_stages_ = 1;
  std::vector<ActionList> actions_;
  // See Note [Pipeline shapes]: each local stage's input and output metas, for the input shapes
  // they were inferred from.
  std::vector<std::vector<int64_t>> inferred_for_;
  std::map<int, std::vector<Tensor>> in_meta_, out_meta_;
  std::map<std::pair<int, int>, Slot> slots_;   // (stage, microbatch)
  std::vector<std::vector<Tensor>> first_mbs_;  // stage 0's microbatches
  std::vector<Tensor> targets_;
  std::optional<Controller> controller_;
  Device device_{kCPU};  // the stages' device: what the group sends and receives lives there
  ActionList order_;  // a controller's: every rank's compute actions, in a valid order
  std::vector<WorkPtr> sends_;
  std::vector<Tensor> send_buffers_;
};

void ScheduleRunner::infer_shapes(const std::vector<Tensor>& first_inputs) {
  std::vector<std::vector<int64_t>> key;
  for (const Tensor& t : first_inputs) {
    key.emplace_back(t.sizes().begin(), t.sizes().end());
    key.back().push_back(static_cast<int64_t>(t.dtype()));
  }
  // Stage 0's rank (group rank 0) says whether the microbatch shapes changed since the last
  // inference; every rank takes part in the same calls.
  bool need = in_meta_.empty();
  if (!need) {
    Tensor changed = kiln::zeros({1}, kInt64);
    if (is_local(0)) changed.data_ptr<int64_t>()[0] = key != inferred_for_;
    if (group_ && p_ > 1) {
      changed = changed.to(std::nullopt, device_);
      group_->broadcast(changed, 0)->wait();
      changed = changed.to(std::nullopt, Device(kCPU));
    }
    need = changed.data_ptr<int64_t>()[0] != 0;
  }
  if (!need) return;
  inferred_for_ = key;
  in_meta_.clear();
  out_meta_.clear();
  std::string error;
  int failed_stage = -1;
  std::vector<WorkPtr> works;
  std::vector<Tensor> keep;
  for (auto& [s, stage] : by_index_) {
    std::optional<std::vector<Tensor>> in;
    if (s == 0) {
      in = meta_like(first_inputs);
    } else if (is_local(s - 1)) {
      if (out_meta_.count(s - 1)) in = out_meta_[s - 1];
    } else {
      Tensor buf = kiln::zeros({kShapeWords}, kInt64, device_);
      group_->recv(buf, rank_of(s - 1), shape_tag(s))->wait();
      in = decode_shapes(buf.to(std::nullopt, Device(kCPU)));
    }
    std::optional<std::vector<Tensor>> out;
    if (in && failed_stage < 0) {
      try {
        out = stage->functions().forward_meta(*in);
        in_meta_[s] = *in;
        out_meta_[s] = *out;
      } catch (const std::exception& e) {
        failed_stage = s;
        std::ostringstream os;
        os << "pipeline: stage " << s;
        if (s > 0)
          os << " cannot take stage " << s - 1 << "'s output (" << describe(*in) << ")";
        else
          os << " cannot take a microbatch of the inputs (" << describe(*in) << ")";
        os << ": " << e.what();
        error = os.str();
      }
    }
    if (s < n_stages_ - 1 && !is_local(s + 1)) {
      keep.push_back(encode_shapes(out ? &*out : nullptr).to(std::nullopt, device_));
      works.push_back(group_->send(keep.back(), rank_of(s + 1), shape_tag(s + 1)));
    }
  }
  for (auto& w : works) w->wait();
  // Every rank learns of the first stage that failed (Note [Pipeline shapes]).
  Tensor verdict = kiln::full({1}, failed_stage < 0 ? n_stages_ : failed_stage, kInt64, device_);
  if (group_ && p_ > 1) group_->all_reduce(verdict, ReduceOp::Min)->wait();
  const int64_t worst = verdict.to(std::nullopt, Device(kCPU)).data_ptr<int64_t>()[0];
  if (worst < n_stages_) {
    in_meta_.clear();
    out_meta_.clear();
    if (!error.empty()) KILN_FAIL(Value, error);
    KILN_FAIL(Value, "pipeline: stage ", worst, " (rank ", rank_of(worst),
              ") cannot take its input; that rank's error says why");
  }
}

void ScheduleRunner::forward(int s, int mb, Slot& slot, bool train) {
  PipelineStage& stage = local(s);
  if (s == 0) {
    slot.inputs = first_mbs_[mb];
  } else if (controller_) {  // sent after stage s - 1's F (Note [Pipeline controller])
    controller_->receive(slot.inputs, s - 1, s);
  } else if (is_local(s - 1)) {
    for (const Tensor& t : slots_[{s - 1, mb}].outputs) slot.inputs.push_back(t.detach());
  }
  if (train && s > 0)
    for (Tensor& t : slot.inputs)
      if (is_floating(t.dtype())) t.requires_grad_();
  autograd::AutoGradMode mode(train && autograd::GradMode::is_enabled());
  slot.outputs = stage.functions().forward(slot.inputs);
  const auto& want = out_meta_.at(s);
  bool same = slot.outputs.size() == want.size();
  for (size_t i = 0; same && i < want.size(); ++i)
    same = slot.outputs[i].sizes() == want[i].sizes() && slot.outputs[i].dtype() == want[i].dtype();
  KILN_CHECK(same, Runtime, "pipeline: stage ", s, " returned ", describe(slot.outputs),
             " for microbatch ", mb, ", but its forward on meta tensors returned ", describe(want),
             " (a stage's output shapes must depend on its input shapes alone)");
  if (train && stage.is_last()) {
    KILN_CHECK(loss_fn_ != nullptr, Value, "pipeline step: the schedule has no loss_fn");
    slot.raw_loss = loss_fn_(slot.outputs, targets_.at(mb));
    KILN_CHECK(slot.raw_loss.numel() == 1, Value, "pipeline: loss_fn returned a tensor of shape ",
               slot.raw_loss.sizes(), "; it must return a scalar");
    slot.loss = slot.raw_loss / static_cast<double>(m_);
  }
}

void ScheduleRunner::backward(Op op, int s, int mb, Slot& slot) {
  PipelineStage& stage = local(s);
  if (controller_ && !stage.is_last()) {  // sent after stage s + 1's B or I
    if (op != Op::W) controller_->receive(slot.grad_outputs, s + 1, s);
  } else if (!stage.is_last() && is_local(s + 1)) {
    slot.grad_outputs = slots_[{s + 1, mb}].grad_inputs;
  }
  if (op == Op::W) {
    autograd::backward_weight(slot.deferred);
    return;
  }
  std::vector<Tensor> roots, grads;
  if (stage.is_last()) {
    roots = {slot.loss};
  } else {
    for (size_t i = 0; i < slot.outputs.size(); ++i)
      if (slot.outputs[i].requires_grad()) {
        roots.push_back(slot.outputs[i]);
        grads.push_back(slot.grad_outputs.at(i));
      }
  }
  std::vector<Tensor> wrt;
  for (const Tensor& t : slot.inputs)
    if (t.requires_grad()) wrt.push_back(t);
  std::vector<Tensor> g;
  if (!roots.empty()) {  // else nothing of this stage needs a gradient
    g = autograd::backward_input(roots, wrt, grads, slot.deferred);
    if (op == Op::B) autograd::backward_weight(slot.deferred);
  }
  if (s > 0) {  // what goes back to stage s - 1 (zeros where there is no gradient)
    for (size_t i = 0, k = 0; i < slot.inputs.size(); ++i) {
      const Tensor& t = slot.inputs[i];
      Tensor gi = t.requires_grad() && !roots.empty() ? g[k++] : Tensor();
      slot.grad_inputs.push_back(gi.defined() ? gi : kiln::zeros_like(t.detach()));
    }
  }
  slot.outputs.clear();  // the graph is gone (or held by `deferred` until W)
  slot.loss = slot.raw_loss = Tensor();
}

std::vector<Tensor> ScheduleRunner::run(const std::vector<Tensor>& inputs,
                                        const std::optional<Tensor>& target,
                                        std::vector<Tensor>* losses, bool train) {
  const auto t0 = std::chrono::steady_clock::now();
  auto now = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  if (is_local(0)) {
    KILN_CHECK(!inputs.empty(), Value,
               "pipeline step: this rank runs stage 0 and must pass the inputs");
    first_mbs_.clear();
    for (int i = 0; i < m_; ++i) first_mbs_.push_back(microbatch(inputs, i, m_, "an input"));
  }
  const bool last_here = is_local(n_stages_ - 1);
  if (train && last_here) {
    KILN_CHECK(target.has_value(), Value,
               "pipeline step: this rank runs the last stage and must pass the target");
    targets_.clear();
    for (int i = 0; i < m_; ++i) targets_.push_back(microbatch({*target}, i, m_, "the target")[0]);
  }
  infer_shapes(is_local(0) ? first_mbs_[0] : std::vector<Tensor>{});
  timeline.clear();
  struct Cleanup {
    ScheduleRunner& r;
    ~Cleanup() {
      for (auto& w : r.sends_) {
        try {
          w->wait();
        } catch (...) {  // the step already failed; the error that counts is the first
        }
      }
      r.sends_.clear();
      r.send_buffers_.clear();
      r.slots_.clear();
    }
  } cleanup{*this};
  std::vector<Tensor> outputs_by_mb(m_);
  for (const Action& a : controller_ ? order_ : actions_[group_->rank()]) {
    const int me = rank_of(a.stage);
    if (!train &&
        (a.op == Op::B || a.op == Op::I || a.op == Op::W || a.op == Op::SendB || a.op == Op::RecvB))
      continue;
    Slot& slot = slots_[{a.stage, a.microbatch}];
    const bool compute = is_compute(a.op);
    if (compute) {  // waiting for a message is idle time, not the action's
      for (auto& w : slot.recvs) w->wait();
      slot.recvs.clear();
    }
    const double start = now();
    if (controller_ && compute) controller_->enter(a.stage);
    struct Leave {
      const std::optional<Controller>& c;
      bool on;
      ~Leave() {
        if (on) c->leave();
      }
    } leave{controller_, controller_.has_value() && compute};
    switch (a.op) {
      case Op::RecvF:
        for (const Tensor& m : in_meta_.at(a.stage)) {
          slot.inputs.push_back(kiln::empty(m.sizes(), m.dtype(), device_));
          slot.recvs.push_back(
              group_->recv(slot.inputs.back(), rank_of(a.stage - 1), fwd_tag(a.stage)));
        }
        break;
      case Op::RecvB:
        for (const Tensor& m : out_meta_.at(a.stage)) {
          slot.grad_outputs.push_back(kiln::empty(m.sizes(), m.dtype(), device_));
          slot.recvs.push_back(
              group_->recv(slot.grad_outputs.back(), rank_of(a.stage + 1), bwd_tag(a.stage)));
        }
        break;
      case Op::SendF:
        for (const Tensor& t : slot.outputs) {
          send_buffers_.push_back(t.detach().contiguous());
          sends_.push_back(
              group_->send(send_buffers_.back(), rank_of(a.stage + 1), fwd_tag(a.stage + 1)));
        }
        break;
      case Op::SendB:
        for (const Tensor& t : slot.grad_inputs) {
          send_buffers_.push_back(t.contiguous());
          sends_.push_back(
              group_->send(send_buffers_.back(), rank_of(a.stage - 1), bwd_tag(a.stage - 1)));
        }
        slot.grad_inputs.clear();
        break;
      case Op::F:
        forward(a.stage, a.microbatch, slot, train);
        if (local(a.stage).is_last()) {
          outputs_by_mb[a.microbatch] = slot.outputs.empty() ? Tensor() : slot.outputs[0].detach();
          if (train && losses) losses->push_back(slot.raw_loss.detach());
        } else if (controller_) {
          std::vector<Tensor> out;
          for (const Tensor& t : slot.outputs) out.push_back(t.detach());
          slots_[{a.stage + 1, a.microbatch}].inputs = controller_->send(out, a.stage, a.stage + 1);
        }
        break;
      case Op::B:
      case Op::I:
      case Op::W:
        backward(a.op, a.stage, a.microbatch, slot);
        if (controller_ && a.op != Op::W && a.stage > 0)
          slots_[{a.stage - 1, a.microbatch}].grad_outputs =
              controller_->send(slot.grad_inputs, a.stage, a.stage - 1);
        break;
      case Op::Unshard:
        if (local(a.stage).functions().unshard) local(a.stage).functions().unshard();
        break;
      case Op::Reshard:
        if (local(a.stage).functions().reshard) local(a.stage).functions().reshard();
        break;
    }
    if (compute) timeline.push_back({me, a, start, now()});
  }
  for (auto& w : sends_) w->wait();
  seconds = now();
  if (!last_here) return {};
  return {kiln::cat(outputs_by_mb, 0)};
}

// ---- Schedule --------------------------------------------------------------------------------

Schedule::Schedule(std::vector<PipelineStage*> stages, ScheduleKind kind, int n_microbatches,
                   LossFn loss_fn, bool fsdp, std::optional<Controller> controller)
    : runner_(std::make_unique<ScheduleRunner>(std::move(stages), kind, n_microbatches,
                                               std::move(loss_fn), fsdp, std::move(controller))) {}
Schedule::~Schedule() = default;

std::vector<Tensor> Schedule::step(const std::vector<Tensor>& inputs,
                                   const std::optional<Tensor>& target,
                                   std::vector<Tensor>* losses) {
  return runner_->run(inputs, target, losses, /*train=*/true);
}

std::vector<Tensor> Schedule::eval(const std::vector<Tensor>& inputs) {
  return runner_->run(inputs, std::nullopt, nullptr, /*train=*/false);
}

const std::vector<ActionList>& Schedule::actions() const { return runner_->actions(); }
const std::vector<TimedAction>& Schedule::last_timeline() const { return runner_->timeline; }
double Schedule::last_step_seconds() const { return runner_->seconds; }

}  // namespace kiln::dist::pipelining
