// worker/src/reports.h: what a worker tells its coordinator beside its load, with each heartbeat
// (worker/src/coordinator_link.cpp): the collectives its gang issued and the training steps its
// sessions marked.
//
// Note [Collective reports]: the collectives this process issues (Note [Collective observer] in
// kiln/dist/process_group.h) while it serves a gang, tagged with the gang's session and with the
// group's members as gang ranks, for the coordinator's desync detection (Note [Desync detection]
// in coordinator/src/desync.h). At most kMaxPendingReports of each kind wait; older ones are
// dropped (the coordinator then misses them: never a false report, since each group's sequence
// numbers stay exact).
//
// Note [Step telemetry]: a client marks the end of each training step (Session.log_step(loss,
// tokens), a StepMark command to every worker). Each worker records, for its rank: when it
// reached the mark, the seconds since its previous mark (or since its session began), its busy
// part (the time it spent running batches, less its waits for collectives:
// dist::collective_wait_seconds(); this tells a straggler apart, since the others wait for it in
// every collective, and leaves out the time the worker waited for the client's next batch), its own
// value of the loss tensor (a data-parallel rank's loss is its shard's), and the tokens the client
// says the step processed. The coordinator keeps them per job (coordinator.cpp, Note [Stragglers]).
#pragma once

#include <string>
#include <vector>

#include "kiln/proto/coordinator.pb.h"

namespace kiln::worker {

inline constexpr size_t kMaxPendingReports = 10000;

// Starts (a session id) or stops ("") recording the gang's collectives.
void report_collectives_of(const std::string& session_id);
std::vector<proto::CollectiveRecord> take_collectives();

void report_step(proto::StepRecord record);
std::vector<proto::StepRecord> take_steps();

// How a batch run ended (Note [Batch jobs] in batch.h).
void report_batch_result(proto::BatchResult result);
std::vector<proto::BatchResult> take_batch_results();

}  // namespace kiln::worker
