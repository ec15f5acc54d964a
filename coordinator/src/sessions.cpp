// Gang sessions: opening one on idle workers (or queueing), looking one up for a worker or
// a client, closing it; who may do each. Note [One lock, write-through] (coordinator.cpp)
// applies.
//
// Note [Session credentials]: who may use a session.
//  - Its tenant's clients (the tenant's token): OpenSession hands them the session, with its
//    secret; LookupSession, Store and CloseSession; ListWorkers names the session to them only.
//  - The workers of its gang (the worker token, naming a worker_id of the gang): LookupSession
//    and Store.
//  - With auth off (loopback only), every caller is every tenant.
// The session id names a session; it is no credential. A client streams to a worker with a
// Hello carrying the session id and its secret (128 random bits, made here and handed out only
// by OpenSession). The worker forwards the secret in its LookupSession, and the coordinator
// compares it, so the secret never needs to reach the workers, and another tenant, or someone
// without any token, who learned a session id cannot use it. Any other tenant's use of a session
// is PERMISSION_DENIED; a missing or unknown token is UNAUTHENTICATED (service.cpp).
#include <absl/strings/str_cat.h>

#include <algorithm>
#include <chrono>
#include <mutex>

#include "kiln/coord/coordinator.h"
#include "kiln/proto/service.h"
#include "state.h"

namespace kiln::coord {

SessionRec& Coordinator::new_session_locked(const std::vector<std::string>& worker_ids,
                                            const std::string& tenant, const std::string& job_id) {
  std::string id;
  do {
    id = absl::StrCat("s-", random_hex(8));
  } while (sessions_.count(id));
  SessionRec& s = sessions_[id];
  s = SessionRec{id, "open", job_id, tenant, "", worker_ids, now_unix_ms(), random_hex(16)};
  for (const auto& wid : worker_ids) {
    WorkerRec& w = workers_.at(wid);
    w.info.set_state("busy");
    w.info.set_session_id(id);
    w.session_seen = Clock::now();
    state_->put_worker(w);
  }
  kv_[id];
  state_->put_session(s);
  return s;
}

// Ends an open session: its live workers go back to idle, its store is dropped, and a running
// job on it fails with the same message (when the session failed).
void Coordinator::end_session_locked(SessionRec& s, const std::string& state,
                                     const std::string& message) {
  s.state = state;
  s.message = message;
  s.ended = Clock::now();
  for (const auto& wid : s.worker_ids) {
    auto it = workers_.find(wid);
    if (it == workers_.end() || it->second.info.session_id() != s.id) continue;
    it->second.info.set_session_id("");
    if (it->second.info.state() == "busy") it->second.info.set_state("idle");
    state_->put_worker(it->second);
  }
  kv_.erase(s.id);
  state_->put_session(s);
  if (state == "failed" && !s.job_id.empty()) {
    auto j = jobs_.find(s.job_id);
    if (j != jobs_.end() && j->second.job.state() == "running" &&
        !restart_locked(j->second, message)) {  // See Note [Restarts] in jobs.cpp
      finish_job_locked(j->second, "failed", 0, message);
    }
  }
}

proto::SessionInfo Coordinator::session_info_locked(const SessionRec& s) {
  proto::SessionInfo info;
  info.set_session_id(s.id);
  for (const auto& wid : s.worker_ids) {
    auto it = workers_.find(wid);
    info.add_worker_addresses(it == workers_.end() ? "" : it->second.info.address());
    info.add_worker_ids(wid);
  }
  info.set_world_size(static_cast<int32_t>(s.worker_ids.size()));
  info.set_job_id(s.job_id);
  return info;
}

absl::Status Coordinator::check_access_locked(const SessionRec& s, const Caller& caller,
                                              const std::string& worker_id) {
  if (caller.kind == Caller::Kind::kTenant && s.tenant != caller.tenant) {
    return absl::PermissionDeniedError(
        absl::StrCat("session ", s.id, " is not a session of tenant ", caller.tenant));
  }
  if (caller.kind == Caller::Kind::kWorker && worker_id.empty()) {
    return absl::PermissionDeniedError(
        absl::StrCat("a worker must name itself (worker_id) to use session ", s.id));
  }
  if (!worker_id.empty() && s.rank_of(worker_id) < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("worker ", shown(worker_id), " is not part of session ", s.id));
  }
  return absl::OkStatus();
}

