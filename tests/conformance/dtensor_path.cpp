// tests/conformance/dtensor_path.cpp: the DTensor path of the conformance driver (builds into
// kiln_tests, with kiln_sharding). It runs inside N ranks (tests/sharding/harness.h): every rank
// walks the same ops and samples, distributes each sample's tensors over the mesh in every
// placement combination it picks, runs the op at the DTensor key and compares full_tensor() of
// each result with eager CPU's. Tests: DTensorConformance.OneDimTwoRanks, OneDimThreeRanks (uneven
// and empty shards) and TwoByTwo.
//
// Note [DTensor conformance]:
//  - Samples: float32 for every sample that has floating data, the others in their own dtype
//    (Options::one_dtype_per_sample), contiguous only. The DTensor key runs the CPU kernels on
//    shards, and the CPU column checks those in every dtype; what this path checks is the
//    placement logic (which piece each rank holds, which collectives run, where a Partial is
//    reduced), which depends on the dtype only through floating vs not (Partial is given to
//    floating tensors only). float32 keeps all three meshes within seconds.
//  - Rows: every sample of a row whose sharding rule is not "replicate"; of a "replicate" row,
//    the first sample, in the aligned combinations whose every mesh dim is Shard(0), Shard(-1) or
//    Partial (that path is shared, so a little of it goes a long way).
//  - Placements: per tensor argument (list elements each on their own; wrapped numbers stay
//    plain), per mesh dim: Replicate(), Shard(d) for every dim d, and Partial(sum) for a floating
//    tensor (distribute_tensor puts the value on index 0, zeros elsewhere: a rule must reduce it
//    before anything non-linear). When the product over the tensors has at most kAllCombos
//    combinations, every one runs; otherwise the union of: all Replicate(); "aligned" ones, where
//    every tensor takes the same choice per mesh dim out of Replicate(), Shard(k) and Shard(-k)
//    (numbered from the front and from the back, so broadcast dims line up) and Partial (a
//    tensor without that dim, or an integer one asked for Partial, stays Replicate()); and
//    "singles", where one tensor takes each of its placements and the others stay Replicate().
//    So every placement of every tensor runs, and so do the combinations where the shards line
//    up; their number grows with the tensors' dims, not exponentially with their count.
//  - Outputs are compared as the driver compares (compare_values, float32 within 1e-5
//    relative); random ops and empty* by shape and dtype only (a sharded random op need not
//    draw what one process draws). Every mutated DTensor argument is compared with eager CPU's
//    (in-place ops, copy_, fill_, the fused optimizer rows). out= variants get an `out` of the
//    result's shape (DTensor does not resize out=).
//  - Collectives must match across ranks, so every rank runs the same checks in the same order,
//    and a rank that raises must not leave the others in a collective: after the op, and again
//    after the gather, the ranks agree (a MAX all-reduce of a flag on the world group) on whether
//    any raised; if so all record the failure and skip the rest of that check.
//  - Rules: a wrapper around the DTensor key's fallback sees every op that reaches it (a
//    composite row's decomposition reaches it op by op) and whether it took the replicate path
//    (DispatchStats::replicated). A call "exercises" its row's rule when it had a Shard or Partial
//    input and did not take the replicate path. Every rule the DTensor key implements
//    (has_sharding_rule) must be exercised on every mesh; the ops that fell back are listed.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "conformance/driver.h"
#include "kiln/dist/dtensor.h"
#include "kiln/dist/process_group.h"
#include "sharding/harness.h"

