// Jobs: the queue, the gang scheduler, cancellation, the driver's reports and the watch stream.
// Note [One lock, write-through] (coordinator.cpp) applies.
#include <absl/strings/ascii.h>
#include <absl/strings/str_cat.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include "kiln/coord/coordinator.h"
#include "kiln/proto/program.pb.h"
#include "kiln/proto/service.h"
#include "state.h"

namespace kiln::coord {

namespace {

const std::set<std::string> kJobStates = {"queued",    "running", "preempted", "restarting",
                                          "succeeded", "failed",  "cancelled"};
constexpr int kMaxRestarts = 1000;
constexpr size_t kMaxCheckpointDirBytes = 4096;

// The ranks of a mesh's inner dims (all but the first): a gang's size must be a multiple of it.
int inner_ranks(const proto::Job& j) {
  int64_t n = 1;
  for (int i = 1; i < j.mesh_size(); ++i) n *= j.mesh(i).size();
  return static_cast<int>(n);
}

bool terminal(const std::string& state) {
  return state == "succeeded" || state == "failed" || state == "cancelled";
}

}  // namespace

absl::StatusOr<JobRec*> Coordinator::find_job_locked(const std::string& job_id,
                                                     const std::string& tenant) {
  if (job_id.empty()) return absl::InvalidArgumentError("job_id is required");
  auto it = jobs_.find(job_id);
  // Another tenant's job reads as unknown: its existence is not ours to reveal.
  if (it == jobs_.end() || (!tenant.empty() && it->second.job.tenant() != tenant)) {
    return absl::NotFoundError(absl::StrCat("unknown job ", job_id));
  }
  return &it->second;
}

// Note [Gang scheduling]: the queued job with the highest priority, oldest first, starts when
// N workers are idle, and takes all N at once. Jobs behind it wait even when they would fit,
// so a large gang is never starved by a stream of small ones.
// Note [Quotas]: an operator may cap the worker slots a tenant holds at once (--quota
// TENANT=N): its open sessions, interactive or a running job's, count against it. A job that
// asks for more than the quota is refused at submission; a queued job that would exceed it waits,
// with the reason as its message, and lets the other tenants' jobs go ahead of it (a queued job
// within its quota still waits for free workers in priority order). An interactive session beyond
// the quota is refused at once (RESOURCE_EXHAUSTED), since its client is waiting.
int Coordinator::tenant_workers_locked(const std::string& tenant) {
  int n = 0;
  for (const auto& [id, s] : sessions_)
    if (s.state == "open" && s.tenant == tenant) n += static_cast<int>(s.worker_ids.size());
  return n;
}

absl::Status Coordinator::check_quota_locked(const std::string& tenant, int more) {
  auto q = options_.quotas.find(tenant);
  if (q == options_.quotas.end()) return absl::OkStatus();
  const int used = tenant_workers_locked(tenant);
  if (used + more <= q->second) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat("tenant ", tenant, " holds ", used, " of its ",
                                                   q->second, " worker slots; ", more,
                                                   " more would exceed its quota"));
}

// Note [Placement]: a gang's ranks are chosen host by host. A job's last mesh dim (its innermost,
// the tensor-parallel one by convention, whose groups talk most) splits the ranks into groups of
// consecutive ranks; each group is taken from one host when a host has that many idle workers,
// the hosts with the most idle workers first, so the whole gang also spans few hosts. A group no
// host can hold spills over the fullest hosts. A worker's host is its registered address without
// the port. A job without a mesh is one group per rank: packed by host all the same.
std::vector<std::string> Coordinator::place_locked(const std::vector<std::string>& idle, int n,
                                                   int group) {
  std::map<std::string, std::vector<std::string>> by_host;
  for (const std::string& id : idle) {
    const std::string& addr = workers_.at(id).info.address();
    by_host[addr.substr(0, addr.rfind(':'))].push_back(id);
  }
  std::vector<std::vector<std::string>*> hosts;
  for (auto& [host, ids] : by_host) hosts.push_back(&ids);
  std::vector<std::string> out;
  while (static_cast<int>(out.size()) < n) {
    std::stable_sort(hosts.begin(), hosts.end(),
                     [](const auto* a, const auto* b) { return a->size() > b->size(); });
    const size_t need = std::min<size_t>(std::max(group, 1), n - out.size());
    auto whole =
        std::find_if(hosts.begin(), hosts.end(), [&](const auto* h) { return h->size() >= need; });
    std::vector<std::string>& from = **(whole != hosts.end() ? whole : hosts.begin());
    const size_t take = std::min(need, from.size());
    out.insert(out.end(), from.begin(), from.begin() + static_cast<std::ptrdiff_t>(take));
    from.erase(from.begin(), from.begin() + static_cast<std::ptrdiff_t>(take));
  }
  return out;
}

