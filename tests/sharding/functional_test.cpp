// The collectives' op-table rows (tensor/ops/comm.toml) in one process: on a one-rank group, on
// Meta, their errors and derivatives. Their manifest samples are in
// tests/samples/comm/comm_samples.cpp.
#include "kiln/dist/process_group.h"
#include "kiln/kiln.h"
#include "samples/comm/comm_samples.h"
#include "test_util.h"

namespace kiln::testing {

TEST(DistFunctional, OneRankGroupIsIdentity) {
  const std::string g = local_group();
  for (ScalarType dt : {kFloat32, kFloat64, kBFloat16, kInt64, kInt32}) {
    Tensor x = random({3, 4}, dt);
    for (const char* op : {"sum", "avg", "max", "min", "product"}) {
      Tensor y = all_reduce(x, op, g);
      EXPECT_FALSE(y.is_alias_of(x));
      expect_close(y, x);
    }
    expect_close(all_gather_into_tensor(x, 1, g), x);
    expect_close(reduce_scatter_tensor(x, "sum", 1, g), x);
    expect_close(broadcast(x, 0, g), x);
    expect_close(all_to_all_single(x, {}, {}, g), x);
    EXPECT_TRUE(wait_tensor(x).is_alias_of(x));
  }
  expect_close(all_gather_into_tensor(full({}, 2.0), 1, g), full({1}, 2.0));
  expect_close(all_reduce(non_contiguous(random({2, 3})), "sum", g), random({2, 3}));
}

TEST(DistFunctional, MetaShapes) {
  Tensor m = empty({6, 2}, kFloat32, Device(DeviceType::Meta));
  EXPECT_EQ(all_gather_into_tensor(m, 4, "any").sizes(), IntArrayRef({24, 2}));
  EXPECT_EQ(reduce_scatter_tensor(m, "sum", 3, "any").sizes(), IntArrayRef({2, 2}));
  EXPECT_EQ(all_to_all_single(m, {1, 4}, {2, 4}, "any").sizes(), IntArrayRef({5, 2}));
  EXPECT_EQ(all_reduce(m, "max", "any").sizes(), IntArrayRef({6, 2}));
}

TEST(DistFunctional, Errors) {
  const std::string g = local_group();
  Tensor x = random({4, 2});
  expect_error(ErrorKind::Value, "no process group named 'nope'",
               [&] { all_reduce(x, "sum", "nope"); });
  expect_error(ErrorKind::Value,
               "reduce_op must be 'sum', 'avg', 'max', 'min' or 'product', got 'mean'",
               [&] { all_reduce(x, "mean", g); });
  expect_error(ErrorKind::Value, "group_size 2 does not match group 'local' of size 1",
               [&] { all_gather_into_tensor(x, 2, g); });
  expect_error(ErrorKind::Value,
               "dim 0 of the input must be divisible by the group size 3, got shape [4, 2]",
               [&] { reduce_scatter_tensor(x, "sum", 3, g); });
  expect_error(ErrorKind::Value, "input_split_sizes [1, 1] must sum to dim 0 of the input", [&] {
    all_to_all_single(x, {1, 1}, {1, 1}, g);
  });
  expect_error(ErrorKind::Value, "broadcast: src 1 is not a rank of group 'local'",
               [&] { broadcast(x, 1, g); });
  Tensor flags = ones({2}, kBool);
  expect_error(ErrorKind::Type, "cannot reduce bool",
               [&] { dist::find_group(g)->all_reduce(flags); });
  Tensor strided = non_contiguous(random({2, 3}));
  expect_error(ErrorKind::Value, "expected a contiguous tensor",
               [&] { dist::find_group(g)->all_reduce(strided); });
  expect_error(ErrorKind::Value, "unknown reduce op 'mean'", [] { dist::parse_reduce_op("mean"); });
}

TEST(DistFunctional, Derivatives) {
  const std::string g = local_group();
  Tensor x = random({4, 2}).requires_grad_();
  all_reduce(x, "sum", g).sum().backward();
  expect_close(x.grad(), ones({4, 2}));
  Tensor y = random({4}).requires_grad_();
  (reduce_scatter_tensor(y, "avg", 1, g) * 3.0).sum().backward();
  expect_close(y.grad(), full({4}, 3.0));
  Tensor z = random({2}).requires_grad_();
  expect_error(ErrorKind::NotImplemented,
               "derivative is implemented for reduce_op 'sum' and 'avg' only",
               [&] { all_reduce(z, "max", g).sum().backward(); });
}

}  // namespace kiln::testing
