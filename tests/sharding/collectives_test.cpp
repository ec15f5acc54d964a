// Collectives across processes (tests/sharding/harness.h): every collective at world sizes 2, 3
// and 4, sizes 0, 1 and odd, float32/float64/bfloat16/int64, against a reference computed
// locally from every rank's input; 64 MiB at world size 2; a killed rank and a skipped collective
// turn into errors on the others within the timeout.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <thread>

#include "harness.h"
#include "kiln/dist/process_group.h"
#include "kiln/kiln.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

using dist::default_group;
using dist::ReduceOp;

const ScalarType kDtypes[] = {kFloat32, kFloat64, kBFloat16, kInt64};
const int64_t kSizes[] = {0, 1, 7, 1001, 70001};  // 70001 floats take the ring path

// Rank r's input: values in [-2, 2) (integers -2..1 for int64), different on every rank.
Tensor input_of(int r, IntArrayRef sizes, ScalarType dtype) {
  return random(sizes, dtype, -2, 2, 100 + r);
}

double combine(double a, double b, const std::string& op) {
  if (op == "max") return std::max(a, b);
  if (op == "min") return std::min(a, b);
  if (op == "product") return a * b;
  return a + b;
}

// The reduction of every rank's input, elementwise.
std::vector<double> reference(IntArrayRef sizes, ScalarType dtype, const std::string& op) {
  std::vector<double> acc = to_doubles(input_of(0, sizes, dtype));
  for (int r = 1; r < world(); ++r) {
    auto v = to_doubles(input_of(r, sizes, dtype));
    for (size_t i = 0; i < acc.size(); ++i) acc[i] = combine(acc[i], v[i], op);
  }
  if (op == "avg")
    for (double& a : acc) a = dtype == kInt64 ? std::trunc(a / world()) : a / world();
  return acc;
}

// Reports the first mismatch only (the tensors can be large).
void expect_values(const Tensor& got, const std::vector<double>& want, ScalarType dtype,
                   const std::string& what) {
  auto g = to_doubles(got);
  ASSERT_EQ(g.size(), want.size()) << what;
  const double rtol = dtype == kBFloat16 ? 1.6e-2 : 1e-5;
  for (size_t i = 0; i < g.size(); ++i)
    ASSERT_NEAR(g[i], want[i], 1e-5 + rtol * std::fabs(want[i])) << what << " element " << i;
}

std::string label(const char* op, ScalarType dt, int64_t n, const std::string& extra = "") {
  std::ostringstream os;
  os << op << " " << dt << " n=" << n << " " << extra << " (world " << world() << ")";
  return os.str();
}

}  // namespace

KILN_RANK_SCENARIO(every_collective) {
  const int w = world(), r = rank();
  for (ScalarType dt : kDtypes) {
    for (int64_t n : kSizes) {
      for (const char* op : {"sum", "avg", "max", "min", "product"}) {
        Tensor got = all_reduce(input_of(r, {n}, dt), op, "world");
        expect_values(got, reference({n}, dt, op), dt, label("all_reduce", dt, n, op));
      }
      // all_gather_into_tensor: (n,) -> (w * n,)
      Tensor gathered = all_gather_into_tensor(input_of(r, {n}, dt), w, "world");
      std::vector<double> want;
      for (int j = 0; j < w; ++j) {
        auto v = to_doubles(input_of(j, {n}, dt));
        want.insert(want.end(), v.begin(), v.end());
      }
      expect_values(gathered, want, dt, label("all_gather_into_tensor", dt, n));
      // reduce_scatter_tensor: (w * n,) -> (n,), block r of the reduction.
      for (const char* op : {"sum", "avg", "max"}) {
        Tensor got = reduce_scatter_tensor(input_of(r, {w * n}, dt), op, w, "world");
        auto full = reference({w * n}, dt, op);
        expect_values(got, std::vector<double>(full.begin() + r * n, full.begin() + (r + 1) * n),
                      dt, label("reduce_scatter_tensor", dt, n, op));
      }
      Tensor b = broadcast(input_of(r, {n}, dt), w - 1, "world");
      expect_values(b, to_doubles(input_of(w - 1, {n}, dt)), dt, label("broadcast", dt, n));
      // all_to_all_single, equal splits of (w * n, 3): block j of my output is block r of j's
      // input.
      Tensor a2a = all_to_all_single(input_of(r, {w * n, 3}, dt), {}, {}, "world");
      want.clear();
      for (int j = 0; j < w; ++j) {
        auto v = to_doubles(input_of(j, {w * n, 3}, dt));
        want.insert(want.end(), v.begin() + r * n * 3, v.begin() + (r + 1) * n * 3);
      }
      expect_values(a2a, want, dt, label("all_to_all_single", dt, n));
    }
  }
}