// Note [Preemption]: when the next job in priority order cannot get its workers, and running
// jobs of lower priority hold enough of them (with the idle ones), the scheduler marks the fewest
// such jobs, lowest priority and latest started first, as preempting (Job.preempting; they stay
// "running"), unless some are preempting already. `kiln submit` then sends its driver SIGTERM
// (KILN_PREEMPT_GRACE_S tells it how long it has) to checkpoint and exit. When the driver exits,
// or after Options::preempt_grace, the job's session ends and the job is "preempted": queued
// again, in its old place, so it runs when workers free up; `kiln submit` then starts its driver
// again with KILN_RESTARTS counting the runs before. A preempted job is never failed. A batch job
// has no driver: its workers are asked to drain (Note [Draining batch jobs] in
// worker/src/batch.h), which checkpoints the step they agree on; its session ends when rank 0
// reports that, and it resumes from that step.
bool Coordinator::preempt_for_locked(const JobRec& next, int idle) {
  std::vector<JobRec*> running;
  for (auto& [id, j] : jobs_) {
    if (j.job.state() != "running") continue;
    if (j.job.preempting()) return false;  // one preemption at a time: wait for it
    if (j.job.priority() < next.job.priority()) running.push_back(&j);
  }
  std::sort(running.begin(), running.end(), [](const JobRec* a, const JobRec* b) {
    return a->job.priority() != b->job.priority()
               ? a->job.priority() < b->job.priority()
               : a->job.started_unix_ms() > b->job.started_unix_ms();
  });
  std::vector<JobRec*> victims;
  for (JobRec* j : running) {
    if (idle >= next.job.workers()) break;
    victims.push_back(j);
    idle += j->job.workers();
  }
  if (idle < next.job.workers()) return false;
  const std::string why = absl::StrCat("job ", next.job.job_id(), " (priority ",
                                       next.job.priority(), ") needs its workers");
  for (JobRec* j : victims) {
    j->job.set_preempting(true);
    j->job.set_message("preempting: " + why);
    j->preempt_asked = Clock::now();
    state_->put_job(*j);
  }
  changed_locked();
  return true;
}

void Coordinator::preempted_locked(JobRec& j, const std::string& why) {
  auto s = sessions_.find(j.job.session_id());
  if (s != sessions_.end() && s->second.state == "open")
    end_session_locked(s->second, "closed", absl::StrCat("job ", j.job.job_id(), " preempted"));
  j.job.set_state(j.growing ? "restarting" : "preempted");  // See Note [Growing back]
  j.job.set_preempting(false);
  j.job.set_message(j.growing ? absl::StrCat(j.job.message(), "; ", why.substr(0, why.find(';')))
                              : why);
  j.growing = false;
  j.restart_after = Clock::now();
  j.job.clear_session_id();
  j.job.clear_worker_addresses();
  state_->put_job(j);
  schedule_locked();
}

