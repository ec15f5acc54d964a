// kiln/coord/coordinator.h: the coordinator's control plane without the transport: the worker
// registry and its heartbeats, gang sessions, the job queue and its gang scheduler, the job logs
// and the sessions' rendezvous store (DESIGN.md "Jobs"). service.h puts gRPC, auth and metrics
// around it; every method validates its input and answers absl::Status codes as DESIGN.md
// "Errors" (bad input INVALID_ARGUMENT naming the field, unknown ids NOT_FOUND, dead workers
// UNAVAILABLE, stale epochs ABORTED).
//
//   auto c = kiln::coord::Coordinator::open({.state_path = "kiln-coordinator.db"});
//   absl::StatusOr<proto::Job> job = (*c)->submit_job(req, /*tenant=*/"");
//   (*c)->watch_job(watch, "", [](const proto::JobEvent& e) { return true; }, never_cancelled);
#pragma once

#include <absl/status/statusor.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kiln/proto/coordinator.pb.h"

namespace kiln::coord {

struct WorkerRec;
struct SessionRec;
class DesyncDetector;
class StragglerDetector;
struct JobRec;
class State;

struct Options {
  std::string state_path = "kiln-coordinator.db";
  std::chrono::milliseconds heartbeat{1000};  // the interval workers are told to beat at
  int dead_after = 3;                         // missed beats before a worker is dead
  // An interactive session none of whose workers has reported a client stream for this long is
  // closed (its client died or never came), so its workers return to the pool.
  std::chrono::milliseconds session_idle{30000};
  // An ended session is kept this long (a late LookupSession learns why it ended), then
  // forgotten, so a long-running coordinator does not grow with every session it ever had.
  std::chrono::milliseconds session_retention{3600 * 1000};
  // A dead worker is listed this long (`kiln workers` shows it dead), then forgotten; it
  // registers again if it comes back.
  std::chrono::milliseconds worker_retention{3600 * 1000};
  // A running job none of whose drivers has had a ReportJob stream open for this long fails
  // (kiln submit was killed, or lost the coordinator and did not come back). A driver re-attaches
  // within it after a network break or a coordinator restart.
  std::chrono::milliseconds driver_grace{30000};
  // A running job that marks steps and has marked none for this long (or 10x its median step
  // time, if longer) is hung (Note [Hang detection] in coordinator.cpp).
  std::chrono::milliseconds hang_after{60000};
  // Worker slots each named tenant may hold at once, in interactive sessions and running jobs
  // together (Note [Quotas] in jobs.cpp); a tenant not listed has no limit.
  std::map<std::string, int> quotas;
  // How long a preempted job's driver has to checkpoint and exit before its session is ended
  // anyway (Note [Preemption] in jobs.cpp).
  std::chrono::milliseconds preempt_grace{30000};
  // How long an elastic job running below its size must see enough idle workers (and no job
  // waiting) before it is asked to grow back (Note [Growing back] in jobs.cpp).
  std::chrono::milliseconds grow_after{30000};
};

// Limits on what a client may submit (beyond them: INVALID_ARGUMENT).
inline constexpr int kMaxJobWorkers = 4096;
inline constexpr size_t kMaxCommandBytes = 64 << 10;
inline constexpr size_t kMaxLogLineBytes = 64 << 10;  // longer driver lines are cut
inline constexpr int kMaxMeshDims = 8;
inline constexpr int kMaxJobStepsReply = 100000;      // JobSteps' largest limit
inline constexpr size_t kMaxDumpBytes = 256 << 10;    // a worker's account for a hang report
// What a worker may register as: an id of 1 to kMaxWorkerIdBytes characters [A-Za-z0-9._-], an
// address HOST:PORT (a host name, an IPv4 address or a bracketed IPv6 one) of at most
// kMaxAddressBytes, and the device "cpu" or "cuda:N".
inline constexpr size_t kMaxWorkerIdBytes = 128;
inline constexpr size_t kMaxAddressBytes = 256;

// Who makes a call, as the service authenticated it (Note [Session credentials] in
// coordinator/src/sessions.cpp says what each may do with a session).
struct Caller {
  enum class Kind {
    kAnyone,  // auth is off (loopback only): no one is told apart
    kWorker,  // presented the worker token
    kTenant,  // presented a tenant's token
  };
  Kind kind = Kind::kAnyone;
  std::string tenant;  // kTenant: the tenant; "" otherwise
};

// The caller's side of a waiting call: true once the client gave up (deadline or cancel).
using Cancelled = std::function<bool()>;

class Coordinator {
 public:
  static absl::StatusOr<std::unique_ptr<Coordinator>> open(const Options& options);
  ~Coordinator();

