// kiln/proto/json.h: the coordinator's records as JSON, with one set of field names for every
// reader: `kiln ... --json` (client/cli) and the dashboard's API (coordinator/src/dashboard.cpp).
//
//   std::printf("%s\n", kiln::proto::to_json(job).dump().c_str());
#pragma once

#include <nlohmann/json.hpp>

#include "kiln/proto/coordinator.pb.h"

namespace kiln::proto {

nlohmann::json to_json(const StepRecord& r);  // loss only when it has one
nlohmann::json to_json(const Finding& f);
nlohmann::json to_json(const Job& j);  // with its findings and each rank's latest step
// Its restart policy and count (Note [Restarts] in coordinator/src/jobs.cpp): part of to_json(j),
// and what the coordinator's state file keeps of them.
nlohmann::json restart_fields(const Job& j);
nlohmann::json to_json(const WorkerInfo& w);

}  // namespace kiln::proto