// Note [Restarts]: a job submitted with --max-restarts R survives R failures: a driver that
// exits non-zero, or a worker of its gang that dies (its session fails), queues the job again as
// "restarting", in its old place, with a "restart" finding naming why, instead of failing it.
// `kiln submit` stops the old driver and runs COMMAND again once the job runs, with KILN_RESTARTS
// counting the runs before and KILN_CHECKPOINT_DIR / KILN_CHECKPOINT_EVERY as submitted: the
// driver resumes from its last distributed checkpoint there, which loads into any mesh (Note
// [Distributed checkpoint format] in kiln/dist/checkpoint.h). A restart waits one dead-worker
// window (heartbeat x dead_after) first, so a worker that died with the driver is marked dead
// before a gang is chosen. With --min-workers M, a restart takes what is idle, down to M workers
// (a multiple of the mesh's inner dims, whose first dim then shrinks); the first run needs all.
// The job fails when its restarts are used up, or when its driver is gone (Options::driver_grace):
// nobody is left to run COMMAND again.
bool Coordinator::restart_locked(JobRec& j, const std::string& why) {
  if (j.job.restarts() >= j.job.max_restarts()) return false;
  auto s = sessions_.find(j.job.session_id());
  if (s != sessions_.end() && s->second.state == "open")
    end_session_locked(s->second, "closed", absl::StrCat("job ", j.job.job_id(), " restarting"));
  j.job.set_restarts(j.job.restarts() + 1);
  j.growing = false;
  const std::string text = absl::StrCat(why, "; restart ", j.job.restarts(), " of ",
                                        j.job.max_restarts(), ", from its last checkpoint");
  std::fprintf(stderr, "[kiln-coordinator] job %s: %s\n", j.job.job_id().c_str(), text.c_str());
  j.job.set_state("restarting");
  j.job.set_preempting(false);
  j.job.set_message(text);
  j.job.clear_session_id();
  j.job.clear_worker_addresses();
  j.restart_after = Clock::now() + options_.heartbeat * options_.dead_after;
  state_->put_job(j);
  add_job_finding_locked(j, "restart", text);
  return true;
}

// Note [Growing back]: an elastic job (--min-workers M below its size N) that a restart left on
// fewer than N workers grows back when workers are free again: once, for Options::grow_after,
// enough workers have been idle to add at least one block of its inner dims (within its tenant's
// quota) and no job has been waiting for workers, it is preempted as by a higher-priority job
// (Note [Preemption]: its driver gets SIGTERM and the preempt grace to checkpoint and exit), with
// a "grow" finding. When its driver exits, it restarts at once, without using up a restart, on
// what is then free up to N (its first mesh dim grows; the checkpoint reshards on load), and its
// driver runs again. One job grows at a time. A batch job (Note [Elastic batch jobs] in
// worker/src/batch.h) drains instead, as when preempted.
void Coordinator::grow_locked(std::chrono::steady_clock::time_point now) {
  bool waiting = false;
  for (const auto& [id, j] : jobs_) {
    const std::string& st = j.job.state();
    waiting |= st == "queued" || st == "preempted" || st == "restarting";
  }
  const int idle = static_cast<int>(idle_workers_locked().size());
  for (auto& [id, j] : jobs_) {
    const proto::Job& job = j.job;
    int n = 0;
    if (!waiting && job.state() == "running" && !job.preempting() &&
        job.workers() < job.max_workers()) {
      const int inner = inner_ranks(job);
      n = std::min(job.max_workers(), job.workers() + idle) / inner * inner;
      if (n > job.workers() && !check_quota_locked(job.tenant(), n - job.workers()).ok()) n = 0;
    }
    if (n <= job.workers()) {
      j.grow_seen = {};
      continue;
    }
    if (j.grow_seen == Clock::time_point{}) j.grow_seen = now;
    if (now - j.grow_seen < options_.grow_after) continue;
    Transaction t(state_->db());
    j.grow_seen = {};
    j.growing = true;
    j.job.set_preempting(true);
    const std::string why = absl::StrCat("growing from ", job.workers(), " to ", n,
                                         " workers, from its last checkpoint");
    j.job.set_message(why);
    j.preempt_asked = now;
    std::fprintf(stderr, "[kiln-coordinator] job %s: %s\n", job.job_id().c_str(), why.c_str());
    state_->put_job(j);
    add_job_finding_locked(j, "grow", why);
    t.commit();
    changed_locked();
    return;  // one at a time: the idle workers are counted once
  }
}

