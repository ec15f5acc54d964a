// kiln/client/gang_pipeline.h: pipeline schedules over a gang's workers, in library
// kiln_client_dist (with the remote DTensor hooks: the client parts that use kiln::dist).
#pragma once

#include <vector>

#include "kiln/dist/pipelining.h"

namespace kiln::client {

// A pipeline over a gang's first `ranks` workers (Note [Pipeline controller] in
// kiln/dist/pipelining.h, Note [Gang stages] in kiln/client/transport.h): a Schedule given all
// the stages (on no group) and this records stage s's actions for worker s % ranks, and moves
// activations and gradients between workers as transfers. Put each stage's module on its worker
// first, inside a StageScope({s % ranks}).
//   pp::Schedule sched(stages, pp::ScheduleKind::OneFOneB, 4, loss, false, gang_controller(2));
dist::pipelining::Controller gang_controller(int ranks);
// The same with several workers per pipeline rank: `workers[r]` run rank r's stages, as data
// parallel replicas (the j-th of each rank's list hands on to the j-th of the next one's).
dist::pipelining::Controller gang_controller(std::vector<std::vector<int>> workers);
}  // namespace kiln::client
