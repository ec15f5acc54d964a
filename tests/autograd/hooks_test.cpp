// Tensor hooks, post-accumulate-grad hooks and node pre/post hooks: what they see, what they may
// replace, the order PyTorch runs them in (Note [Hook order] in engine.h), and removal.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "test_util.h"

namespace kiln {
namespace {

using autograd::variable_list;
using testing::expect_close;
using testing::expect_error;
using testing::random;

Tensor filled(IntArrayRef sizes, double v) { return full(sizes, v, kFloat64); }

TEST(AutogradHooks, TensorHookSeesAndReplacesGradOfNonLeaf) {
  Tensor x = random({3}, kFloat64, -1, 1, 1).requires_grad_();
  Tensor y = x * 2;
  Tensor seen;
  autograd::register_hook(y, [&](const Tensor& g) {
    seen = g;
    return g * 10;  // y's gradient becomes 10x before it reaches MulBackward0
  });
  (y * 3).sum().backward();
  expect_close(seen, filled({3}, 3), 0, 0);
  expect_close(x.grad(), filled({3}, 60), 0, 0);
}

TEST(AutogradHooks, TensorHookOnLeafRunsBeforeAccumulation) {
  Tensor x = random({2}, kFloat64, -1, 1, 2).requires_grad_();
  bool grad_was_undefined = false;
  autograd::register_hook(x, [&](const Tensor& g) {
    grad_was_undefined = !x.grad().defined();
    return g + 1;
  });
  (x * 4).sum().backward();
  EXPECT_TRUE(grad_was_undefined);
  expect_close(x.grad(), filled({2}, 5), 0, 0);
  // Returning an undefined tensor keeps the gradient.
  Tensor z = random({2}, kFloat64, -1, 1, 3).requires_grad_();
  int calls = 0;
  autograd::register_hook(z, [&](const Tensor&) {
    ++calls;
    return Tensor();
  });
  (z * 4).sum().backward();
  EXPECT_EQ(calls, 1);
  expect_close(z.grad(), filled({2}, 4), 0, 0);
}

TEST(AutogradHooks, HooksChainInRegistrationOrder) {
  Tensor x = random({2}, kFloat64, -1, 1, 4).requires_grad_();
  Tensor y = x * 1;
  std::vector<std::string> order;
  autograd::register_hook(y, [&](const Tensor& g) {
    order.push_back("first");
    return g + 1;
  });
  autograd::register_hook(y, [&](const Tensor& g) {
    order.push_back("second");
    return g * 3;  // sees (1 + 1)
  });
  y.sum().backward();
  EXPECT_EQ(order, (std::vector<std::string>{"first", "second"}));
  expect_close(x.grad(), filled({2}, 6), 0, 0);
}

TEST(AutogradHooks, RemovalHandles) {
  Tensor x = random({2}, kFloat64, -1, 1, 5).requires_grad_();
  int tensor_calls = 0, post_acc_calls = 0, pre_calls = 0, post_calls = 0;
  auto h1 = autograd::register_hook(x, [&](const Tensor&) {
    ++tensor_calls;
    return Tensor();
  });
  auto h2 = autograd::register_post_accumulate_grad_hook(x, [&](const Tensor&) { ++post_acc_calls; });
  Tensor y = x * 2;
  auto h3 = y.grad_fn()->register_prehook([&](const variable_list&) {
    ++pre_calls;
    return variable_list{};
  });
  auto h4 = y.grad_fn()->register_hook([&](const variable_list&, const variable_list&) {
    ++post_calls;
    return variable_list{};
  });
  y.sum().backward(Tensor(), true);
  EXPECT_EQ(tensor_calls + post_acc_calls + pre_calls + post_calls, 4);
  h1.remove();
  h2.remove();
  h3.remove();
  h4.remove();
  h4.remove();  // idempotent
  y.sum().backward();
  EXPECT_EQ(tensor_calls + post_acc_calls + pre_calls + post_calls, 4);
  expect_close(x.grad(), filled({2}, 4), 0, 0);
  // A handle outliving its node is harmless.
  autograd::RemovableHandle late;
  {
    Tensor t = x * 3;
    late = autograd::register_hook(t, [](const Tensor& g) { return g; });
  }
  late.remove();
}

TEST(AutogradHooks, PyTorchOrder) {
  // PyTorch, for one node: tensor hooks, retain_grad, node pre-hooks, the node, node post-hooks;
  // for a leaf: tensor hooks, AccumulateGrad (.grad updated), post-accumulate-grad hooks.
  Tensor x = random({2}, kFloat64, -1, 1, 6).requires_grad_();
  std::vector<std::string> order;
  Tensor y = x * 2;
  Tensor z = y.exp();
  y.retain_grad();
  autograd::register_hook(y, [&](const Tensor& g) {
    order.push_back("y tensor hook");
    return g * 2;
  });
  y.grad_fn()->register_prehook([&](const variable_list& g) {
    order.push_back("y node pre-hook");
    EXPECT_TRUE(y.grad().defined());  // retain_grad already saw the hooked gradient
    expect_close(y.grad(), g[0], 0, 0);
    return variable_list{};
  });
  y.grad_fn()->register_hook([&](const variable_list& grad_inputs, const variable_list& grad_outputs) {
    order.push_back("y node post-hook");
    EXPECT_EQ(grad_inputs.size(), 2u);   // MulBackward0: one per forward input
    EXPECT_EQ(grad_outputs.size(), 1u);  // one per forward output
    return variable_list{};
  });
  z.grad_fn()->register_hook([&](const variable_list&, const variable_list&) {
    order.push_back("z node post-hook");
    return variable_list{};
  });
  autograd::register_hook(x, [&](const Tensor& g) {
    order.push_back("x tensor hook");
    EXPECT_FALSE(x.grad().defined());
    return g;
  });
  autograd::register_post_accumulate_grad_hook(x, [&](const Tensor& leaf) {
    order.push_back("x post-accumulate-grad hook");
    EXPECT_TRUE(leaf.grad().defined());  // .grad is already updated
  });
  z.sum().backward();
  EXPECT_EQ(order, (std::vector<std::string>{"z node post-hook", "y tensor hook", "y node pre-hook",
                                             "y node post-hook", "x tensor hook",
                                             "x post-accumulate-grad hook"}));
  Tensor want = (x.detach() * 2).exp() * 4;  // d exp(2x)/dx, doubled by y's hook
  expect_close(x.grad(), want, 1e-12, 1e-12);
  expect_close(y.grad(), (x.detach() * 2).exp() * 2, 1e-12, 1e-12);
}

TEST(AutogradHooks, NodeHooksReplaceGradients) {
  Tensor a = random({3}, kFloat64, -1, 1, 7).requires_grad_();
  Tensor b = random({3}, kFloat64, -1, 1, 8).requires_grad_();
  Tensor y = a * b;
  y.grad_fn()->register_prehook([](const variable_list& g) { return variable_list{g[0] * 2}; });
  y.grad_fn()->register_hook([](const variable_list& gi, const variable_list&) {
    return variable_list{gi[0], Tensor()};  // drop b's gradient
  });
  y.sum().backward();
  expect_close(a.grad(), b.detach() * 2, 0, 0);
  EXPECT_FALSE(b.grad().defined());
  // A pre-hook returning the wrong number of gradients is an error naming the node.
  Tensor c = a * 3;
  c.grad_fn()->register_prehook([](const variable_list& g) { return variable_list{g[0], g[0]}; });
  expect_error(ErrorKind::Runtime, "returned 2 gradients", [&] { c.sum().backward(); });
}

TEST(AutogradHooks, PostAccumulateGradHookSeesAccumulatedGrad) {
  // DDP-style: the hook reads the leaf's accumulated .grad (and may start a collective on it).
  Tensor w = random({2}, kFloat64, -1, 1, 9).requires_grad_();
  std::vector<Tensor> seen;
  autograd::register_post_accumulate_grad_hook(w, [&](const Tensor& leaf) {
    seen.push_back(leaf.grad().clone());
  });
  (w * 2).sum().backward();
  (w * 3).sum().backward();
  ASSERT_EQ(seen.size(), 2u);
  expect_close(seen[0], filled({2}, 2), 0, 0);
  expect_close(seen[1], filled({2}, 5), 0, 0);
  // Used twice in one graph: AccumulateGrad runs once with the summed gradient.
  Tensor v = random({2}, kFloat64, -1, 1, 10).requires_grad_();
  int calls = 0;
  autograd::register_post_accumulate_grad_hook(v, [&](const Tensor&) { ++calls; });
  (v * 2 + v * 5).sum().backward();
  EXPECT_EQ(calls, 1);
  expect_close(v.grad(), filled({2}, 7), 0, 0);
}

TEST(AutogradHooks, GradCapturesSeeHookedGradient) {
  Tensor x = random({2}, kFloat64, -1, 1, 11).requires_grad_();
  Tensor y = x * 2;
  autograd::register_hook(y, [](const Tensor& g) { return g * 5; });
  autograd::register_hook(x, [](const Tensor& g) { return g + 1; });
  auto g = autograd::grad({y.sum()}, {x, y});
  expect_close(g[0], filled({2}, 11), 0, 0);
  expect_close(g[1], filled({2}, 5), 0, 0);
  EXPECT_FALSE(x.grad().defined());  // grad() accumulates nothing
}

TEST(AutogradHooks, Errors) {
  Tensor plain = random({2}, kFloat64, -1, 1, 12);
  expect_error(ErrorKind::Runtime, "doesn't require gradient",
               [&] { autograd::register_hook(plain, [](const Tensor& g) { return g; }); });
  Tensor x = random({2}, kFloat64, -1, 1, 13).requires_grad_();
  Tensor y = x * 2;
  expect_error(ErrorKind::Runtime, "non-leaf", [&] {
    autograd::register_post_accumulate_grad_hook(y, [](const Tensor&) {});
  });
  // A tensor hook returning the wrong shape is caught by the engine.
  autograd::register_hook(y, [](const Tensor& g) { return g.sum(); });
  expect_error(ErrorKind::Runtime, "invalid gradient", [&] { y.sum().backward(); });
}

TEST(AutogradHooks, HookBeforeInplaceStaysWithOldValue) {
  // A hook registered before an in-place op sees the gradient of the value before the op.
  Tensor x = random({2}, kFloat64, -1, 1, 14).requires_grad_();
  Tensor y = x * 1;
  Tensor seen;
  autograd::register_hook(y, [&](const Tensor& g) {
    seen = g;
    return Tensor();
  });
  y *= 3;
  y.sum().backward();
  expect_close(seen, filled({2}, 3), 0, 0);
  expect_close(x.grad(), filled({2}, 3), 0, 0);
}

}  // namespace
}  // namespace kiln