// What a coordinator can check of a batch job's spec without running it (the workers check the
// rest, and a failure shows as the job's): that it is a BatchJob of sane sizes, whose batch splits
// over the gang (or its mesh's first dim: Note [Batch jobs on a mesh]), with no command beside
// it. See Note [Batch jobs] in worker/src/batch.h.
static absl::Status check_batch_spec(const proto::SubmitJobRequest& req, proto::BatchJob& spec) {
  constexpr size_t kMaxSpecBytes = size_t{8} << 20;  // heartbeat replies carry it (16 MiB max)
  if (!req.command().empty())
    return absl::InvalidArgumentError("a batch job has no command (its workers run its spec)");
  if (req.batch().size() > kMaxSpecBytes)
    return absl::InvalidArgumentError(absl::StrCat("the batch job's spec is ", req.batch().size(),
                                                   " bytes; the limit is ", kMaxSpecBytes));
  if (!spec.ParseFromString(req.batch()))
    return absl::InvalidArgumentError("the batch job's spec is not a BatchJob (program.proto)");
  if (spec.step().nodes_size() == 0 || spec.inputs_size() != spec.step().inputs_size())
    return absl::InvalidArgumentError(absl::StrCat(
        "the batch job's step has ", spec.step().nodes_size(), " nodes, ",
        spec.step().inputs_size(), " inputs and ", spec.inputs_size(), " input sources"));
  if (spec.steps() < 1 || spec.init_checkpoint().empty() || spec.data().empty())
    return absl::InvalidArgumentError(absl::StrCat(
        "the batch job needs steps >= 1 (got ", spec.steps(), "), an initial checkpoint and a "
        "data file"));
  int64_t split = req.workers();
  if (spec.mesh_names_size() > 0 || spec.mesh_shape_size() > 0) {
    std::string dims;
    int64_t product = 1;
    bool sane =
        spec.mesh_names_size() == spec.mesh_shape_size() && spec.mesh_shape_size() <= kMaxMeshDims;
    for (int k = 0; sane && k < spec.mesh_shape_size(); ++k) {
      sane = spec.mesh_shape(k) >= 1 && spec.mesh_shape(k) <= kMaxJobWorkers;
      product *= sane ? spec.mesh_shape(k) : 1;
      absl::StrAppend(&dims, k ? "," : "", spec.mesh_names(k), "=", spec.mesh_shape(k));
    }
    if (!sane || product != req.workers())
      return absl::InvalidArgumentError(
          absl::StrCat("the batch job's step was captured on the mesh ", dims,
                       "; the job asks for ", req.workers(), " workers"));
    bool same = req.mesh_size() == 0 || req.mesh_size() == spec.mesh_names_size();
    for (int k = 0; same && k < req.mesh_size(); ++k)
      same = req.mesh(k).name() == spec.mesh_names(k) && req.mesh(k).size() == spec.mesh_shape(k);
    if (!same)
      return absl::InvalidArgumentError(absl::StrCat(
          "--mesh differs from the mesh the batch job's step was captured on (", dims, ")"));
    split = spec.mesh_shape(0);
  }
  bool programs = spec.program_of_rank_size() == 0 ||
                  (spec.program_of_rank_size() == req.workers() && spec.mesh_names_size() > 0);
  for (int k = 0; programs && k < spec.program_of_rank_size(); ++k)
    programs = spec.program_of_rank(k) >= 0 && spec.program_of_rank(k) < spec.programs_size();
  if (!programs)
    return absl::InvalidArgumentError(absl::StrCat(
        "the batch job's per-rank steps (", spec.program_of_rank_size(), " ranks, ",
        spec.programs_size(), " steps) do not fit its mesh of ", req.workers(), " workers"));
  if (spec.batch_size() < 1 || spec.batch_size() % split != 0)
    return absl::InvalidArgumentError(absl::StrCat("the batch job's batch_size ", spec.batch_size(),
                                                   " does not split over ", split,
                                                   " data-parallel ranks"));
  // See Note [Elastic batch jobs] in worker/src/batch.h.
  if (spec.world_size() != 0 && spec.world_size() != req.workers())
    return absl::InvalidArgumentError(absl::StrCat("the batch job's step was captured for ",
                                                   spec.world_size(), " workers; the job asks for ",
                                                   req.workers()));
  if (req.min_workers() != 0 && req.min_workers() != req.workers()) {
    if (spec.world_size() == 0)
      return absl::InvalidArgumentError(
          "a batch job runs on the world size its step was captured for: no --min-workers (its "
          "spec records no world size; save it again with this kiln for an elastic one)");
    const int inner = req.workers() / static_cast<int>(split);
    if (req.min_workers() % inner != 0)
      return absl::InvalidArgumentError(
          absl::StrCat("min_workers ", req.min_workers(), " is not a multiple of ", inner,
                       ", the ranks of the mesh's inner dims (a restart shrinks the first dim)"));
    for (int r = 0; r < spec.program_of_rank_size(); ++r)
      if (spec.program_of_rank(r) != spec.program_of_rank(r % inner))
        return absl::InvalidArgumentError(
            "the batch job's ranks run different steps along its mesh's first dim: it runs on "
            "its full gang only (no --min-workers)");
  }
  return absl::OkStatus();
}

