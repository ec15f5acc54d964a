// coordinator/src/profiles.h: merging the per-rank Chrome traces of a remote profile into one
// (issue 25, "Profiler: Remote"). Coordinator::profile_job (profiles.cpp) asks the ranks and
// waits; merge_traces is the pure part, tested on its own.
//
//   std::vector<RankTrace> got = {{0, "w0", rank0_profile}, {1, "w1", rank1_profile}};
//   absl::StatusOr<std::string> merged = merge_traces(got);   // one file, one pid per rank
//
// Note [Remote profiling]: `kiln profile JOB --steps N` (ProfileJob) profiles the next N steps
// of every rank of a running job.
//  - A step is what Note [Step telemetry] (worker/src/reports.h) calls one: the interval between
//    two step marks of the rank's session (Session.log_step's StepMark for a driven job, each
//    step of a batch job's loop). Every step mark goes through report_step, so both kinds of
//    job are profiled the same way. A job that marks no steps cannot be profiled: its ranks never
//    answer, and ProfileJob says which.
//  - The coordinator keeps one request per job (a second one while it waits is
//    FAILED_PRECONDITION) and hands it to each worker of the job's gang in its heartbeat replies
//    (HeartbeatReply.profile) until that rank answers. The worker (worker/src/remote_profile.h)
//    starts kiln::profiler at its session's mark of step S (ProfileRequest.first_step, or its
//    first mark past it), and at the Nth mark after that stops and sends its Chrome trace (at
//    most proto::kMaxRankTraceBytes, or an error instead) in its next beat
//    (HeartbeatRequest.profiles), so each rank's trace holds steps S+1 to S+N as ProfilerStep#0
//    to #N-1. S is the latest step any rank reported plus a margin of three heartbeats at the
//    fastest rank's step time, so that the request reaches every rank before its window opens and
//    all ranks profile the same steps; 0 (the next mark) for a job that reported no step yet.
//  - Clocks: each beat carries the worker's send time and each reply the coordinator's receive
//    and reply times; the worker estimates its offset from the coordinator NTP-style, offset =
//    ((received - sent) + (replied - got_reply)) / 2, keeping the estimate of the beat with the
//    shortest round trip among its latest ones (an estimate is off by at most half its round
//    trip). A trace carries its origin on the worker's clock and that offset.
//  - merge_traces puts every rank's events on the coordinator's clock: an event's ts becomes
//    origin + offset + ts, less the earliest rank's origin + offset (so the merged ts start near 0
//    and keep us precision); the base, in us since the epoch, is in otherData. Each rank becomes
//    one process (pid = rank, named "rank R (worker W)").
//  - The merged file is stored under the state file's directory, as STATE.profiles/JOB/ID.json
//    (with ID.info, its ProfileInfo), the latest kMaxProfilesPerJob per job; the job lists them
//    (Job.profiles) and the dashboard links to /api/jobs/JOB/profiles/ID.
//  - ProfileJob waits up to its timeout for every rank. Ranks that never answer, or answered an
//    error, are named in ProfileInfo.missing; the trace holds the others. When no rank answered,
//    it fails DEADLINE_EXCEEDED naming them all.
#pragma once

#include <absl/status/statusor.h>

#include <chrono>
#include <string>
#include <vector>

#include "kiln/proto/coordinator.pb.h"

namespace kiln::coord {

inline constexpr int kMaxProfileSteps = 100;
inline constexpr int kMaxProfilesPerJob = 5;
inline constexpr std::chrono::milliseconds kDefaultProfileTimeout{120000};
inline constexpr std::chrono::milliseconds kMaxProfileTimeout{3600 * 1000};

struct RankTrace {
  int rank = 0;
  std::string worker_id;
  proto::RankProfile profile;  // with a trace
};

// One Chrome trace of every rank's events, on the coordinator's clock (Note [Remote profiling]).
// INVALID_ARGUMENT naming the rank when a trace is not a Chrome trace's JSON.
absl::StatusOr<std::string> merge_traces(const std::vector<RankTrace>& ranks);

}  // namespace kiln::coord
