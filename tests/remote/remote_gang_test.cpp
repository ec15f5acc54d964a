// Gangs on embedded workers (Note [Gangs] in kiln/client/transport.h): one device over two
// workers, scatter, fetches from rank 0, a Sync naming the failing rank, and the routing of a
// pipeline's stages (Note [Gang stages]). Collectives and transfers need real workers and a
// coordinator: remote_coordinator_test.cpp, tests/python/test_pipelining.py.
#include <gtest/gtest.h>

#include "kiln/client/connection.h"
#include "kiln/client/session.h"
#include "kiln/client/transport.h"
#include "kiln/generated/ops.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

// Two embedded workers as one device (Note [Gangs]): ops run on both, fetches read rank 0.
TEST(RemoteGang, ScatterRunsEveryOpOnEveryRank) {
  auto s = client::connect_in_process(2, {.worker_id = "g"});
  EXPECT_EQ(s.world_size(), 2);
  Tensor x = random({4, 3});
  Tensor shard = s.scatter(x);
  EXPECT_EQ(shard.sizes(), IntArrayRef({2, 3}));
  Tensor w = random({3, 2});
  Tensor y = shard.matmul(w.to(std::nullopt, s.device())).relu();
  expect_close(y.to(std::nullopt, Device(kCPU)), x.slice(0, 0, 2).matmul(w).relu());
  s.sync();
  EXPECT_THROW(s.scatter(random({3, 2})), Error);  // 3 rows do not split in 2
}

TEST(RemoteGang, SyncNamesTheFailingRank) {
  auto s = client::connect_in_process(2, {.worker_id = "g"});
  Tensor idx = s.scatter(from_vector<int64_t>({0, 9}, {2}));  // rank 1's index is out of range
  Tensor picked = kiln::index_select(random({3}).to(std::nullopt, s.device()), 0, idx);
  try {
    s.sync();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
  }
}

// A value made inside a StageScope lives on that worker alone: ops on it run there, and reads go
// there (rank 0 has no such value: a read sent to it would fail).
TEST(RemoteGang, StageValuesLiveOnTheirWorker) {
  auto s = client::connect_in_process(2, {.worker_id = "g"});
  Tensor x = random({3, 2});
  Tensor a;
  {
    client::StageScope on1({1});
    a = x.to(std::nullopt, s.device());
  }
  Tensor b = (a * 2.0).relu();  // recorded outside the scope: routed to a's worker
  expect_close(b.to(std::nullopt, Device(kCPU)), (x * 2.0).relu());
  a = Tensor();  // its Free goes to worker 1 alone
  s.sync();
}

// Values of two stages in one op: the worker lacking one of them names it.
TEST(RemoteGang, AnOpAcrossStagesFailsNamingTheValue) {
  auto s = client::connect_in_process(2, {.worker_id = "g"});
  Tensor a, b;
  {
    client::StageScope on0({0});
    a = random({2}).to(std::nullopt, s.device());
  }
  {
    client::StageScope on1({1});
    b = random({2}).to(std::nullopt, s.device());
  }
  Tensor c = a + b;
  try {
    s.sync();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown value id"), std::string::npos) << e.what();
  }
}

// A fused optimizer step over two stages' parameters is split: each worker updates its own.
TEST(RemoteGang, AListOpOverTwoStagesIsSplit) {
  auto s = client::connect_in_process(2, {.worker_id = "g"});
  Tensor w0 = random({3}), w1 = random({4}), g0 = random({3}), g1 = random({4});
  std::vector<Tensor> params, grads;
  for (int r = 0; r < 2; ++r) {
    client::StageScope on({r});
    params.push_back((r ? w1 : w0).to(std::nullopt, s.device()));
    grads.push_back((r ? g1 : g0).to(std::nullopt, s.device()));
  }
  kiln::_fused_sgd_(params, grads, {}, 0.0, 0.0, 0.5, 0.0, false, false, true);
  expect_close(params[0].to(std::nullopt, Device(kCPU)), w0 - g0 * 0.5);
  expect_close(params[1].to(std::nullopt, Device(kCPU)), w1 - g1 * 0.5);
}

// Transfers move values between the workers of a gang's process group; embedded workers have
// none, and say so. Bad worker numbers are refused before anything is recorded.
TEST(RemoteGang, TransferErrors) {
  auto s = client::connect_in_process(2, {.worker_id = "g"});
  Tensor a;
  {
    client::StageScope on0({0});
    a = random({2}).to(std::nullopt, s.device());
  }
  EXPECT_THROW(client::transfer(a, {0}, {0}), Error);            // not distinct
  EXPECT_THROW(client::transfer(a, {0}, {2}), Error);            // no worker 2
  EXPECT_THROW(client::transfer(a, {0}, {}), Error);             // unpaired
  EXPECT_THROW(client::transfer(random({2}), {0}, {1}), Error);  // not a remote tensor
  Tensor b = client::transfer(a, {0}, {1});
  EXPECT_EQ(b.sizes(), a.sizes());
  try {
    s.sync();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no process group"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln::testing
