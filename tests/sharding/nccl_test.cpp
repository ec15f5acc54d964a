// The NCCL backend (sharding/comm/nccl.cpp) at world size 1: one GPU cannot host two NCCL ranks,
// so multi-rank NCCL stays unverified here. Without a GPU (or in a build without CUDA)
// init_process_group("nccl") raises a clear error and the test skips.
#include "kiln/dist/process_group.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

const Device kGpu("cuda:0");

// The world of one rank on backend "nccl", or nullptr (the reason in `why`) without a GPU.
dist::ProcessGroupPtr init_nccl(std::string& why) {
  dist::InitOptions o;
  o.backend = "nccl";
  o.init_method = "";
  o.rank = 0;
  o.world_size = 1;
  try {
    return dist::init_process_group(o);
  } catch (const Error& e) {
    why = e.what();
    const bool no_device =
        e.kind() == ErrorKind::Runtime && why.find("no CUDA device") != std::string::npos;
    const bool no_cuda_build = e.kind() == ErrorKind::Value &&
                               why.find("nccl needs a build with CUDA") != std::string::npos;
    EXPECT_TRUE(no_device || no_cuda_build) << why;
    EXPECT_FALSE(dist::is_initialized());
    return nullptr;
  }
}

Tensor cpu(const Tensor& t) { return t.to(std::nullopt, Device(kCPU)); }

}  // namespace

TEST(DistNccl, WorldOfOne) {
  std::string why;
  auto pg = init_nccl(why);
  if (!pg) GTEST_SKIP() << why;
  const auto wait = std::chrono::milliseconds(30000);

  for (ScalarType dt : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt64}) {
    for (auto op : {dist::ReduceOp::Sum, dist::ReduceOp::Avg, dist::ReduceOp::Max}) {
      if (op == dist::ReduceOp::Avg && dt == kInt64) continue;
      Tensor t = arange(0, 7, 1, dt, kGpu);
      pg->all_reduce(t, op)->wait(wait);
      expect_close(cpu(t), arange(0, 7, 1, dt));
    }
  }
  Tensor b = arange(0, 5, 1, kFloat32, kGpu);
  pg->broadcast(b, 0)->wait(wait);
  expect_close(cpu(b), arange(0, 5));

  Tensor in = arange(0, 6, 1, kBFloat16, kGpu).reshape({2, 3});
  Tensor out = zeros({2, 3}, kBFloat16, kGpu);
  pg->all_gather_into_tensor(out, in)->wait(wait);
  expect_close(cpu(out), cpu(in));
  pg->reduce_scatter_tensor(out, arange(6, 12, 1, kBFloat16, kGpu).reshape({2, 3}),
                            dist::ReduceOp::Sum)
      ->wait(wait);
  expect_close(cpu(out), arange(6, 12, 1, kBFloat16).reshape({2, 3}));
  Tensor a2a = zeros({3}, kInt64, kGpu);
  pg->all_to_all_single(a2a, arange(3, 6, 1, kInt64, kGpu))->wait(wait);
  expect_close(cpu(a2a), arange(3, 6, 1, kInt64));

  Tensor empty = zeros({0}, kFloat32, kGpu);
  pg->all_reduce(empty)->wait(wait);
  pg->barrier()->wait(wait);

  // A subgroup: ncclCommSplit of the world's communicator.
  auto sub = dist::new_group({0});
  ASSERT_TRUE(sub);
  Tensor s = ones({4}, kFloat32, kGpu);
  sub->all_reduce(s, dist::ReduceOp::Sum)->wait(wait);
  expect_close(cpu(s), ones({4}));

  Tensor host = ones({2});
  expect_error(ErrorKind::Value, "takes tensors on cuda:0", [&] { pg->all_reduce(host); });
  Tensor flags = zeros({2}, kBool, kGpu);
  expect_error(ErrorKind::Type, "cannot reduce bool", [&] { pg->all_reduce(flags); });
  expect_error(ErrorKind::Value, "must be another rank", [&] { pg->send(s, 0); });
  Tensor big = zeros({3}, kFloat32, kGpu);
  expect_error(ErrorKind::Value, "must hold 1 copies", [&] { pg->all_gather_into_tensor(big, s); });
  dist::destroy_process_group();
  EXPECT_FALSE(dist::is_initialized());
}

}  // namespace kiln::testing
