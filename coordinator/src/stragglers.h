// coordinator/src/stragglers.h: naming the rank of a job whose steps take longer than the
// others'.
//
//   StragglerDetector d(/*world=*/4);
//   for (const std::string& report : d.add(step_record)) tell_the_job(report);
//
// Note [Stragglers]: every rank reports each training step with its busy seconds (the step's
// time less its waits for collectives: Note [Step telemetry] in worker/src/reports.h; in a
// data-parallel step every rank's wall time is the slowest's, so only the busy time tells the
// slow rank apart). Once every rank of the gang has reported a step, a rank whose busy time
// exceeds kStragglerRatio times the step's median is slow at that step, and kStragglerSteps slow
// steps in a row make it a straggler: one finding per rank and job, in `kiln status`, the job's
// log and the metrics (coordinator.cpp). Steps whose median is under kMinStepSeconds are noise
// and judge no one. A judged step is forgotten; at most kMaxPendingSteps wait for late ranks.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "kiln/proto/coordinator.pb.h"

namespace kiln::coord {

inline constexpr double kStragglerRatio = 1.3;
inline constexpr int kStragglerSteps = 3;
inline constexpr double kMinStepSeconds = 0.01;
inline constexpr size_t kMaxPendingSteps = 1024;
inline constexpr int kMaxStepsPerBeat = 20000;

class StragglerDetector {
 public:
  explicit StragglerDetector(int world = 1) : world_(world) {}
  // A rank's step record (its rank set): the reports it completes.
  std::vector<std::string> add(const proto::StepRecord& r);

 private:
  struct Slow {
    int count = 0;      // slow steps in a row
    int64_t first = 0;  // the first of them
    double worst = 0;   // the largest ratio among them
  };
  int world_;
  std::map<int64_t, std::map<int, double>> pending_;  // step -> rank -> busy seconds
  std::map<int, Slow> slow_;
  std::set<int> reported_;
};

}  // namespace kiln::coord