KILN_RANK_SCENARIO(uneven_p2p_groups) {
  const int w = world(), r = rank();
  auto pg = default_group();
  // all_to_all_single with uneven splits: rank i sends (i + j) % 3 rows to rank j.
  auto rows = [](int i, int j) -> int64_t { return (i + j) % 3; };
  auto in_rows = [&](int i) {
    int64_t s = 0;
    for (int j = 0; j < w; ++j) s += rows(i, j);
    return s;
  };
  std::vector<int64_t> in_split, out_split;
  for (int j = 0; j < w; ++j) {
    in_split.push_back(rows(r, j));
    out_split.push_back(rows(j, r));
  }
  Tensor got =
      all_to_all_single(input_of(r, {in_rows(r), 2}, kFloat32), out_split, in_split, "world");
  std::vector<double> want;
  for (int j = 0; j < w; ++j) {
    auto v = to_doubles(input_of(j, {in_rows(j), 2}, kFloat32));
    int64_t at = 0;
    for (int k = 0; k < r; ++k) at += rows(j, k);
    want.insert(want.end(), v.begin() + at * 2, v.begin() + (at + rows(j, r)) * 2);
  }
  expect_values(got, want, kFloat32, "all_to_all_single uneven");

  // send/recv around the ring, with the Work API.
  Tensor mine = input_of(r, {5, 3}, kFloat64), from_left = empty({5, 3}, kFloat64);
  auto rq = pg->recv(from_left, (r + w - 1) % w);
  auto sq = pg->send(mine, (r + 1) % w);
  rq->wait();
  sq->wait();
  EXPECT_TRUE(rq->is_completed());
  expect_values(from_left, to_doubles(input_of((r + w - 1) % w, {5, 3}, kFloat64)), kFloat64,
                "recv");

  // Several collectives in flight at once finish in order.
  std::vector<Tensor> ts;
  std::vector<dist::WorkPtr> works;
  for (int i = 0; i < 4; ++i) {
    ts.push_back(input_of(r, {100 + i}, kBFloat16));
    works.push_back(pg->all_reduce(ts.back(), ReduceOp::Sum));
  }
  pg->barrier()->wait();
  for (int i = 0; i < 4; ++i) {
    works[i]->wait();
    expect_values(ts[i], reference({100 + i}, kBFloat16, "sum"), kBFloat16, "async all_reduce");
  }

  // A subgroup of the first and last ranks (every rank calls new_group).
  auto sub = dist::new_group({0, w - 1});
  ASSERT_EQ(static_cast<bool>(sub), r == 0 || r == w - 1);
  if (sub) {
    EXPECT_EQ(sub->size(), 2);
    EXPECT_EQ(sub->rank(), r == 0 ? 0 : 1);
    Tensor s = all_reduce(input_of(r, {33}, kFloat32), "sum", sub->name());
    auto a = to_doubles(input_of(0, {33}, kFloat32)),
         b = to_doubles(input_of(w - 1, {33}, kFloat32));
    for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
    expect_values(s, a, kFloat32, "subgroup all_reduce");
  }
  pg->barrier()->wait();
}

TEST(DistCollectives, World2) { expect_all_pass(run_ranks("every_collective", 2)); }
TEST(DistCollectives, World3) { expect_all_pass(run_ranks("every_collective", 3)); }
TEST(DistCollectives, World4) { expect_all_pass(run_ranks("every_collective", 4)); }
TEST(DistCollectives, UnevenP2PGroupsWorld3) { expect_all_pass(run_ranks("uneven_p2p_groups", 3)); }
TEST(DistCollectives, UnevenP2PGroupsWorld4) { expect_all_pass(run_ranks("uneven_p2p_groups", 4)); }

