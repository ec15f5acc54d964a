// worker/src/remote_profile.h: the worker's side of `kiln profile` (See Note [Remote profiling]
// in coordinator/src/profiles.h): a profile request from a heartbeat reply turns kiln::profiler
// on at the session's next step mark and off N marks later; the Chrome trace then waits for the
// next beat, with this worker's clock offset from the coordinator.
//
//   arm_profile(request);                  // the heartbeat thread, from HeartbeatReply.profile
//   profile_step(session_id, step);        // report_step, at every step mark
//   for (proto::RankProfile& p : take_profiles()) *beat.add_profiles() = std::move(p);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/proto/coordinator.pb.h"

namespace kiln::worker {

// Starts waiting for the session's next step mark; a request seen before is ignored.
void arm_profile(const proto::ProfileRequest& request);
// The mark of step `step` of `session_id`: starts (from the request's first_step on), steps or
// finishes the armed profile of that session.
void profile_step(const std::string& session_id, int64_t step);
// Ends a profile whose session is not among `served` (it ended mid-profile): its answer is an
// error naming how many steps it saw.
void end_profiles_except(const std::vector<std::string>& served);
std::vector<proto::RankProfile> take_profiles();

// This worker's clock, in us since the epoch. KILN_WORKER_CLOCK_SKEW_US (an integer) shifts it:
// a test's stand-in for a host whose clock is off.
int64_t worker_unix_us();
// One beat's times (sent and got on this worker's clock, received and replied on the
// coordinator's) for the clock offset estimate.
void note_clock(int64_t sent, int64_t received, int64_t replied, int64_t got);

}  // namespace kiln::worker
