// A worker's part of a batch job (See Note [Batch jobs] in batch.h).
#include "batch.h"

#include <absl/strings/str_cat.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "coordinator_link.h"
#include "gang.h"
#include "kiln/compiler/export.h"
#include "kiln/compiler/graph.h"
#include "kiln/dist/checkpoint.h"
#include "kiln/dist/device_mesh.h"
#include "kiln/dist/dtensor.h"
#include "kiln/dist/process_group.h"
#include "kiln/generated/ops.h"
#include "kiln/ir.h"
#include "kiln/proto/codec.h"
#include "kiln/proto/program.pb.h"
#include "kiln/safetensors.h"
#include "kiln/worker/stream_gate.h"
#include "reports.h"
#include "session_state.h"

namespace kiln::worker {

namespace {

constexpr auto kEnterWait = std::chrono::seconds(10);  // for a client stream still tearing down

int64_t unix_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

// The step to resume after, from a checkpoint's extra JSON ({"values": {"step": N}}, as
// kiln.distributed.checkpoint stores non-tensor values); 0 when it has none.
int64_t saved_step(const std::string& extra) {
  const auto j = nlohmann::json::parse(extra, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("values") || !j["values"].is_object()) return 0;
  const auto& v = j["values"];
  return v.contains("step") && v["step"].is_number_integer() ? v["step"].get<int64_t>() : 0;
}

// The product of the spec's mesh dims after the first (1 without a mesh): the ranks that share
// one data-parallel rank's rows.
int64_t inner_ranks(const proto::BatchJob& spec) {
  int64_t inner = 1;
  for (int k = 1; k < spec.mesh_shape_size(); ++k) inner *= spec.mesh_shape(k);
  return inner;
}

// The step's mesh on this gang (its first dim is what the gang leaves: Note [Elastic batch
// jobs]), and its collectives' "@DIM" groups renamed to this rank's group along DIM (See Note
// [Batch jobs on a mesh]).
dist::DeviceMesh mesh_of(proto::BatchJob& spec, Device device, int world, const std::string& what) {
  std::vector<std::string> names(spec.mesh_names().begin(), spec.mesh_names().end());
  std::vector<int64_t> shape(spec.mesh_shape().begin(), spec.mesh_shape().end());
  const int64_t inner = inner_ranks(spec);
  KILN_CHECK(!names.empty() && names.size() == shape.size() && inner >= 1 && world % inner == 0,
             Value, what, ": the step's mesh ", IntArrayRef(shape), " does not fit the gang of ",
             world, " workers");
  shape[0] = world / inner;
  dist::DeviceMesh mesh = dist::init_device_mesh(device.is_cuda() ? "cuda" : "cpu", shape, names);
  proto::rename_collective_groups(
      *spec.mutable_step(), [&](const std::string&, const std::string& group) {
        return group.size() > 1 && group[0] == '@' ? mesh.group(group.substr(1))->name() : group;
      });
  return mesh;
}

// An empty DTensor state entry whose shard is graph input `ts` (Note [Batch jobs on a mesh]).
Tensor dtensor_state(const proto::BatchInput& in, const TensorSpec& ts,
                     const dist::DeviceMesh& mesh, Device device, const std::string& what) {
  dist::DTensorSpec spec;
  spec.mesh = mesh.submesh({in.mesh_dims().begin(), in.mesh_dims().end()});
  spec.placements = session_detail::decode_placements(in.placements());
  for (int64_t d : in.shape()) spec.shape.push_back(d);
  spec.stride = DimVector(spec.shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(spec.shape.size()) - 2; d >= 0; --d)
    spec.stride[d] = spec.stride[d + 1] * std::max<int64_t>(spec.shape[d + 1], 1);
  spec.dtype = ts.dtype;
  KILN_CHECK(spec.placements.size() == static_cast<size_t>(spec.mesh.ndim()) &&
                 dist::local_shape(spec.shape, spec.mesh, spec.placements) == ts.sizes,
             Value, what, ": state '", in.state(), "' (", IntArrayRef(spec.shape), " on ",
             spec.mesh.str(), ") does not give this rank the step's ", IntArrayRef(ts.sizes));
  Tensor local = empty_strided(IntArrayRef(ts.sizes), IntArrayRef(ts.strides), ts.dtype, device);
  return dist::detail::make_dtensor(std::move(local), std::move(spec));
}

}  // namespace

// Note [Draining batch jobs]: a batch job that is preempted or grows (Note [Preemption],
// Note [Growing back] in coordinator/src/jobs.cpp) has no driver to checkpoint it, so the
// coordinator asks its workers to drain (HeartbeatReply.drain_sessions). The ranks must stop
// after the same step, and the request reaches them at different steps. So every so often,
// after a step, they all-reduce (max) a pair: whether any was asked, and the seconds a step took
// since the last check. The next check comes about kDrainCheck seconds of steps later (between 1
// and 1024 steps), a number each rank computes from the reduced pair, so all agree on it. Once a
// check finds a request, every rank saves the checkpoint of that step (unless the periodic one
// just did), and the run ends with BatchResult.drained. The coordinator then requeues the job,
// which resumes from that step: nothing is lost. Without a checkpoint directory the run stops
// there and restarts from the initial state. A rank that never answers is stopped by the
// coordinator's preempt grace, as a driver would be.
constexpr double kDrainCheck = 0.5;

proto::BatchResult run_batch(const proto::BatchRun& run, Device device,
                             const std::atomic<bool>& stop, const std::atomic<bool>& drain) {
  proto::BatchResult res;
  res.set_session_id(run.session_id());
  int64_t step = 0;
  const std::string what = absl::StrCat("batch job ", run.job_id(), " (rank ", run.rank(), ")");
  try {
    proto::BatchJob spec;
    KILN_CHECK(spec.ParseFromString(run.spec()), Value, what, ": the spec is not a BatchJob");
    const int world = run.world_size(), rank = run.rank();
    // See Note [Elastic batch jobs].
    const int64_t captured = spec.world_size() > 0 ? spec.world_size() : world;
    KILN_CHECK(world <= captured, Value, what, ": a gang of ", world,
               " workers for a step captured on ", captured);
    if (spec.program_of_rank_size() > 0) {  // this rank's own step (Note [Batch jobs on a mesh])
      const int ranks = spec.program_of_rank_size();
      const int64_t inner = inner_ranks(spec);
      KILN_CHECK(ranks == captured && inner >= 1, Value, what, ": the spec has steps for ", ranks,
                 " ranks, captured on ", captured);
      // On fewer workers, the step of the captured rank at this rank's place in its tp group;
      // allowed only where the steps repeat along the first dim.
      for (int r = 0; world != captured && r < ranks; ++r)
        KILN_CHECK(spec.program_of_rank(r) == spec.program_of_rank(static_cast<int>(r % inner)),
                   Value, what,
                   ": the ranks' steps differ along the mesh's first dim, so the job "
                   "runs on its ",
                   captured, " workers only");
      const int k = spec.program_of_rank(world == captured ? rank : static_cast<int>(rank % inner));
      KILN_CHECK(k >= 0 && k < spec.programs_size(), Value, what, ": step ", k, " of ",
                 spec.programs_size());
      proto::BatchProgram* p = spec.mutable_programs(k);
      spec.mutable_step()->Swap(p->mutable_step());
      spec.mutable_inputs()->Swap(p->mutable_inputs());
      spec.set_loss(p->loss());
    }
    // The batch splits over the mesh's first dim (data parallel), or over the whole gang.
    dist::DeviceMesh mesh;
    int64_t dp_size = world, dp = rank;
    if (spec.mesh_names_size() > 0) {
      mesh = mesh_of(spec, device, world, what);
      dp_size = mesh.size(0);
      dp = mesh.coordinate()[0];
    }
    ir::Graph g = proto::decode_graph(spec.step());
    const size_t n = g.inputs().size();
    KILN_CHECK(static_cast<size_t>(spec.inputs_size()) == n, Value, what, ": ", spec.inputs_size(),
               " input sources for a step of ", n, " inputs");
    KILN_CHECK(spec.loss() >= -1 && spec.loss() < static_cast<int>(g.outputs().size()), Value, what,
               ": loss output ", spec.loss(), " of a step with ", g.outputs().size(), " outputs");
    // Each data-parallel rank's rows are fixed; on fewer workers the global batch is smaller.
    const int64_t captured_dp = captured / inner_ranks(spec);
    KILN_CHECK(world >= 1 && spec.batch_size() > 0 && spec.batch_size() % captured_dp == 0, Value,
               what, ": batch_size ", spec.batch_size(), " is not a positive multiple of the ",
               captured_dp, " data-parallel ranks");
    const int64_t rows = spec.batch_size() / captured_dp, batch = rows * dp_size;

    // The state, shaped as the step's inputs, loaded by name; and the data inputs.
    TensorMap state;
    std::vector<Tensor> inputs(n);
    std::vector<std::pair<size_t, Tensor>> data;  // input index, the whole data tensor
    SafetensorsData file;
    bool file_loaded = false;
    for (size_t i = 0; i < n; ++i) {
      const TensorSpec& ts = g.value(g.inputs()[i]).meta;
      const proto::BatchInput& in = spec.inputs(static_cast<int>(i));
      if (in.has_state()) {
        KILN_CHECK(in.placements_size() == 0 || spec.mesh_names_size() > 0, Value, what,
                   ": state '", in.state(), "' is a DTensor, but the step has no mesh");
        Tensor t =
            in.placements_size() > 0
                ? dtensor_state(in, ts, mesh, device, what)
                : empty_strided(IntArrayRef(ts.sizes), IntArrayRef(ts.strides), ts.dtype, device);
        KILN_CHECK(state.emplace(in.state(), t).second, Value, what, ": state '", in.state(),
                   "' feeds two inputs");
        inputs[i] = dist::is_dtensor(t) ? dist::detail::local_of(t) : t;
      } else if (in.has_data()) {
        if (!file_loaded) {
          file = load_safetensors(spec.data());
          file_loaded = true;
        }
        auto it = file.tensors.find(in.data());
        KILN_CHECK(it != file.tensors.end(), Value, what, ": the data file '", spec.data(),
                   "' has no tensor '", in.data(), "'");
        const Tensor& all = it->second;
        DimVector want = ts.sizes;
        KILN_CHECK(!want.empty() && want[0] == rows &&
                       all.dim() == static_cast<int64_t>(want.size()) && all.size(0) > 0 &&
                       all.dtype() == ts.dtype,
                   Value, what, ": data '", in.data(), "' is ", all.dtype(), all.sizes(),
                   "; the step takes ", ts.dtype, IntArrayRef(want), " per rank (batch_size ",
                   batch, " over ", dp_size, " data-parallel ranks)");
        for (size_t d = 1; d < want.size(); ++d)
          KILN_CHECK(all.size(static_cast<int64_t>(d)) == want[d], Value, what, ": data '",
                     in.data(), "' is ", all.sizes(), "; the step takes ", IntArrayRef(want),
                     " per rank");
        data.emplace_back(i, all.to(std::nullopt, device));
      } else {  // a wrapped number the graph holds (Note [Exported steps])
        inputs[i] = compiler::constant_input(g, i);
        KILN_CHECK(inputs[i].defined(), Value, what, ": input ", i,
                   " has no source (state or data) and is no constant of the step");
      }
    }
    // A restart resumes from the job's checkpoint directory; the first run starts from the
    // initial checkpoint.
    namespace fs = std::filesystem;
    const std::string& dir = run.checkpoint_dir();
    const bool resume = !dir.empty() && fs::exists(fs::path(dir) / ".metadata");
    // Not strict: a checkpoint may hold state the step never reads (a tied weight's second name).
    const std::string from = resume ? dir : spec.init_checkpoint();
    dist::checkpoint::LoadResult loaded = dist::checkpoint::load(state, from, /*strict=*/false);
    KILN_CHECK(loaded.missing_keys.empty(), Value, what, ": the checkpoint in '", from,
               "' lacks the step's state ", loaded.missing_keys.front(),
               loaded.missing_keys.size() > 1 ? " (and more)" : "");
    step = resume ? saved_step(loaded.extra) : 0;
    res.set_resumed(step);

    // See Note [Random batch steps].
    compiler::CompiledGraph step_graph(std::move(g),
                                       {spec.rng_seed(), spec.rng_offset(), spec.rng_count()});
    auto mark = std::chrono::steady_clock::now();
    double waited = dist::collective_wait_seconds();
    int64_t checked = step, next_check = step + 1;  // See Note [Draining batch jobs].
    auto checked_at = mark;
    auto save = [&](int64_t s) {
      dist::checkpoint::save(state, dir, nlohmann::json{{"values", {{"step", s}}}}.dump());
    };
    for (int64_t s = step + 1; s <= spec.steps(); ++s) {
      KILN_CHECK(!stop.load(), Runtime, what, ": stopped before step ", s,
                 " (its session ended)");
      for (auto& [i, all] : data) {  // rank dp's rows of global batch s - 1, wrapping around
        const int64_t first = ((s - 1) * batch + dp * rows) % all.size(0);
        Tensor index = remainder(arange(first, first + rows, 1, kInt64, device),
                                 full({1}, all.size(0), kInt64, device));
        inputs[i] = index_select(all, 0, index);
      }
      const uint64_t base =
          (static_cast<uint64_t>(s - 1) * dp_size + static_cast<uint64_t>(dp)) * spec.rng_count();
      std::vector<Tensor> outs = step_graph.run(inputs, spec.seed(), base);
      const auto now = std::chrono::steady_clock::now();
      const double seconds = std::chrono::duration<double>(now - mark).count();
      const double w = dist::collective_wait_seconds();
      proto::StepRecord r;  // See Note [Step telemetry] in reports.h
      r.set_session_id(run.session_id());
      r.set_step(s);
      r.set_rank(rank);
      r.set_unix_ms(unix_ms());
      r.set_seconds(seconds);
      r.set_busy_seconds(std::max(0.0, seconds - (w - waited)));
      r.set_tokens(static_cast<double>(batch));
      if (spec.loss() >= 0 && outs[spec.loss()].defined() && outs[spec.loss()].numel() == 1)
        r.set_loss(outs[spec.loss()].item().to_double());
      report_step(std::move(r));
      mark = now;
      waited = w;
      const bool saved =
          run.checkpoint_every() > 0 && s % run.checkpoint_every() == 0 && !dir.empty();
      if (saved) save(s);
      step = s;
      if (s == next_check && s < spec.steps()) {
        const double per_step = std::chrono::duration<double>(now - checked_at).count() /
                                static_cast<double>(s - checked);
        Tensor ask = empty_on({2}, kFloat64, kCPU);
        double* got = static_cast<double*>(ask.impl()->raw_data());
        got[0] = drain.load() ? 1.0 : 0.0;
        got[1] = per_step;
        if (!device.is_cpu()) ask = ask.to(std::nullopt, device);  // NCCL reduces on the GPU
        dist::default_group()->all_reduce(ask, dist::ReduceOp::Max)->wait();
        if (!device.is_cpu()) {
          ask = ask.to(std::nullopt, kCPU);
          got = static_cast<double*>(ask.impl()->raw_data());
        }
        if (got[0] > 0) {
          if (!saved && !dir.empty()) save(s);
          res.set_drained(true);
          res.set_message(
              absl::StrCat("stopped on request after step ", s,
                           dir.empty() ? " (no checkpoint directory)" : ", checkpointed"));
          break;
        }
        checked = s;
        checked_at = now;
        next_check = s + std::clamp<int64_t>(
                             static_cast<int64_t>(kDrainCheck / std::max(got[1], 1e-9)), 1, 1024);
      }
    }
    res.set_ok(!res.drained());
  } catch (const std::exception& e) {
    res.set_ok(false);
    res.set_message(e.what());
  }
  res.set_steps(step);
  return res;
}

BatchRunner::~BatchRunner() {
  std::vector<Run> runs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Run& r : runs_) r.stop->store(true);
    runs.swap(runs_);
  }
  for (Run& r : runs) r.thread.join();
}