absl::StatusOr<proto::SessionInfo> Coordinator::lookup_session(
    const proto::LookupSessionRequest& req, const Caller& caller) {
  if (req.session_id().empty()) return absl::InvalidArgumentError("session_id is required");
  std::lock_guard lock(mu_);
  auto it = sessions_.find(req.session_id());
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown session ", shown(req.session_id())));
  }
  const SessionRec& s = it->second;
  if (auto st = check_access_locked(s, caller, req.worker_id()); !st.ok()) return st;
  // A worker checks a client's Hello: the secret first, so that a stranger learns nothing more
  // of the session (not even that it ended).
  if (!req.worker_id().empty() &&
      (s.secret.empty() || !proto::secrets_equal(req.session_secret(), s.secret))) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the client did not present the secret of session ", s.id,
        req.session_secret().empty() ? " (none given)" : " (a wrong one)",
        s.secret.empty() ? "; the session predates session secrets: open a new one" : ""));
  }
  if (s.state == "failed") {
    return absl::UnavailableError(absl::StrCat("session ", s.id, " failed: ", s.message));
  }
  if (s.state != "open") {
    return absl::FailedPreconditionError(
        absl::StrCat("session ", s.id, " is closed", s.message.empty() ? "" : ": ", s.message));
  }
  proto::SessionInfo info = session_info_locked(s);
  if (!req.worker_id().empty()) {
    info.set_rank(s.rank_of(req.worker_id()));
  }
  return info;
}

absl::StatusOr<proto::SessionInfo> Coordinator::open_session(const proto::OpenSessionRequest& req,
                                                             const std::string& tenant,
                                                             const Cancelled& cancelled) {
  if (auto st = proto::check_version(req.protocol_version(), "client", "coordinator"); !st.ok()) {
    return st;
  }
  std::unique_lock lock(mu_);
  if (!req.job_id().empty()) {
    auto j = find_job_locked(req.job_id(), tenant);
    if (!j.ok()) return j.status();
    const proto::Job& job = (*j)->job;
    if (job.state() != "running") {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job.job_id(), " is ", job.state(), job.message().empty() ? "" : ": ",
                       job.message(), job.state() == "queued" ? " (not running yet)" : ""));
    }
    const SessionRec& s = sessions_.at(job.session_id());
    proto::SessionInfo info = session_info_locked(s);
    info.set_session_secret(s.secret);
    return info;
  }
  const int n = req.workers();
  if (n < 1 || n > kMaxJobWorkers) {
    return absl::InvalidArgumentError(
        absl::StrCat("workers must be in [1, ", kMaxJobWorkers, "], got ", n));
  }
  if (auto st = check_quota_locked(tenant, n); !st.ok())
    return st;  // See Note [Quotas] in jobs.cpp
  // Note: an interactive session takes idle workers ahead of queued jobs; it is short-lived and
  // its client is waiting.
  const auto until = Clock::now() + std::chrono::milliseconds(req.wait_ms());
  while (true) {
    std::vector<std::string> idle = idle_workers_locked();
    if (static_cast<int>(idle.size()) >= n) {
      idle = place_locked(idle, n, 1);  // See Note [Placement] in jobs.cpp
      Transaction t(state_->db());
      SessionRec& s = new_session_locked(idle, tenant, "");
      t.commit();
      changed_locked();
      proto::SessionInfo info = session_info_locked(s);
      info.set_session_secret(s.secret);
      return info;
    }
    if (stopping_) return absl::UnavailableError("the coordinator is shutting down");
    if (Clock::now() >= until || cancelled()) {
      int live = 0;
      for (const auto& [id, w] : workers_) live += w.info.state() != "dead";
      if (live < n) {
        return absl::UnavailableError(absl::StrCat("asked for ", n, " workers but only ", live,
                                                   " live workers are registered"));
      }
      return absl::ResourceExhaustedError(
          absl::StrCat("asked for ", n, " workers but only ", idle.size(), " of ", live,
                       " live workers are idle after waiting ", req.wait_ms(), " ms"));
    }
    cv_.wait_until(lock, std::min(until, Clock::now() + std::chrono::milliseconds(200)));
  }
}

absl::Status Coordinator::close_session(const proto::CloseSessionRequest& req,
                                        const std::string& tenant) {
  if (req.session_id().empty()) return absl::InvalidArgumentError("session_id is required");
  std::lock_guard lock(mu_);
  auto it = sessions_.find(req.session_id());
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown session ", shown(req.session_id())));
  }
  SessionRec& s = it->second;
  if (!tenant.empty() && s.tenant != tenant) {
    return absl::PermissionDeniedError(
        absl::StrCat("session ", s.id, " is not a session of tenant ", tenant));
  }
  if (!s.job_id.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("session ", s.id, " belongs to job ", s.job_id, "; cancel the job instead"));
  }
  if (s.state != "open") return absl::OkStatus();
  Transaction t(state_->db());
  end_session_locked(s, "closed", "closed by its client");
  schedule_locked();
  t.commit();
  changed_locked();
  return absl::OkStatus();
}

}  // namespace kiln::coord
