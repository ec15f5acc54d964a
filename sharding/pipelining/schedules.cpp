// Pipeline schedules as action lists, their simulation and timelines. See Note [Pipeline
// schedules] in kiln/dist/pipelining.h.
#include <algorithm>
#include <deque>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "kiln/dist/pipelining.h"
#include "kiln/error.h"

namespace kiln::dist::pipelining {
namespace {

// The compute order of rank r: GPipe and 1F1B differ only in the warm-up length.
ActionList one_stage_per_rank(int r, int p, int m, bool gpipe, bool split) {
  const int warmup = gpipe ? m : std::min(m, p - r - 1);
  ActionList out;
  for (int i = 0; i < warmup; ++i) out.push_back({Op::F, r, i});
  for (int i = 0; i < m - warmup; ++i) {
    out.push_back({Op::F, r, warmup + i});
    out.push_back({split ? Op::I : Op::B, r, i});
    if (split) out.push_back({Op::W, r, i});
  }
  for (int i = m - warmup; i < m; ++i) {
    out.push_back({split ? Op::I : Op::B, r, i});
    if (split) out.push_back({Op::W, r, i});
  }
  return out;
}

// Megatron's interleaved order: the k-th forward of rank r is microbatch
// (k / (p v)) p + k % p of its chunk (k / p) % v; backwards walk the chunks in reverse.
ActionList interleaved(int r, int p, int m, int v) {
  const int total = m * v;
  const int warmup = std::min(total, (p - r - 1) * 2 + (v - 1) * p);
  auto mb = [&](int k) { return (k / (p * v)) * p + k % p; };
  auto fwd = [&](int k) { return Action{Op::F, ((k / p) % v) * p + r, mb(k)}; };
  auto bwd = [&](int k) { return Action{Op::B, (v - 1 - (k / p) % v) * p + r, mb(k)}; };
  ActionList out;
  for (int k = 0; k < warmup; ++k) out.push_back(fwd(k));
  for (int k = 0; k < total - warmup; ++k) {
    out.push_back(fwd(warmup + k));
    out.push_back(bwd(k));
  }
  for (int k = total - warmup; k < total; ++k) out.push_back(bwd(k));
  return out;
}

// ZB-H1 by list scheduling with unit costs: each rank, whenever it is free, runs the first of
// I (its next one, once the next stage's I of that microbatch is done), F (while it holds fewer
// than p - r activations awaiting I, as 1F1B does), W (its oldest pending one) that is ready;
// a rank with p - r - 1 W's pending runs W before F.
std::vector<ActionList> zbh1(int p, int m) {
  std::vector<ActionList> out(p);
  // Unit-time end of F and I of (stage, microbatch); -1 while not run.
  std::vector<std::vector<int>> f_end(p, std::vector<int>(m, -1)), i_end = f_end;
  std::vector<int> nf(p, 0), ni(p, 0), nw(p, 0);
  int done = 0;
  for (int t = 0; done < 3 * p * m; ++t) {
    KILN_CHECK(t <= 6 * p * m + 2 * p, Runtime, "zbh1 schedule for p=", p, ", m=", m,
               " did not converge");
    for (int r = 0; r < p; ++r) {
      const bool i_ready = ni[r] < nf[r] && ni[r] < m &&
                           (r == p - 1 ? f_end[r][ni[r]] <= t
                                       : i_end[r + 1][ni[r]] >= 0 && i_end[r + 1][ni[r]] <= t) &&
                           f_end[r][ni[r]] <= t;
      const bool f_ready = nf[r] < m && nf[r] - ni[r] < p - r &&
                           (r == 0 || (f_end[r - 1][nf[r]] >= 0 && f_end[r - 1][nf[r]] <= t));
      const bool w_ready = nw[r] < ni[r];
      const bool w_first = w_ready && ni[r] - nw[r] > p - r - 1;
      if (i_ready) {
        i_end[r][ni[r]] = t + 1;
        out[r].push_back({Op::I, r, ni[r]++});
      } else if (f_ready && !w_first) {
        f_end[r][nf[r]] = t + 1;
        out[r].push_back({Op::F, r, nf[r]++});
      } else if (w_ready) {
        out[r].push_back({Op::W, r, nw[r]++});
      } else {
        continue;
      }
      ++done;
    }
    // Every action above ends at t + 1; the next round starts then (ranks are never free early).
  }
  return out;
}

// Inserts the messages: RECV_F before an F whose input comes from another rank, SEND_F after
// an F whose output goes to one; the same for gradients (after B or I, before B or I).
ActionList with_messages(const ActionList& compute, int p, int n_stages, bool fsdp) {
  auto rank_of = [&](int s) { return s % p; };
  ActionList out;
  std::set<int> unsharded;
  std::map<int, int> last_use;  // stage -> index of its last compute action
  for (size_t k = 0; k < compute.size(); ++k) last_use[compute[k].stage] = static_cast<int>(k);
  for (size_t k = 0; k < compute.size(); ++k) {
    const Action& a = compute[k];
    const int s = a.stage, me = rank_of(s);
    if (fsdp && unsharded.insert(s).second) out.push_back({Op::Unshard, s});
    if (a.op == Op::F && s > 0 && rank_of(s - 1) != me) out.push_back({Op::RecvF, s, a.microbatch});
    if ((a.op == Op::B || a.op == Op::I) && s < n_stages - 1 && rank_of(s + 1) != me)
      out.push_back({Op::RecvB, s, a.microbatch});
    out.push_back(a);
    if (a.op == Op::F && s < n_stages - 1 && rank_of(s + 1) != me)
      out.push_back({Op::SendF, s, a.microbatch});
    if ((a.op == Op::B || a.op == Op::I) && s > 0 && rank_of(s - 1) != me)
      out.push_back({Op::SendB, s, a.microbatch});
    if (fsdp && last_use[s] == static_cast<int>(k)) out.push_back({Op::Reshard, s});
  }
  return out;
}

}  // namespace

const char* op_name(Op op) {
  switch (op) {
    case Op::F:
      return "F";
    case Op::B:
      return "B";
    case Op::I:
      return "I";
    case Op::W:
      return "W";
    case Op::SendF:
      return "SEND_F";
    case Op::RecvF:
      return "RECV_F";
    case Op::SendB:
      return "SEND_B";
    case Op::RecvB:
      return "RECV_B";
    case Op::Unshard:
      return "UNSHARD";
    case Op::Reshard:
      return "RESHARD";
  }
  return "?";
}

bool is_compute(Op op) { return op == Op::F || op == Op::B || op == Op::I || op == Op::W; }

std::string to_string(const Action& a) {
  std::string s = std::to_string(a.stage) + op_name(a.op);
  if (a.microbatch >= 0) s += std::to_string(a.microbatch);
  return s;
}

namespace {

// The schedules by name, in ScheduleKind's order (the one table both directions read).
constexpr const char* kScheduleNames[] = {"gpipe", "1f1b", "interleaved_1f1b", "zbh1"};

}  // namespace

ScheduleKind parse_schedule_kind(std::string_view name) {
  for (size_t i = 0; i < std::size(kScheduleNames); ++i)
    if (name == kScheduleNames[i]) return static_cast<ScheduleKind>(i);
  KILN_FAIL(Value, "unknown pipeline schedule '", name,
            "'; the schedules are gpipe, 1f1b, interleaved_1f1b, zbh1");
}

const char* schedule_kind_name(ScheduleKind kind) {
  const auto i = static_cast<size_t>(kind);
  return i < std::size(kScheduleNames) ? kScheduleNames[i] : "?";
}

std::vector<ActionList> make_schedule(const ScheduleSpec& spec) {
  const int p = spec.pp_size, m = spec.n_microbatches, v = spec.stages_per_rank;
  const char* name = schedule_kind_name(spec.kind);
  KILN_CHECK(p >= 1, Value, "pipeline schedule ", name, ": the pipeline group has ", p, " ranks");
  KILN_CHECK(m >= 1, Value, "pipeline schedule ", name, ": n_microbatches must be positive, got ",
             m);
  if (spec.kind == ScheduleKind::Interleaved1F1B) {
    KILN_CHECK(v >= 2, Value, "interleaved_1f1b needs at least 2 stages per rank, got ", v,
               " (use 1f1b for one)");
    KILN_CHECK(m >= p && m % p == 0, Value, "interleaved_1f1b over ", p,
               " ranks needs a multiple of ", p, " microbatches (at least ", p,
               "), got n_microbatches=", m);
  } else {
    KILN_CHECK(v == 1, Value, "pipeline schedule ", name, " runs one stage per rank, got ", v,
               " (interleaved_1f1b runs several)");
  }
  std::vector<ActionList> compute;
  if (spec.kind == ScheduleKind::ZBH1) {
    compute = zbh1(p, m);
  } else {
    for (int r = 0; r < p; ++r)
      compute.push_back(spec.kind == ScheduleKind::Interleaved1F1B
                            ? interleaved(r, p, m, v)
                            : one_stage_per_rank(r, p, m, spec.kind == ScheduleKind::GPipe,
                                                 /*split=*/false));
  }
  std::vector<ActionList> out;
  for (const ActionList& c : compute) out.push_back(with_messages(c, p, p * v, spec.fsdp));
  return out;
}

std::string format_schedule(const std::vector<ActionList>& actions) {
  std::ostringstream os;
  for (size_t r = 0; r < actions.size(); ++r) {
    os << "rank " << r << ":";
    for (const Action& a : actions[r]) os << " " << to_string(a);
    os << "\n";
  }
  return os.str();
}

std::vector<TimedAction> simulate(const std::vector<ActionList>& actions, const Costs& costs) {
  const int p = static_cast<int>(actions.size());
  int n_stages = 0;
  for (const auto& l : actions)
    for (const Action& a : l) n_stages = std::max(n_stages, a.stage + 1);
  // End times of the compute actions run so far, by (op, stage, microbatch).
  std::map<std::tuple<Op, int, int>, double> end;
  auto ended = [&](Op op, int s, int mb) -> std::optional<double> {
    auto it = end.find({op, s, mb});
    if (it == end.end()) return std::nullopt;
    return it->second;
  };
  // The backward of (s, mb) as the stage before it sees it: B, or I in split schedules.
  auto grad_ready = [&](int s, int mb) {
    auto b = ended(Op::B, s, mb);
    return b ? b : ended(Op::I, s, mb);
  };
  std::vector<size_t> next(p, 0);
  std::vector<double> free_at(p, 0);
  std::vector<TimedAction> out;
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      while (next[r] < actions[r].size()) {
        const Action& a = actions[r][next[r]];
        if (!is_compute(a.op)) {
          ++next[r];
          continue;
        }
        std::optional<double> dep = 0.0;
        auto need = [&](std::optional<double> t) {
          dep = (dep && t) ? std::optional<double>(std::max(*dep, *t)) : std::nullopt;
        };
        if (a.op == Op::F && a.stage > 0) need(ended(Op::F, a.stage - 1, a.microbatch));
        if (a.op == Op::B || a.op == Op::I) {
          need(ended(Op::F, a.stage, a.microbatch));
          if (a.stage < n_stages - 1) need(grad_ready(a.stage + 1, a.microbatch));
        }
        if (a.op == Op::W) need(ended(Op::I, a.stage, a.microbatch));
        if (!dep) break;
        const double cost = a.op == Op::F   ? costs.f
                            : a.op == Op::B ? costs.b
                            : a.op == Op::I ? costs.i
                                            : costs.w;
        const double start = std::max(free_at[r], *dep);
        free_at[r] = start + cost;
        end[{a.op, a.stage, a.microbatch}] = free_at[r];
        out.push_back({r, a, start, free_at[r]});
        ++next[r];
        progress = true;
      }
    }
  }
  std::ostringstream stuck;
  for (int r = 0; r < p; ++r)
    if (next[r] < actions[r].size())
      stuck << " rank " << r << " at " << to_string(actions[r][next[r]]);
  KILN_CHECK(stuck.str().empty(), Runtime, "pipeline schedule deadlocks:", stuck.str(),
             " each wait for an action that never runs");
  return out;
}

