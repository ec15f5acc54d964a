// kiln/dist/pipelining.h: pipeline parallelism (PyTorch's torch.distributed.pipelining): a
// model cut into stages, one or more per rank of a pipeline group, and a schedule that runs the
// microbatches of a batch through them.
//
//   namespace pp = kiln::dist::pipelining;
//   auto group = kiln::dist::default_group();                 // kiln run --nproc 2
//   pp::PipelineStage stage(my_half_of_the_model, /*stage_index=*/group->rank(), /*num_stages=*/2,
//                           group);
//   pp::Schedule schedule({&stage}, pp::ScheduleKind::OneFOneB, /*n_microbatches=*/4, loss_fn);
//   std::vector<kiln::Tensor> losses;
//   schedule.step({x}, y, &losses);   // stage 0's rank passes x, the last stage's rank y
//   std::cout << pp::format_schedule(schedule.actions());
//
// Note [Pipeline schedules]: a schedule is one action list per rank of the pipeline group.
// Stage s lives on rank s % p (p ranks; with v stages per rank, rank r holds r, r+p, ...). The
// compute actions are F (forward of one microbatch), B (its whole backward), I and W (the two
// halves of B in ZeroBubble schedules, See Note [Split backward] in kiln/autograd/engine.h);
// SEND_F/RECV_F carry activations to the next stage's rank, SEND_B/RECV_B gradients to the
// previous one, and UNSHARD/RESHARD bracket a stage's use of FSDP-sharded parameters. Every
// stage runs its F's, and its B's (or I's), in microbatch order, so the messages between two
// stages match by order alone (one p2p tag per stage and direction).
//   GPipe:           all F's, then all B's.
//   1F1B:            rank r runs p-r-1 F's, then alternates F and B, then the remaining B's.
//   Interleaved1F1B: v stages per rank (Megatron's order); needs m % p == 0.
//   ZBH1:            1F1B with B split in I and W; a rank runs I before F before W, and puts
//                    off at most p-r-1 W's, so they fill the cooldown (ZB-H1 of Qi et al.,
//                    "Zero Bubble Pipeline Parallelism", 2023), at 1F1B's activation memory.
// The compute orders are made for unit costs (F = I = W = 1, B = 2); simulate() replays a list
// with any costs, and rejects one that would deadlock.
//
// Note [Pipeline shapes]: nobody writes a stage's shapes. On the first step (and whenever the
// microbatch shapes change), stage 0 runs its forward on meta tensors shaped like a microbatch,
// and each stage sends its output's shapes and dtypes to the next one, which runs its own
// forward on meta tensors of those. A stage whose forward rejects them fails there, and an
// all-reduce over the group makes every rank raise, naming the stage, before any real message
// is sent: a mismatch is an error, never a hang. A dead rank makes the others' receives fail
// within the group's timeout.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/autograd/engine.h"
#include "kiln/dist/process_group.h"
#include "kiln/nn/module.h"

