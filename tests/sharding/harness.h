// tests/sharding/harness.h: runs a scenario in N ranks, each a fresh exec of this test binary
// (/proc/self/exe; never a fork, so no rank inherits UCX state), and collects their exit codes.
//
//   KILN_RANK_SCENARIO(sum_ones) {               // runs in every rank: rank(), world()
//     Tensor t = ones({4});
//     kiln::dist::default_group()->all_reduce(t)->wait();
//     EXPECT_EQ(t.item<float>(), world());
//   }
//   TEST(Dist, SumOnes) { expect_all_pass(run_ranks("sum_ones", 3)); }
//
// The parent hosts the store (KILN_AGENT_STORE=1) and sets the launch environment (RANK,
// WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK, LOCAL_WORLD_SIZE, OMP_NUM_THREADS=1). A rank
// calls init_process_group() itself (the scenario body runs after it) and reports failures through
// GoogleTest; its output is captured and shown when it fails.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace kiln::testing {

struct RankResult {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  bool timed_out = false;
  std::string output;
};

using ScenarioFn = void (*)();
int register_scenario(const char* name, ScenarioFn fn);
int rank();
int world();

std::vector<RankResult> run_ranks(const std::string& scenario, int world,
                                  std::chrono::seconds timeout = std::chrono::seconds(60),
                                  const std::map<std::string, std::string>& env = {});
// Every rank exited 0 (the output of the others is printed).
void expect_all_pass(const std::vector<RankResult>& results);

}  // namespace kiln::testing

#define KILN_RANK_SCENARIO(NAME)                                        \
  static void kiln_scenario_##NAME();                                   \
  static const int kiln_scenario_##NAME##_reg =                         \
      ::kiln::testing::register_scenario(#NAME, &kiln_scenario_##NAME); \
  static void kiln_scenario_##NAME()