namespace kiln::conformance {
namespace {

using dist::Placement;
using dist::Placements;

constexpr size_t kAllCombos = 16;

// ---- What the DTensor key did ------------------------------------------------------------------

struct RuleCount {
  int64_t calls = 0;                   // calls that took the rule's sharded path
  int64_t checks = 0;                  // checks with at least one such call
  std::set<std::string> samples;       // "op sample i" of those checks
  std::set<std::string> declined_ops;  // ops whose rule took the replicate path on a sharded input
};

struct State {
  bool active = false;  // inside a DTensorConformance rank
  dist::DeviceMesh mesh;
  BoxedKernel inner = nullptr;  // the DTensor key's fallback
  // Per check: the rules that took their sharded path on a Shard or Partial input.
  std::set<ShardingRule> exercised;
  std::map<ShardingRule, RuleCount> rules;
  int64_t checks = 0;
  std::map<std::string, int64_t> checks_per_op;
  std::vector<std::string> failures;  // every mismatch, in full
};

State& state() {
  static State s;
  return s;
}

// The DTensor key's fallback, watched (See Note [DTensor conformance]).
void watch(const OperatorHandle& op, DispatchKeySet ks, Stack& stack) {
  State& st = state();
  const OpInfo& info = op.info();
  bool sharded_input = false;
  for (int i = 0; i < info.num_args; ++i) {
    const IValue& v = stack[stack.size() - info.num_args + i];
    auto see = [&](const Tensor& t) {
      if (!t.defined() || !dist::is_dtensor(t)) return;
      for (const Placement& p : dist::detail::spec_of(t).placements)
        sharded_input = sharded_input || !p.is_replicate();
    };
    if (v.is_tensor()) see(v.to_tensor());
    if (v.is_tensor_list())
      for (const Tensor& t : v.to_tensor_list()) see(t);
  }
  const int64_t before = dist::dispatch_stats().replicated;
  st.inner(op, ks, stack);
  const bool replicated = dist::dispatch_stats().replicated != before;
  if (!sharded_input || info.is_out || !dist::has_sharding_rule(info.sharding)) return;
  RuleCount& rc = st.rules[info.sharding];
  if (replicated) {
    rc.declined_ops.insert(op.name());
  } else {
    ++rc.calls;
    st.exercised.insert(info.sharding);
  }
}

// ---- Placements
// ----------------------------------------------------------------------------------

// The placements one tensor may take along one mesh dim.
std::vector<Placement> one_dim_choices(const Tensor& t) {
  std::vector<Placement> c{dist::Replicate()};
  for (int64_t d = 0; d < t.dim(); ++d) c.push_back(dist::Shard(d));
  if (is_floating(t.dtype())) c.push_back(dist::Partial());
  return c;
}

// Every placement of one tensor on the mesh (choices per mesh dim, all combined).
std::vector<Placements> tensor_choices(const Tensor& t, int64_t mesh_dims) {
  std::vector<Placements> out{{}};
  const std::vector<Placement> one = one_dim_choices(t);
  for (int64_t i = 0; i < mesh_dims; ++i) {
    std::vector<Placements> next;
    for (const Placements& p : out)
      for (const Placement& c : one) {
        Placements q = p;
        q.push_back(c);
        next.push_back(std::move(q));
      }
    out = std::move(next);
  }
  return out;
}

// An aligned choice along one mesh dim: 0 Replicate, k > 0 Shard(k - 1), k < 0 Shard(k), and
// kPartial Partial; what `t` takes for it (Replicate where it does not apply).
constexpr int kPartial = 1000;
Placement aligned_one(const Tensor& t, int choice) {
  if (choice == kPartial) return is_floating(t.dtype()) ? dist::Partial() : dist::Replicate();
  if (choice > 0 && choice - 1 < t.dim()) return dist::Shard(choice - 1);
  if (choice < 0 && -choice <= t.dim()) return dist::Shard(t.dim() + choice);
  return dist::Replicate();
}

using Combo = std::vector<Placements>;  // per slot

// The combinations of Note [DTensor conformance].
std::vector<Combo> combos(const std::vector<Tensor>& ts, int64_t mesh_dims, bool replicate_row) {
  int64_t max_dim = 0;
  for (const Tensor& t : ts) max_dim = std::max(max_dim, t.dim());
  std::vector<int> aligned_choices{0, kPartial};
  for (int k = 1; k <= max_dim; ++k) {
    aligned_choices.push_back(k);
    aligned_choices.push_back(-k);
  }
  if (replicate_row) aligned_choices = {1, -1, kPartial};
  std::vector<Combo> out;
  std::set<std::string> seen;
  auto add = [&](Combo c) {
    std::string key;
    for (const Placements& p : c) key += dist::placements_str(p);
    if (seen.insert(key).second) out.push_back(std::move(c));
  };
  // Aligned: every tensor takes the same choice per mesh dim.
  std::vector<std::vector<int>> per_mesh{{}};
  for (int64_t i = 0; i < mesh_dims; ++i) {
    std::vector<std::vector<int>> next;
    for (const auto& p : per_mesh)
      for (int c : aligned_choices) {
        auto q = p;
        q.push_back(c);
        next.push_back(std::move(q));
      }
    per_mesh = std::move(next);
  }
  if (replicate_row) {
    for (const auto& choice : per_mesh) {
      if (std::adjacent_find(choice.begin(), choice.end(), std::not_equal_to<>()) != choice.end())
        continue;  // the same choice on every mesh dim
      Combo c;
      for (const Tensor& t : ts) {
        Placements p;
        for (int x : choice) p.push_back(aligned_one(t, x));
        c.push_back(std::move(p));
      }
      add(std::move(c));
    }
    return out;
  }
  std::vector<std::vector<Placements>> choices;
  size_t product = 1;
  for (const Tensor& t : ts) {
    choices.push_back(tensor_choices(t, mesh_dims));
    product = std::min<size_t>(product * choices.back().size(), kAllCombos + 1);
  }
  if (product <= kAllCombos) {  // every combination
    std::vector<size_t> idx(ts.size(), 0);
    while (true) {
      Combo c;
      for (size_t k = 0; k < ts.size(); ++k) c.push_back(choices[k][idx[k]]);
      add(std::move(c));
      size_t k = 0;
      for (; k < ts.size(); ++k) {
        if (++idx[k] < choices[k].size()) break;
        idx[k] = 0;
      }
      if (k == ts.size()) return out;
    }
  }
  const Combo all_replicate(ts.size(), Placements(mesh_dims, dist::Replicate()));
  add(all_replicate);
  for (const auto& choice : per_mesh) {
    Combo c;
    for (const Tensor& t : ts) {
      Placements p;
      for (int x : choice) p.push_back(aligned_one(t, x));
      c.push_back(std::move(p));
    }
    add(std::move(c));
  }
  for (size_t k = 0; k < ts.size(); ++k)
    for (const Placements& p : choices[k]) {
      Combo c = all_replicate;
      c[k] = p;
      add(std::move(c));
    }
  return out;
}

std::string combo_str(const std::vector<Slot>& slots, const Combo& c, const OpInfo& info) {
  std::ostringstream os;
  for (size_t k = 0; k < slots.size(); ++k) {
    os << (k ? ", " : "") << info.args[slots[k].arg].name;
    if (slots[k].member >= 0) os << "[" << slots[k].member << "]";
    os << " " << dist::placements_str(c[k]);
  }
  return os.str();
}

// ---- One check
// -----------------------------------------------------------------------------------

// Whether any rank says so (a MAX all-reduce over the world group; every rank must call it).
bool any_rank(bool mine) {
  Tensor f = full({1}, mine ? 1.0 : 0.0, kFloat32);
  dist::default_group()->all_reduce(f, dist::ReduceOp::Max)->wait();
  return f.item<float>() > 0;
}

Tensor gathered(const Tensor& t) {
  return dist::is_dtensor(t) ? dist::DTensor(t).full_tensor() : t;
}

// Random ops and empty*: shapes and dtypes only (See Note [DTensor conformance]).
std::string compare(const Case& c, std::vector<Tensor> got, std::vector<Tensor> want) {
  if (c.random() || c.row.name.rfind("empty", 0) == 0) {
    for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
      got[i] = zeros(got[i].sizes(), got[i].dtype());
      want[i] = zeros(want[i].sizes(), want[i].dtype());
    }
  }
  return compare_values(got, want, false);
}

// The op on `sample` with its slots placed by `combo`: "" when the gathered results agree with
// eager CPU's. Every rank runs it with the same arguments (collectives inside).
std::string check(const Case& c, const Stack& sample, const std::vector<Slot>& slots,
                  const Combo& combo) {
  State& st = state();
  const OpInfo& info = c.op().info();
  Stack s = testing::clone_stack(sample), args;
  std::string error;
  st.exercised.clear();
  try {
    for (size_t k = 0; k < slots.size(); ++k)
      put(s, slots[k], dist::distribute_tensor(get(s, slots[k]), st.mesh, combo[k]));
    args = s;  // the call leaves its results on `s`
    manual_seed(c.seed);
    c.op().call_boxed(s);
  } catch (const std::exception& e) {
    error = std::string("raised where eager CPU did not: ") + e.what();
  }
  if (any_rank(!error.empty()))
    return error.empty() ? "another rank raised (its output says what)" : error;
  std::vector<Tensor> got, want = testing::outputs_of(c.cpu_out);
  std::vector<std::pair<Slot, Tensor>> mutated;  // an argument the op writes, gathered
  try {
    for (const Tensor& t : testing::outputs_of(s)) got.push_back(gathered(t));
    for (const Slot& slot : slots)
      if (info.args[slot.arg].is_mutable) mutated.emplace_back(slot, gathered(get(args, slot)));
  } catch (const std::exception& e) {
    error = std::string("gathering the results raised: ") + e.what();
  }
  if (any_rank(!error.empty()))
    return error.empty() ? "another rank raised gathering the results" : error;
  for (ShardingRule r : st.exercised) {
    ++st.rules[r].checks;
    st.rules[r].samples.insert(c.row.name + " " + c.where);
  }
  std::string why = compare(c, got, want);
  for (const auto& [slot, t] : mutated) {
    if (!why.empty()) break;
    why = compare(c, {t}, {get(c.cpu_in, slot)});
    if (!why.empty()) why = std::string("argument ") + info.args[slot.arg].name + ": " + why;
  }
  return why;
}

class DTensorPath : public Path {
 public:
  std::string name() const override { return "DTensor"; }
  // The shards run the CPU kernels.
  testing::Backend claims() const override { return testing::Backend::CPU; }
  DispatchKey key() const override { return DispatchKey::DTensor; }
  std::string unavailable() const override {
    return state().active ? "" : "runs inside ranks only (the DTensorConformance tests)";
  }

