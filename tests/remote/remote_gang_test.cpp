// Gangs on embedded workers (Note [Gangs] in kiln/client/transport.h): one device over two
// workers, scatter, fetches from rank 0, a Sync naming the failing rank. Collectives need real
// workers and a coordinator: remote_coordinator_test.cpp.
#include <gtest/gtest.h>

#include "kiln/client/session.h"
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

}  // namespace
}  // namespace kiln::testing