double bubble_fraction(const std::vector<TimedAction>& timeline, int pp_size) {
  double makespan = 0, busy = 0;
  for (const TimedAction& t : timeline) {
    makespan = std::max(makespan, t.end);
    busy += t.end - t.start;
  }
  return makespan > 0 ? 1 - busy / (pp_size * makespan) : 0;
}

std::string chrome_trace(const std::vector<TimedAction>& timeline) {
  std::ostringstream os;
  os << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [";
  std::set<int> ranks;
  bool first = true;
  for (const TimedAction& t : timeline) {
    ranks.insert(t.rank);
    os << (first ? "\n" : ",\n") << "{\"name\": \"" << to_string(t.action) << "\", \"cat\": \""
       << op_name(t.action.op) << "\", \"ph\": \"X\", \"pid\": 0, \"tid\": " << t.rank
       << ", \"ts\": " << t.start * 1e6 << ", \"dur\": " << (t.end - t.start) * 1e6
       << ", \"args\": {\"stage\": " << t.action.stage
       << ", \"microbatch\": " << t.action.microbatch << "}}";
    first = false;
  }
  for (int r : ranks)
    os << (first ? "\n" : ",\n")
       << "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": " << r
       << ", \"args\": {\"name\": \"rank " << r << "\"}}",
        first = false;
  os << "\n]}\n";
  return os.str();
}

}  // namespace kiln::dist::pipelining
