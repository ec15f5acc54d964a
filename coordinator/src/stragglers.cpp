// See Note [Stragglers] in stragglers.h.
#include "stragglers.h"

#include <absl/strings/str_format.h>

#include <algorithm>

namespace kiln::coord {

std::vector<std::string> StragglerDetector::add(const proto::StepRecord& r) {
  std::vector<std::string> reports;
  auto& step = pending_[r.step()];
  step[r.rank()] = r.busy_seconds();
  if (static_cast<int>(step.size()) >= world_) {
    std::vector<double> busy;
    for (const auto& [rank, b] : step) busy.push_back(b);
    std::sort(busy.begin(), busy.end());
    const size_t n = busy.size();
    const double median = n % 2 ? busy[n / 2] : (busy[n / 2 - 1] + busy[n / 2]) / 2;
    for (const auto& [rank, b] : step) {
      Slow& s = slow_[rank];
      if (median < kMinStepSeconds || b <= kStragglerRatio * median) {
        s = Slow();
        continue;
      }
      if (s.count++ == 0) s.first = r.step();
      s.worst = std::max(s.worst, b / median);
      if (s.count >= kStragglerSteps && reported_.insert(rank).second)
        reports.push_back(absl::StrFormat(
            "rank %d is a straggler: its busy time was over %.1fx the median of the ranks for "
            "%d steps in a row (steps %d to %d, up to %.2fx; at step %d %.3f s against %.3f s)",
            rank, kStragglerRatio, s.count, s.first, r.step(), s.worst, r.step(), b, median));
    }
    pending_.erase(r.step());
  }
  while (pending_.size() > kMaxPendingSteps) pending_.erase(pending_.begin());
  return reports;
}

}  // namespace kiln::coord
