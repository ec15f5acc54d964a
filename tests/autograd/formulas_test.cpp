// Tests of the derivative-formula helpers for broadcasting, views, lists, indexing and pointwise
// ops (autograd/src/formulas_{pointwise,views,indexing}.cpp): each against central differences of
// the forward op in float64, or against a direct computation.
#include "autograd/formula_util.h"

namespace kiln::autograd {
namespace {

using testing::cotangent;
using testing::expect_close;
using testing::expect_vjp;
using testing::from_vector;
using testing::random;
using testing::to_doubles;

TEST(Formulas, SumToReducesBroadcastDims) {
  Tensor x = random({3, 1}, kFloat64);
  auto f = [](const Tensor& t) { return t.expand({2, 3, 4}); };
  Tensor v = cotangent(f(x));
  expect_vjp(f, x, sum_to(v, x.sizes()), v);
  // Direct: out[i] = sum over a, c of v[a, i, c].
  std::vector<double> g = to_doubles(sum_to(v, {3, 1})), vv = to_doubles(v);
  for (int i = 0; i < 3; ++i) {
    double s = 0;
    for (int a = 0; a < 2; ++a)
      for (int c = 0; c < 4; ++c) s += vv[(a * 3 + i) * 4 + c];
    EXPECT_NEAR(g[i], s, 1e-12);
  }
  EXPECT_TRUE(sum_to(v, v.sizes()).is_same(v));              // same shape: no op
  EXPECT_EQ(sum_to(v, {}).sizes(), IntArrayRef{});            // to a scalar
  EXPECT_NEAR(sum_to(v, {}).item<double>(), v.sum().item<double>(), 1e-12);
  EXPECT_EQ(grad_for_broadcast(v, {4}).sizes(), IntArrayRef{4});
  EXPECT_EQ(reduce_grad(v, x).sizes(), x.sizes());
  testing::expect_error(ErrorKind::Value, "sum_to", [&] { sum_to(v, {5, 4}); });
  testing::expect_error(ErrorKind::Value, "sum_to", [&] { sum_to(v, {1, 2, 3, 4}); });
}

TEST(Formulas, CastBackAndCopyBackward) {
  Tensor like = random({2, 3}, kFloat64);
  Tensor g = random({2, 3}, kFloat32);
  Tensor c = cast_back(g, like);
  EXPECT_EQ(c.dtype(), kFloat64);
  expect_close(c, g.to(kFloat64));
  EXPECT_TRUE(cast_back(like, like).is_same(like));
  Tensor src = random({3}, kFloat32);
  Tensor cb = copy_backward(random({2, 3}, kFloat64), src);
  EXPECT_EQ(cb.dtype(), kFloat32);
  expect_close(cb, random({2, 3}, kFloat64).sum({0}).to(kFloat32));
}

TEST(Formulas, ViewBackwardsPlaceGrad) {
  Tensor x = random({3, 4, 5}, kFloat64);
  {
    auto f = [](const Tensor& t) { return t.select(1, -1); };
    Tensor v = cotangent(f(x));
    expect_vjp(f, x, select_backward(v, x.sizes(), 1, -1), v);
  }
  {
    auto f = [](const Tensor& t) { return t.slice(2, 1, std::nullopt, 2); };
    Tensor v = cotangent(f(x));
    expect_vjp(f, x, slice_backward(v, x.sizes(), 2, 1, std::nullopt, 2), v);
  }
  {
    auto f = [](const Tensor& t) { return t.slice(0, std::nullopt, -1, 1); };
    Tensor v = cotangent(f(x));
    expect_vjp(f, x, slice_backward(v, x.sizes(), 0, std::nullopt, -1, 1), v);
  }
  for (int64_t offset : {0, 1, -2}) {
    auto f = [offset](const Tensor& t) { return t.diagonal(offset, 2, 0); };
    Tensor v = cotangent(f(x));
    expect_vjp(f, x, diagonal_backward(v, x.sizes(), offset, 2, 0), v);
  }
  {
    auto f = [](const Tensor& t) { return t.permute({2, 0, 1}); };
    Tensor v = cotangent(f(x));
    expect_vjp(f, x, permute_backward(v, {2, 0, -2}), v);
  }
  {
    Tensor m = random({4, 4}, kFloat64);
    auto fl = [](const Tensor& t) { return t.tril(-1); };
    auto fu = [](const Tensor& t) { return t.triu(1); };
    Tensor v = cotangent(m);
    expect_vjp(fl, m, tril_backward(v, -1), v);
    expect_vjp(fu, m, triu_backward(v, 1), v);
    EXPECT_EQ(view_backward(v, {2, 8}).sizes(), (std::vector<int64_t>{2, 8}));
  }
  // select: zeros everywhere but the selected slice, which holds grad.
  Tensor v = cotangent(x.select(0, 1));
  Tensor g = select_backward(v, x.sizes(), 0, 1);
  expect_close(g.select(0, 1), v, 0, 0);
  EXPECT_EQ(g.select(0, 0).abs().sum().item<double>(), 0.0);
  EXPECT_EQ(g.select(0, 2).abs().sum().item<double>(), 0.0);
}

TEST(Formulas, EdgeCasesZeroSizeNonContiguousDtypes) {
  // Empty slices and zero-size inputs give zeros of the input's shape.
  Tensor x = random({4, 3}, kFloat32);
  Tensor e = x.slice(0, 3, 1, 1);
  ASSERT_EQ(e.size(0), 0);
  Tensor g = slice_backward(zeros_like(e), x.sizes(), 0, 3, 1, 1);
  EXPECT_EQ(g.sizes(), x.sizes());
  EXPECT_EQ(g.dtype(), kFloat32);
  EXPECT_EQ(g.abs().sum().item<double>(), 0.0);
  Tensor z = zeros({0, 3}, kFloat64);
  EXPECT_EQ(select_backward(zeros({0}, kFloat64), z.sizes(), 1, 0).sizes(), z.sizes());
  EXPECT_EQ(slice_backward(zeros({0, 1}, kFloat64), z.sizes(), 1, 1, 2, 2).sizes(), z.sizes());
  EXPECT_EQ(sum_backward(zeros({3}, kFloat64), z.sizes(), std::vector<int64_t>{0}, false).sizes(),
            z.sizes());
  EXPECT_EQ(index_select_backward(zeros({0, 3}, kFloat64), {4, 3}, 0, zeros({0}, kInt64)).sizes(),
            (std::vector<int64_t>{4, 3}));
  // A slice whose start is past the end of the dim (clamped), and a non-contiguous grad.
  Tensor y = random({5, 4}, kFloat64);
  auto f = [](const Tensor& t) { return t.slice(1, -3, 100, 1); };
  Tensor v = testing::non_contiguous(cotangent(f(y)));
  expect_vjp(f, y, slice_backward(v, y.sizes(), 1, -3, 100, 1), v);
  Tensor wide = testing::non_contiguous(cotangent(zeros({2, 5, 4}, kFloat64)));
  expect_close(sum_to(wide, {5, 1}), wide.contiguous().sum(std::vector<int64_t>{0, 2}).reshape({5, 1}));
  // float32 gradients stay float32.
  Tensor gf = random({3, 4}, kFloat32);
  EXPECT_EQ(select_backward(gf.select(0, 1), gf.sizes(), 0, 1).dtype(), kFloat32);
  EXPECT_EQ(gelu_backward(gf, gf, "tanh").dtype(), kFloat32);
  EXPECT_EQ(softmax_backward(gf, gf.softmax(1), 1, gf).dtype(), kFloat32);
  testing::expect_error(ErrorKind::Index, "select_backward", [&] { select_backward(gf, {3, 4}, 0, 3); });
}

TEST(Formulas, AsStridedBackward) {
  Tensor x = random({12}, kFloat64);
  {  // a plain window with an offset
    auto f = [](const Tensor& t) { return t.as_strided({2, 3}, {4, 1}, 3); };
    Tensor v = cotangent(f(x));
    expect_vjp(f, x, as_strided_backward(v, x, {2, 3}, {4, 1}, 3), v);
  }
  {  // overlapping output elements (stride 0 and stride 1 windows) accumulate
    auto f = [](const Tensor& t) { return t.as_strided({3, 4}, {1, 1}, std::nullopt); };
    Tensor v = cotangent(f(x));
    expect_vjp(f, x, as_strided_backward(v, x, {3, 4}, {1, 1}, std::nullopt), v);
    auto g = [](const Tensor& t) { return t.as_strided({5, 2}, {0, 3}, 1); };
    Tensor w = cotangent(g(x));
    expect_vjp(g, x, as_strided_backward(w, x, {5, 2}, {0, 3}, 1), w);
  }
  {  // the input is itself a view with a storage offset: the offset is relative to the storage
    auto f = [](const Tensor& t) { return t.narrow(0, 2, 8).as_strided({2, 2}, {1, 3}, 4); };
    Tensor v = cotangent(f(x));
    Tensor self = x.narrow(0, 2, 8);
    Tensor g_self = as_strided_backward(v, self, {2, 2}, {1, 3}, 4);
    expect_vjp(f, x, slice_backward(g_self, x.sizes(), 0, 2, 10, 1), v);
  }
  {  // an input whose elements overlap (expanded) shares each storage gradient evenly
    Tensor base = random({3}, kFloat64);
    Tensor self = base.unsqueeze(0).expand({2, 3});
    Tensor v = cotangent(self);
    Tensor g = as_strided_backward(v, self, {2, 3}, {0, 1}, std::nullopt);
    std::vector<double> got = to_doubles(g), vv = to_doubles(v);
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j) EXPECT_NEAR(got[i * 3 + j], (vv[j] + vv[3 + j]) / 2, 1e-12);
  }
}

TEST(Formulas, CatStackSplitBackward) {
  Tensor a = random({2, 3}, kFloat64, -2, 2, 1), b = random({2, 1}, kFloat64, -2, 2, 2);
  Tensor empty = zeros({0}, kFloat64);
  std::vector<Tensor> ins{a, empty, b};
  Tensor grad = cotangent(cat(ins, -1));
  std::vector<Tensor> gs = cat_backward(grad, ins, -1);
  ASSERT_EQ(gs.size(), 3u);
  expect_close(gs[0], grad.narrow(1, 0, 3), 0, 0);
  EXPECT_EQ(gs[1].sizes(), IntArrayRef{0});
  expect_close(gs[2], grad.narrow(1, 3, 1), 0, 0);
  // cat's vjp for the first input, by finite differences.
  auto f = [&](const Tensor& t) { return cat(std::vector<Tensor>{t, b}, 1); };
  Tensor v = cotangent(f(a));
  expect_vjp(f, a, cat_backward(v, std::vector<Tensor>{a, b}, 1)[0], v);

  std::vector<Tensor> st{a, a};
  Tensor sg = cotangent(stack(st, 1));
  std::vector<Tensor> sgs = stack_backward(sg, st, 1);
  ASSERT_EQ(sgs.size(), 2u);
  expect_close(sgs[1], sg.select(1, 1), 0, 0);

  Tensor x = random({7, 2}, kFloat64);
  std::vector<Tensor> parts = x.split(3, 0);
  ASSERT_EQ(parts.size(), 3u);
  Tensor p0 = cotangent(parts[0], 5), p2 = cotangent(parts[2], 6);
  Tensor joined = split_backward(std::vector<Tensor>{p0, Tensor(), p2}, x.sizes(), 3, 0);
  expect_close(joined.narrow(0, 0, 3), p0, 0, 0);
  EXPECT_EQ(joined.narrow(0, 3, 3).abs().sum().item<double>(), 0.0);
  expect_close(joined.narrow(0, 6, 1), p2, 0, 0);
  testing::expect_error(ErrorKind::Value, "undefined", [&] {
    split_backward(std::vector<Tensor>{Tensor(), Tensor(), Tensor()}, x.sizes(), 3, 0);
  });
}

TEST(Formulas, IndexingBackwardsAccumulateRepeatedIndices) {
  Tensor x = random({4, 3}, kFloat64);
  Tensor idx = from_vector<int64_t>({2, 0, 2, 2}, {4});
  {
    auto f = [&](const Tensor& t) { return t.index_select(0, idx); };
    Tensor v = cotangent(f(x));
    Tensor g = index_select_backward(v, x.sizes(), 0, idx);
    expect_vjp(f, x, g, v);
    // Row 2 receives the sum of three gradient rows.
    expect_close(g.select(0, 2), v.select(0, 0) + v.select(0, 2) + v.select(0, 3));
    auto f1 = [&](const Tensor& t) { return t.index_select(-1, idx.narrow(0, 0, 2)); };
    Tensor v1 = cotangent(f1(x));
    expect_vjp(f1, x, index_select_backward(v1, x.sizes(), -1, idx.narrow(0, 0, 2)), v1);
  }
  Tensor gidx = from_vector<int64_t>({1, 1, 0, 3, 3, 3}, {2, 3});
  {
    auto f = [&](const Tensor& t) { return t.gather(0, gidx); };
    Tensor v = cotangent(f(x));
    expect_vjp(f, x, gather_backward(v, x, 0, gidx), v);
  }
  {
    Tensor src = random({2, 3}, kFloat64, -2, 2, 9);
    auto fs = [&](const Tensor& t) { return x.scatter_add(0, gidx, t); };
    Tensor v = cotangent(fs(src));
    expect_vjp(fs, src, scatter_add_backward(v, 0, gidx), v);
    auto fself = [&](const Tensor& t) { return t.scatter_add(0, gidx, src); };
    expect_vjp(fself, x, v, v);
    // scatter overwrites: self's gradient is 0 where src was written (unique indices here).
    Tensor uidx = from_vector<int64_t>({1, 0, 3, 3, 2, 0}, {2, 3});
    auto fw = [&](const Tensor& t) { return t.scatter(0, uidx, src); };
    expect_vjp(fw, x, scatter_backward(v, 0, uidx), v);
  }
  {  // advanced indexing x[i0, i1] with repeated (and negative) pairs
    Tensor y = random({3, 4, 2}, kFloat64);
    Tensor i0 = from_vector<int64_t>({0, 2, 0, -1}, {4});
    Tensor i1 = from_vector<int64_t>({1, 3, 1, 3}, {4});
    Tensor v = cotangent(zeros({4, 2}, kFloat64));
    Tensor g = index_backward(v, y.sizes(), std::vector<Tensor>{i0, i1});
    std::vector<double> want(y.numel(), 0.0), vv = to_doubles(v);
    const int64_t r0[] = {0, 2, 0, 2}, r1[] = {1, 3, 1, 3};
    for (int k = 0; k < 4; ++k)
      for (int c = 0; c < 2; ++c) want[(r0[k] * 4 + r1[k]) * 2 + c] += vv[k * 2 + c];
    expect_close(g, from_vector<double>(want, {3, 4, 2}), 1e-12, 1e-12);
  }
}

TEST(Formulas, MasksWhereMaskedFillClamp) {
  Tensor x = from_vector<double>({-2, -0.5, 0.25, 1, 3, 0.75}, {2, 3});
  Tensor g = from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  expect_close(clamp_backward(g, x, Scalar(-1.0), Scalar(1.0)),
               from_vector<double>({0, 2, 3, 4, 0, 6}, {2, 3}), 0, 0);
  expect_close(clamp_backward(g, x, std::optional<Scalar>(0.5), std::nullopt),
               from_vector<double>({0, 0, 0, 4, 5, 6}, {2, 3}), 0, 0);
  expect_close(clamp_backward(g, x, std::nullopt, std::optional<Scalar>(0.5)),
               from_vector<double>({1, 2, 3, 0, 0, 0}, {2, 3}), 0, 0);
  Tensor lo = from_vector<double>({0, -1, 0}, {3});
  expect_close(clamp_backward(g, x, std::optional<Tensor>(lo), std::optional<Tensor>()),
               from_vector<double>({0, 2, 3, 4, 5, 6}, {2, 3}), 0, 0);
  {  // clamp against finite differences away from the bounds
    auto f = [](const Tensor& t) { return t.clamp(Scalar(-0.9), Scalar(0.9)); };
    Tensor v = cotangent(x);
    expect_vjp(f, x, clamp_backward(v, x, Scalar(-0.9), Scalar(0.9)), v);
  }
  Tensor cond = from_vector<bool>({true, false, true}, {3});
  expect_close(where_backward(g, cond, true, {3}), from_vector<double>({5, 0, 9}, {3}), 0, 0);
  expect_close(where_backward(g, cond, false, {2, 3}),
               from_vector<double>({0, 2, 0, 0, 5, 0}, {2, 3}), 0, 0);
  expect_close(mask_grad(g, cond), from_vector<double>({1, 0, 3, 4, 0, 6}, {2, 3}), 0, 0);
  expect_close(masked_fill_backward(g, cond, {2, 3}),
               from_vector<double>({0, 2, 0, 0, 5, 0}, {2, 3}), 0, 0);
  expect_close(masked_fill_backward(g, cond, {1, 3}), from_vector<double>({0, 7, 0}, {1, 3}), 0, 0);
  expect_close(sign_grad(g, x), from_vector<double>({-1, -2, 3, 4, 5, 6}, {2, 3}), 0, 0);
}

TEST(Formulas, GeluBackwardBothForms) {
  Tensor x = random({3, 5}, kFloat64, -4, 4);
  for (const char* approx : {"none", "tanh"}) {
    auto f = [approx](const Tensor& t) { return gelu(t, approx); };
    Tensor v = cotangent(x);
    expect_vjp(f, x, gelu_backward(v, x, approx), v);
  }
  testing::expect_error(ErrorKind::Value, "approximate", [&] { gelu_backward(x, x, "erf"); });
}

TEST(Formulas, PowBackward) {
  Tensor x = random({2, 3}, kFloat64, 0.5, 2);
  Tensor e = random({3}, kFloat64, -2, 3, 3);
  {
    auto f = [&](const Tensor& t) { return pow(t, e); };
    Tensor v = cotangent(f(x));
    expect_vjp(f, x, pow_backward_self(v, x, e), v);
    auto fe = [&](const Tensor& t) { return pow(x, t); };
    expect_vjp(fe, e, pow_backward_exponent(v, x, e, pow(x, e)), v);
  }
  {
    auto f = [](const Tensor& t) { return pow(t, scalar_tensor_of(2.5, kFloat64)); };
    Tensor v = cotangent(x);
    expect_vjp(f, x, pow_backward_self(v, x, Scalar(2.5)), v);
    expect_vjp(f, x, pow_backward_self(v, x, Scalar(2.5)), v);
    auto fi = [](const Tensor& t) { return pow(t, scalar_tensor_of(3, kFloat64)); };
    expect_vjp(fi, x, pow_backward_self(v, x, Scalar(int64_t{3})), v);
    EXPECT_EQ(pow_backward_self(v, x, Scalar(0.0)).abs().sum().item<double>(), 0.0);
    auto fb = [](const Tensor& t) { return pow(scalar_tensor_of(1.5, kFloat64), t); };
    Tensor ev = cotangent(e);
    expect_vjp(fb, e, pow_backward_exponent(ev, Scalar(1.5), e, fb(e)), ev);
  }
  // At a zero base: d/dx 0^0 counts as 0; d/dy 0^y is 0 for y >= 0.
  Tensor zb = from_vector<double>({0, 0, 2}, {3});
  Tensor ze = from_vector<double>({0, 2, 1}, {3});
  Tensor ones3 = ones({3}, kFloat64);
  expect_close(pow_backward_self(ones3, zb, ze), from_vector<double>({0, 0, 1}, {3}), 0, 0);
  expect_close(pow_backward_exponent(ones3, zb, ze, pow(zb, ze)),
               from_vector<double>({0, 0, 2 * std::log(2.0)}, {3}), 1e-12, 0);
}

TEST(Formulas, FmodBackward) {
  Tensor a = from_vector<double>({5.3, -7.1, 2.2, 9.7}, {2, 2});
  Tensor b = from_vector<double>({2.1, 1.7}, {2});
  auto f = [&](const Tensor& t) { return fmod(a, t); };
  Tensor v = cotangent(f(b));
  expect_vjp(f, b, fmod_backward(v, a, b), v);
}

TEST(Formulas, MatmulBackward) {
  struct Case {
    std::vector<int64_t> a, b;
  };
  for (const Case& c : {Case{{3}, {3, 4}}, Case{{2, 3, 4}, {4}}, Case{{3}, {3}},
                        Case{{2, 1, 3, 4}, {5, 4, 2}}, Case{{3, 4}, {2, 4, 5}}}) {
    Tensor a = random(c.a, kFloat64, -1, 1, 11), b = random(c.b, kFloat64, -1, 1, 12);
    auto fa = [&](const Tensor& t) { return matmul(t, b); };
    auto fb = [&](const Tensor& t) { return matmul(a, t); };
    Tensor v = cotangent(matmul(a, b));
    expect_vjp(fa, a, matmul_backward_self(v, a, b), v);
    expect_vjp(fb, b, matmul_backward_other(v, a, b), v);
  }
}

}  // namespace
}  // namespace kiln::autograd
