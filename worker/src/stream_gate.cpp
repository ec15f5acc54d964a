// Stream admission and the worker's one stream slot (Note [One stream per worker] in
// kiln/worker/stream_gate.h).
#include "kiln/worker/stream_gate.h"

#include <absl/strings/str_cat.h>

#include "kiln/proto/service.h"

namespace kiln::worker {

absl::Status StreamGate::check_caller(std::optional<std::string_view> authorization) const {
  if (options_.coordinated) return absl::OkStatus();  // the session secret decides (admit)
  return proto::check_bearer(authorization, options_.token);
}

absl::StatusOr<proto::SessionInfo> StreamGate::admit(const proto::Hello& hello,
                                                     const Lookup& lookup) const {
  if (auto st = proto::check_version(hello.protocol_version(), "the client", "kiln-worker");
      !st.ok())
    return st;
  if (!options_.coordinated) {
    if (!hello.session_id().empty())
      return absl::FailedPreconditionError(absl::StrCat(
          "Hello names session '", hello.session_id(),
          "' but this worker serves directly (started without --coordinator)"));
    proto::SessionInfo direct;
    direct.set_world_size(1);
    return direct;
  }
  if (hello.session_id().empty())
    return absl::FailedPreconditionError(absl::StrCat(
        "worker '", options_.worker_id,
        "' serves its coordinator's sessions only: connect through the coordinator "
        "(kiln.connect(COORDINATOR)), which opens a session"));
  absl::StatusOr<proto::SessionInfo> info = lookup(hello.session_id(), hello.session_secret());
  if (!info.ok()) return info.status();
  for (const std::string& id : info->worker_ids())
    if (id == options_.worker_id) return info;
  return absl::PermissionDeniedError(absl::StrCat("worker '", options_.worker_id,
                                                  "' is not in session '", hello.session_id(),
                                                  "'"));
}

absl::StatusOr<StreamGate::Lease> StreamGate::enter(const std::string& session_id, Cancel cancel,
                                                   std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lock(mu_);
  // The coordinator put this worker in session_id (admit checked): the holder's session ended.
  if (held_ && options_.coordinated && session_ != session_id && cancel_) cancel_();
  if (!freed_.wait_for(lock, wait, [&] { return !held_; })) {
    if (session_ == session_id && !session_id.empty())
      return absl::AlreadyExistsError(absl::StrCat(
          "session '", session_id, "' already has a client stream on worker '",
          options_.worker_id, "' (one stream per session and worker)"));
    return absl::ResourceExhaustedError(absl::StrCat(
        "worker '", options_.worker_id,
        "' is serving another client: a worker serves one session at a time"));
  }
  held_ = true;
  session_ = session_id;
  cancel_ = std::move(cancel);
  return Lease(this);
}

void StreamGate::leave() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    held_ = false;
    session_.clear();
    cancel_ = nullptr;
  }
  freed_.notify_all();
}

StreamGate::Lease::~Lease() {
  if (gate_) gate_->leave();
}

void StreamGate::cancel(const std::string& session_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (held_ && session_ == session_id && cancel_) cancel_();
}

std::optional<std::string> StreamGate::holder() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!held_) return std::nullopt;
  return session_;
}

}  // namespace kiln::worker
