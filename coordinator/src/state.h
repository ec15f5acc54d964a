// coordinator/src/state.h: the coordinator's records and their SQLite tables (DESIGN.md "Jobs":
// job state lives in SQLite, so a restarted coordinator has lost nothing). The coordinator keeps
// every record in memory as well and writes each change through, inside one transaction per
// mutation; at start it loads them back.
//
//   State st;  st.open("kiln-coordinator.db");
//   Loaded all = st.load();
//   { Transaction t(st.db()); st.put_job(job); st.put_worker(w); t.commit(); }
#pragma once

#include <absl/status/status.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "db.h"
#include "kiln/proto/coordinator.pb.h"

namespace kiln::coord {

using Clock = std::chrono::steady_clock;

int64_t now_unix_ms();
int64_t now_unix_us();
// `bytes` bytes from the kernel's CSPRNG, as hex (ids must not be predictable from earlier ones,
// and secrets must not be guessable at all).
std::string random_hex(size_t bytes);
// A field's value for an error message: escaped and cut, so a hostile megabyte does not become
// the message.
std::string shown(const std::string& v);

struct WorkerRec {
  proto::WorkerInfo info;  // state "idle", "busy" or "dead"
  uint64_t memory_limit_bytes = 0;
  // Not persisted (a write per beat buys nothing): a loaded worker gets a fresh grace period.
  Clock::time_point last_beat = Clock::now();
  // When a beat last listed its session as served (or the session began).
  Clock::time_point session_seen = Clock::now();
  // When it was marked dead (not stored: a loaded dead worker counts from the load), for
  // Options::worker_retention.
  Clock::time_point died = Clock::now();
};

// A gang of workers for one client or one job. "open" until closed ("closed") or until one of
// its workers dies ("failed", with the message); the record stays so a late LookupSession or
// Heartbeat learns why.
struct SessionRec {
  std::string id, state, job_id, tenant, message;
  std::vector<std::string> worker_ids;  // rank order
  // The rank of `worker_id` in the gang, or -1 when it is not one of its workers.
  int rank_of(const std::string& worker_id) const {
    auto at = std::find(worker_ids.begin(), worker_ids.end(), worker_id);
    return at == worker_ids.end() ? -1 : static_cast<int>(at - worker_ids.begin());
  }
  int64_t created_unix_ms = 0;
  // Its credential (Note [Session credentials] in sessions.cpp); "" for a session stored by a
  // coordinator from before secrets, which no worker accepts.
  std::string secret;
  // When it stopped being open (not stored: a loaded ended session counts from the load), for
  // Options::session_retention.
  Clock::time_point ended = Clock::now();
};

struct JobRec {
  int64_t seq = 0;  // submission order: FIFO within a priority
  proto::Job job;
  // Not stored: the driver's open ReportJob streams, and since when it has had none (the job's
  // start, or the coordinator's load of it), for Options::driver_grace.
  int drivers = 0;
  Clock::time_point driver_seen = Clock::now();
  // Not stored: when it was asked to give its workers up (job.preempting()).
  Clock::time_point preempt_asked;
  std::string spec;  // a batch job's BatchJob bytes (job_specs; Note [Batch jobs])
  // Not stored: a restarting job starts no earlier (Note [Restarts] in jobs.cpp).
  Clock::time_point restart_after;
  // Not stored (Note [Growing back] in jobs.cpp): since when it could grow (zero: it cannot), and
  // whether its preemption is a growth.
  Clock::time_point grow_seen{};
  bool growing = false;
};

struct Loaded {
  std::map<std::string, WorkerRec> workers;
  std::map<std::string, SessionRec> sessions;
  std::map<std::string, JobRec> jobs;
  int64_t max_seq = 0;
};

class State {
 public:
  // Opens or creates the file and its schema; refuses a file from a newer schema.
  absl::Status open(const std::string& path);
  Loaded load();
  Db& db() { return db_; }

  void put_worker(const WorkerRec& w);
  void put_session(const SessionRec& s);
  void delete_session(const std::string& id);
  void delete_worker(const std::string& id);
  void put_job(const JobRec& j);
  void append_logs(const std::string& job_id, const std::vector<std::string>& lines);
  // Log lines with index >= `from` (0-based), at most `limit` of them.
  std::vector<std::string> logs(const std::string& job_id, int64_t from, int64_t limit);
  int64_t log_count(const std::string& job_id);
  // Finding `idx` (0-based) of a job (Note [Desync detection] in desync.h).
  void put_finding(const std::string& job_id, int idx, const proto::Finding& f);
  // A batch job's spec (Note [Batch jobs] in worker/src/batch.h), stored once at submission.
  void put_spec(const std::string& job_id, const std::string& spec);
  // A rank's step of a job, and a job's steps from `from` on (by step, then rank), at most
  // `limit` (See Note [Step telemetry] in worker/src/reports.h).
  void put_step(const std::string& job_id, const proto::StepRecord& r);
  std::vector<proto::StepRecord> steps(const std::string& job_id, int64_t from, int64_t limit);

 private:
  Db db_;
};

}  // namespace kiln::coord