// How many workers `j` starts on with `idle` free (0: it waits). See Note [Restarts]; a preempted
// elastic job, too, takes what is free.
static int gang_size(const proto::Job& j, int idle) {
  if ((j.state() != "restarting" && j.state() != "preempted") || j.min_workers() >= j.max_workers())
    return j.workers();
  const int inner = inner_ranks(j);
  const int n = std::min(j.max_workers(), idle) / inner * inner;
  return n >= j.min_workers() ? n : 0;
}

void Coordinator::schedule_locked() {
  const auto now = Clock::now();
  while (true) {
    std::vector<JobRec*> queued;
    for (auto& [id, j] : jobs_)
      if (j.job.state() == "queued" || j.job.state() == "preempted" ||
          (j.job.state() == "restarting" && now >= j.restart_after))
        queued.push_back(&j);
    std::sort(queued.begin(), queued.end(), [](const JobRec* a, const JobRec* b) {
      return a->job.priority() != b->job.priority() ? a->job.priority() > b->job.priority()
                                                    : a->seq < b->seq;
    });
    JobRec* next = nullptr;
    for (JobRec* j : queued) {  // See Note [Quotas]
      absl::Status quota = check_quota_locked(j->job.tenant(), j->job.workers());
      const std::string why = quota.ok() ? "" : absl::StrCat("waiting: ", quota.message());
      if (j->job.message() != why) {
        j->job.set_message(why);
        state_->put_job(*j);
      }
      if (quota.ok()) {
        next = j;
        break;
      }
    }
    if (!next) return;
    std::vector<std::string> idle = idle_workers_locked();
    const int n = gang_size(next->job, static_cast<int>(idle.size()));
    if (n == 0 || static_cast<int>(idle.size()) < n) {
      preempt_for_locked(*next, static_cast<int>(idle.size()));
      return;
    }
    proto::Job& job = next->job;
    if (n != job.workers()) {  // an elastic restart on fewer (or again more) workers
      job.set_workers(n);
      if (job.mesh_size() > 0) job.mutable_mesh(0)->set_size(n / inner_ranks(job));
    }
    const int group = job.mesh_size() ? job.mesh(job.mesh_size() - 1).size() : 1;
    idle = place_locked(idle, n, group);
    SessionRec& s = new_session_locked(idle, job.tenant(), job.job_id());
    job.set_state("running");
    job.set_message("");
    job.set_session_id(s.id);
    job.clear_worker_addresses();
    for (const auto& wid : idle) job.add_worker_addresses(workers_.at(wid).info.address());
    job.set_started_unix_ms(now_unix_ms());
    next->driver_seen = Clock::now();  // Options::driver_grace counts from the start
    state_->put_job(*next);
  }
}

