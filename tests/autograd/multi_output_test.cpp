// Multi-output nodes in the engine: max.dim/min.dim (values differentiable, indices not), their
// saved `indices` output, hooks and retain_grad on one output, and list outputs (split/chunk).
#include <gtest/gtest.h>

#include "autograd/gradcheck.h"
#include "test_util.h"

namespace kiln {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::random;

TEST(AutogradMultiOutput, ValuesAndIndicesSlots) {
  Tensor x = testing::from_vector<double>({3, 1, 2, 0, 5, 4}, {2, 3}).requires_grad_();
  auto [v, i] = min(x, 1);
  EXPECT_EQ(v.output_nr(), 0);
  EXPECT_EQ(v.grad_fn()->num_inputs(), 2u);  // one slot per output, indices included
  EXPECT_EQ(v.grad_fn()->input_metadata(1).dtype, kInt64);
  v.retain_grad();
  Tensor seen;
  autograd::register_hook(v, [&](const Tensor& g) {
    seen = g;
    return g * 2;
  });
  (v * testing::from_vector<double>({1, 10}, {2})).sum().backward();
  expect_close(seen, testing::from_vector<double>({1, 10}, {2}), 0, 0);
  expect_close(v.grad(), testing::from_vector<double>({2, 20}, {2}), 0, 0);
  expect_close(x.grad(), testing::from_vector<double>({0, 2, 0, 20, 0, 0}, {2, 3}), 0, 0);
}

TEST(AutogradMultiOutput, SavedIndicesAreVersionChecked) {
  // max.dim saves its `indices` output; changing it in place before backward is an error.
  Tensor x = random({2, 3}, kFloat64, -1, 1, 1).requires_grad_();
  auto [v, i] = max(x, 1);
  i.zero_();
  expect_error(ErrorKind::Runtime, "'indices' saved by MaxBackward1", [&] { v.sum().backward(); });
  // Freed after backward like any saved tensor.
  auto [v2, i2] = max(x, 0);
  v2.sum().backward();
  expect_error(ErrorKind::Runtime, "second time", [&] { v2.sum().backward(); });
}

TEST(AutogradMultiOutput, ListOutputsWithUnusedParts) {
  // split's parts are views of one node: unused parts get zeros.
  Tensor x = random({6, 2}, kFloat64, -1, 1, 2).requires_grad_();
  auto parts = split(x, 2, 0);
  ASSERT_EQ(parts.size(), 3u);
  (parts[1] * 3).sum().backward();
  auto g = testing::to_doubles(x.grad());
  for (int64_t k = 0; k < 12; ++k) EXPECT_EQ(g[k], (k >= 4 && k < 8) ? 3.0 : 0.0) << k;
  // cat of a split gives back the identity's gradient.
  Tensor y = random({5, 3}, kFloat64, -1, 1, 3).requires_grad_();
  auto c = chunk(y, 3, 0);
  cat(c, 0).sum().backward();
  expect_close(y.grad(), ones_like(y.detach()), 0, 0);
}

TEST(AutogradMultiOutput, SplitAndChunkShareOneNode) {
  // One SplitBackward0 for all pieces: its gradient is one cat of theirs (no zero-padded copy per
  // piece); the pieces stay views of the input (their base).
  Tensor x = random({5, 2}, kFloat64, -1, 1, 4).requires_grad_();
  auto parts = split(x, 2, 0);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_STREQ(parts[0].grad_fn()->name(), "SplitBackward0");
  EXPECT_EQ(parts[0].grad_fn(), parts[2].grad_fn());
  EXPECT_EQ(parts[2].output_nr(), 2);
  EXPECT_EQ(parts[1].grad_fn()->num_inputs(), 3u);
  (parts[0] * 2 + parts[1] * 3).sum().backward();
  auto g = testing::to_doubles(x.grad());
  for (int64_t k = 0; k < 10; ++k) EXPECT_EQ(g[k], k < 4 ? 2.0 : (k < 8 ? 3.0 : 0.0)) << k;
  auto c = chunk(x, 2, 1);
  EXPECT_STREQ(c[1].grad_fn()->name(), "ChunkBackward0");
  x.grad().zero_();
  (c[1] * 5).sum().backward();
  g = testing::to_doubles(x.grad());
  for (int64_t k = 0; k < 10; ++k) EXPECT_EQ(g[k], k % 2 ? 5.0 : 0.0) << k;
  // In place on a piece rebases the whole tensor (Note [CopySlices]; PyTorch refuses this for
  // multi-output views, whose view functions it cannot replay: Kiln regenerates by geometry).
  Tensor y = x * 1;
  auto ys = split(y, 2, 0);
  ys[0].add_(ys[1]);  // rows 0-1 += rows 2-3
  x.grad().zero_();
  (y * 1).sum().backward();
  g = testing::to_doubles(x.grad());
  for (int64_t k = 0; k < 10; ++k) EXPECT_EQ(g[k], (k >= 4 && k < 8) ? 2.0 : 1.0) << k;
}

}  // namespace
}  // namespace kiln