  // Workers. A tenant's listing names only its own sessions.
  absl::StatusOr<proto::RegisterWorkerReply> register_worker(const proto::RegisterWorkerRequest&);
  absl::StatusOr<proto::HeartbeatReply> heartbeat(const proto::HeartbeatRequest&);
  proto::ListWorkersReply list_workers(const Caller& caller);

  // Sessions. `tenant` is the caller's tenant ("" when auth is off: sees everything), as for
  // jobs. A session's secret is in OpenSession's answer only.
  absl::StatusOr<proto::SessionInfo> lookup_session(const proto::LookupSessionRequest&,
                                                    const Caller& caller);
  absl::StatusOr<proto::SessionInfo> open_session(const proto::OpenSessionRequest&,
                                                  const std::string& tenant,
                                                  const Cancelled& cancelled);
  absl::Status close_session(const proto::CloseSessionRequest&, const std::string& tenant);

  // Jobs.
  absl::StatusOr<proto::Job> submit_job(const proto::SubmitJobRequest&, const std::string& tenant);
  absl::StatusOr<proto::Job> get_job(const proto::GetJobRequest&, const std::string& tenant);
  absl::StatusOr<proto::ListJobsReply> list_jobs(const proto::ListJobsRequest&,
                                                 const std::string& tenant);
  absl::StatusOr<proto::Job> cancel_job(const proto::CancelJobRequest&, const std::string& tenant);
  // Sends the job's log lines and state changes through `send` (false: the client is gone);
  // with follow, until the job ends.
  absl::Status watch_job(const proto::WatchJobRequest&, const std::string& tenant,
                         const std::function<bool(const proto::JobEvent&)>& send,
                         const Cancelled& cancelled);
  // One message of a driver's ReportJob stream. Answers the job as it is now; a job that is no
  // longer running (cancelled) tells the driver to stop.
  absl::StatusOr<proto::Job> report_job(const proto::JobReport&, const std::string& tenant);
  // A driver's ReportJob stream for the job opened (true) or ended (false): see
  // Options::driver_grace.
  void driver_attached(const std::string& job_id, const std::string& tenant, bool attached);

  // The sessions' rendezvous store.
  absl::StatusOr<proto::StoreReply> store(const proto::StoreRequest&, const Caller& caller,
                                          const Cancelled& cancelled);

  // Counts by state, for metrics.
  std::map<std::string, int> job_counts();
  std::map<std::string, int> worker_counts();
  // Findings by kind ("desync", "straggler") since the coordinator started, for metrics.
  std::map<std::string, int> finding_counts();
  // Each running job's ranks' latest steps, by job id, for metrics.
  std::vector<std::pair<std::string, proto::StepRecord>> running_steps();
  // A job's step telemetry (See Note [Step telemetry] in worker/src/reports.h).
  absl::StatusOr<proto::JobStepsReply> job_steps(const proto::JobStepsRequest&,
                                                 const std::string& tenant);
  // Profiles the next steps of every rank of a running job and sends the merged trace through
  // `send`: a ProfileInfo, then the trace's bytes (Note [Remote profiling] in profiles.h).
  absl::Status profile_job(const proto::ProfileJobRequest&, const std::string& tenant,
                           const std::function<bool(const proto::ProfileChunk&)>& send,
                           const Cancelled& cancelled);
  // A merged profile the job lists (Job.profiles), for the dashboard.
  absl::StatusOr<std::string> read_profile(const std::string& job_id, const std::string& tenant,
                                           int64_t profile_id);
  // The last `lines` (1 to 1000) lines of a job's log, oldest first; for the dashboard.
  absl::StatusOr<std::vector<std::string>> log_tail(const std::string& job_id,
                                                    const std::string& tenant, int64_t lines);

  // Wakes and ends every waiting call (UNAVAILABLE) and stops the reaper; for SIGTERM.
  void shutdown();

