// Remote profiling: the coordinator's side (See Note [Remote profiling] in profiles.h).
#include "profiles.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kiln/coord/coordinator.h"
#include "kiln/proto/service.h"
#include "state.h"

namespace kiln::coord {

namespace fs = std::filesystem;
using json = nlohmann::json;

absl::StatusOr<std::string> merge_traces(const std::vector<RankTrace>& ranks) {
  int64_t base = std::numeric_limits<int64_t>::max();
  for (const RankTrace& r : ranks)
    base = std::min(base, r.profile.origin_unix_us() + r.profile.clock_offset_us());
  json events = json::array(), clocks = json::array();
  for (const RankTrace& r : ranks) {
    json trace = json::parse(r.profile.trace(), nullptr, /*allow_exceptions=*/false);
    if (trace.is_discarded() || !trace.is_object() || !trace.contains("traceEvents") ||
        !trace["traceEvents"].is_array())
      return absl::InvalidArgumentError(absl::StrCat("rank ", r.rank, " (worker ", r.worker_id,
                                                     ") sent a trace that is not Chrome trace "
                                                     "JSON with a traceEvents array"));
    const int64_t shift = r.profile.origin_unix_us() + r.profile.clock_offset_us() - base;
    const std::string name = absl::StrCat("rank ", r.rank, " (worker ", r.worker_id, ")");
    events.push_back({{"ph", "M"},
                      {"name", "process_name"},
                      {"pid", r.rank},
                      {"tid", 0},
                      {"args", {{"name", name}}}});
    events.push_back({{"ph", "M"},
                      {"name", "process_sort_index"},
                      {"pid", r.rank},
                      {"tid", 0},
                      {"args", {{"sort_index", r.rank}}}});
    for (json& e : trace["traceEvents"]) {
      if (!e.is_object()) continue;
      if (e.value("ph", "") == "M" && e.value("name", "") == "process_name") continue;
      e["pid"] = r.rank;
      if (e.contains("ts") && e["ts"].is_number())
        e["ts"] = e["ts"].get<double>() + static_cast<double>(shift);
      events.push_back(std::move(e));
    }
    clocks.push_back({{"rank", r.rank},
                      {"worker", r.worker_id},
                      {"origin_unix_us", r.profile.origin_unix_us()},
                      {"clock_offset_us", r.profile.clock_offset_us()},
                      {"clock_rtt_us", r.profile.clock_rtt_us()}});
  }
  json out = {{"schemaVersion", 1},
              {"displayTimeUnit", "ms"},
              {"traceEvents", std::move(events)},
              {"otherData", {{"base_unix_us", base}, {"ranks", std::move(clocks)}}}};
  return out.dump();
}

namespace {

// `worker_id`'s rank in the session, -1 when it is not in it (or the session is gone).
int rank_in(const std::map<std::string, SessionRec>& sessions, const std::string& session_id,
            const std::string& worker_id) {
  auto s = sessions.find(session_id);
  return s == sessions.end() ? -1 : s->second.rank_of(worker_id);
}

fs::path profile_dir(const std::string& state_path, const std::string& job_id) {
  return fs::path(state_path + ".profiles") / job_id;
}

}  // namespace

// See Note [Remote profiling]: the profile requests of a worker's gang, and its traces.
void Coordinator::profile_beat_locked(const proto::HeartbeatRequest& req, const WorkerRec& w,
                                      proto::HeartbeatReply& reply) {
  for (const proto::RankProfile& p : req.profiles()) {
    for (auto& [job_id, run] : profile_runs_) {
      if (run.profile_id != p.profile_id() || run.session_id != p.session_id()) continue;
      const int rank = rank_in(sessions_, run.session_id, req.worker_id());
      if (rank < 0) continue;
      proto::RankProfile& got = run.got[rank] = p;
      if (got.trace().size() > proto::kMaxRankTraceBytes) {
        got.clear_trace();
        got.set_error(absl::StrCat("its trace exceeds ", proto::kMaxRankTraceBytes, " bytes"));
      }
      changed_locked();
    }
  }
  for (const auto& [job_id, run] : profile_runs_) {
    if (run.session_id != w.info.session_id()) continue;
    const int rank = rank_in(sessions_, run.session_id, req.worker_id());
    if (rank < 0 || run.got.count(rank)) continue;
    proto::ProfileRequest& r = *reply.add_profile();
    r.set_session_id(run.session_id);
    r.set_profile_id(run.profile_id);
    r.set_steps(run.steps);
    r.set_first_step(run.first_step);
  }
}

absl::Status Coordinator::profile_job(const proto::ProfileJobRequest& req,
                                      const std::string& tenant,
                                      const std::function<bool(const proto::ProfileChunk&)>& send,
                                      const Cancelled& cancelled) {
  if (req.steps() < 1 || req.steps() > kMaxProfileSteps)
    return absl::InvalidArgumentError(
        absl::StrCat("steps must be in [1, ", kMaxProfileSteps, "], got ", req.steps()));
  const auto timeout =
      req.timeout_ms() ? std::chrono::milliseconds(req.timeout_ms()) : kDefaultProfileTimeout;
  if (timeout > kMaxProfileTimeout)
    return absl::InvalidArgumentError(absl::StrCat(
        "timeout_ms must be at most ", kMaxProfileTimeout.count(), ", got ", req.timeout_ms()));
  std::unique_lock lock(mu_);
  absl::StatusOr<JobRec*> found = find_job_locked(req.job_id(), tenant);
  if (!found.ok()) return found.status();
  const proto::Job& job = (*found)->job;
  auto s = sessions_.find(job.session_id());
  if (job.state() != "running" || s == sessions_.end() || s->second.state != "open")
    return absl::FailedPreconditionError(absl::StrCat("job ", req.job_id(), " is ", job.state(),
                                                      ", not running: only a running "
                                                      "job can be profiled"));
  if (auto busy = profile_runs_.find(req.job_id()); busy != profile_runs_.end())
    return absl::FailedPreconditionError(
        absl::StrCat("job ", req.job_id(), " is already being profiled (profile ",
                     busy->second.profile_id, "); wait for it to finish"));
  const std::string job_id = req.job_id(), session_id = job.session_id();
  const std::vector<std::string> gang = s->second.worker_ids;
  ProfileRun& run = profile_runs_[job_id];
  run.profile_id = ++last_profile_id_;
  run.session_id = session_id;
  run.steps = req.steps();
  // Every rank's window starts at the same step: far enough past the latest step any rank marked
  // that the request reaches every rank first (3 heartbeats at the fastest rank's step rate).
  int64_t latest = 0;
  double fastest = 1.0;
  for (const proto::StepRecord& r : job.last_steps()) {
    latest = std::max(latest, r.step());
    if (r.seconds() > 0) fastest = std::min(fastest, r.seconds());
  }
  const double beats = 3.0 * std::chrono::duration<double>(options_.heartbeat).count();
  const int64_t margin = static_cast<int64_t>(std::ceil(beats / std::max(fastest, 1e-3))) + 1;
  run.first_step = job.last_steps().empty() ? 0 : latest + std::min<int64_t>(margin, 10000);
  const int64_t profile_id = run.profile_id, run_first_step = run.first_step;
  struct Forget {  // the request ends with this call, however it ends
    Coordinator& c;
    std::string job_id;
    ~Forget() { c.profile_runs_.erase(job_id); }  // under mu_: see the relock below
  };
  const auto until = Clock::now() + timeout;
  std::map<int, proto::RankProfile> got;
  {
    Forget forget{*this, job_id};
    while (true) {
      if (stopping_) return absl::UnavailableError("the coordinator is shutting down");
      if (cancelled()) return absl::CancelledError("the client went away");
      const ProfileRun& r = profile_runs_.at(job_id);
      if (r.got.size() == gang.size() || Clock::now() >= until) break;
      auto now = sessions_.find(session_id);
      if (now == sessions_.end() || now->second.state != "open")
        return absl::FailedPreconditionError(
            absl::StrCat("job ", job_id, " stopped running while it was being profiled"));
      cv_.wait_for(lock, std::chrono::milliseconds(200));
    }
    got = profile_runs_.at(job_id).got;
  }

  std::vector<RankTrace> traces;
  proto::ProfileInfo info;
  info.set_profile_id(profile_id);
  info.set_steps(req.steps());
  for (int rank = 0; rank < static_cast<int>(gang.size()); ++rank) {
    const std::string who = absl::StrCat("rank ", rank, " (worker ", gang[rank], ")");
    auto g = got.find(rank);
    if (g == got.end()) {
      info.add_missing(absl::StrCat(who, ": no trace within ", timeout.count(),
                                    " ms (it profiles from its mark of step ", run_first_step,
                                    " on: does the job mark steps?)"));
    } else if (!g->second.error().empty()) {
      info.add_missing(absl::StrCat(who, ": ", g->second.error()));
    } else {
      info.add_ranks(rank);
      traces.push_back({rank, gang[rank], std::move(g->second)});
    }
  }
  if (traces.empty()) {
    const std::string why = absl::StrCat("no rank of job ", job_id,
                                         " sent a trace: ", absl::StrJoin(info.missing(), "; "));
    return got.empty() ? absl::DeadlineExceededError(why) : absl::FailedPreconditionError(why);
  }
  lock.unlock();  // merging and writing take a while
  absl::StatusOr<std::string> merged = merge_traces(traces);
  if (!merged.ok()) return merged.status();
  info.set_bytes(static_cast<int64_t>(merged->size()));
  info.set_unix_ms(now_unix_ms());
  const fs::path dir = profile_dir(options_.state_path, job_id);
  std::error_code ec;
  fs::create_directories(dir, ec);
  {
    std::ofstream f(dir / absl::StrCat(profile_id, ".json"), std::ios::binary);
    f << *merged;
    std::ofstream i(dir / absl::StrCat(profile_id, ".info"), std::ios::binary);
    i << info.SerializeAsString();
    if (!f.good() || !i.good())
      return absl::InternalError(
          absl::StrCat("cannot write the merged profile under ", dir.string()));
  }
  lock.lock();
  if (auto j = jobs_.find(job_id); j != jobs_.end()) {
    auto& list = *j->second.job.mutable_profiles();
    *list.Add() = info;
    while (list.size() > kMaxProfilesPerJob) {
      fs::remove(dir / absl::StrCat(list[0].profile_id(), ".json"), ec);
      fs::remove(dir / absl::StrCat(list[0].profile_id(), ".info"), ec);
      list.DeleteSubrange(0, 1);
    }
    changed_locked();
  }
  lock.unlock();
  proto::ProfileChunk first;
  *first.mutable_info() = info;
  if (!send(first)) return absl::CancelledError("the client went away");
  for (size_t at = 0; at < merged->size(); at += proto::kChunkBytes) {
    proto::ProfileChunk c;
    c.set_data(merged->substr(at, proto::kChunkBytes));
    if (!send(c)) return absl::CancelledError("the client went away");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Coordinator::read_profile(const std::string& job_id,
                                                      const std::string& tenant,
                                                      int64_t profile_id) {
  {
    std::lock_guard lock(mu_);
    absl::StatusOr<JobRec*> j = find_job_locked(job_id, tenant);
    if (!j.ok()) return j.status();
    const auto& list = (*j)->job.profiles();
    if (std::none_of(list.begin(), list.end(),
                     [&](const proto::ProfileInfo& p) { return p.profile_id() == profile_id; }))
      return absl::NotFoundError(absl::StrCat("job ", job_id, " has no profile ", profile_id));
  }
  std::ifstream f(profile_dir(options_.state_path, job_id) / absl::StrCat(profile_id, ".json"),
                  std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  if (!f.good())
    return absl::NotFoundError(
        absl::StrCat("profile ", profile_id, " of job ", job_id, " is gone from the disk"));
  return s.str();
}

// The profiles kept on disk, listed again on their jobs after a restart (Note [Remote
// profiling]); also where profile ids continue from.
void Coordinator::load_profiles_locked() {
  for (auto& [job_id, j] : jobs_) {
    std::error_code ec;
    std::vector<proto::ProfileInfo> found;
    for (const fs::directory_entry& e :
         fs::directory_iterator(profile_dir(options_.state_path, job_id), ec)) {
      if (e.path().extension() != ".info") continue;
      std::ifstream f(e.path(), std::ios::binary);
      proto::ProfileInfo info;
      if (info.ParseFromIstream(&f)) found.push_back(std::move(info));
    }
    std::sort(found.begin(), found.end(),
              [](const auto& a, const auto& b) { return a.profile_id() < b.profile_id(); });
    j.job.clear_profiles();
    for (proto::ProfileInfo& p : found) {
      last_profile_id_ = std::max(last_profile_id_, p.profile_id());
      *j.job.add_profiles() = std::move(p);
    }
  }
}

}  // namespace kiln::coord