// 64 MiB of float32 (n = 2^24), the ring with pipelined pieces.
KILN_RANK_SCENARIO(all_reduce_64mib) {
  const int64_t n = int64_t{1} << 24;
  Tensor t = empty({n}, kFloat32);
  float* p = static_cast<float*>(t.data_ptr());
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(i % 1000) * (rank() + 1);
  default_group()->all_reduce(t)->wait();
  const float scale = world() * (world() + 1) / 2.0f;
  for (int64_t i = 0; i < n; ++i)
    if (p[i] != static_cast<float>(i % 1000) * scale) FAIL() << "element " << i << " = " << p[i];
  Tensor g = all_gather_into_tensor(t.slice(0, 0, n / 2), world(), "world");
  EXPECT_EQ(g.numel(), n / 2 * world());
}

TEST(DistCollectives, AllReduce64MiBWorld2) { expect_all_pass(run_ranks("all_reduce_64mib", 2)); }

const std::map<std::string, std::string> kShortTimeout = {{"KILN_COMM_TIMEOUT_S", "3"}};

// Ranks on one host all-reduce through shared memory (Note [Shared-memory ring]); KILN_UCX_SHM=0
// sends every piece as a UCX message instead, as between hosts.
const std::map<std::string, std::string> kOverMessages = {{"KILN_UCX_SHM", "0"}};

TEST(DistCollectives, World3OverMessages) {
  expect_all_pass(run_ranks("every_collective", 3, std::chrono::seconds(60), kOverMessages));
}

TEST(DistCollectives, AllReduce64MiBWorld2OverMessages) {
  expect_all_pass(run_ranks("all_reduce_64mib", 2, std::chrono::seconds(60), kOverMessages));
}

// Rank 0 turns shared memory off and rank 1 does not: both find out, and use messages.
KILN_RANK_SCENARIO(mixed_shared_memory_settings) {
  dist::destroy_process_group();
  if (rank() == 0) setenv("KILN_UCX_SHM", "0", 1);
  dist::init_process_group();
  Tensor t = full({100000}, static_cast<double>(rank() + 1));
  default_group()->all_reduce(t)->wait();
  expect_values(t, std::vector<double>(100000, 3.0), kFloat32, "all_reduce");
}

TEST(DistCollectives, MixedSharedMemorySettings) {
  expect_all_pass(run_ranks("mixed_shared_memory_settings", 2, std::chrono::seconds(30), kShortTimeout));
}

// Ranks that pass different sizes to a large all_reduce fail, and one of them names the sizes
// (the other may find its first piece the expected size, and then wait in vain), on both paths.
KILN_RANK_SCENARIO(mismatched_sizes) {
  Tensor t = ones({100000 + rank()});
  expect_error(ErrorKind::Runtime, "all_reduce #1", [&] { default_group()->all_reduce(t)->wait(); });
}

TEST(DistCollectives, MismatchedSizesAreNamed) {
  for (bool shm : {true, false}) {
    auto env = kShortTimeout;
    if (!shm) env.insert(kOverMessages.begin(), kOverMessages.end());
    auto res = run_ranks("mismatched_sizes", 2, std::chrono::seconds(30), env);
    expect_all_pass(res);
    EXPECT_NE((res[0].output + res[1].output).find("the ranks passed different sizes"),
              std::string::npos)
        << res[0].output << res[1].output;
  }
}

// ---- Faults
// --------------------------------------------------------------------------------------

// Rank 2 dies inside an all_reduce of KILL_NUMEL floats (a large one mid-transfer: Note [Peer
// failures]). 2 ms after the start: 16 MiB take several times that here, even on a loaded
// machine, while 4 MiB once completed in time (CI), so the others timed out at the next one.
KILN_RANK_SCENARIO(killed_mid_all_reduce) {
  auto pg = default_group();
  const int64_t n = std::atoll(std::getenv("KILL_NUMEL"));
  Tensor t = ones({n});
  pg->all_reduce(t)->wait();
  if (rank() == 2) {  // a small all_reduce could finish in 2 ms: die before it then
    Tensor mine = ones({n});
    auto w = n > 1024 ? pg->all_reduce(mine) : nullptr;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    raise(SIGKILL);
  }
  const auto start = std::chrono::steady_clock::now();
  expect_error(ErrorKind::Runtime, "never reached all_reduce #2",
               [&] { pg->all_reduce(t)->wait(); });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(s, 3.0 + 1.5) << "the timeout is 3 s, the desync report waits 0.3 s";
  // The group is aborted: later collectives fail at once.
  expect_error(ErrorKind::Runtime, "aborted by an earlier failure", [&] { pg->barrier()->wait(); });
}