 private:
  explicit Coordinator(const Options& options);
  void reap_loop();
  void reap_locked();
  void schedule_locked();
  // Marks the running jobs below `j`'s priority whose workers `j` needs as preempting, when
  // that frees enough (Note [Preemption] in jobs.cpp); true if it did.
  bool preempt_for_locked(const JobRec& j, int idle);
  // A preempting job's driver exited (or its grace ran out): its session ends, it is requeued.
  void preempted_locked(JobRec& j, const std::string& why);
  // Asks one elastic job below its size to grow back onto idle workers (Note [Growing back]).
  void grow_locked(std::chrono::steady_clock::time_point now);
  // Whether `j` has restarts left; if so, queues it again as "restarting" (Note [Restarts]).
  bool restart_locked(JobRec& j, const std::string& why);
  SessionRec& new_session_locked(const std::vector<std::string>& worker_ids,
                                 const std::string& tenant, const std::string& job_id);
  void end_session_locked(SessionRec& s, const std::string& state, const std::string& message);
  void finish_job_locked(JobRec& j, const std::string& state, int exit_code,
                         const std::string& message);
  proto::SessionInfo session_info_locked(const SessionRec& s);
  // OK when `caller` (and `worker_id`, when a worker names itself) may use session `s`.
  absl::Status check_access_locked(const SessionRec& s, const Caller& caller,
                                   const std::string& worker_id);
  absl::StatusOr<JobRec*> find_job_locked(const std::string& job_id, const std::string& tenant);
  std::vector<std::string> idle_workers_locked();
  // `n` of the `idle` workers, in rank order, groups of `group` consecutive ranks on one host
  // where they fit (Note [Placement] in jobs.cpp).
  std::vector<std::string> place_locked(const std::vector<std::string>& idle, int n, int group);
  // Workers held by the tenant's open sessions; the error when `more` would exceed its quota.
  int tenant_workers_locked(const std::string& tenant);
  absl::Status check_quota_locked(const std::string& tenant, int more);
  void changed_locked();
  // A finding about session `s` (Note [Desync detection] in desync.h): on its job (kept in the
  // state file), in its log, on stderr and in finding_counts().
  void add_finding_locked(const SessionRec& s, const std::string& kind, const std::string& text);
  // The same for a job, inside the caller's transaction.
  void add_job_finding_locked(JobRec& j, const std::string& kind, const std::string& text);
  // A heartbeat's batch results, and the BatchRun its worker still needs (Note [Batch jobs]).
  void batch_beat_locked(const proto::HeartbeatRequest& req, const WorkerRec& w,
                         proto::HeartbeatReply& reply);
  // The step records of a heartbeat: stored per job, each rank's latest on the job, stragglers
  // named (Note [Stragglers] in stragglers.h).
  void record_steps_locked(const proto::HeartbeatRequest& req);
  // A heartbeat's traces, and the profile requests its worker still needs (Note [Remote
  // profiling] in profiles.h).
  void profile_beat_locked(const proto::HeartbeatRequest& req, const WorkerRec& w,
                           proto::HeartbeatReply& reply);
  void load_profiles_locked();

  Options options_;
  std::unique_ptr<State> state_;
  std::mutex mu_;
  std::condition_variable cv_;  // every change: watchers, session and store waiters
  uint64_t version_ = 0;        // bumped by every change
  bool stopping_ = false;
  std::map<std::string, WorkerRec> workers_;
  std::map<std::string, SessionRec> sessions_;
  std::map<std::string, JobRec> jobs_;
  std::map<std::string, std::map<std::string, std::string>> kv_;  // open session -> its store
  std::map<std::string, DesyncDetector> desync_;                  // session -> its collectives (until forgotten)
  std::map<std::string, StragglerDetector> stragglers_;           // session -> its steps (until forgotten)
  std::map<std::string, int> findings_;
  // See Note [Hang detection] in coordinator.cpp.
  struct HangWatch {
    std::chrono::steady_clock::time_point last_step = std::chrono::steady_clock::now();
    int64_t step = 0;            // the latest step marked
    std::vector<double> recent;  // rank 0's latest step times
    bool asked = false, reported = false;
    std::chrono::steady_clock::time_point asked_at;
    std::map<int, std::string> dumps;  // rank -> its StackDump
  };
  std::map<std::string, HangWatch> hangs_;  // session -> its progress (until forgotten)
  void watch_hangs_locked(std::chrono::steady_clock::time_point now);
  // A job's profile request while its ProfileJob call waits (Note [Remote profiling]).
  struct ProfileRun {
    int64_t profile_id = 0;
    std::string session_id;
    int steps = 0;
    int64_t first_step = 0;                 // See ProfileRequest.first_step
    std::map<int, proto::RankProfile> got;  // rank -> its trace or error
  };
  std::map<std::string, ProfileRun> profile_runs_;  // job id -> its request
  int64_t last_profile_id_ = 0;
  int64_t last_seq_ = 0;
  std::thread reaper_;
};

}  // namespace kiln::coord
