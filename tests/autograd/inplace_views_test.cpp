// In-place writes through views (Note [CopySlices] in autograd/src/copy_slices.h): gradients
// against hand-derived values and central differences in float64, the regenerated grad_fns of
// views, double backward, forward AD, custom Functions, PyTorch's remaining errors, and the graph
// being freed. Python's indexing assignments map to the C++ calls named in each comment.
#include <gtest/gtest.h>

#include "autograd/gradcheck.h"
#include "autograd/gradgradcheck.h"
#include "test_util.h"

namespace kiln {
namespace {

using autograd::AutogradContext;
using autograd::variable_list;
using testing::expect_close;
using testing::expect_error;
using testing::random;
namespace fwd = autograd::forward;

constexpr std::nullopt_t kAll = std::nullopt;

Tensor scalar(double v) { return full({}, v, kFloat64); }

// f(x, w): y = 2x with y[1:3, ::2] = w (the Python assignment), then y*y.
Tensor strided_write(const std::vector<Tensor>& v) {
  Tensor y = v[0] * 2;
  y.slice(0, 1, 3).slice(1, kAll, kAll, 2).copy_(v[1]);
  return y * y;
}

TEST(AutogradInplaceViews, StridedSliceAssignment) {  // y[1:3, ::2] = w
  Tensor x = random({4, 5}, kFloat64, -1, 1, 1).requires_grad_();
  Tensor w = random({2, 3}, kFloat64, -1, 1, 2).requires_grad_();
  Tensor c = random({4, 5}, kFloat64, -1, 1, 3);
  Tensor y = x * 2;
  y.slice(0, 1, 3).slice(1, kAll, kAll, 2).copy_(w);
  EXPECT_STREQ(y.grad_fn()->name(), "CopySlices");
  (y * c).sum().backward();
  // dL/dx = 2c outside the written block and 0 inside it; dL/dw = c on the block.
  Tensor outside = ones({4, 5}, kFloat64);
  outside.slice(0, 1, 3).slice(1, kAll, kAll, 2).zero_();
  expect_close(x.grad(), c * 2 * outside, 0, 1e-12);
  expect_close(w.grad(), c.slice(0, 1, 3).slice(1, kAll, kAll, 2), 0, 1e-12);
  EXPECT_TRUE(testing::gradcheck(strided_write, {random({4, 5}, kFloat64, -1, 1, 4),
                                                 random({2, 3}, kFloat64, -1, 1, 5)}));
}

TEST(AutogradInplaceViews, NodesKeepOnlyTheMetadataTheyRead) {
  // copy_ (for src), sum and mean keep the sizes, dtype and device of their input, not the
  // tensor: writing it afterwards does not fail their backward (PyTorch keeps none either).
  Tensor x = random({3, 2}, kFloat64, -1, 1, 63).requires_grad_();
  Tensor y = x * 2;
  Tensor s = y.sum() + y.mean();
  y.select(0, 1).mul_(scalar(3));
  s.backward();
  expect_close(x.grad(), full({3, 2}, 2.0 + 2.0 / 6, kFloat64), 0, 1e-12);
}

TEST(AutogradInplaceViews, ColumnFillWithScalar) {  // y[:, -1] = 7
  Tensor x = random({3, 4}, kFloat64, -1, 1, 6).requires_grad_();
  Tensor c = random({3, 4}, kFloat64, -1, 1, 7);
  Tensor y = x.sin();  // (exp or tanh save their result: writing it is PyTorch's error below)
  y.select(1, -1).fill_(7);
  expect_close(y.select(1, -1), full({3}, 7.0, kFloat64), 0, 0);
  (y * c).sum().backward();
  Tensor want = c * x.detach().cos();
  want.select(1, -1).zero_();
  expect_close(x.grad(), want, 1e-12, 1e-12);
  EXPECT_TRUE(testing::gradcheck(
      [](const std::vector<Tensor>& v) {
        Tensor y = v[0].sin();
        y.select(1, -1).fill_(7);
        return y * y;
      },
      {random({3, 4}, kFloat64, -1, 1, 8)}));
}

TEST(AutogradInplaceViews, RowCopiedFromAnotherRow) {  // y[4] = y[0]
  Tensor x = random({5, 3}, kFloat64, -1, 1, 9).requires_grad_();
  Tensor c = random({5, 3}, kFloat64, -1, 1, 10);
  Tensor y = x * 3;
  y.select(0, 4).copy_(y.select(0, 0));
  expect_close(y.select(0, 4), x.detach().select(0, 0) * 3, 0, 1e-12);
  (y * c).sum().backward();
  // Row 0 reaches the loss twice (as itself and as row 4); x's row 4 no longer does.
  Tensor want = c * 3;
  want.select(0, 0).add_(c.select(0, 4) * 3);
  want.select(0, 4).zero_();
  expect_close(x.grad(), want, 0, 1e-12);
  EXPECT_TRUE(testing::gradcheck(
      [](const std::vector<Tensor>& v) {
        Tensor y = v[0].sin();
        y.select(0, 4).copy_(y.select(0, 0));
        return y * y;
      },
      {random({5, 3}, kFloat64, -1, 1, 11)}));
}

TEST(AutogradInplaceViews, ViewOfNonLeafAddAndMul) {  // x.view(...).add_(...), .mul_(...)
  Tensor x = random({2, 3}, kFloat64, -1, 1, 12).requires_grad_();
  Tensor b = random({6}, kFloat64, -1, 1, 13).requires_grad_();
  Tensor w = random({3, 2}, kFloat64, -1, 1, 14).requires_grad_();
  Tensor c = random({2, 3}, kFloat64, -1, 1, 15);
  Tensor h = x * 1;
  h.view({6}).add_(b);
  h.view({3, 2}).mul_(w);
  (h * c).sum().backward();
  // h = (x + b') * w' (b', w': b and w viewed as 2x3).
  Tensor bp = b.detach().view({2, 3}), wp = w.detach().reshape({2, 3});
  expect_close(x.grad(), c * wp, 0, 1e-12);
  expect_close(b.grad(), (c * wp).reshape({6}), 0, 1e-12);
  expect_close(w.grad(), (c * (x.detach() + bp)).reshape({3, 2}), 0, 1e-12);
  EXPECT_TRUE(testing::gradcheck(
      [](const std::vector<Tensor>& v) {
        Tensor h = v[0] * v[0];
        h.view({6}).add_(v[1]);
        h.view({3, 2}).mul_(v[2]);
        return h.exp();
      },
      {random({2, 3}, kFloat64, -1, 1, 16), random({6}, kFloat64, -1, 1, 17),
       random({3, 2}, kFloat64, -1, 1, 18)}));
}

TEST(AutogradInplaceViews, ChainsOfViews) {  // transpose then slice; a view of a view
  Tensor x = random({3, 4}, kFloat64, -1, 1, 19).requires_grad_();
  Tensor c = random({3, 4}, kFloat64, -1, 1, 20);
  Tensor h = x * 1;
  h.t().slice(0, 1, 3).mul_(scalar(2));  // h[:, 1:3] *= 2
  (h * c).sum().backward();
  Tensor want = c.clone();
  want.slice(1, 1, 3).mul_(scalar(2));
  expect_close(x.grad(), want, 0, 1e-12);
  EXPECT_TRUE(testing::gradcheck(
      [](const std::vector<Tensor>& v) {
        Tensor h = v[0] * v[0];
        h.t().slice(0, 1, 3).mul_(v[1]);                          // (2, 3) through a transpose
        h.view({12}).slice(0, 2, 10, 2).view({2, 2}).add_(v[2]);  // a view of views of views
        return h * h;
      },
      {random({3, 4}, kFloat64, -1, 1, 21), random({2, 3}, kFloat64, -1, 1, 22),
       random({2, 2}, kFloat64, -1, 1, 23)}));
}

TEST(AutogradInplaceViews, BaseChangedWhileViewsAlive) {
  Tensor x = random({3, 2}, kFloat64, -1, 1, 24).requires_grad_();
  Tensor c = random({2}, kFloat64, -1, 1, 25);
  Tensor h = x * 1;
  Tensor v = h.select(0, 1);
  EXPECT_STREQ(v.grad_fn()->name(), "SelectBackward0");
  h.mul_(scalar(3));  // the view's grad_fn is made again from h's new history
  EXPECT_STREQ(v.grad_fn()->name(), "AsStridedBackward0");
  EXPECT_EQ(std::string(v.grad_fn()->next_edge(0).fn->name()).rfind("MulBackward", 0), 0u);
  (v * c).sum().backward();
  Tensor want = zeros({3, 2}, kFloat64);
  want.select(0, 1).copy_(c * 3);
  expect_close(x.grad(), want, 0, 1e-12);
  // Written through one view, read through another that overlaps it.
  x.set_grad(Tensor());
  Tensor g = x * 1;
  Tensor a = g.slice(0, 0, 2), b = g.slice(0, 1, 3);
  a.mul_(scalar(2));
  (b * 5).sum().backward();
  want = zeros({3, 2}, kFloat64);
  want.select(0, 1).fill_(10);
  want.select(0, 2).fill_(5);
  expect_close(x.grad(), want, 0, 0);
  EXPECT_TRUE(testing::gradcheck(
      [](const std::vector<Tensor>& v) {
        Tensor h = v[0] * v[0];
        Tensor first = h.select(0, 0), both = h.slice(0, 1, 3);
        h.mul_(v[0]);
        first.add_(v[0].select(0, 2));
        return both * first;
      },
      {random({3, 2}, kFloat64, -1, 1, 26)}));
}

TEST(AutogradInplaceViews, KvCacheLoop) {
  constexpr int64_t T = 4, D = 3;
  Tensor x = random({T, D}, kFloat64, -1, 1, 27).requires_grad_();
  Tensor w = random({D}, kFloat64, -1, 1, 28).requires_grad_();
  Tensor c = random({T, D}, kFloat64, -1, 1, 29);
  Tensor cache = zeros({T, D}, kFloat64);  // preallocated: does not require grad
  for (int64_t t = 0; t < T; ++t) cache.select(0, t).copy_(x.select(0, t) * w);
  EXPECT_TRUE(cache.requires_grad());  // since the first write
  EXPECT_FALSE(cache.is_leaf());
  (cache * c).sum().backward();
  expect_close(x.grad(), c * w.detach(), 0, 1e-12);
  expect_close(w.grad(), (c * x.detach()).sum({0}), 1e-12, 1e-12);
  EXPECT_TRUE(testing::gradcheck(
      [](const std::vector<Tensor>& v) {
        Tensor cache = zeros({T, D}, kFloat64);
        for (int64_t t = 0; t < T; ++t) {
          Tensor k = v[0].select(0, t) * v[1];
          if (t > 0) k = k + cache.select(0, t - 1);  // reads the previous row back
          cache.select(0, t).copy_(k.tanh());
        }
        return cache * cache;
      },
      {random({T, D}, kFloat64, -1, 1, 30), random({D}, kFloat64, -1, 1, 31)}));
}

TEST(AutogradInplaceViews, FirstWriteMakesTheBaseRequireGrad) {
  Tensor w = random({2}, kFloat64, -1, 1, 32).requires_grad_();
  Tensor c = random({4}, kFloat64, -1, 1, 33);
  Tensor y = zeros({4}, kFloat64);
  Tensor v = y.slice(0, 1, 3);
  v.copy_(w);  // PyTorch: y now requires grad
  EXPECT_TRUE(y.requires_grad());
  EXPECT_FALSE(y.is_leaf());
  EXPECT_STREQ(y.grad_fn()->name(), "CopySlices");
  EXPECT_TRUE(v.requires_grad());
  EXPECT_STREQ(v.grad_fn()->name(), "AsStridedBackward0");
  (y * c + v.sum()).sum().backward();
  expect_close(w.grad(), c.slice(0, 1, 3) + 4, 0, 1e-12);
}

TEST(AutogradInplaceViews, StorageSharingRefusals) {
  Tensor w = random({2}, kFloat64, -1, 1, 34).requires_grad_();
  // Other views of the base would not see its new history.
  Tensor y = zeros({4}, kFloat64);
  Tensor a = y.slice(0, 0, 2), b = y.slice(0, 2, 4);
  expect_error(ErrorKind::NotImplemented, "share their storage", [&] { a.copy_(w); });
  EXPECT_FALSE(y.requires_grad());
  // A base written while views of it (or a detached alias) are alive.
  Tensor z = zeros({2}, kFloat64);
  Tensor keep = z.select(0, 0);
  expect_error(ErrorKind::NotImplemented, "share its storage", [&] { z.copy_(w); });
  Tensor d = z.detach();
  keep = Tensor();
  expect_error(ErrorKind::NotImplemented, "share its storage", [&] { z.mul_(w); });
  d = Tensor();
  z.mul_(w);  // alone again
  EXPECT_TRUE(z.requires_grad());
}

TEST(AutogradInplaceViews, PyTorchErrorsRemain) {
  Tensor x = random({2, 3}, kFloat64, -1, 1, 35).requires_grad_();
  expect_error(ErrorKind::Runtime, "a view of a leaf Variable that requires grad",
               [&] { x.t().mul_(scalar(2)); });
  expect_error(ErrorKind::Runtime, "a view of a leaf Variable that requires grad",
               [&] { x.select(0, 0).copy_(x.select(0, 1)); });
  Tensor h = x * 1;
  Tensor v;
  {
    autograd::NoGradGuard ng;
    v = h.select(0, 0);
  }
  Tensor w = random({3}, kFloat64, -1, 1, 60).requires_grad_();
  expect_error(ErrorKind::Runtime, "created in no_grad mode", [&] { v.mul_(w); });
  {
    autograd::NoGradGuard ng;
    v.mul_(scalar(2));  // both under no_grad: not recorded
  }
  Tensor p = zeros({3}, kFloat64);
  Tensor q = p.slice(0, 0, 2);
  q.requires_grad_();  // a leaf that happens to be a view
  expect_error(ErrorKind::Runtime, "a leaf Variable that requires grad",
               [&] { q.mul_(scalar(2)); });
  // A value saved for backward and then written through a view fails at backward, as in PyTorch.
  Tensor e = x.exp();
  e.select(1, -1).fill_(7);
  expect_error(ErrorKind::Runtime, "modified by an inplace operation", [&] { e.sum().backward(); });
}

TEST(AutogradInplaceViews, ParameterCarvedFromAPlainBuffer) {
  Tensor buf = zeros({6}, kFloat64);
  Tensor w = buf.slice(0, 0, 4).view({2, 2});
  w.requires_grad_();  // a leaf that is a view of a tensor without history
  Tensor wt = w.t();
  {
    autograd::NoGradGuard ng;
    buf.add_(scalar(1));  // an optimizer-style update of the buffer
  }
  Tensor c = random({2, 2}, kFloat64, -1, 1, 59);
  (wt * c).sum().backward();  // wt keeps its history through w
  expect_close(w.grad(), c.t(), 0, 0);
  expect_error(ErrorKind::Runtime, "a view of a leaf Variable that requires grad",
               [&] { w.select(0, 0).mul_(scalar(2)); });
}

TEST(AutogradInplaceViews, MaskingAndResidualWrites) {
  Tensor mask = random({3, 4}, kFloat64, -1, 1, 36) > 0;  // fixed while differentiating
  Tensor row_mask = mask.select(0, 1);
  auto masked = [&](const std::vector<Tensor>& v) {
    Tensor y = v[0] * v[0];
    y.index_put_({mask}, scalar(0));                 // y[mask] = 0: on the base
    y.select(0, 2).masked_fill_(row_mask, 0.5);      // y[2][m] = 0.5: through a view
    y.select(0, 1).index_put_({row_mask}, v[1].select(0, 1).masked_select(row_mask));
    return y.exp();
  };
  EXPECT_TRUE(testing::gradcheck(
      masked, {random({3, 4}, kFloat64, -1, 1, 37), random({3, 4}, kFloat64, -1, 1, 38)}));
  // y[:, :2] += z @ w: a residual write into part of a tensor.
  Tensor x = random({3, 4}, kFloat64, -1, 1, 39).requires_grad_();
  Tensor r = random({3, 2}, kFloat64, -1, 1, 40).requires_grad_();
  Tensor c = random({3, 4}, kFloat64, -1, 1, 41);
  Tensor y = x.sin();
  y.slice(1, 0, 2).add_(r);
  (y * c).sum().backward();
  expect_close(x.grad(), c * x.detach().cos(), 1e-12, 1e-12);
  expect_close(r.grad(), c.slice(1, 0, 2), 0, 0);
  EXPECT_TRUE(testing::gradcheck(
      [](const std::vector<Tensor>& v) {
        Tensor y = v[0].sin();
        y.slice(1, 0, 2).add_(v[1].matmul(v[2]));
        return y * y;
      },
      {random({3, 4}, kFloat64, -1, 1, 42), random({3, 5}, kFloat64, -1, 1, 43),
       random({5, 2}, kFloat64, -1, 1, 44)}));
}

TEST(AutogradInplaceViews, RetainGradAndGradOfAView) {
  Tensor x = random({3, 2}, kFloat64, -1, 1, 46).requires_grad_();
  Tensor h = x * 1;
  Tensor v = h.select(0, 1);
  v.retain_grad();
  v.mul_(scalar(2));
  (v * 3).sum().backward();
  expect_close(v.grad(), full({2}, 3.0, kFloat64), 0, 0);
  Tensor want = zeros({3, 2}, kFloat64);
  want.select(0, 1).fill_(6);
  expect_close(x.grad(), want, 0, 0);
  // grad() with respect to a view whose base changed after it was taken.
  Tensor g = x * 1;
  Tensor u = g.slice(0, 0, 2);
  g.add_(scalar(1));
  auto gu = autograd::grad({(u * u).sum()}, {u});
  expect_close(gu[0], u.detach() * 2, 0, 1e-12);
}

TEST(AutogradInplaceViews, DoubleBackward) {
  using VF = testing::MultiFn;
  VF through_view = [](const std::vector<Tensor>& v) {  // CopySlices with create_graph
    Tensor y = v[0] * v[0];
    y.slice(0, 1, 3).mul_(v[0].slice(0, 0, 2));
    return std::vector<Tensor>{y * y};
  };
  EXPECT_TRUE(testing::gradgradcheck(through_view, {random({4}, kFloat64, -1, 1, 47)}));
  VF saved_result = [](const std::vector<Tensor>& v) {  // exp_ saves its result, on a view
    Tensor y = v[0] * 1;
    y.slice(0, 1, 3).exp_();
    return std::vector<Tensor>{y * v[0]};
  };
  EXPECT_TRUE(testing::gradgradcheck(saved_result, {random({4}, kFloat64, -1, 1, 48)}));
  VF regenerated = [](const std::vector<Tensor>& v) {  // AsStridedBackward0 with create_graph
    Tensor y = v[0] * v[0];
    Tensor head = y.slice(0, 0, 2);
    y.mul_(v[0]);
    return std::vector<Tensor>{head * head};
  };
  EXPECT_TRUE(testing::gradgradcheck(regenerated, {random({4}, kFloat64, -1, 1, 49)}));
}

TEST(AutogradInplaceViews, JacobiansOfCacheWrites) {
  // cache[t] = x[t:t+2] * x[t]: jacrev runs CopySlices under vmap (batched cotangents), jacfwd
  // writes tangents through the views.
  auto writes = [](const Tensor& x) {
    Tensor cache = zeros({3, 2}, kFloat64);
    for (int64_t t = 0; t < 3; ++t) cache.select(0, t).copy_(x.slice(0, t, t + 2) * x.select(0, t));
    return cache;
  };
  Tensor x = random({4}, kFloat64, -1, 1, 62);
  std::vector<double> xv = testing::to_doubles(x), j(3 * 2 * 4, 0.0);
  for (int64_t t = 0; t < 3; ++t) {  // d cache[t][0] = 2 x_t; d cache[t][1] = x_{t+1}, x_t
    j[(t * 2 + 0) * 4 + t] = 2 * xv[t];
    j[(t * 2 + 1) * 4 + t] = xv[t + 1];
    j[(t * 2 + 1) * 4 + t + 1] = xv[t];
  }
  Tensor want = testing::from_vector(j, {3, 2, 4});
  expect_close(func::jacrev(func::UnaryFn(writes))(x), want, 1e-12, 1e-12);
  expect_close(func::jacfwd(func::UnaryFn(writes))(x), want, 1e-12, 1e-12);
}

// x.mul_(2) in place, marked dirty (as in function_test.cpp).
struct DoubleInPlace : autograd::Function<DoubleInPlace> {
  static Tensor forward(AutogradContext* ctx, Tensor x) {
    x.mul_(full({}, 2.0, x.dtype()));
    ctx->mark_dirty({x});
    ctx->save_for_backward({x});
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    EXPECT_EQ(ctx->get_saved_variables().size(), 1u);
    return {g[0] * 2};
  }
};

TEST(AutogradInplaceViews, CustomFunctionModifyingAView) {
  Tensor leaf = random({3, 2}, kFloat64, -1, 1, 50).requires_grad_();
  Tensor h = leaf * 3;
  DoubleInPlace::apply(h.select(0, 1));
  EXPECT_STREQ(h.grad_fn()->name(), "CopySlices");
  (h * h).sum().backward();
  // h = 3 leaf, row 1 doubled: d/dleaf sum(h^2) = 2 h dh/dleaf.
  Tensor want = leaf.detach() * 18;
  want.select(0, 1).mul_(scalar(4));
  expect_close(leaf.grad(), want, 1e-12, 1e-12);
  EXPECT_TRUE(testing::gradcheck(
      [](const std::vector<Tensor>& v) {
        Tensor h = v[0] * v[0];
        DoubleInPlace::apply(h.t().select(0, 1));
        return h * h;
      },
      {random({3, 2}, kFloat64, -1, 1, 51)}));
}

TEST(AutogradInplaceViews, ForwardAD) {
  fwd::DualLevel level;
  // An in-place op on a view of a dual tensor updates the dual's tangent.
  Tensor p = random({3, 2}, kFloat64, -1, 1, 52), t = random({3, 2}, kFloat64, -1, 1, 53);
  Tensor want = t.clone();
  want.select(0, 1).mul_(scalar(3));
  Tensor d = fwd::make_dual(p, t);
  d.select(0, 1).mul_(scalar(3));
  expect_close(fwd::unpack_dual(d).tangent, want, 0, 1e-12);
  // A plain buffer written with a dual value gets a tangent: zeros but where it was written.
  Tensor kp = random({2}, kFloat64, -1, 1, 54), kt = random({2}, kFloat64, -1, 1, 55);
  Tensor cache = zeros({3, 2}, kFloat64);
  cache.select(0, 1).copy_(fwd::make_dual(kp, kt));
  Tensor ct = fwd::unpack_dual(cache).tangent;
  ASSERT_TRUE(ct.defined());
  want = zeros({3, 2}, kFloat64);
  want.select(0, 1).copy_(kt);
  expect_close(ct, want, 0, 0);
  cache.select(0, 2).mul_(fwd::make_dual(scalar(2), scalar(1)));  // row 2 (zeros) stays 0
  expect_close(fwd::unpack_dual(cache).tangent, want, 0, 0);
  // Other views of a base without a tangent would not see it.
  Tensor y = zeros({4}, kFloat64);
  Tensor other = y.slice(0, 2, 4);
  expect_error(ErrorKind::NotImplemented, "forward-mode AD",
               [&] { y.slice(0, 0, 2).copy_(fwd::make_dual(kp, kt)); });
}

TEST(AutogradInplaceViews, GraphIsFreed) {
  std::weak_ptr<autograd::Node> base_fn, view_fn;
  {
    Tensor x = random({3, 2}, kFloat64, -1, 1, 56).requires_grad_();
    Tensor w = random({2}, kFloat64, -1, 1, 57).requires_grad_();
    Tensor h = x * 1;
    h.select(0, 1).mul_(w);
    Tensor v = h.select(0, 0);
    h.add_(scalar(1));
    base_fn = h.grad_fn();
    view_fn = v.grad_fn();
    (v.sum() + h.sum()).backward(Tensor(), /*retain_graph=*/true);
    EXPECT_FALSE(base_fn.expired());
  }
  EXPECT_TRUE(base_fn.expired());
  EXPECT_TRUE(view_fn.expired());
  {
    Tensor cache = zeros({64, 2}, kFloat64);
    Tensor w = random({2}, kFloat64, -1, 1, 58).requires_grad_();
    for (int64_t t = 0; t < 64; ++t) cache.select(0, t).copy_(w * static_cast<double>(t));
    base_fn = cache.grad_fn();
  }
  EXPECT_TRUE(base_fn.expired());  // never backpropagated: freed all the same
}

}  // namespace
}  // namespace kiln
