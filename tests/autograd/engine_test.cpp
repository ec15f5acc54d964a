// The autograd engine: graph recording, backward/grad, accumulation, retain_graph, saved-tensor
// version checks, grad modes, higher order, and freeing the graph.
#include <gtest/gtest.h>

#include "autograd/gradcheck.h"
#include "kiln/autograd_hooks.h"
#include "test_util.h"

namespace kiln {
namespace {

using autograd::grad;
using testing::expect_close;
using testing::expect_error;
using testing::random;

TEST(AutogradEngine, RequiresGradPropagationAndKeys) {
  Tensor x = random({3}, kFloat64, -1, 1, 1);
  EXPECT_FALSE(x.requires_grad());
  EXPECT_FALSE(x.key_set().has(DispatchKey::Autograd));
  x.requires_grad_();
  EXPECT_TRUE(x.requires_grad());
  EXPECT_TRUE(x.key_set().has(DispatchKey::Autograd));
  EXPECT_TRUE(x.is_leaf());
  Tensor plain = random({3}, kFloat64, -1, 1, 2);
  Tensor y = exp(plain);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_FALSE(y.key_set().has(DispatchKey::Autograd));
  Tensor z = mul(x, plain);
  EXPECT_TRUE(z.requires_grad());
  EXPECT_FALSE(z.is_leaf());
  EXPECT_TRUE(z.key_set().has(DispatchKey::Autograd));
  EXPECT_FALSE((z > 0).requires_grad());  // non-differentiable op
  x.requires_grad_(false);
  EXPECT_FALSE(x.requires_grad());
  EXPECT_FALSE(x.key_set().has(DispatchKey::Autograd));
  expect_error(ErrorKind::Runtime, "floating point", [] {
    Tensor i = kiln::zeros({2}, kInt64);
    i.requires_grad_();
  });
  expect_error(ErrorKind::Runtime, "leaf variables", [&] { z.requires_grad_(false); });
}

TEST(AutogradEngine, IntegerOutputsDoNotRequireGrad) {
  Tensor x = random({3}, kFloat64, -1, 1, 31).requires_grad_();
  Tensor s = x.sum(std::nullopt, false, kInt64);
  EXPECT_EQ(s.dtype(), kInt64);
  EXPECT_FALSE(s.requires_grad());
  EXPECT_TRUE(x.sum().requires_grad());
}

TEST(AutogradEngine, WithoutAutogradHooksMethodsRaise) {
  const AutogradHooks* hooks = autograd_hooks();
  ASSERT_NE(hooks, nullptr);  // kiln_autograd registered itself at load time
  set_autograd_hooks(nullptr);
  Tensor x = kiln::ones({2}, kFloat32);
  expect_error(ErrorKind::Runtime, "kiln_autograd is not loaded", [&] { x.requires_grad_(); });
  expect_error(ErrorKind::Runtime, "kiln_autograd is not loaded", [&] { x.backward(); });
  EXPECT_FALSE(x.requires_grad());  // reads need no hooks
  EXPECT_TRUE(x.is_leaf());
  EXPECT_FALSE(x.grad().defined());
  set_autograd_hooks(hooks);
}

TEST(AutogradEngine, GradFnNamesAndEdges) {
  Tensor x = random({2, 3}, kFloat64, -1, 1, 3).requires_grad_();
  Tensor w = random({3, 2}, kFloat64, -1, 1, 4).requires_grad_();
  EXPECT_EQ(x.grad_fn(), nullptr);
  EXPECT_STREQ(exp(x).grad_fn()->name(), "ExpBackward0");
  EXPECT_STREQ(mul(x, x).grad_fn()->name(), "MulBackward0");
  EXPECT_STREQ(add(x, x).grad_fn()->name(), "AddBackward0");
  EXPECT_STREQ(mm(x, w).grad_fn()->name(), "MmBackward0");
  EXPECT_STREQ(x.t().grad_fn()->name(), "TBackward0");
  EXPECT_STREQ(x.view({6}).grad_fn()->name(), "ViewBackward0");
  EXPECT_STREQ(tanh(x).grad_fn()->name(), "TanhBackward0");
  Tensor y = mm(x, w);
  ASSERT_EQ(y.grad_fn()->next_edges().size(), 2u);
  EXPECT_STREQ(y.grad_fn()->next_edges()[0].fn->name(), "AccumulateGrad");
  // One AccumulateGrad per leaf, shared by every use.
  EXPECT_EQ(mul(x, x).grad_fn()->next_edges()[0].fn, mul(x, x).grad_fn()->next_edges()[1].fn);
  Tensor z = exp(y);
  EXPECT_EQ(z.grad_fn()->next_edges()[0].fn, y.grad_fn());
}

TEST(AutogradEngine, BackwardMatchesClosedForm) {
  Tensor x = random({4}, kFloat64, -1, 1, 5).requires_grad_();
  Tensor w = random({4}, kFloat64, -1, 1, 6).requires_grad_();
  Tensor loss = (tanh(x) * w).sum();
  loss.backward();
  Tensor xd = x.detach(), wd = w.detach();
  expect_close(x.grad(), (1 - tanh(xd) * tanh(xd)) * wd, 1e-12, 1e-12);
  expect_close(w.grad(), tanh(xd), 1e-12, 1e-12);
  EXPECT_FALSE(x.grad().requires_grad());
}

TEST(AutogradEngine, FanOutAccumulates) {
  Tensor x = random({5}, kFloat64, -1, 1, 7).requires_grad_();
  Tensor y = x * x + exp(x) + x;  // x used four times
  y.sum().backward();
  Tensor xd = x.detach();
  expect_close(x.grad(), 2 * xd + exp(xd) + 1, 1e-12, 1e-12);
}

TEST(AutogradEngine, GradAccumulatesAcrossCalls) {
  Tensor x = random({3}, kFloat64, -1, 1, 8).requires_grad_();
  exp(x).sum().backward();
  Tensor first = x.grad().clone();
  exp(x).sum().backward();
  expect_close(x.grad(), 2 * first, 1e-12, 1e-12);
  x.set_grad(Tensor());
  EXPECT_FALSE(x.grad().defined());
}

TEST(AutogradEngine, SharedGradientIsNotAliased) {
  // AddBackward0 passes the same gradient to both leaves: accumulating into one must not
  // change the other.
  Tensor a = random({3}, kFloat64, -1, 1, 9).requires_grad_();
  Tensor b = random({3}, kFloat64, -1, 1, 10).requires_grad_();
  Tensor g = kiln::ones({3}, kFloat64);
  add(a, b).backward(g);
  add(a, exp(b.detach())).backward(g);
  expect_close(a.grad(), 2 * g, 0, 0);
  expect_close(b.grad(), g, 0, 0);
}

TEST(AutogradEngine, ImplicitGradOnlyForScalars) {
  Tensor x = random({3}, kFloat64, -1, 1, 11).requires_grad_();
  expect_error(ErrorKind::Runtime, "implicitly created only for scalar outputs",
               [&] { exp(x).backward(); });
  expect_error(ErrorKind::Runtime, "does not require grad",
               [&] { x.detach().exp().backward(kiln::ones({3}, kFloat64)); });
  expect_error(ErrorKind::Runtime, "Mismatch in shape",
               [&] { exp(x).backward(kiln::ones({4}, kFloat64)); });
}

TEST(AutogradEngine, RetainGraph) {
  Tensor x = random({3}, kFloat64, -1, 1, 12).requires_grad_();
  Tensor s = exp(x).sum();
  s.backward(Tensor(), /*retain_graph=*/true);
  s.backward();
  expect_close(x.grad(), 2 * exp(x.detach()), 1e-12, 1e-12);
  expect_error(ErrorKind::Runtime, "Trying to backward through the graph a second time",
               [&] { s.backward(); });
  // A graph whose nodes save nothing (NegBackward0) can run again, as in PyTorch.
  Tensor n = neg(x);
  n.backward(kiln::ones({3}, kFloat64));
  n.backward(kiln::ones({3}, kFloat64));
  // Nodes that only need an input's shape keep the shape, not the tensor (AddBackward0).
  Tensor s2 = add(x, x);
  s2.backward(kiln::ones({3}, kFloat64));
  s2.backward(kiln::ones({3}, kFloat64));
}

TEST(AutogradEngine, InplaceOnSavedTensorIsDetected) {
  Tensor x = random({3}, kFloat64, -1, 1, 13).requires_grad_();
  Tensor a = x * 2;
  Tensor b = sin(a);  // saves a at version 0
  a *= 3;             // a: version 1, grad_fn rebased onto MulBackward0
  EXPECT_STREQ(a.grad_fn()->name(), "MulBackward0");
  try {
    b.sum().backward();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("modified by an inplace operation"), std::string::npos) << m;
    EXPECT_NE(m.find("SinBackward0"), std::string::npos) << m;
    EXPECT_NE(m.find("is at version 1; expected version 0"), std::string::npos) << m;
  }
  // exp saves its result: changing the result in place is caught too.
  Tensor e = exp(x);
  e += 1;
  expect_error(ErrorKind::Runtime, "ExpBackward0", [&] { e.sum().backward(); });
}

TEST(AutogradEngine, InplaceOnNonLeafRebases) {
  Tensor x = random({4}, kFloat64, -1, 1, 14).requires_grad_();
  Tensor w = random({4}, kFloat64, -1, 1, 15).requires_grad_();
  Tensor y = x * 2;
  y.mul_(w);
  EXPECT_STREQ(y.grad_fn()->name(), "MulBackward0");
  y.sum().backward();
  Tensor xd = x.detach(), wd = w.detach();
  expect_close(x.grad(), 2 * wd, 1e-12, 1e-12);
  expect_close(w.grad(), 2 * xd, 1e-12, 1e-12);
  // As in PyTorch, modifying a saved result in place (exp saves its output) is an error.
  Tensor e = exp(x);
  e.mul_(w);
  expect_error(ErrorKind::Runtime, "ExpBackward0", [&] { e.sum().backward(); });
  // A plain tensor modified in place by a tensor that requires grad starts requiring grad.
  Tensor p = kiln::ones({4}, kFloat64);
  p.mul_(w);
  EXPECT_TRUE(p.requires_grad());
  EXPECT_FALSE(p.is_leaf());
}

TEST(AutogradEngine, InplaceOnLeafRequiringGrad) {
  Tensor x = random({3}, kFloat64, -1, 1, 16).requires_grad_();
  expect_error(ErrorKind::Runtime, "a leaf Variable that requires grad is being used in an in-place operation",
               [&] { x += 1; });
  {
    autograd::NoGradGuard ng;
    x += 1;  // optimizer-style update
  }
  EXPECT_TRUE(x.is_leaf());
}

TEST(AutogradEngine, InplaceOnViews) {  // more in inplace_views_test.cpp
  Tensor x = random({2, 3}, kFloat64, -1, 1, 29).requires_grad_();
  Tensor v = x.t();
  expect_error(ErrorKind::Runtime, "a view of a leaf Variable that requires grad",
               [&] { v *= 2; });
  Tensor y = x * 2;
  Tensor yv = y.view({6});
  yv *= 2;  // y's history is rebased (Note [CopySlices])
  y *= 2;   // and yv's is made again from it when next used
  (y.sum() + yv.sum()).backward();
  expect_close(x.grad(), kiln::full_like(x.detach(), 16), 0, 0);
  // Writing a tensor that requires grad into a view of a plain tensor: the base requires grad.
  Tensor p = kiln::ones({2, 3}, kFloat64);
  p.t().mul_(x.t());
  EXPECT_TRUE(p.requires_grad());
  Tensor q = kiln::ones({2, 3}, kFloat64);
  q.mul_(x);
  EXPECT_TRUE(q.requires_grad());
}

TEST(AutogradEngine, DoubleBackwardThroughInplaceReadsSelfBeforeTheOp) {
  // y = x^2, then y *= x in place: y = x^3, y' = 3x^2, y'' = 6x. mul_'s formula for `other`
  // reads self before the op, which under create_graph keeps its history then (12x gave 8x).
  Tensor x = random({3}, kFloat64, 0.5, 2, 61).requires_grad_();
  Tensor y = x * x;
  y.mul_(x);
  auto g = grad({y.sum()}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true);
  expect_close(g[0], x.detach() * x.detach() * 3, 1e-12, 1e-12);
  auto gg = grad({g[0].sum()}, {x});
  expect_close(gg[0], x.detach() * 6, 1e-12, 1e-12);
}

TEST(AutogradEngine, RetainGradSurvivesInplace) {
  Tensor x = random({3}, kFloat64, -1, 1, 30).requires_grad_();
  Tensor h = x * 2;
  h.retain_grad();
  h *= 3;  // rebased: the retained gradient is now the one flowing into the in-place result
  h.sum().backward();
  expect_close(h.grad(), kiln::ones({3}, kFloat64), 0, 0);
  expect_close(x.grad(), kiln::full_like(x.detach(), 6), 0, 0);
}

TEST(AutogradEngine, GradModes) {
  Tensor x = random({3}, kFloat64, -1, 1, 17).requires_grad_();
  {
    autograd::NoGradGuard ng;
    EXPECT_FALSE(autograd::GradMode::is_enabled());
    Tensor y = x * x;
    EXPECT_FALSE(y.requires_grad());
    EXPECT_EQ(y.grad_fn(), nullptr);
    {
      autograd::EnableGradGuard eg;
      EXPECT_TRUE((x * x).requires_grad());
    }
    EXPECT_FALSE((x * x).requires_grad());
  }
  EXPECT_TRUE(autograd::GradMode::is_enabled());
  EXPECT_TRUE((x * x).requires_grad());
}

TEST(AutogradEngine, InferenceMode) {
  Tensor x = random({3}, kFloat64, -1, 1, 18).requires_grad_();
  Tensor t;
  {
    autograd::InferenceModeGuard im;
    EXPECT_TRUE(autograd::InferenceModeGuard::is_enabled());
    t = exp(x);
    EXPECT_FALSE(t.requires_grad());
    EXPECT_TRUE(t.is_inference());
  }
  EXPECT_FALSE(autograd::InferenceModeGuard::is_enabled());
  EXPECT_FALSE(exp(x).is_inference());
  expect_error(ErrorKind::Runtime, "inference tensor outside InferenceMode", [&] { t.requires_grad_(); });
  expect_error(ErrorKind::Runtime, "Inference tensors cannot be saved for backward", [&] { (void)mul(t, x); });
}

TEST(AutogradEngine, GradFunction) {
  Tensor x = random({3}, kFloat64, -1, 1, 19).requires_grad_();
  Tensor w = random({3}, kFloat64, -1, 1, 20).requires_grad_();
  Tensor u = random({3}, kFloat64, -1, 1, 21).requires_grad_();
  Tensor y = (x * w).sum();
  auto gs = grad({y}, {x, w});
  expect_close(gs[0], w.detach(), 0, 0);
  expect_close(gs[1], x.detach(), 0, 0);
  EXPECT_FALSE(x.grad().defined());  // grad() accumulates nothing
  Tensor y2 = (x * w).sum();
  expect_error(ErrorKind::Runtime, "appears to not have been used in the graph",
               [&] { grad({y2}, {u}, {}, true); });
  auto gu = grad({y2}, {x, u}, {}, std::nullopt, false, /*allow_unused=*/true);
  EXPECT_TRUE(gu[0].defined());
  EXPECT_FALSE(gu[1].defined());
  // Gradient with respect to a non-leaf.
  Tensor h = exp(x);
  Tensor z = (h * w).sum();
  auto gh = grad({z}, {h});
  expect_close(gh[0], w.detach(), 0, 0);
}

TEST(AutogradEngine, RetainGradOnNonLeaf) {
  Tensor x = random({3}, kFloat64, -1, 1, 22).requires_grad_();
  Tensor h = exp(x);
  h.retain_grad();
  EXPECT_TRUE(h.retains_grad());
  (h * 3).sum().backward();
  expect_close(h.grad(), kiln::full_like(h.detach(), 3), 0, 0);
  Tensor k = exp(x);
  (k * 3).sum().backward();
  EXPECT_FALSE(k.grad().defined());
}

TEST(AutogradEngine, GradOfGrad) {
  Tensor x = random({4}, kFloat64, -1, 1, 23).requires_grad_();
  // d/dx exp(x) = exp(x); d2/dx2 = exp(x).
  Tensor y = exp(x);
  auto g = grad({y}, {x}, {kiln::ones({4}, kFloat64)}, std::nullopt, /*create_graph=*/true);
  ASSERT_TRUE(g[0].requires_grad());
  auto gg = grad({g[0]}, {x}, {kiln::ones({4}, kFloat64)});
  expect_close(gg[0], exp(x.detach()), 1e-12, 1e-12);
  // d/dx x*x*x = 3x^2; d2/dx2 = 6x (mul twice).
  Tensor c = x * x * x;
  auto g1 = grad({c.sum()}, {x}, {}, std::nullopt, true);
  expect_close(g1[0], 3 * x.detach() * x.detach(), 1e-12, 1e-12);
  auto g2 = grad({g1[0].sum()}, {x});
  expect_close(g2[0], 6 * x.detach(), 1e-12, 1e-12);
  // backward(create_graph) leaves a differentiable .grad.
  Tensor w = random({4}, kFloat64, -1, 1, 24).requires_grad_();
  (w * w).sum().backward(Tensor(), std::nullopt, /*create_graph=*/true);
  ASSERT_TRUE(w.grad().requires_grad());
  auto gw = grad({w.grad().sum()}, {w});
  expect_close(gw[0], kiln::full_like(w.detach(), 2), 0, 0);
  w.set_grad(Tensor());  // breaks the w -> .grad -> MulBackward0 -> w cycle (as in PyTorch)
}

TEST(AutogradEngine, Detach) {
  Tensor x = random({3}, kFloat64, -1, 1, 25).requires_grad_();
  Tensor y = exp(x);
  Tensor d = y.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(d.is_leaf());
  EXPECT_TRUE(d.is_alias_of(y));
  EXPECT_EQ(d.version(), y.version());
}

TEST(AutogradEngine, OutVariantsRefuseGrad) {
  Tensor x = random({3}, kFloat64, -1, 1, 26).requires_grad_();
  Tensor out = kiln::empty_on({3}, kFloat64, kCPU);
  expect_error(ErrorKind::Runtime, "don't support automatic differentiation",
               [&] { add_out(out, x, x); });
  autograd::NoGradGuard ng;
  add_out(out, x, x);
}

TEST(AutogradEngine, DeepGraphsAreFreedWithoutRecursion) {
  Tensor x = kiln::ones({1}, kFloat32).requires_grad_();
  Tensor b = kiln::ones({1}, kFloat32);
  Tensor y = x;
  for (int i = 0; i < 200000; ++i) y = mul(y, b);  // saves its inputs: chains through them too
  EXPECT_STREQ(y.grad_fn()->name(), "MulBackward0");
  y = Tensor();  // drops 200,000 nodes
  Tensor z = x;
  for (int i = 0; i < 20000; ++i) z = neg(z);
  z.backward(kiln::ones({1}, kFloat32));
  expect_close(x.grad(), kiln::ones({1}, kFloat32), 0, 0);
}

TEST(AutogradEngine, GraphIsFreedAfterBackward) {
  Allocator* alloc = get_allocator(DeviceType::CPU);
  Tensor x = random({64}, kFloat64, -1, 1, 27).requires_grad_();
  Tensor w = random({64, 64}, kFloat64, -1, 1, 28).requires_grad_();
  auto step = [&] {
    Tensor h = tanh(mm(x.unsqueeze(0), w));
    Tensor loss = (h * h).sum();
    loss.backward();
  };
  for (int i = 0; i < 10; ++i) step();  // warm the allocator's cache and the grads
  size_t before = alloc->stats().in_use_bytes;
  for (int i = 0; i < 1000; ++i) step();
  EXPECT_EQ(alloc->stats().in_use_bytes, before);
}

}  // namespace
}  // namespace kiln