std::vector<std::string> BatchRunner::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {running_.begin(), running_.end()};
}

void BatchRunner::start(CoordinatorLink& link, const proto::BatchRun& run) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!seen_.insert(run.session_id()).second) return;  // started before (a repeated BatchRun)
  for (auto it = runs_.begin(); it != runs_.end();) {  // runs that have returned: joined at once
    if (it->done->load()) {
      it->thread.join();
      it = runs_.erase(it);
    } else {
      ++it;
    }
  }
  auto stop = std::make_shared<std::atomic<bool>>(false);
  auto done = std::make_shared<std::atomic<bool>>(false);
  auto drain = std::make_shared<std::atomic<bool>>(false);
  running_.insert(run.session_id());
  runs_.push_back({run.session_id(), std::thread([this, &link, run, stop, done, drain] {
                     main(link, run, *stop, *drain);
                     done->store(true);
                   }),
                   stop, done, drain});
}

void BatchRunner::drain(const std::string& session_id) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Run& r : runs_)
    if (r.session_id == session_id) r.drain->store(true);
}

void BatchRunner::main(CoordinatorLink& link, const proto::BatchRun& run, std::atomic<bool>& stop,
                       const std::atomic<bool>& drain) {
  proto::BatchResult res;
  // The worker's one stream slot, as a client's session holds it: the coordinator's close (or
  // another session) stops the run and aborts its collectives.
  absl::StatusOr<StreamGate::Lease> lease = gate_.enter(
      run.session_id(),
      [this, &stop, id = run.session_id()] {
        stop.store(true);
        gang_.abort(id, "ended (the coordinator closed it)");
      },
      kEnterWait);
  if (!lease.ok()) {
    res.set_session_id(run.session_id());
    res.set_message(std::string(lease.status().message()));
  } else {
    // Even a gang of one: the step's collectives need a "world" of this run (not one left by
    // an earlier gang: Note [Elastic batch jobs]).
    absl::Status joined =
        gang_.join(link, run.session_id(), run.rank(), run.world_size(), host_, device_).get();
    if (joined.ok()) {
      res = run_batch(run, device_, stop, drain);
    } else {
      res.set_session_id(run.session_id());
      res.set_message(std::string(joined.message()));
    }
  }
  report_batch_result(std::move(res));
  std::lock_guard<std::mutex> lock(mu_);
  running_.erase(run.session_id());
}

}  // namespace kiln::worker
