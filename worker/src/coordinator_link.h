// worker/src/coordinator_link.h: the worker's side of the coordinator (coordinator.proto):
// RegisterWorker at start, a heartbeat thread (re-registering when the coordinator forgot us:
// ABORTED for a stale epoch, NOT_FOUND after a restart), and LookupSession for a Hello that
// names a session.
#pragma once

#include <absl/status/statusor.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kiln/proto/coordinator.grpc.pb.h"

namespace kiln::worker {

class CoordinatorLink {
 public:
  struct Load {
    std::vector<std::string> sessions;  // the session ids being served
    uint64_t memory_in_use_bytes = 0;
  };
  using LoadFn = std::function<Load()>;
  // Ends the streams of a session the coordinator closed.
  using CloseFn = std::function<void(const std::string& session_id)>;
  // The worker's account of a session it serves, for a hang report (See Note [Hang detection]
  // in coordinator/src/coordinator.cpp).
  using DumpFn = std::function<std::string(const std::string& session_id)>;
  // Starts a batch job's run the coordinator handed this worker (Note [Batch jobs] in batch.h).
  using RunFn = std::function<void(const proto::BatchRun& run)>;
  // Asks a batch run to checkpoint and stop (Note [Draining batch jobs] in batch.h).
  using DrainFn = std::function<void(const std::string& session_id)>;
  // Registers once (its failure is start's) and starts the heartbeat thread, which beats every
  // interval the coordinator asked for, and sooner (every kReportPoll) while reports wait (See
  // Note [Collective reports] and Note [Step telemetry] in reports.h).
  static absl::StatusOr<std::unique_ptr<CoordinatorLink>> start(
      const std::string& address, const std::string& token, proto::RegisterWorkerRequest request,
      LoadFn load, CloseFn close, DumpFn dump = nullptr, RunFn run = nullptr,
      DrainFn drain = nullptr);
  static constexpr std::chrono::milliseconds kReportPoll{100};
  ~CoordinatorLink();  // stops the heartbeat thread

  // The session as the coordinator sees it, with this worker's rank, when `secret` (from the
  // client's Hello) is the session's. PERMISSION_DENIED naming the coordinator's reason when this
  // worker is not in its gang, the secret is wrong, or the coordinator does not know the session.
  absl::StatusOr<proto::SessionInfo> lookup(const std::string& session_id,
                                            const std::string& secret);
  // The gang's rendezvous store (session-scoped keys); the request goes as this worker's.
  absl::StatusOr<proto::StoreReply> store(proto::StoreRequest request);

 private:
  CoordinatorLink() = default;
  absl::Status register_worker();
  void heartbeat_loop();

  std::string token_;
  proto::RegisterWorkerRequest request_;
  LoadFn load_;
  CloseFn close_;
  DumpFn dump_;
  RunFn run_;
  DrainFn drain_;
  std::unique_ptr<proto::Coordinator::Stub> stub_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  uint64_t epoch_ = 0;
  uint32_t interval_ms_ = 1000;
  std::thread thread_;
};

}  // namespace kiln::worker
