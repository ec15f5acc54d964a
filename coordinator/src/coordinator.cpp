// The worker registry, heartbeats, step telemetry and the reaper. Sessions are in sessions.cpp,
// jobs and the scheduler in jobs.cpp, the rendezvous store in kv.cpp.
//
// Note [One lock, write-through]: every record lives in memory under mu_, and every mutation
// writes the records it changed to SQLite inside one transaction before the lock is released.
// So a coordinator killed at any point restarts from a state some client already saw.
//
#include "kiln/coord/coordinator.h"

#include <absl/strings/ascii.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <arpa/inet.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <optional>

#include "desync.h"
#include "kiln/proto/service.h"
#include "state.h"
#include "stragglers.h"

namespace kiln::coord {

namespace {

bool host_char(char c) { return absl::ascii_isalnum(c) || c == '.' || c == '-' || c == '_'; }

// The limits of kMaxWorkerIdBytes and kMaxAddressBytes (coordinator.h).
absl::Status check_registration(const proto::RegisterWorkerRequest& req) {
  const std::string& id = req.worker_id();
  if (id.empty()) return absl::InvalidArgumentError("worker_id is required");
  if (id.size() > kMaxWorkerIdBytes ||
      !std::all_of(id.begin(), id.end(), [](char c) { return host_char(c); }))
    return absl::InvalidArgumentError(
        absl::StrCat("worker_id '", shown(id), "' must be 1 to ", kMaxWorkerIdBytes,
                     " characters of [A-Za-z0-9._-]"));
  const std::string& addr = req.address();
  if (addr.empty()) return absl::InvalidArgumentError("address is required (host:port)");
  auto bad_address = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("address '", shown(addr), "' is not HOST:PORT: ", why));
  };
  if (addr.size() > kMaxAddressBytes)
    return bad_address(absl::StrCat("longer than ", kMaxAddressBytes, " bytes"));
  const size_t colon = addr.rfind(':');
  if (colon == std::string::npos) return bad_address("no port");
  const std::string host = addr.substr(0, colon), port = addr.substr(colon + 1);
  int port_number = 0;
  if (port.empty() || !std::all_of(port.begin(), port.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(port, &port_number) || port_number < 1 || port_number > 65535)
    return bad_address("the port must be a number in [1, 65535]");
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    in6_addr v6;
    if (inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), &v6) != 1)
      return bad_address("not an IPv6 address in the brackets");
  } else if (host.empty() || !std::all_of(host.begin(), host.end(), host_char)) {
    return bad_address("the host must be a name or an address of [A-Za-z0-9._-]");
  }
  const std::string& dev = req.device();
  int index = -1;
  if (!dev.empty() && dev != "cpu" &&
      !(dev.rfind("cuda:", 0) == 0 && dev.size() > 5 && dev.size() <= 10 &&
        std::all_of(dev.begin() + 5, dev.end(), absl::ascii_isdigit) &&
        absl::SimpleAtoi(dev.substr(5), &index) && index <= 32767))
    return absl::InvalidArgumentError(
        absl::StrCat("device '", shown(dev), "' must be cpu or cuda:N"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::open(const Options& options) {
  if (options.heartbeat.count() <= 0) return absl::InvalidArgumentError("heartbeat must be > 0 ms");
  if (options.dead_after < 1) return absl::InvalidArgumentError("dead_after must be >= 1");
  std::unique_ptr<Coordinator> c(new Coordinator(options));
  if (auto st = c->state_->open(options.state_path); !st.ok()) return st;
  Loaded loaded = c->state_->load();
  c->workers_ = std::move(loaded.workers);
  c->sessions_ = std::move(loaded.sessions);
  c->jobs_ = std::move(loaded.jobs);
  c->last_seq_ = loaded.max_seq;
  c->load_profiles_locked();  // not shared yet: no lock needed
  // Loaded workers get a fresh grace period (WorkerRec::last_beat): they beat on, or re-register
  // after a NOT_FOUND, or the reaper fails their sessions.
  c->reaper_ = std::thread([p = c.get()] { p->reap_loop(); });
  return c;
}

Coordinator::Coordinator(const Options& options)
    : options_(options), state_(std::make_unique<State>()) {}

Coordinator::~Coordinator() {
  shutdown();
  if (reaper_.joinable()) reaper_.join();
}

void Coordinator::shutdown() {
  std::lock_guard lock(mu_);
  stopping_ = true;
  cv_.notify_all();
}

void Coordinator::changed_locked() {
  ++version_;
  cv_.notify_all();
}

// ---- workers ----

absl::StatusOr<proto::RegisterWorkerReply> Coordinator::register_worker(
    const proto::RegisterWorkerRequest& req) {
  if (auto st = proto::check_version(req.protocol_version(), "worker", "coordinator"); !st.ok()) {
    return st;
  }
  if (auto st = check_registration(req); !st.ok()) return st;
  std::lock_guard lock(mu_);
  Transaction t(state_->db());
  WorkerRec& w = workers_[req.worker_id()];
  if (!w.info.session_id().empty()) {
    auto it = sessions_.find(w.info.session_id());
    if (it != sessions_.end() && it->second.state == "open") {
      end_session_locked(it->second, "failed",
                         absl::StrCat("worker ", req.worker_id(), " restarted (registered again)"));
    }
  }
  w.info.set_worker_id(req.worker_id());
  w.info.set_address(req.address());
  w.info.set_device(req.device().empty() ? "cpu" : req.device());
  w.info.set_state("idle");
  w.info.set_session_id("");
  w.info.set_epoch(w.info.epoch() + 1);
  w.info.set_memory_in_use_bytes(0);
  w.memory_limit_bytes = req.memory_limit_bytes();
  w.last_beat = Clock::now();
  state_->put_worker(w);
  schedule_locked();
  t.commit();
  changed_locked();
  proto::RegisterWorkerReply reply;
  reply.set_epoch(w.info.epoch());
  reply.set_heartbeat_interval_ms(static_cast<uint32_t>(options_.heartbeat.count()));
  return reply;
}

absl::StatusOr<proto::HeartbeatReply> Coordinator::heartbeat(const proto::HeartbeatRequest& req) {
  if (req.worker_id().empty()) return absl::InvalidArgumentError("worker_id is required");
  std::lock_guard lock(mu_);
  auto it = workers_.find(req.worker_id());
  if (it == workers_.end()) {
    return absl::NotFoundError(
        absl::StrCat("unknown worker ", req.worker_id(), "; register again"));
  }
  const int64_t received_us = now_unix_us();  // See Note [Remote profiling] in profiles.h
  WorkerRec& w = it->second;
  if (req.epoch() != w.info.epoch()) {
    return absl::AbortedError(absl::StrCat("stale epoch ", req.epoch(), " for worker ",
                                           req.worker_id(), " (now ", w.info.epoch(),
                                           "): a newer registration replaced it"));
  }
  if (w.info.state() == "dead") {
    return absl::NotFoundError(absl::StrCat(
        "worker ", req.worker_id(), " was marked dead after missed heartbeats; register again"));
  }
  w.last_beat = Clock::now();
  w.info.set_last_heartbeat_unix_ms(now_unix_ms());
  w.info.set_memory_in_use_bytes(req.memory_in_use_bytes());
  proto::HeartbeatReply reply;
  for (const auto& sid : req.sessions()) {
    if (sid != w.info.session_id())
      reply.add_close_sessions(sid);
    else
      w.session_seen = w.last_beat;
  }
  // See Note [Desync detection] in desync.h. Records of a session this worker is not in, or one
  // that ended, are ignored.
  int taken = 0;
  for (const proto::CollectiveRecord& r : req.collectives()) {
    if (++taken > kMaxCollectivesPerBeat) break;
    auto s = sessions_.find(r.session_id());
    if (s == sessions_.end() || s->second.state != "open") continue;
    const int rank = s->second.rank_of(req.worker_id());
    if (rank < 0) continue;
    for (const std::string& report : desync_[r.session_id()].add(rank, r, Clock::now()))
      add_finding_locked(s->second, "desync", report);
  }
  record_steps_locked(req);
  // See Note [Hang detection]: this worker's account, and whether one is wanted.
  for (const proto::StackDump& d : req.dumps()) {
    auto s = sessions_.find(d.session_id());
    auto hw = hangs_.find(d.session_id());
    if (s == sessions_.end() || hw == hangs_.end() || !hw->second.asked) continue;
    if (const int rank = s->second.rank_of(req.worker_id()); rank >= 0)
      hw->second.dumps[rank] = d.text().substr(0, kMaxDumpBytes);
  }
  if (auto hw = hangs_.find(w.info.session_id());
      hw != hangs_.end() && hw->second.asked && !hw->second.reported) {
    const int rank = sessions_.at(hw->first).rank_of(req.worker_id());
    if (rank >= 0 && !hw->second.dumps.count(rank)) reply.add_dump_sessions(hw->first);
  }
  batch_beat_locked(req, w, reply);
  profile_beat_locked(req, w, reply);
  reply.set_received_unix_us(received_us);
  reply.set_replied_unix_us(now_unix_us());
  return reply;
}

// See Note [Batch jobs] in worker/src/batch.h: a worker of a running batch job's session that
// does not serve it yet is told to run it (again at every beat until it does: the worker runs a
// session's batch once); a run's end finishes the job (rank 0's success) or restarts or fails it
// (any rank's failure), as a driver's exit would.
void Coordinator::batch_beat_locked(const proto::HeartbeatRequest& req, const WorkerRec& w,
                                    proto::HeartbeatReply& reply) {
  for (const proto::BatchResult& r : req.batch_results()) {
    auto s = sessions_.find(r.session_id());
    if (s == sessions_.end()) continue;
    const int rank = s->second.rank_of(req.worker_id());
    auto j = jobs_.find(s->second.job_id);
    if (rank < 0 || j == jobs_.end()) continue;
    JobRec& job = j->second;
    Transaction t(state_->db());
    const std::string from =
        r.resumed() > 0 ? absl::StrCat(" (resumed after step ", r.resumed(), ")") : "";
    const std::string line =
        r.ok() ? absl::StrCat("[kiln-worker rank ", rank, "] finished step ", r.steps(), from)
        : r.drained() ? absl::StrCat("[kiln-worker rank ", rank, "] drained after step ", r.steps(),
                                     from, ": ", r.message())
                      : absl::StrCat("[kiln-worker rank ", rank, "] failed after step ", r.steps(),
                                     from, ": ", r.message());
    state_->append_logs(job.job.job_id(), {line.substr(0, kMaxLogLineBytes)});
    // The run of a session that is over (a restart, a cancel) is only logged.
    const bool current = s->second.state == "open" && job.job.state() == "running" &&
                         job.job.session_id() == s->first;
    if (r.drained()) {  // See Note [Draining batch jobs]: every rank stopped after this step
      if (current && rank == 0 && job.job.preempting()) {
        preempted_locked(job, absl::StrCat("preempted after step ", r.steps(),
                                           "; it runs again from there when workers free up"));
      } else if (current && rank == 0) {
        const std::string why = absl::StrCat("rank 0 stopped after step ", r.steps(), " unasked");
        if (!restart_locked(job, why)) finish_job_locked(job, "failed", 1, why);
        schedule_locked();
      }
    } else if (current && !r.ok()) {
      const std::string why = absl::StrCat("rank ", rank, " failed: ", r.message());
      if (!restart_locked(job, why)) finish_job_locked(job, "failed", 1, why);
      schedule_locked();
    } else if (current && rank == 0) {
      finish_job_locked(job, "succeeded", 0, "");
      schedule_locked();
    }
    t.commit();
    changed_locked();
  }
  const std::string& sid = w.info.session_id();
  auto s = sessions_.find(sid);
  if (s == sessions_.end() || s->second.state != "open" || s->second.job_id.empty()) return;
  auto j = jobs_.find(s->second.job_id);
  if (j == jobs_.end() || !j->second.job.batch() || j->second.job.state() != "running") return;
  if (j->second.job.preempting()) reply.add_drain_sessions(sid);  // Note [Draining batch jobs]
  if (std::find(req.sessions().begin(), req.sessions().end(), sid) != req.sessions().end()) return;
  const proto::Job& job = j->second.job;
  proto::BatchRun& run = *reply.add_run_batches();
  run.set_session_id(sid);
  run.set_session_secret(s->second.secret);
  run.set_job_id(job.job_id());
  run.set_rank(s->second.rank_of(req.worker_id()));
  run.set_world_size(static_cast<int32_t>(s->second.worker_ids.size()));
  run.set_spec(j->second.spec);
  run.set_checkpoint_dir(job.checkpoint_dir());
  run.set_checkpoint_every(job.checkpoint_every());
}

// Note [Hang detection]: a running job whose driver marks steps (Session.log_step: Note [Step
// telemetry] in worker/src/reports.h) and has marked none for Options::hang_after, or for 10x
// the median of its latest step times if that is longer, looks hung. The coordinator then asks
// each of its workers (in the reply to its next heartbeat) for an account of itself: what its
// executor is doing and for how long (an instruction and its op, a compiled segment, or idle),
// its process groups' last collectives and their states, and its threads' native stacks (Note
// [Thread stacks] in worker/src/stacks.h). Once every rank answered, or 5 s after asking, the
// answers become one finding, rank by rank: in `kiln status`, the job's log and the metrics. A
// new step re-arms the watch; a job that marks no steps is never judged.
void Coordinator::watch_hangs_locked(Clock::time_point now) {
  for (auto& [sid, hw] : hangs_) {
    auto s = sessions_.find(sid);
    if (s == sessions_.end() || s->second.state != "open" || hw.reported) continue;
    if (!hw.asked) {
      std::vector<double> sorted = hw.recent;
      std::sort(sorted.begin(), sorted.end());
      const double median = sorted.empty() ? 0 : sorted[sorted.size() / 2];
      const auto limit = std::max<Clock::duration>(
          options_.hang_after,
          std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(10 * median)));
      if (now - hw.last_step < limit) continue;
      hw.asked = true;
      hw.asked_at = now;
      std::cerr << "kiln-coordinator: session " << sid << ": no step for "
                << std::chrono::duration<double>(now - hw.last_step).count()
                << " s; asking its workers what they are doing" << std::endl;
      continue;
    }
    const std::vector<std::string>& ids = s->second.worker_ids;
    if (hw.dumps.size() < ids.size() && now - hw.asked_at < std::chrono::seconds(5)) continue;
    hw.reported = true;
    std::string text = absl::StrCat(
        "no step for ",
        absl::SixDigits(std::chrono::duration<double>(hw.asked_at - hw.last_step).count()),
        " s after step ", hw.step, "; what each rank was doing:");
    for (size_t r = 0; r < ids.size(); ++r) {
      auto d = hw.dumps.find(static_cast<int>(r));
      absl::StrAppend(&text, "\n--- rank ", r, " (worker ", ids[r], ") ---\n",
                      d == hw.dumps.end() ? "no answer within 5 s\n" : d->second);
    }
    add_finding_locked(s->second, "hang", text);
  }
}

namespace {

// A step record with only sane numbers, or nullopt (See Note [Step telemetry] in
// worker/src/reports.h).
std::optional<proto::StepRecord> sane_step(const proto::StepRecord& in, int rank) {
  auto finite = [](double v, double hi) { return std::isfinite(v) && v >= 0 && v <= hi; };
  if (in.step() < 1 || in.step() > (int64_t{1} << 50) || !finite(in.seconds(), 1e7) ||
      !finite(in.busy_seconds(), 1e7) || !finite(in.tokens(), 1e18))
    return std::nullopt;
  proto::StepRecord r = in;
  r.set_rank(rank);
  r.set_busy_seconds(std::min(r.busy_seconds(), r.seconds()));
  if (r.has_loss() && !std::isfinite(r.loss())) r.clear_loss();
  r.clear_session_id();
  return r;
}

}  // namespace

void Coordinator::record_steps_locked(const proto::HeartbeatRequest& req) {
  std::map<std::string, std::vector<proto::StepRecord>> by_job;
  int taken = 0;
  for (const proto::StepRecord& in : req.steps()) {
    if (++taken > kMaxStepsPerBeat) break;
    // An ended session's last steps may come with the beat after its end: still its job's.
    auto s = sessions_.find(in.session_id());
    if (s == sessions_.end() || s->second.job_id.empty()) continue;
    const int rank = s->second.rank_of(req.worker_id());
    if (rank < 0) continue;
    std::optional<proto::StepRecord> r = sane_step(in, rank);
    if (!r) continue;
    HangWatch& hw = hangs_[s->first];  // See Note [Hang detection]
    if (r->step() > hw.step) {
      hw = HangWatch{.step = r->step(), .recent = std::move(hw.recent)};
    }
    if (r->rank() == 0) {
      hw.recent.push_back(r->seconds());
      if (hw.recent.size() > 20) hw.recent.erase(hw.recent.begin());
    }
    auto [det, fresh] =
        stragglers_.try_emplace(s->first, static_cast<int>(s->second.worker_ids.size()));
    for (const std::string& report : det->second.add(*r))
      add_finding_locked(s->second, "straggler", report);
    by_job[s->second.job_id].push_back(*r);
  }
  if (by_job.empty()) return;
  Transaction t(state_->db());
  for (const auto& [job_id, records] : by_job) {
    auto j = jobs_.find(job_id);
    if (j == jobs_.end()) continue;
    for (const proto::StepRecord& r : records) {
      state_->put_step(job_id, r);
      auto* last = j->second.job.mutable_last_steps();
      auto same = std::find_if(last->begin(), last->end(),
                               [&](const proto::StepRecord& l) { return l.rank() == r.rank(); });
      if (same == last->end())
        *last->Add() = r;
      else if (same->step() <= r.step())
        *same = r;
    }
  }
  t.commit();
  changed_locked();
}

absl::StatusOr<proto::JobStepsReply> Coordinator::job_steps(const proto::JobStepsRequest& req,
                                                            const std::string& tenant) {
  if (req.from_step() < 0)
    return absl::InvalidArgumentError(
        absl::StrCat("from_step must be >= 0, got ", req.from_step()));
  if (req.limit() < 0 || req.limit() > kMaxJobStepsReply)
    return absl::InvalidArgumentError(
        absl::StrCat("limit must be 0..", kMaxJobStepsReply, ", got ", req.limit()));
  std::lock_guard lock(mu_);
  auto j = find_job_locked(req.job_id(), tenant);
  if (!j.ok()) return j.status();
  proto::JobStepsReply reply;
  for (proto::StepRecord& r :
       state_->steps(req.job_id(), req.from_step(), req.limit() ? req.limit() : 10000))
    *reply.add_steps() = std::move(r);
  return reply;
}

std::vector<std::pair<std::string, proto::StepRecord>> Coordinator::running_steps() {
  std::lock_guard lock(mu_);
  std::vector<std::pair<std::string, proto::StepRecord>> out;
  for (const auto& [id, j] : jobs_)
    if (j.job.state() == "running")
      for (const proto::StepRecord& r : j.job.last_steps()) out.emplace_back(id, r);
  return out;
}

void Coordinator::add_finding_locked(const SessionRec& s, const std::string& kind,
                                     const std::string& text) {
  std::cerr << "kiln-coordinator: session " << s.id << ": " << kind << ": " << text << std::endl;
  auto j = jobs_.find(s.job_id);
  if (j == jobs_.end()) {
    ++findings_[kind];
    return;
  }
  Transaction t(state_->db());
  add_job_finding_locked(j->second, kind, text);
  t.commit();
  changed_locked();
}

void Coordinator::add_job_finding_locked(JobRec& j, const std::string& kind,
                                         const std::string& text) {
  ++findings_[kind];
  proto::Finding f;
  f.set_kind(kind);
  f.set_text(text);
  f.set_unix_ms(now_unix_ms());
  *j.job.add_findings() = f;
  state_->put_finding(j.job.job_id(), j.job.findings_size() - 1, f);
  state_->append_logs(j.job.job_id(), {absl::StrCat("[kiln-coordinator] ", kind, ": ", text)});
}

std::map<std::string, int> Coordinator::finding_counts() {
  std::lock_guard lock(mu_);
  return findings_;
}

proto::ListWorkersReply Coordinator::list_workers(const Caller& caller) {
  std::lock_guard lock(mu_);
  proto::ListWorkersReply reply;
  for (const auto& [id, w] : workers_) {
    proto::WorkerInfo& info = *reply.add_workers() = w.info;
    if (caller.kind != Caller::Kind::kTenant || info.session_id().empty()) continue;
    auto s = sessions_.find(info.session_id());
    if (s == sessions_.end() || s->second.tenant != caller.tenant) info.clear_session_id();
  }
  return reply;
}

void Coordinator::reap_loop() {
  std::unique_lock lock(mu_);
  const auto tick = std::max(options_.heartbeat / 4, std::chrono::milliseconds(10));
  while (!stopping_) {
    cv_.wait_for(lock, tick, [&] { return stopping_; });
    if (stopping_) break;
    try {
      reap_locked();
    } catch (const std::exception& e) {
      // A broken state file: the next tick tries again; the RPCs report it as INTERNAL.
      std::fprintf(stderr, "kiln-coordinator: reaper: %s\n", e.what());
    }
  }
}

void Coordinator::reap_locked() {
  const auto limit = options_.heartbeat * options_.dead_after;
  const auto now = Clock::now();
  watch_hangs_locked(now);
  for (auto& [sid, detector] : desync_) {  // See Note [Desync detection] in desync.h
    auto s = sessions_.find(sid);
    if (s != sessions_.end())
      for (const std::string& report : detector.poll(now))
        add_finding_locked(s->second, "desync", report);
  }
  std::vector<WorkerRec*> dead;
  std::vector<std::string> forgotten;  // dead for Options::worker_retention
  for (auto& [id, w] : workers_) {
    if (w.info.state() != "dead" && now - w.last_beat > limit) dead.push_back(&w);
    if (w.info.state() == "dead" && now - w.died > options_.worker_retention)
      forgotten.push_back(id);
  }
  // Interactive sessions whose client never streamed, or went away (Options::session_idle).
  std::vector<SessionRec*> idle;
  std::vector<std::string> expired;
  for (auto& [id, s] : sessions_) {
    if (s.state != "open" && now - s.ended > options_.session_retention) expired.push_back(id);
    if (s.state != "open" || !s.job_id.empty()) continue;
    bool seen = false;
    for (const auto& wid : s.worker_ids) {
      auto w = workers_.find(wid);
      seen |= w != workers_.end() && now - w->second.session_seen <= options_.session_idle;
    }
    if (!seen) idle.push_back(&s);
  }
  // Running jobs whose driver has been gone for Options::driver_grace.
  std::vector<JobRec*> orphaned;
  for (auto& [id, s] : sessions_) {
    if (s.state != "open" || s.job_id.empty()) continue;
    auto j = jobs_.find(s.job_id);
    if (j != jobs_.end() && j->second.job.state() == "running" && !j->second.job.batch() &&
        j->second.drivers == 0 && now - j->second.driver_seen > options_.driver_grace)
      orphaned.push_back(&j->second);
  }
  // Preempting jobs whose driver has not exited within Options::preempt_grace.
  std::vector<JobRec*> overdue;
  for (auto& [id, j] : jobs_)
    if (j.job.state() == "running" && j.job.preempting() &&
        now - j.preempt_asked > options_.preempt_grace)
      overdue.push_back(&j);
  grow_locked(now);  // See Note [Growing back] in jobs.cpp
  // Restarting jobs whose wait is over (See Note [Restarts] in jobs.cpp).
  bool restart_due = false;
  for (auto& [id, j] : jobs_)
    restart_due |= j.job.state() == "restarting" && now >= j.restart_after;
  if (dead.empty() && forgotten.empty() && idle.empty() && expired.empty() && orphaned.empty() &&
      overdue.empty() && !restart_due)
    return;
  Transaction t(state_->db());
  for (const std::string& id : expired) {
    sessions_.erase(id);
    // Kept until now: a session's last steps may come with the beat after its end.
    desync_.erase(id);
    stragglers_.erase(id);
    hangs_.erase(id);
    state_->delete_session(id);
  }
  for (const std::string& id : forgotten) {
    workers_.erase(id);
    state_->delete_worker(id);
  }
  for (SessionRec* s : idle) {
    const std::string why = absl::StrCat("no client streamed to session ", s->id, " for ",
                                         options_.session_idle.count() / 1000.0, " s");
    std::fprintf(stderr, "kiln-coordinator: %s; closed\n", why.c_str());
    end_session_locked(*s, "closed", why);
  }
  for (JobRec* j : overdue)  // See Note [Preemption] in jobs.cpp
    preempted_locked(
        *j, absl::StrCat("preempted (its ",
                         j->job.batch() ? "workers did not checkpoint" : "driver did not exit",
                         " within ", options_.preempt_grace.count() / 1000.0,
                         " s); it runs again when workers free up"));
  for (JobRec* j : orphaned) {
    const std::string why =
        absl::StrCat("no driver has reported for ", options_.driver_grace.count() / 1000.0,
                     " s (kiln submit killed, or it lost the coordinator and did not come back)");
    std::fprintf(stderr, "kiln-coordinator: job %s: %s; failed\n", j->job.job_id().c_str(),
                 why.c_str());
    finish_job_locked(*j, "failed", 0, why);
  }
  for (WorkerRec* w : dead) {
    const std::string why = absl::StrCat("worker ", w->info.worker_id(), " stopped heartbeating");
    std::fprintf(stderr, "kiln-coordinator: %s; marked dead\n", why.c_str());
    auto s = sessions_.find(w->info.session_id());
    if (s != sessions_.end() && s->second.state == "open")
      end_session_locked(s->second, "failed", why);
    w->info.set_state("dead");
    w->info.set_session_id("");
    w->died = now;
    state_->put_worker(*w);
  }
  schedule_locked();
  t.commit();
  changed_locked();
}

std::vector<std::string> Coordinator::idle_workers_locked() {
  std::vector<std::string> out;
  for (const auto& [id, w] : workers_) {
    if (w.info.state() == "idle") out.push_back(id);
  }
  return out;
}

std::map<std::string, int> Coordinator::worker_counts() {
  std::lock_guard lock(mu_);
  std::map<std::string, int> out{{"idle", 0}, {"busy", 0}, {"dead", 0}};
  for (const auto& [id, w] : workers_) ++out[w.info.state()];
  return out;
}

}  // namespace kiln::coord
