// Activation checkpointing (Note [Checkpointing] in checkpoint.h): gradients equal the plain
// call's bit for bit, random ops replayed, intermediates not kept.
#include <gtest/gtest.h>

#include "autograd/gradcheck.h"
#include "test_util.h"

namespace kiln {
namespace {

using autograd::variable_list;
using testing::expect_close;
using testing::random;

void expect_bitwise_equal(const Tensor& a, const Tensor& b) {
  ASSERT_TRUE(a.defined());
  ASSERT_TRUE(b.defined());
  ASSERT_EQ(a.sizes(), b.sizes());
  auto va = testing::to_doubles(a), vb = testing::to_doubles(b);
  for (size_t i = 0; i < va.size(); ++i) EXPECT_EQ(va[i], vb[i]) << "element " << i;
}

// A small block with a parameter captured from outside and dropout (bernoulli) inside.
struct Block {
  Tensor w;
  variable_list operator()(const variable_list& in) const {
    Tensor h = tanh(mm(in[0], w));
    Tensor keep = bernoulli(full_like(h.detach(), 0.5));
    return {h * keep * 2 + in[1]};
  }
};

TEST(AutogradCheckpoint, SameGradientsBitForBitWithRandomOps) {
  Tensor x0 = random({4, 3}, kFloat64, -1, 1, 1);
  Tensor b0 = random({4, 5}, kFloat64, -1, 1, 2);
  Tensor w0 = random({3, 5}, kFloat64, -1, 1, 3);
  auto run = [&](bool ckpt, Tensor& gx, Tensor& gb, Tensor& gw, Tensor& out) {
    Tensor x = x0.clone().requires_grad_();
    Tensor b = b0.clone().requires_grad_();
    Block blk{w0.clone().requires_grad_()};
    manual_seed(1234);
    Tensor xs = x * 1.5;  // a non-leaf input
    variable_list y = ckpt ? autograd::checkpoint(blk, {xs, b}) : blk({xs, b});
    out = y[0].detach();
    // The generator moves on between forward and backward: replay must not depend on it.
    Tensor noise = rand({7}, std::nullopt, kFloat64);
    (y[0] * y[0]).sum().backward();
    gx = x.grad();
    gb = b.grad();
    gw = blk.w.grad();
  };
  Tensor gx1, gb1, gw1, o1, gx2, gb2, gw2, o2;
  run(false, gx1, gb1, gw1, o1);
  run(true, gx2, gb2, gw2, o2);
  expect_bitwise_equal(o1, o2);
  expect_bitwise_equal(gx1, gx2);
  expect_bitwise_equal(gb1, gb2);
  expect_bitwise_equal(gw1, gw2);
  // The mask is random (some dropped, some kept), so replay mattered.
  auto v = testing::to_doubles(o1 - b0);
  int zeros = 0;
  for (double d : v) zeros += d == 0.0;
  EXPECT_GT(zeros, 0);
  EXPECT_LT(zeros, static_cast<int>(v.size()));
}

TEST(AutogradCheckpoint, WithoutRngReplayMasksDiffer) {
  Tensor x = random({64}, kFloat64, 0.5, 1, 4).requires_grad_();
  auto fn = [](const variable_list& in) {
    return variable_list{in[0] * bernoulli(full_like(in[0].detach(), 0.5))};
  };
  manual_seed(7);
  Tensor y = autograd::checkpoint(fn, {x}, /*preserve_rng_state=*/false)[0];
  Tensor mask = (y.detach() != 0).to(kFloat64);
  y.sum().backward();
  Tensor grad_mask = (x.grad() != 0).to(kFloat64);
  EXPECT_FALSE(testing::to_doubles(grad_mask) == testing::to_doubles(mask));
  // With replay the gradient's mask is the forward's.
  Tensor x2 = x.detach().clone().requires_grad_();
  manual_seed(7);
  Tensor y2 = autograd::checkpoint(fn, {x2})[0];
  y2.sum().backward();
  EXPECT_EQ(testing::to_doubles((x2.grad() != 0).to(kFloat64)),
            testing::to_doubles((y2.detach() != 0).to(kFloat64)));
}

TEST(AutogradCheckpoint, RecomputesInBackwardAndKeepsOnlyInputs) {
  Tensor x = random({3}, kFloat64, -1, 1, 5).requires_grad_();
  int calls = 0;
  bool grad_mode_in_forward = true;
  auto fn = [&](const variable_list& in) {
    ++calls;
    grad_mode_in_forward = calls == 1 ? autograd::GradMode::is_enabled() : grad_mode_in_forward;
    return variable_list{exp(in[0]) * in[0]};
  };
  Tensor y = autograd::checkpoint(fn, {x})[0];
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(grad_mode_in_forward);  // no intermediates recorded
  EXPECT_STREQ(y.grad_fn()->name(), "CheckpointFunctionBackward");
  ASSERT_EQ(y.grad_fn()->next_edges().size(), 1u);
  EXPECT_STREQ(y.grad_fn()->next_edges()[0].fn->name(), "AccumulateGrad");
  y.sum().backward();
  EXPECT_EQ(calls, 2);
  Tensor xd = x.detach();
  expect_close(x.grad(), exp(xd) * (xd + 1), 1e-12, 1e-12);
  // Freed after backward; in-place changes to a saved input are caught.
  EXPECT_THROW(y.sum().backward(), Error);
  Tensor a = x * 1;
  Tensor z = autograd::checkpoint(fn, {a})[0];
  {
    autograd::NoGradGuard ng;
    a += 1;
  }
  testing::expect_error(ErrorKind::Runtime, "modified by an inplace operation",
                        [&] { z.sum().backward(); });
}

TEST(AutogradCheckpoint, GradcheckAndNoGradInputs) {
  Tensor a = random({2, 3}, kFloat64, -1, 1, 6);
  Tensor b = random({3, 2}, kFloat64, -1, 1, 7);
  auto fn = [](const variable_list& in) { return variable_list{mm(in[0].sin(), in[1]).tanh()}; };
  EXPECT_TRUE(testing::gradcheck(
      [&](const std::vector<Tensor>& v) { return autograd::checkpoint(fn, {v[0], v[1]})[0]; },
      {a, b}));
  // No input requires grad: fn just runs (a captured parameter still gets its gradient).
  Tensor w = random({3, 2}, kFloat64, -1, 1, 8).requires_grad_();
  Tensor y = autograd::checkpoint([&](const variable_list& in) { return variable_list{mm(in[0], w)}; },
                                  {a})[0];
  y.sum().backward();
  ASSERT_TRUE(w.grad().defined());
  // An input returned as is becomes a new output with the checkpoint's history.
  Tensor x = random({2}, kFloat64, -1, 1, 9).requires_grad_();
  auto outs = autograd::checkpoint([](const variable_list& in) { return variable_list{in[0], in[0] * 2}; },
                                   {x});
  EXPECT_TRUE(x.is_leaf());
  (outs[0] + outs[1]).sum().backward();
  expect_close(x.grad(), full({2}, 3.0, kFloat64), 0, 0);
  // Double backward through a checkpoint is refused rather than silently wrong.
  Tensor z = autograd::checkpoint(fn, {a.clone().requires_grad_(), b})[0];
  testing::expect_error(ErrorKind::Runtime, "create_graph=true", [&] {
    autograd::grad({z.sum()}, {z}, {}, std::nullopt, /*create_graph=*/false);  // fine: z itself
    autograd::backward({z.sum()}, {}, std::nullopt, /*create_graph=*/true);
  });
}

}  // namespace
}  // namespace kiln
