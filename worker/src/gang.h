// worker/src/gang.h: the process group of the gang a worker serves (DESIGN.md "Execution",
// distributed).
//
// Note [Gang process group]: when the coordinator's session has world_size > 1, the worker
// joins the gang's default process group so the collective instructions of the op table
// (tensor/ops/comm.toml) find it by name. The naming contract with the client: the group is
// named "world" (kiln::dist's default group name), so a program recorded against the default
// group of an eager run means the same group on the workers. Rendezvous: rank 0 hosts a
// kiln::dist::TCPStore on a free port of its advertised host and publishes "host:port" under
// the session-scoped key "store" of the coordinator's Store; the other ranks read it (waiting).
// A worker serves one gang at a time: a new session's gang replaces the previous group.
#pragma once

#include <absl/status/status.h>

#include <future>
#include <memory>
#include <mutex>
#include <string>

#include "kiln/device.h"

namespace kiln::dist {
class TCPStore;
}

namespace kiln::worker {

class CoordinatorLink;

inline constexpr const char* kGangGroupName = "world";

class Gang {
 public:
  // Starts joining (in the background: a rank must answer its Hello before the others said
  // theirs). The returned future is OK once the group exists.
  std::shared_future<absl::Status> join(CoordinatorLink& link, const std::string& session_id,
                                        int rank, int world_size, const std::string& host,
                                        Device device);
  // Waits for a join in progress and destroys the group.
  void leave();
  ~Gang() { leave(); }
  // Aborts the groups of `session_id`, when they are this worker's (Note [Aborting process
  // groups] in kiln/dist/process_group.h): its executor, stuck in a collective with a dead rank,
  // is freed at once. Never blocks on a join in progress.
  void abort(const std::string& session_id, const std::string& why);

 private:
  std::mutex mu_;
  std::string session_id_;
  std::mutex abort_mu_;  // guards joined_ (abort() must not wait for mu_)
  std::string joined_;   // the session whose groups exist or are being made
  std::shared_future<absl::Status> ready_;
  std::shared_ptr<dist::TCPStore> store_;
};

}  // namespace kiln::worker
