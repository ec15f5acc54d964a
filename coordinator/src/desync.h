// coordinator/src/desync.h: naming the rank of a gang that fell out of step with the others'
// collectives, long before the communicator's timeout.
//
//   DesyncDetector d;
//   for (const proto::CollectiveRecord& r : beat.collectives())
//     for (const std::string& report : d.add(rank_of_worker, r, now)) tell_the_job(report);
//   for (const std::string& report : d.poll(now)) tell_the_job(report);   // on a timer
//
// Note [Desync detection]: every worker of a gang reports the collectives it issues (Note
// [Collective observer] in kiln/dist/process_group.h) with its heartbeats, a batch at most every
// 100 ms while collectives run (worker/src/coordinator_link.cpp). For each session and process
// group (its name and members: every tensor-parallel group of a mesh may share a name), the
// coordinator keeps, per sequence number, what each rank ran there: the op and its dtype and
// sizes. The first time two ranks disagree at one sequence number, it waits until one
// collective there has more than half the members, or every member has reported it and the next
// number (which tells who skipped), or kSettle has passed (a rank stuck elsewhere reports no
// more), and then names the ranks out of step: those
// outside the largest agreeing set, or, when no set is larger than the others (two ranks), a
// rank whose collective there is what another rank ran next (it skipped one), and failing that
// every rank involved. Ranks are the gang's (the order of `kiln status`'s gang).
// A group reports once; the report becomes a finding of the session's job (`kiln status`), a
// line of its log and a metric (coordinator.cpp). Sequence numbers that every member reported
// alike are forgotten, and a group keeps at most kMaxPendingPerGroup others, so a long job costs
// nothing and a flood from a broken worker costs bounded memory.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kiln/proto/coordinator.pb.h"

namespace kiln::coord {

inline constexpr size_t kMaxPendingPerGroup = 4096;
inline constexpr int kMaxCollectivesPerBeat = 20000;
inline constexpr std::chrono::milliseconds kSettle{300};

class DesyncDetector {
 public:
  using Clock = std::chrono::steady_clock;
  // Rank `rank` of the gang issued `r`: the reports this makes final.
  std::vector<std::string> add(int rank, const proto::CollectiveRecord& r, Clock::time_point now);
  // The reports whose settling time has passed by `now`.
  std::vector<std::string> poll(Clock::time_point now);

 private:
  struct Group {
    std::string name;
    int size = 0;                                         // members (0: unknown)
    std::map<uint64_t, std::map<int, std::string>> seqs;  // seq -> rank -> "op shape"
    std::optional<uint64_t> suspect;  // the first sequence number the ranks disagree at
    Clock::time_point settle_until;
    bool reported = false;
  };
  bool settled(const Group& g, Clock::time_point now) const;
  std::string judge(Group& g) const;
  std::map<std::string, Group> groups_;  // by name and members
};

}  // namespace kiln::coord
