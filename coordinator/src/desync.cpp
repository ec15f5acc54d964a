// See Note [Desync detection] in desync.h.
#include "desync.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>

namespace kiln::coord {

std::vector<std::string> DesyncDetector::add(int rank, const proto::CollectiveRecord& r,
                                             Clock::time_point now) {
  std::string key = absl::StrCat(r.group(), "/", absl::StrJoin(r.members(), ","));
  Group& g = groups_[key];
  if (g.name.empty()) {
    g.name = r.group();
    g.size = r.members_size();
  }
  if (g.reported) return {};
  auto& ranks = g.seqs[r.seq()];
  ranks[rank] = absl::StrCat(r.op(), " ", r.shape());
  if (!g.suspect) {
    bool agree = true;
    for (const auto& [other, what] : ranks) agree = agree && what == ranks.begin()->second;
    if (!agree) {
      g.suspect = r.seq();
      g.settle_until = now + kSettle;
    } else {
      if (g.size > 0 && static_cast<int>(ranks.size()) == g.size) g.seqs.erase(r.seq());
      while (g.seqs.size() > kMaxPendingPerGroup) g.seqs.erase(g.seqs.begin());
      return {};
    }
  }
  if (!settled(g, now)) return {};
  return {judge(g)};
}

std::vector<std::string> DesyncDetector::poll(Clock::time_point now) {
  std::vector<std::string> out;
  for (auto& [key, g] : groups_)
    if (g.suspect && !g.reported && now >= g.settle_until) out.push_back(judge(g));
  return out;
}

bool DesyncDetector::settled(const Group& g, Clock::time_point now) const {
  if (now >= g.settle_until) return true;
  const std::map<int, std::string>& at = g.seqs.at(*g.suspect);
  std::map<std::string, int> count;
  for (const auto& [rank, what] : at)
    if (g.size > 0 && 2 * ++count[what] > g.size) return true;  // a majority whatever comes
  // Everyone reported and no majority (two ranks): the next sequence number tells who skipped.
  auto next = g.seqs.find(*g.suspect + 1);
  return g.size > 0 && static_cast<int>(at.size()) >= g.size && next != g.seqs.end();
}

std::string DesyncDetector::judge(Group& g) const {
  const uint64_t seq = *g.suspect;
  g.reported = true;
  const std::map<int, std::string>& at = g.seqs.at(seq);
  std::map<std::string, std::vector<int>> by_what;
  for (const auto& [rank, what] : at) by_what[what].push_back(rank);
  size_t most = 0, with_most = 0;
  for (const auto& [what, ranks] : by_what) {
    if (ranks.size() > most) {
      most = ranks.size();
      with_most = 1;
    } else if (ranks.size() == most) {
      ++with_most;
    }
  }
  auto ran = [&](const std::vector<int>& ranks, const std::string& what) {
    return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ", "), " ran ",
                        what);
  };
  const std::string where = absl::StrCat("collective #", seq, " of group '", g.name, "'");
  std::vector<int> culprits;
  std::vector<std::string> parts;
  if (with_most == 1) {  // a majority: the others are out of step
    for (const auto& [what, ranks] : by_what)
      if (ranks.size() != most) {
        culprits.insert(culprits.end(), ranks.begin(), ranks.end());
        parts.push_back(ran(ranks, what));
      }
    for (const auto& [what, ranks] : by_what)
      if (ranks.size() == most) parts.push_back(absl::StrCat("where ", ran(ranks, what)));
  } else {
    // No majority: a rank whose #seq is what another ran as #seq+1 skipped that one's #seq.
    auto next = g.seqs.find(seq + 1);
    for (const auto& [rank, what] : at)
      if (next != g.seqs.end())
        for (const auto& [other, later] : next->second)
          if (other != rank && later == what && at.count(other) && at.at(other) != what)
            culprits.push_back(rank);
    for (const auto& [what, ranks] : by_what) parts.push_back(ran(ranks, what));
  }
  std::string who;
  if (culprits.empty()) {
    who = "the ranks disagree (a skipped or reordered collective)";
  } else {
    who = absl::StrCat(culprits.size() == 1 ? "rank " : "ranks ", absl::StrJoin(culprits, ", "),
                       " skipped or reordered a collective");
  }
  std::string report = absl::StrCat(who, ": at ", where, ", ", absl::StrJoin(parts, ", "));
  g.seqs.clear();
  return report;
}

}  // namespace kiln::coord
