// The fake process group (Note [Fake process group]) and the FSDP x TP planner
// (kiln/dist/plan.h): a 70B Llama on 1,024 ranks, beside the ZeRO-3 and Megatron formulas.
#include "kiln/dist/plan.h"

#include <gtest/gtest.h>

#include "kiln/dist/device_mesh.h"
#include "kiln/kiln.h"
#include "test_util.h"

namespace kiln::dist {
namespace {

TEST(FakeGroup, CountsWhatEachCollectiveSends) {
  InitOptions io;
  io.backend = "fake";
  io.init_method = "";
  io.rank = 3;
  io.world_size = 8;
  ProcessGroupPtr pg = init_process_group(io);
  reset_fake_comm_stats();
  EXPECT_EQ(pg->rank(), 3);
  EXPECT_EQ(pg->size(), 8);
  Tensor t = empty_on({1000}, kFloat32, kMeta);
  pg->all_reduce(t)->wait();
  Tensor big = empty_on({8000}, kFloat32, kMeta);
  pg->all_gather_into_tensor(big, t)->wait();
  pg->reduce_scatter_tensor(t, big)->wait();
  Tensor cpu = ones({4});
  pg->broadcast(cpu, 3)->wait();
  EXPECT_EQ(cpu.sum().item<float>(), 4.0f);  // untouched
  auto s = fake_comm_stats();
  EXPECT_EQ(s["all_reduce"].calls, 1);
  EXPECT_EQ(s["all_reduce"].bytes, 2 * 7 * 4000 / 8);
  EXPECT_EQ(s["all_gather_into_tensor"].bytes, 7 * 4000);
  EXPECT_EQ(s["reduce_scatter_tensor"].bytes, 7 * 32000 / 8);
  EXPECT_EQ(s["broadcast"].bytes, 16);
  // The checks of the real collectives still hold.
  Tensor wrong = empty_on({10}, kFloat32, kMeta);
  testing::expect_error(ErrorKind::Value, "must hold 8 copies",
                        [&] { pg->all_gather_into_tensor(wrong, t); });
  // A mesh of 1,024 ranks makes its 136 groups without a transport.
  destroy_process_group();
  io.rank = 0;
  io.world_size = 1024;
  init_process_group(io);
  DeviceMesh mesh = init_device_mesh("cpu", {128, 8}, {"dp", "tp"});
  EXPECT_EQ(mesh.group("dp")->size(), 128);
  EXPECT_EQ(mesh.group("tp")->size(), 8);
  destroy_process_group();
  io.rank = 8;
  io.world_size = 8;
  testing::expect_error(ErrorKind::Value, "0 <= rank < world_size",
                        [&] { init_process_group(io); });
}

TEST(Plan, Llama70bOn1024RanksAgreesWithZero3) {
  PlanOptions o;
  o.model = LlamaShape::llama3_70b();
  o.dp = 128;
  o.tp = 8;
  PlanReport r = plan_fsdp_tp(o);
  std::cout << r.str();
  EXPECT_GT(r.psi, 70'000'000'000);
  EXPECT_LT(r.psi, 71'000'000'000);
  EXPECT_EQ(r.world, 1024);
  EXPECT_NEAR(r.state_bytes() / r.zero3_state_bytes, 1.0, 0.05);
  EXPECT_NEAR(r.fsdp_bytes / r.zero3_comm_bytes, 1.0, 0.05);
  EXPECT_NEAR(r.tp_bytes / r.megatron_tp_bytes, 1.0, 0.05);
  EXPECT_LT(r.seconds, 10.0);
  EXPECT_FALSE(is_initialized());  // the planner's fake group is gone
  // Every rank's shards add up to the model: the sum over ranks of the parameters' elements,
  // divided by the replication over tp of the norms, is Psi (an 8b model on 2 x 4 ranks).
  o.model = LlamaShape::llama3_8b();
  o.dp = 2;
  o.tp = 4;
  int64_t elems = 0;
  for (int64_t rank = 0; rank < 8; ++rank) {
    o.rank = rank;
    elems += plan_fsdp_tp(o).param_bytes / 4;
  }
  const LlamaShape& m = o.model;
  const int64_t norms = (2 * m.layers + 1) * m.dim;
  EXPECT_EQ(elems - norms * (o.tp - 1), m.num_parameters());
}

TEST(Plan, BadInput) {
  PlanOptions o;
  o.dp = 0;
  testing::expect_error(ErrorKind::Value, "dp and tp must be >= 1", [&] { plan_fsdp_tp(o); });
  o.dp = 2;
  o.rank = 2;
  testing::expect_error(ErrorKind::Value, "rank 2 is not in a world of 2",
                        [&] { plan_fsdp_tp(o); });
  testing::expect_error(ErrorKind::Value, "unknown model 'gpt5'",
                        [&] { LlamaShape::by_name("gpt5"); });
  o.rank = 0;
  o.model.heads = 7;
  testing::expect_error(ErrorKind::Value, "bad model shape", [&] { plan_fsdp_tp(o); });
  o.model = LlamaShape::llama3_8b();
  InitOptions io;
  io.backend = "fake";
  io.init_method = "";
  io.rank = 0;
  io.world_size = 2;
  init_process_group(io);
  testing::expect_error(ErrorKind::Value, "a process group exists already",
                        [&] { plan_fsdp_tp(o); });
  destroy_process_group();
}

}  // namespace
}  // namespace kiln::dist