void Coordinator::finish_job_locked(JobRec& j, const std::string& state, int exit_code,
                                    const std::string& message) {
  j.job.set_state(state);
  j.job.set_preempting(false);  // ended while preempting (cancelled, a worker died)
  j.growing = false;
  j.job.set_exit_code(exit_code);
  j.job.set_message(message);
  j.job.set_finished_unix_ms(now_unix_ms());
  state_->put_job(j);
  auto s = sessions_.find(j.job.session_id());
  if (s != sessions_.end() && s->second.state == "open") {
    end_session_locked(s->second, "closed", absl::StrCat("job ", j.job.job_id(), " ", state));
  }
}

absl::StatusOr<proto::Job> Coordinator::submit_job(const proto::SubmitJobRequest& req,
                                                   const std::string& tenant) {
  if (auto st = proto::check_version(req.protocol_version(), "client", "coordinator"); !st.ok()) {
    return st;
  }
  if (req.workers() < 1 || req.workers() > kMaxJobWorkers) {
    return absl::InvalidArgumentError(
        absl::StrCat("workers must be in [1, ", kMaxJobWorkers, "], got ", req.workers()));
  }
  const bool batch = !req.batch().empty();  // See Note [Batch jobs] in worker/src/batch.h
  proto::BatchJob spec;
  if (batch) {
    if (auto st = check_batch_spec(req, spec); !st.ok()) return st;
  } else if (req.command().empty() || req.command(0).empty()) {
    return absl::InvalidArgumentError(
        "command is required (the driver program and its args), or a batch job's spec");
  }
  size_t bytes = 0;
  for (const auto& arg : req.command()) bytes += arg.size() + 1;
  if (bytes > kMaxCommandBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("command is ", bytes, " bytes; the limit is ", kMaxCommandBytes));
  }
  // See Note [Restarts].
  if (req.max_restarts() < 0 || req.max_restarts() > kMaxRestarts)
    return absl::InvalidArgumentError(absl::StrCat("max_restarts must be in [0, ", kMaxRestarts,
                                                   "], got ", req.max_restarts()));
  if (req.min_workers() < 0 || req.min_workers() > req.workers())
    return absl::InvalidArgumentError(absl::StrCat("min_workers must be in [1, workers = ",
                                                   req.workers(), "], got ", req.min_workers()));
  if (req.checkpoint_every() < 0)
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint_every must be >= 0 steps, got ", req.checkpoint_every()));
  if (req.checkpoint_dir().size() > kMaxCheckpointDirBytes ||
      req.checkpoint_dir().find('\0') != std::string::npos)
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint_dir must be a path of at most ", kMaxCheckpointDirBytes, " bytes"));
  if (req.mesh_size() > 0) {  // See Note [Placement]
    if (req.mesh_size() > kMaxMeshDims)
      return absl::InvalidArgumentError(
          absl::StrCat("mesh has ", req.mesh_size(), " dims; at most ", kMaxMeshDims));
    int64_t product = 1;
    std::set<std::string> names;
    for (const proto::MeshDim& d : req.mesh()) {
      const bool ok_name = !d.name().empty() && d.name().size() <= 32 &&
                           std::all_of(d.name().begin(), d.name().end(),
                                       [](char c) { return absl::ascii_isalnum(c) || c == '_'; });
      if (!ok_name || !names.insert(d.name()).second)
        return absl::InvalidArgumentError(absl::StrCat(
            "mesh dim names must be distinct, 1 to 32 of [A-Za-z0-9_], got '", d.name(), "'"));
      if (d.size() < 1 || d.size() > kMaxJobWorkers)
        return absl::InvalidArgumentError(
            absl::StrCat("mesh dim '", d.name(), "' has size ", d.size(), "; it must be >= 1"));
      product *= d.size();
      if (product > kMaxJobWorkers) break;
    }
    if (product != req.workers())
      return absl::InvalidArgumentError(absl::StrCat(
          "the mesh has ", product, " ranks but the job asks for ", req.workers(), " workers"));
    const int64_t inner = product / req.mesh(0).size();
    if (req.min_workers() > 0 && req.min_workers() % inner != 0)
      return absl::InvalidArgumentError(absl::StrCat(
          "min_workers ", req.min_workers(), " is not a multiple of ", inner,
          ", the ranks of the mesh's inner dims (a restart shrinks the first dim, '",
          req.mesh(0).name(), "')"));
  }
  std::lock_guard lock(mu_);
  if (auto q = options_.quotas.find(tenant);
      q != options_.quotas.end() && req.workers() > q->second)
    return absl::ResourceExhaustedError(absl::StrCat("the job asks for ", req.workers(),
                                                     " workers; tenant ", tenant, "'s quota is ",
                                                     q->second, " worker slots"));  // Note [Quotas]
  JobRec r;
  r.seq = last_seq_ + 1;
  r.job.set_job_id(absl::StrCat("job-", r.seq));
  r.job.set_state("queued");
  r.job.set_workers(req.workers());
  r.job.set_priority(req.priority());
  *r.job.mutable_command() = req.command();
  *r.job.mutable_mesh() = req.mesh();
  for (int k = 0; req.mesh_size() == 0 && k < spec.mesh_names_size(); ++k) {  // a batch job's
    proto::MeshDim& d = *r.job.add_mesh();
    d.set_name(spec.mesh_names(k));
    d.set_size(static_cast<int32_t>(spec.mesh_shape(k)));
  }
  r.job.set_max_restarts(req.max_restarts());
  r.job.set_min_workers(req.min_workers() > 0 ? req.min_workers() : req.workers());
  r.job.set_max_workers(req.workers());
  r.job.set_checkpoint_dir(req.checkpoint_dir());
  r.job.set_checkpoint_every(req.checkpoint_every());
  r.job.set_batch(batch);
  r.spec = req.batch();
  r.job.set_tenant(tenant);
  r.job.set_submitted_unix_ms(now_unix_ms());
  Transaction t(state_->db());
  state_->put_job(r);
  if (batch) state_->put_spec(r.job.job_id(), r.spec);
  JobRec& stored = jobs_[r.job.job_id()] = r;
  schedule_locked();
  t.commit();
  last_seq_ = r.seq;
  changed_locked();
  return stored.job;
}