void expect_killed_rank_named(const std::map<std::string, std::string>& env) {
  auto res = run_ranks("killed_mid_all_reduce", 3, std::chrono::seconds(30), env);
  EXPECT_EQ(res[2].signal, SIGKILL) << res[2].output;
  for (int r : {0, 1}) {
    EXPECT_EQ(res[r].exit_code, 0) << "rank " << r << ":\n" << res[r].output;
    EXPECT_NE(res[r].output.find("last collectives of group 'world'"), std::string::npos);
  }
}

TEST(DistFaults, KilledRankRaisesOnOthers) {
  expect_killed_rank_named({{"KILN_COMM_TIMEOUT_S", "3"}, {"KILL_NUMEL", "16"}});
}

TEST(DistFaults, KilledRankMidLargeTransfer) {
  expect_killed_rank_named({{"KILN_COMM_TIMEOUT_S", "3"}, {"KILL_NUMEL", "4194304"}});
}

TEST(DistFaults, KilledRankMidLargeTransferWithPeerErrors) {
  expect_killed_rank_named(
      {{"KILN_COMM_TIMEOUT_S", "3"}, {"KILL_NUMEL", "4194304"}, {"KILN_UCX_PEER_ERRORS", "1"}});
}

KILN_RANK_SCENARIO(skipped_collective) {
  auto pg = default_group();
  Tensor t = ones({16});
  pg->all_reduce(t)->wait();  // #1 everywhere
  if (rank() == 1) {          // rank 1 skips all_reduce #2 and goes on to a barrier
    expect_error(ErrorKind::Runtime, "barrier #2", [&] { pg->barrier()->wait(); });
    return;
  }
  expect_error(ErrorKind::Runtime, "rank 1 is at barrier #2 instead",
               [&] { pg->all_reduce(t)->wait(); });
}

// Large all_reduces go through shared memory (Note [Shared-memory ring]). Two groups of the same
// ranks, used in opposite orders: each rank finds the other's pieces of the other group's
// all_reduce where it waits for its own, and says so at once instead of mixing them up.
KILN_RANK_SCENARIO(crossed_groups) {
  auto world_group = default_group();
  auto other = dist::new_group({0, 1});
  Tensor t = ones({100000});
  expect_error(ErrorKind::Runtime, "out of step",
               [&] { (rank() == 0 ? world_group : other)->all_reduce(t)->wait(); });
}

TEST(DistFaults, CrossedGroupsAreNamed) {
  expect_all_pass(run_ranks("crossed_groups", 2, std::chrono::seconds(30), kShortTimeout));
}

TEST(DistFaults, SkippedCollectiveIsNamed) {
  auto res = run_ranks("skipped_collective", 3, std::chrono::seconds(30), kShortTimeout);
  expect_all_pass(res);
  EXPECT_NE(res[0].output.find("#2 all_reduce float32[16]: timed out"), std::string::npos)
      << res[0].output;
}

}  // namespace kiln::testing

namespace kiln::testing {

// A child forked after init raises instead of hanging
// (See Note [No fork after init] in sharding/comm/process_group.cpp).
KILN_RANK_SCENARIO(fork_after_init) {
  auto pg = default_group();
  pid_t pid = fork();
  if (pid == 0) {
    try {
      pg->barrier()->wait();
    } catch (const Error& e) {
      _exit(std::string(e.what()).find("forked after init_process_group") != std::string::npos ? 0
                                                                                               : 3);
    }
    _exit(4);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  pg->barrier()->wait();  // the parent still works
}

TEST(DistFaults, ForkedChildRaises) { expect_all_pass(run_ranks("fork_after_init", 2)); }

}  // namespace kiln::testing
