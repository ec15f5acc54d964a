// kiln/worker/stream_gate.h: who may open a Session stream on a worker, and the rule that a
// worker serves one stream at a time. The gRPC service (server.cpp) asks it about every stream;
// it knows nothing of gRPC, so the fuzzers drive it too (tests/worker/fuzz).
//
//   StreamGate gate({.token = "t", .coordinated = true, .worker_id = "w0"});
//   if (auto st = gate.check_caller(authorization); !st.ok()) return st;     // before the Hello
//   absl::StatusOr<proto::SessionInfo> info = gate.admit(hello, lookup);     // after it
//   absl::StatusOr<StreamGate::Lease> lease = gate.enter(hello.session_id(), cancel, wait);
//   // ... serve the stream; the lease's end frees the worker for the next one
//
// Note [One stream per worker]: a worker runs one client stream at a time, so its
// --memory-limit binds the whole worker and a session's values never share a worker with
// another client's. Which stream may enter:
//  - a worker started without --coordinator serves direct streams only (a Hello naming a session
//    is FAILED_PRECONDITION), which present its --token when it has one (UNAUTHENTICATED);
//  - a worker registered with a coordinator serves that coordinator's sessions only (a Hello
//    without a session is FAILED_PRECONDITION, whatever token it carries). The Hello's session
//    id and secret go to the coordinator (Lookup), which answers the session when this worker is
//    in its gang and the secret is the session's (else PERMISSION_DENIED; Note [Session
//    credentials] in coordinator/src/coordinator.cpp).
// While a stream holds the worker, a new one waits up to `wait` (a client that has just closed
// its stream may not be gone yet), then is refused: ALREADY_EXISTS for a second stream of the
// same session, RESOURCE_EXHAUSTED for any other. One exception: a stream of a different
// coordinator session is stale once the coordinator has put this worker in a new session, so
// the new session's stream cancels it and takes its place.
#pragma once

#include <absl/status/statusor.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "kiln/proto/coordinator.pb.h"
#include "kiln/proto/worker.pb.h"

namespace kiln::worker {

class StreamGate {
 public:
  struct Options {
    std::string token;         // the worker's --token ("" : none)
    bool coordinated = false;  // registered with a coordinator
    std::string worker_id;
  };
  // The coordinator's LookupSession for (session id, secret): the session, with this worker's
  // rank, or why not.
  using Lookup = std::function<absl::StatusOr<proto::SessionInfo>(const std::string& session_id,
                                                                  const std::string& secret)>;
  // Asks the stream holding the worker to end; it may return before the stream has ended. It
  // runs under the gate's lock (while its stream holds the lease, so what it refers to lives)
  // and must not call the gate.
  using Cancel = std::function<void()>;

  explicit StreamGate(Options options) : options_(std::move(options)) {}

  // Before the Hello is read: the token of a direct worker (its authorization metadata).
  absl::Status check_caller(std::optional<std::string_view> authorization) const;
  // The Hello's claim. For a coordinated worker, the session as the coordinator answered it;
  // for a direct one, a SessionInfo of world size 1.
  absl::StatusOr<proto::SessionInfo> admit(const proto::Hello& hello, const Lookup& lookup) const;

  // Holds the worker for one stream until destroyed.
  class Lease {
   public:
    Lease(Lease&& other) noexcept : gate_(std::exchange(other.gate_, nullptr)) {}
    Lease& operator=(Lease&&) = delete;
    ~Lease();

   private:
    friend class StreamGate;
    explicit Lease(StreamGate* gate) : gate_(gate) {}
    StreamGate* gate_;
  };
  // Takes the worker for a stream of `session_id` ("" : direct). `cancel` ends that stream when
  // a newer session's stream takes over.
  absl::StatusOr<Lease> enter(const std::string& session_id, Cancel cancel,
                              std::chrono::milliseconds wait);
  // Cancels the stream of `session_id` (the coordinator ended the session), if it holds the
  // worker.
  void cancel(const std::string& session_id);
  // The session of the stream holding the worker; nullopt when the worker is free.
  std::optional<std::string> holder() const;

 private:
  void leave();

  Options options_;
  mutable std::mutex mu_;
  std::condition_variable freed_;
  bool held_ = false;
  std::string session_;  // the holder's
  Cancel cancel_;        // the holder's
};

}  // namespace kiln::worker