absl::StatusOr<proto::Job> Coordinator::get_job(const proto::GetJobRequest& req,
                                                const std::string& tenant) {
  std::lock_guard lock(mu_);
  auto j = find_job_locked(req.job_id(), tenant);
  if (!j.ok()) return j.status();
  return (*j)->job;
}

absl::StatusOr<proto::ListJobsReply> Coordinator::list_jobs(const proto::ListJobsRequest& req,
                                                            const std::string& tenant) {
  if (!req.state().empty() && !kJobStates.count(req.state())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state must be one of queued, running, preempted, restarting, succeeded, failed, "
        "cancelled; got '",
        req.state(), "'"));
  }
  std::lock_guard lock(mu_);
  std::vector<const JobRec*> picked;
  for (const auto& [id, j] : jobs_) {
    if ((tenant.empty() || j.job.tenant() == tenant) &&
        (req.state().empty() || j.job.state() == req.state())) {
      picked.push_back(&j);
    }
  }
  std::sort(picked.begin(), picked.end(), [](auto* a, auto* b) { return a->seq < b->seq; });
  proto::ListJobsReply reply;
  for (const JobRec* j : picked) *reply.add_jobs() = j->job;
  return reply;
}

absl::StatusOr<proto::Job> Coordinator::cancel_job(const proto::CancelJobRequest& req,
                                                   const std::string& tenant) {
  std::lock_guard lock(mu_);
  auto found = find_job_locked(req.job_id(), tenant);
  if (!found.ok()) return found.status();
  JobRec& j = **found;
  const std::string& state = j.job.state();
  if (state == "cancelled") return j.job;
  if (terminal(state)) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", j.job.job_id(), " already ", state, "; nothing to cancel"));
  }
  Transaction t(state_->db());
  finish_job_locked(j, "cancelled", 0, "cancelled by request");
  schedule_locked();
  t.commit();
  changed_locked();
  return j.job;
}