namespace kiln::dist::pipelining {

enum class Op { F, B, I, W, SendF, RecvF, SendB, RecvB, Unshard, Reshard };
const char* op_name(Op op);  // "F", "SEND_F", "UNSHARD", ...
bool is_compute(Op op);      // F, B, I or W

struct Action {
  Op op;
  int stage;
  int microbatch = -1;  // -1 for UNSHARD and RESHARD
  bool operator==(const Action&) const = default;
};
// PyTorch's spelling: "1F3" (stage 1, microbatch 3), "0SEND_F2", "2UNSHARD".
std::string to_string(const Action& a);
using ActionList = std::vector<Action>;

enum class ScheduleKind { GPipe, OneFOneB, Interleaved1F1B, ZBH1 };
// "gpipe", "1f1b", "interleaved_1f1b", "zbh1" (ValueError naming the choices otherwise).
ScheduleKind parse_schedule_kind(std::string_view name);
const char* schedule_kind_name(ScheduleKind kind);

struct ScheduleSpec {
  ScheduleKind kind = ScheduleKind::OneFOneB;
  int pp_size = 1;  // ranks of the pipeline group
  int n_microbatches = 1;
  int stages_per_rank = 1;  // v: > 1 only for Interleaved1F1B
  bool fsdp = false;        // bracket each stage's work with UNSHARD and RESHARD
};
// One action list per rank (Note [Pipeline schedules]). ValueError for a spec the schedule
// cannot run: fewer microbatches than the interleaved schedule needs, v != 1 elsewhere, ...
std::vector<ActionList> make_schedule(const ScheduleSpec& spec);
// One line per rank: "rank 0: 0F0 0SEND_F0 0F1 ...".
std::string format_schedule(const std::vector<ActionList>& actions);

// One compute action in time (seconds, or simulated units), for timelines and bubbles.
struct TimedAction {
  int rank;
  Action action;
  double start;
  double end;
};
struct Costs {
  double f = 1, b = 2, i = 1, w = 1;
};
// Runs the lists with the given costs and free communication. Runtime error naming the stuck
// ranks and their next actions when the lists deadlock.
std::vector<TimedAction> simulate(const std::vector<ActionList>& actions, const Costs& costs = {});
// 1 - (busy time / (ranks * makespan)): the idle share of the pipeline's time.
double bubble_fraction(const std::vector<TimedAction>& timeline, int pp_size);
// Chrome trace-event JSON (opens in Perfetto, ui.perfetto.dev, or chrome://tracing): one track
// per rank, one slice per compute action.
std::string chrome_trace(const std::vector<TimedAction>& timeline);

// What a stage computes, as functions (the Python package builds one from a kiln.nn.Module).
struct StageFunctions {
  // The stage's forward on one microbatch's inputs.
  std::function<std::vector<Tensor>(const std::vector<Tensor>&)> forward;
  // The same forward on meta tensors, the module's tensors on meta too (Note [Pipeline shapes]).
  std::function<std::vector<Tensor>(const std::vector<Tensor>&)> forward_meta;
  // Optional (FSDP): gather the parameters before the stage's first action, free them after.
  std::function<void()> unshard, reshard;
};

// Note [Pipeline controller]: one process may run every stage of a pipeline, as a client drives
// the workers of a gang (Note [Gang stages] in kiln/client/transport.h): the runner then takes
// all the stages, on no group, and goes through every rank's compute actions in the order the
// schedule's simulation runs them (a topological order of the step). Each action runs between
// enter(stage) and leave(), which place what it records on the stage's workers. Activations and
// gradients go from stage to stage in two halves, where SEND and RECV would run: send() right
// after the action that made them (the stage's workers send at once), receive() just before
// the action that needs them (the next stage's workers wait only then). Each worker thus
// receives its own rank's action list, in order, and the workers run concurrently.
struct Controller {
  int ranks = 1;  // the pipeline's ranks: stage s runs on rank s % ranks
  std::function<void(int stage)> enter;
  std::function<void()> leave;
  // Stage `from`'s tensors as stage `to` will hold them (recorded: the senders' half).
  std::function<std::vector<Tensor>(const std::vector<Tensor>&, int from_stage, int to_stage)> send;
  // The receivers' half, for what send() returned.
  std::function<void(const std::vector<Tensor>&, int from_stage, int to_stage)> receive;
};

// One stage of the pipeline, on the rank (of `group`) that runs it; with no group, one of the
// stages a Controller runs.
class PipelineStage {
 public:
  // A module whose forward takes and returns one tensor. `device`: where the stage's
  // activations are, and so what the group moves (CUDA tensors over an NCCL group).
  PipelineStage(nn::ModulePtr module, int stage_index, int num_stages, ProcessGroupPtr group,
                Device device = Device(kCPU));
  PipelineStage(StageFunctions fns, int stage_index, int num_stages, ProcessGroupPtr group,
                Device device = Device(kCPU));
  int stage_index() const { return index_; }
  int num_stages() const { return num_stages_; }
  bool is_first() const { return index_ == 0; }
  bool is_last() const { return index_ == num_stages_ - 1; }
  const ProcessGroupPtr& group() const { return group_; }
  const StageFunctions& functions() const { return fns_; }
  Device device() const { return device_; }

 private:
  StageFunctions fns_;
  int index_;
  int num_stages_;
  ProcessGroupPtr group_;
  Device device_;
};

// The last stage's loss on one microbatch: (its outputs, the microbatch's target) -> scalar.
using LossFn = std::function<Tensor(const std::vector<Tensor>&, const Tensor&)>;

class ScheduleRunner;

// Runs a schedule's actions for this rank's stages. Losses are scaled by 1/m per microbatch
// before backward, so the accumulated gradients are those of the mean loss over the batch.
class Schedule {
 public:
  // `stages`: this rank's stages (v of them for Interleaved1F1B), all on one group; with a
  // controller, every stage (Note [Pipeline controller]).
  Schedule(std::vector<PipelineStage*> stages, ScheduleKind kind, int n_microbatches,
           LossFn loss_fn, bool fsdp = false, std::optional<Controller> controller = std::nullopt);
  ~Schedule();
  // One training step: forward and backward of every microbatch, the parameters' gradients
  // accumulated. `inputs` (split along dim 0 in n_microbatches) are the first stage's; `target`
  // (split the same way) the last stage's; ranks without those stages pass nothing. Returns the
  // last stage's outputs, concatenated, on its rank (empty elsewhere); appends each
  // microbatch's (unscaled) loss to *losses there.
  std::vector<Tensor> step(const std::vector<Tensor>& inputs = {},
                           const std::optional<Tensor>& target = std::nullopt,
                           std::vector<Tensor>* losses = nullptr);
  // Forward only (no loss, no backward): the last stage's outputs, concatenated.
  std::vector<Tensor> eval(const std::vector<Tensor>& inputs = {});

  const std::vector<ActionList>& actions() const;  // every rank's
  // This rank's compute actions of the last step, timed in seconds from the step's start.
  const std::vector<TimedAction>& last_timeline() const;
  double last_step_seconds() const;

 private:
  std::unique_ptr<ScheduleRunner> runner_;
};

}  // namespace kiln::dist::pipelining