  Outcome run(const Case& c) const override {
    State& st = state();
    const OpInfo& info = c.op().info();
    const bool replicate_row = info.sharding == ShardingRule::Replicate;
    if (replicate_row && c.index > 0)
      return Outcome::nothing_to_compare("rule replicate: its first sample only");
    Stack sample = testing::clone_stack(c.sample);
    // out=: an `out` of the result's shape.
    if (info.is_out) {
      const std::vector<Tensor> want = testing::outputs_of(c.cpu_out);
      size_t k = 0;
      for (int i = 0; i < info.num_args && k < want.size(); ++i)
        if (info.args[i].is_mutable && sample[i].is_tensor()) {
          sample[i] = zeros(want[k].sizes(), want[k].dtype());
          ++k;
        }
    }
    std::vector<Slot> slots;
    std::vector<Tensor> ts;
    for (int i = 0; i < static_cast<int>(sample.size()) && i < info.num_args; ++i) {
      auto take = [&](const Tensor& t, int member) {
        if (!t.defined() || t.impl()->is_wrapped_number()) return;
        slots.push_back({i, member});
        ts.push_back(t);
      };
      if (sample[i].is_tensor()) take(sample[i].to_tensor(), -1);
      if (sample[i].is_tensor_list())
        for (int k = 0; k < static_cast<int>(sample[i].to_tensor_list().size()); ++k)
          take(sample[i].to_tensor_list()[k], k);
    }
    if (slots.empty()) return Outcome::nothing_to_compare("no tensor argument to distribute");
    std::string first;
    for (const Combo& combo : combos(ts, st.mesh.ndim(), replicate_row)) {
      ++st.checks;
      ++st.checks_per_op[c.row.name];
      const std::string why = check(c, sample, slots, combo);
      if (why.empty()) continue;
      std::string line = c.row.name + " " + c.where + " [" + combo_str(slots, combo, info) +
                         "] on " + st.mesh.str() + ": " + why;
      st.failures.push_back(line);
      if (first.empty()) first = line;
    }
    return Outcome::failed_unless(first);
  }
};

KILN_CONFORMANCE_PATH(DTensorPath);

// ---- The tests
// -----------------------------------------------------------------------------------

std::vector<int64_t> mesh_shape() {
  const char* v = std::getenv("KILN_CONFORMANCE_MESH");
  KILN_CHECK(v != nullptr, Value, "KILN_CONFORMANCE_MESH is not set");
  return std::string(v) == "2x2" ? std::vector<int64_t>{2, 2} : std::vector<int64_t>{std::atoll(v)};
}

void quiet(const std::string&) {}  // the replicate path's warnings (fallback_ops() lists them)

KILN_RANK_SCENARIO(conformance_dtensor) {
  State& st = state();
  st.mesh = dist::init_device_mesh("cpu", mesh_shape());
  st.active = true;
  Dispatcher& d = Dispatcher::get();
  st.inner = d.fallback(DispatchKey::DTensor);
  ASSERT_NE(st.inner, nullptr) << "no DTensor fallback registered";
  d.register_fallback(DispatchKey::DTensor, &watch);
  const WarningHandler before = set_warning_handler(&quiet);
  dist::clear_fallback_ops();
  Options opt;
  opt.paths = {"DTensor"};
  opt.one_dtype_per_sample = true;
  opt.non_contiguous = false;
  if (const char* op = std::getenv("KILN_CONFORMANCE_OP")) opt.op = op;
  const Matrix m = run(opt);
  set_warning_handler(before);
  d.register_fallback(DispatchKey::DTensor, st.inner);
  st.active = false;

  // Every rank checks the same results; rank 0 reports them.
  const bool report = testing::rank() == 0;
  for (const Matrix::Problem& p : m.problems())
    if (p.path == "DTensor" && p.status == Status::Missing && report)
      ADD_FAILURE() << p.op << " " << scalar_type_name(p.dtype) << ": missing: " << p.detail;
  constexpr size_t kShown = 40;
  for (size_t i = 0; i < st.failures.size() && report; ++i)
    if (i < kShown) ADD_FAILURE() << st.failures[i];
  if (st.failures.size() > kShown && report)
    ADD_FAILURE() << "... and " << st.failures.size() - kShown << " more mismatches";
  std::ostringstream os;
  os << "[DTensor] mesh " << st.mesh.str() << ": " << st.checks << " checks of "
     << st.checks_per_op.size() << " ops, " << st.failures.size() << " mismatches\n";
  for (int r = 0; r < kNumShardingRules; ++r) {
    const auto rule = static_cast<ShardingRule>(r);
    if (!dist::has_sharding_rule(rule)) continue;
    const RuleCount& rc = st.rules[rule];
    std::set<std::string> ops;
    for (const std::string& s : rc.samples) ops.insert(s.substr(0, s.find(' ')));
    os << "[DTensor] rule " << to_string(rule) << ": " << rc.checks << " checks, "
       << rc.samples.size() << " samples, " << ops.size() << " ops took it on sharded inputs";
    if (!rc.declined_ops.empty()) {
      os << "; replicated instead (a sharded input the rule does not handle):";
      for (const std::string& o : rc.declined_ops) os << " " << o;
    }
    os << "\n";
    if (rc.checks == 0 && report)
      ADD_FAILURE() << "sharding rule '" << to_string(rule)
                    << "' is implemented but no sample exercised it on " << st.mesh.str();
  }
  const std::vector<std::string> fell_back = dist::fallback_ops();
  os << "[DTensor] " << fell_back.size() << " ops fell back (rule not implemented yet):";
  for (const std::string& o : fell_back) os << " " << o;
  os << "\n";
  if (report) std::cout << os.str() << std::flush;
}

// Rank 0's report (the lines that start with "[DTensor]").
void run_mesh(const std::string& mesh, int world) {
  std::map<std::string, std::string> env{{"KILN_CONFORMANCE_MESH", mesh}};
  if (const char* op = std::getenv("KILN_CONFORMANCE_OP")) env["KILN_CONFORMANCE_OP"] = op;
  const auto results =
      testing::run_ranks("conformance_dtensor", world, std::chrono::seconds(120), env);
  testing::expect_all_pass(results);
  std::istringstream lines(results.at(0).output);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("[DTensor]", 0) == 0) std::cout << line << "\n";
}

TEST(DTensorConformance, OneDimTwoRanks) { run_mesh("2", 2); }
TEST(DTensorConformance, OneDimThreeRanks) { run_mesh("3", 3); }
TEST(DTensorConformance, TwoByTwo) { run_mesh("2x2", 4); }

}  // namespace
}  // namespace kiln::conformance