absl::StatusOr<proto::Job> Coordinator::report_job(const proto::JobReport& report,
                                                   const std::string& tenant) {
  std::lock_guard lock(mu_);
  auto found = find_job_locked(report.job_id(), tenant);
  if (!found.ok()) return found.status();
  JobRec& j = **found;
  if (j.job.state() == "queued") {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", j.job.job_id(), " is queued; a driver reports once it is running"));
  }
  if (j.job.state() != "running") return j.job;  // cancelled, failed, preempted meanwhile: stop
  if (report.log_lines().empty() && !report.finished()) return j.job;
  Transaction t(state_->db());
  std::vector<std::string> lines;
  for (const auto& line : report.log_lines()) {
    lines.push_back(line.size() > kMaxLogLineBytes ? line.substr(0, kMaxLogLineBytes) : line);
  }
  state_->append_logs(j.job.job_id(), lines);
  if (report.finished() && j.job.preempting()) {  // See Note [Preemption]
    preempted_locked(j, absl::StrCat("preempted (its driver exited with code ", report.exit_code(),
                                     "); it runs again when workers free up"));
  } else if (report.finished()) {
    const int code = report.exit_code();
    const std::string why = absl::StrCat("the driver exited with code ", code);
    if (code == 0 || !restart_locked(j, why))  // See Note [Restarts]
      finish_job_locked(j, code == 0 ? "succeeded" : "failed", code, code == 0 ? "" : why);
    schedule_locked();
  }
  t.commit();
  changed_locked();
  return j.job;
}

void Coordinator::driver_attached(const std::string& job_id, const std::string& tenant,
                                  bool attached) {
  std::lock_guard lock(mu_);
  auto found = find_job_locked(job_id, tenant);
  if (!found.ok()) return;
  JobRec& j = **found;
  j.drivers += attached ? 1 : -1;
  j.driver_seen = Clock::now();
}

absl::Status Coordinator::watch_job(const proto::WatchJobRequest& req, const std::string& tenant,
                                    const std::function<bool(const proto::JobEvent&)>& send,
                                    const Cancelled& cancelled) {
  constexpr int64_t kBatch = 256;
  int64_t sent_lines = 0;
  std::string sent_state;
  bool sent_preempting = false;
  std::unique_lock lock(mu_);
  uint64_t seen = version_ - 1;  // forces the first pass
  while (true) {
    cv_.wait_for(lock, std::chrono::milliseconds(200),
                 [&] { return version_ != seen || stopping_; });
    if (stopping_) return absl::UnavailableError("the coordinator is shutting down");
    if (cancelled()) return absl::CancelledError("the client went away");
    if (version_ == seen) continue;
    seen = version_;
    auto found = find_job_locked(req.job_id(), tenant);
    if (!found.ok()) return found.status();
    const proto::Job job = (*found)->job;
    // Logs before the state: a finished job's last lines arrive before its final state.
    std::vector<std::string> lines;
    do {
      lines = state_->logs(job.job_id(), sent_lines, kBatch);
      sent_lines += static_cast<int64_t>(lines.size());
      lock.unlock();
      for (auto& line : lines) {
        proto::JobEvent e;
        e.set_log_line(std::move(line));
        if (!send(e)) return absl::CancelledError("the client went away");
      }
      lock.lock();
    } while (static_cast<int64_t>(lines.size()) == kBatch);
    if (job.state() != sent_state || job.preempting() != sent_preempting) {
      sent_state = job.state();
      sent_preempting = job.preempting();  // See Note [Preemption]
      proto::JobEvent e;
      *e.mutable_job() = job;
      lock.unlock();
      if (!send(e)) return absl::CancelledError("the client went away");
      lock.lock();
    }
    // A finished job takes no more lines, so the loop above has drained them all.
    if (!req.follow() || terminal(job.state())) return absl::OkStatus();
  }
}

std::map<std::string, int> Coordinator::job_counts() {
  std::lock_guard lock(mu_);
  std::map<std::string, int> out;
  for (const auto& s : kJobStates) out[s] = 0;
  for (const auto& [id, j] : jobs_) ++out[j.job.state()];
  return out;
}

}  // namespace kiln::coord
