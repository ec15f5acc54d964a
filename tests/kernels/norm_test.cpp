// Norm kernels (tensor/ops/nn.toml) against naive double loops, the fused backward rows against
// their decompositions (kiln::composite::*_backward, what double backward differentiates), every
// floating dtype (float16/bfloat16 accumulate in float), non-contiguous and zero-size inputs,
// running statistics, bad input; dropout's (seed, offset) mask, embedding, softmax backward.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/autograd/autograd.h"
#include "kiln/generated/composite/nn.h"
#include "kiln/generated/composite/reduction.h"
#include "kiln/kiln.h"
#include "test_util.h"

namespace kiln {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::random;
using testing::to_doubles;

// Reference: normalize each of `sets` groups of `n` consecutive elements of `x` (row-major);
// weight index of element k of a set: widx(k, set). rms: no mean subtraction.
std::vector<double> ref_norm(const std::vector<double>& x, int64_t sets, int64_t n, double eps,
                             bool rms) {
  std::vector<double> y(x.size());
  for (int64_t s = 0; s < sets; ++s) {
    double m = 0, v = 0;
    for (int64_t k = 0; k < n; ++k) m += x[s * n + k];
    m = rms ? 0 : m / n;
    for (int64_t k = 0; k < n; ++k) v += (x[s * n + k] - m) * (x[s * n + k] - m);
    double r = 1 / std::sqrt(v / n + eps);
    for (int64_t k = 0; k < n; ++k) y[s * n + k] = (x[s * n + k] - m) * r;
  }
  return y;
}

Tensor as(const std::vector<double>& v, IntArrayRef sizes) { return testing::from_vector(v, sizes); }

TEST(Norm, LayerNormMatchesReferenceInEveryDtype) {
  for (ScalarType dt : {kFloat32, kFloat64, kBFloat16, kFloat16}) {
    SCOPED_TRACE(scalar_type_name(dt));
    Tensor x = random({3, 7, 5}, dt, -3, 3, 1), w = random({7, 5}, dt, -1, 1, 2),
           b = random({7, 5}, dt, -1, 1, 3);
    std::vector<double> xh = ref_norm(to_doubles(x), 3, 35, 1e-5, false);
    std::vector<double> wd = to_doubles(w), bd = to_doubles(b), want(xh.size());
    for (size_t i = 0; i < xh.size(); ++i) want[i] = xh[i] * wd[i % 35] + bd[i % 35];
    Tensor y = layer_norm(x, {7, 5}, w, b);
    EXPECT_EQ(y.dtype(), dt);
    double tol = std::max(1e-5, testing::rtol_for(dt) * 4);
    expect_close(y, as(want, {3, 7, 5}), tol, tol);
    // non-contiguous input, no affine parameters
    expect_close(layer_norm(testing::non_contiguous(x), {7, 5}), as(xh, {3, 7, 5}), tol, tol);
  }
}

TEST(Norm, RmsNormMatchesReference) {
  Tensor x = random({4, 9}, kFloat64, -2, 2, 4), w = random({9}, kFloat64, -1, 1, 5);
  std::vector<double> xh = ref_norm(to_doubles(x), 4, 9, 1e-6, true), wd = to_doubles(w);
  for (size_t i = 0; i < xh.size(); ++i) xh[i] *= wd[i % 9];
  expect_close(rms_norm(x, {9}, w, 1e-6), as(xh, {4, 9}), 1e-12, 1e-12);
  // eps defaults to the dtype's epsilon
  Tensor x32 = x.to(kFloat32);
  expect_close(rms_norm(x32, {9}), rms_norm(x32, {9}, std::nullopt, 1.1920928955078125e-07));
}

TEST(Norm, GroupNormAndBatchNormMatchReference) {
  Tensor x = random({2, 6, 5}, kFloat64, -2, 2, 6), w = random({6}, kFloat64, -1, 1, 7),
         b = random({6}, kFloat64, -1, 1, 8);
  std::vector<double> xd = to_doubles(x), wd = to_doubles(w), bd = to_doubles(b);
  std::vector<double> g = ref_norm(xd, 2 * 3, 10, 1e-5, false);  // 3 groups of 2 channels x 5
  for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] * wd[(i / 5) % 6] + bd[(i / 5) % 6];
  expect_close(group_norm(x, 3, w, b), as(g, {2, 6, 5}), 1e-12, 1e-12);
  // batch norm: per channel over (N, S); reference through a channel-major copy
  Tensor xt = x.permute({1, 0, 2}).contiguous();  // (C, N, S)
  std::vector<double> bn = ref_norm(to_doubles(xt), 6, 10, 1e-5, false);
  for (size_t i = 0; i < bn.size(); ++i) bn[i] = bn[i] * wd[i / 10] + bd[i / 10];
  Tensor want = as(bn, {6, 2, 5}).permute({1, 0, 2});
  Tensor rm = kiln::zeros({6}, kFloat64), rv = kiln::ones({6}, kFloat64);
  expect_close(batch_norm(x, w, b, rm, rv, true, 0.1, 1e-5), want, 1e-12, 1e-12);
  // running statistics: momentum towards the batch mean and the unbiased variance
  expect_close(rm, x.mean({0, 2}) * 0.1, 1e-12, 1e-12);
  expect_close(rv, x.var({0, 2}, 1.0) * 0.1 + 0.9, 1e-12, 1e-12);
  // evaluation uses them
  Tensor eval = batch_norm(x, w, b, rm, rv, false, 0.1, 1e-5);
  expect_close(eval, (x - rm.view({1, 6, 1})) / sqrt(rv.view({1, 6, 1}) + 1e-5) * w.view({1, 6, 1}) +
                         b.view({1, 6, 1}), 1e-12, 1e-12);
}

// The fused backward kernels agree with their decompositions, in float64 and in bfloat16.
TEST(Norm, FusedBackwardKernelsMatchTheirDecompositions) {
  for (ScalarType dt : {kFloat64, kFloat32, kBFloat16}) {
    SCOPED_TRACE(scalar_type_name(dt));
    const double tol = dt == kFloat64 ? 1e-12 : dt == kFloat32 ? 1e-5 : 5e-2;
    auto ref = [&](const Tensor& t) { return t.to(kFloat64); };
    Tensor g = random({4, 3, 6}, dt, -1, 1, 10), x = random({4, 3, 6}, dt, -2, 2, 11);
    Tensor w6 = random({6}, dt, -1, 1, 12), w3 = random({3}, dt, -1, 1, 13);
    auto [dx, dw, db] = _layer_norm_backward(g, x, w6, {6}, 1e-5);
    auto [rx, rw, rb] = composite::layer_norm_backward(ref(g), ref(x), ref(w6), {6}, 1e-5);
    expect_close(dx, rx, tol, tol);
    expect_close(dw, rw, tol * 4, tol * 4);
    expect_close(db, rb, tol * 4, tol * 4);
    auto [sx, sw] = _rms_norm_backward(g, x, w6, {6}, 1e-6);
    auto [qx, qw] = composite::rms_norm_backward(ref(g), ref(x), ref(w6), {6}, 1e-6);
    expect_close(sx, qx, tol, tol);
    expect_close(sw, qw, tol * 4, tol * 4);
    auto [gx, gw, gb] = _group_norm_backward(g, x, w3, 3, 1e-5);
    auto [hx, hw, hb] = composite::group_norm_backward(ref(g), ref(x), ref(w3), 3, 1e-5);
    expect_close(gx, hx, tol, tol);
    expect_close(gw, hw, tol * 4, tol * 4);
    expect_close(gb, hb, tol * 4, tol * 4);
    expect_close(batch_norm_backward(g, x, w3, 1e-5),
                 composite::batch_norm_backward(ref(g), ref(x), ref(w3), 1e-5), tol, tol);
    expect_close(batch_norm_backward_weight(g, x, 1e-5),
                 composite::batch_norm_backward_weight(ref(g), ref(x), 1e-5), tol * 4, tol * 4);
    Tensor y = softmax(x, 1), ly = log_softmax(x, -1);
    expect_close(softmax_backward_data(g, y, 1),
                 composite::softmax_backward_data(ref(g), ref(y), 1), tol, tol);
    expect_close(log_softmax_backward_data(g, ly, -1),
                 composite::log_softmax_backward_data(ref(g), ref(ly), -1), tol, tol);
  }
}

// The fused layer/rms norm backward sums the weight and bias gradients per chunk of rows: many
// rows (several chunks), non-contiguous inputs, two normalized dims, and the same bits whatever the
// thread count.
TEST(Norm, RowNormBackwardOverManyRows) {
  Tensor g = random({300, 2, 65}, kFloat64, -1, 1, 14);
  Tensor x = random({300, 2, 65}, kFloat64, -2, 2, 15);
  Tensor w = random({2, 65}, kFloat64, -1, 1, 16);
  auto [dx, dw, db] = _layer_norm_backward(testing::non_contiguous(g), testing::non_contiguous(x),
                                           w, {2, 65}, 1e-5);
  auto [rx, rw, rb] = composite::layer_norm_backward(g, x, w, {2, 65}, 1e-5);
  expect_close(dx, rx, 1e-11, 1e-11);
  expect_close(dw, rw, 1e-11, 1e-11);
  expect_close(db, rb, 1e-11, 1e-11);
  auto [sx, sw] = _rms_norm_backward(g, testing::non_contiguous(x), w, {2, 65}, 1e-6);
  auto [qx, qw] = composite::rms_norm_backward(g, x, w, {2, 65}, 1e-6);
  expect_close(sx, qx, 1e-11, 1e-11);
  expect_close(sw, qw, 1e-11, 1e-11);
  // float32 over 3000 rows of 130: twelve chunks, added in order whatever the thread count
  Tensor g32 = random({3000, 130}, kFloat32, -1, 1, 17);
  Tensor x32 = random({3000, 130}, kFloat32, -2, 2, 18);
  Tensor w32 = random({130}, kFloat32, -1, 1, 19);
  auto many = _layer_norm_backward(g32, x32, w32, {130}, 1e-5);
  const int threads = get_num_threads();
  set_num_threads(1);
  auto one = _layer_norm_backward(g32, x32, w32, {130}, 1e-5);
  set_num_threads(threads);
  EXPECT_EQ(to_doubles(std::get<0>(many)), to_doubles(std::get<0>(one)));
  EXPECT_EQ(to_doubles(std::get<1>(many)), to_doubles(std::get<1>(one)));
  EXPECT_EQ(to_doubles(std::get<2>(many)), to_doubles(std::get<2>(one)));
  expect_close(std::get<2>(many), g32.to(kFloat64).sum({0}), 1e-4, 1e-4);
}

// group_norm's fused backward: several samples, groups of several channels, a non-contiguous
// input, the same bits whatever the thread count, and zero-size inputs.
TEST(Norm, GroupNormBackwardGivesAllThreeGradients) {
  Tensor g = random({5, 6, 7, 3}, kFloat64, -1, 1, 24);
  Tensor x = random({5, 6, 7, 3}, kFloat64, -2, 2, 25);
  Tensor w = random({6}, kFloat64, -1, 1, 26);
  auto [dx, dw, db] = _group_norm_backward(g, testing::non_contiguous(x), w, 2, 1e-5);
  auto [rx, rw, rb] = composite::group_norm_backward(g, x, w, 2, 1e-5);
  expect_close(dx, rx, 1e-11, 1e-11);
  expect_close(dw, rw, 1e-11, 1e-11);
  expect_close(db, rb, 1e-11, 1e-11);
  Tensor g32 = g.to(kFloat32), x32 = x.to(kFloat32), w32 = w.to(kFloat32);
  auto many = _group_norm_backward(g32, x32, w32, 3, 1e-5);
  const int threads = get_num_threads();
  set_num_threads(1);
  auto one = _group_norm_backward(g32, x32, w32, 3, 1e-5);
  set_num_threads(threads);
  EXPECT_EQ(to_doubles(std::get<0>(many)), to_doubles(std::get<0>(one)));
  EXPECT_EQ(to_doubles(std::get<1>(many)), to_doubles(std::get<1>(one)));
  EXPECT_EQ(to_doubles(std::get<2>(many)), to_doubles(std::get<2>(one)));
  auto [zx, zw, zb] = _group_norm_backward(kiln::zeros({0, 4, 2}), kiln::zeros({0, 4, 2}),
                                           kiln::ones({4}), 2, 1e-5);
  EXPECT_EQ(zx.sizes(), IntArrayRef({0, 4, 2}));
  expect_close(zw, kiln::zeros({4}));
  expect_close(zb, kiln::zeros({4}));
  expect_error(ErrorKind::Value, "_group_norm_backward: expected grad of shape [5, 6, 7, 3]", [&] {
    _group_norm_backward(random({5, 6}), x, w, 2, 1e-5);
  });
}

// Autograd takes the input, weight and bias gradients from the one fused row.
TEST(Norm, LayerNormGradientsThroughAutograd) {
  Tensor x = random({5, 7}, kFloat64, -2, 2, 20).requires_grad_();
  Tensor w = random({7}, kFloat64, -1, 1, 21).requires_grad_();
  Tensor b = random({7}, kFloat64, -1, 1, 22).requires_grad_();
  Tensor g = random({5, 7}, kFloat64, -1, 1, 23);
  layer_norm(x, {7}, w, b).backward(g);
  auto [rx, rw, rb] = composite::layer_norm_backward(g, x.detach(), w.detach(), {7}, 1e-5);
  expect_close(x.grad(), rx, 1e-12, 1e-12);
  expect_close(w.grad(), rw, 1e-12, 1e-12);
  expect_close(b.grad(), rb, 1e-12, 1e-12);
  // bfloat16 storage: gradients in bfloat16, accumulated in float32
  Tensor xb = x.detach().to(kBFloat16).requires_grad_();
  Tensor wb = w.detach().to(kBFloat16).requires_grad_();
  rms_norm(xb, {7}, wb, 1e-6).backward(g.to(kBFloat16));
  auto [qx, qw] = composite::rms_norm_backward(g, xb.detach().to(kFloat64),
                                               wb.detach().to(kFloat64), {7}, 1e-6);
  EXPECT_EQ(xb.grad().dtype(), kBFloat16);
  expect_close(xb.grad(), qx, 5e-2, 5e-2);
  expect_close(wb.grad(), qw, 5e-2, 5e-2);
}

TEST(Norm, ZeroSizeInputs) {
  EXPECT_EQ(layer_norm(kiln::zeros({0, 4}), {4}).sizes(), IntArrayRef({0, 4}));
  Tensor x = kiln::zeros({0, 4}).requires_grad_();
  Tensor w = kiln::ones({4}).requires_grad_();
  layer_norm(x, {4}, w).sum().backward();
  expect_close(w.grad(), kiln::zeros({4}));
  EXPECT_EQ(group_norm(kiln::zeros({0, 4, 2}), 2).sizes(), IntArrayRef({0, 4, 2}));
  EXPECT_EQ(rms_norm(kiln::zeros({2, 0}), {0}).sizes(), IntArrayRef({2, 0}));
}

TEST(Norm, BadInput) {
  Tensor x = random({2, 3, 4});
  expect_error(ErrorKind::Value, "normalized_shape [3] must match the trailing dimensions", [&] {
    layer_norm(x, {3});
  });
  expect_error(ErrorKind::Value, "expected weight of shape [4], got [3]", [&] {
    layer_norm(x, {4}, kiln::ones({3}));
  });
  expect_error(ErrorKind::Type, "expected weight to have dtype", [&] {
    layer_norm(x, {4}, kiln::ones({4}, kFloat64));
  });
  expect_error(ErrorKind::Type, "expected a floating point input", [&] {
    layer_norm(kiln::ones({2, 4}, kInt64), {4});
  });
  expect_error(ErrorKind::Value, "_layer_norm_backward: expected grad of shape [2, 3, 4]", [&] {
    _layer_norm_backward(random({2, 4}), x, kiln::ones({4}), {4}, 1e-5);
  });
  expect_error(ErrorKind::Value, "_rms_norm_backward: expected weight of shape [4], got [3]", [&] {
    _rms_norm_backward(x, x, kiln::ones({3}), {4}, 1e-5);
  });
  expect_error(ErrorKind::Value, "to be divisible by num_groups", [&] { group_norm(x, 2); });
  expect_error(ErrorKind::Value, "more than 1 value per channel", [&] {
    batch_norm(random({1, 3}), std::nullopt, std::nullopt, std::nullopt, std::nullopt, true);
  });
  expect_error(ErrorKind::Value, "needs running_mean and running_var", [&] { batch_norm(x); });
  expect_error(ErrorKind::Value, "probability has to be between 0 and 1", [&] {
    dropout(x, 1.5);
  });
}

// ---- dropout ----------------------------------------------------------------------------------

TEST(Dropout, MaskFollowsSeedAndOffsetAndBackwardRegeneratesIt) {
  Tensor x = random({100, 50}, kFloat32, 1, 2, 20).requires_grad_();
  Generator gen(123);
  Tensor y = dropout(x, 0.3, true, gen);
  std::vector<double> xd = to_doubles(x), yd = to_doubles(y);
  int64_t kept = 0;
  for (size_t i = 0; i < xd.size(); ++i) {
    if (yd[i] == 0) continue;
    ++kept;
    EXPECT_NEAR(yd[i], xd[i] / 0.7, 1e-5);
  }
  EXPECT_NEAR(kept / 5000.0, 0.7, 0.03);
  // backward: the same mask and scale
  y.backward(kiln::ones_like(y));
  std::vector<double> gd = to_doubles(x.grad());
  for (size_t i = 0; i < xd.size(); ++i) EXPECT_NEAR(gd[i], yd[i] == 0 ? 0 : 1 / 0.7, 1e-5);
  // the generator advanced by ceil(numel / 4) counters; the same state gives the same mask
  EXPECT_EQ(gen.get_state().offset, 1250u);
  Generator again(123);
  expect_close(dropout(x.detach(), 0.3, true, again), y.detach());
  EXPECT_NE(to_doubles(dropout(x.detach(), 0.3, true, gen)), yd);  // next offset: a new mask
  // the mask does not depend on the dtype or the thread count
  Tensor ones64 = kiln::ones({100, 50}, kFloat64);
  std::vector<double> m64 = to_doubles(dropout_seeded(ones64, 0.3, 123, 0));
  const int threads = get_num_threads();
  set_num_threads(1);
  std::vector<double> m32 = to_doubles(dropout_seeded(kiln::ones({100, 50}), 0.3, 123, 0));
  set_num_threads(threads);
  for (size_t i = 0; i < m64.size(); ++i) EXPECT_EQ(m64[i] == 0, m32[i] == 0);
  for (size_t i = 0; i < m64.size(); ++i) EXPECT_EQ(m64[i] == 0, yd[i] == 0);
}

TEST(Dropout, EvalAndEdgeProbabilities) {
  Tensor x = random({3, 4});
  expect_close(dropout(x, 0.5, false), x);
  expect_close(dropout(x, 0.0, true), x);
  expect_close(dropout(x, 1.0, true), kiln::zeros({3, 4}));
  Tensor h = random({3, 4}, kBFloat16, 1, 2, 21);
  EXPECT_EQ(dropout(h, 0.5, true).dtype(), kBFloat16);
  EXPECT_EQ(dropout(kiln::zeros({0, 3}), 0.5).sizes(), IntArrayRef({0, 3}));
}

// ---- embedding --------------------------------------------------------------------------------

TEST(Embedding, ForwardAndBackwardWithPaddingAndFrequencyScaling) {
  Tensor w = random({5, 3}, kFloat64, -1, 1, 30).requires_grad_();
  Tensor idx = testing::from_vector<int64_t>({1, 3, 3, 0, 1, 3}, {2, 3});
  Tensor y = embedding(w, idx, 0, true);
  EXPECT_EQ(y.sizes(), IntArrayRef({2, 3, 3}));
  expect_close(y.select(0, 1).select(0, 2), w.detach().select(0, 3));
  Tensor g = random({2, 3, 3}, kFloat64, -1, 1, 31);
  y.backward(g);
  // row 3: three occurrences averaged; row 1: two; row 0: padding (no gradient); rows 2, 4: none
  std::vector<double> gd = to_doubles(g), want(15, 0.0);
  std::vector<int64_t> ids = {1, 3, 3, 0, 1, 3};
  std::vector<int> count = {1, 2, 0, 3, 0};
  for (int k = 0; k < 6; ++k)
    if (ids[k] != 0)
      for (int j = 0; j < 3; ++j) want[ids[k] * 3 + j] += gd[k * 3 + j] / count[ids[k]];
  expect_close(w.grad(), testing::from_vector(want, {5, 3}), 1e-12, 1e-12);
  // the kernel agrees with the decomposition; int32 indices and bfloat16 too
  expect_close(embedding_dense_backward(g, idx.to(kInt32), 5, 0, true),
               composite::embedding_dense_backward(g, idx, 5, 0, true), 1e-12, 1e-12);
  Tensor wb = w.detach().to(kBFloat16);
  expect_close(embedding(wb, idx), embedding(w.detach(), idx).to(kBFloat16));
}

TEST(Embedding, BadInput) {
  Tensor w = random({4, 2});
  expect_error(ErrorKind::Index, "index 4 is out of range for a weight with 4 rows", [&] {
    embedding(w, testing::from_vector<int64_t>({0, 4}, {2}));
  });
  expect_error(ErrorKind::Type, "expected indices of dtype int64 or int32", [&] {
    embedding(w, kiln::zeros({2}));
  });
  expect_error(ErrorKind::NotImplemented, "sparse=True", [&] {
    embedding(w, kiln::zeros({2}, kInt64), -1, false, true);
  });
}

// ---- softmax backward -------------------------------------------------------------------------

TEST(SoftmaxBackward, AutogradUsesTheFusedRowsAndMatchesTheFormula) {
  for (int64_t dim : {0, 1, 2}) {
    Tensor x = random({3, 4, 5}, kFloat64, -2, 2, 40).requires_grad_();
    Tensor g = random({3, 4, 5}, kFloat64, -1, 1, 41);
    Tensor y = softmax(x, dim);
    y.backward(g);
    Tensor yd = y.detach();
    expect_close(x.grad(), yd * (g - (g * yd).sum({dim}, true)), 1e-12, 1e-12);
    Tensor x2 = x.detach().requires_grad_();
    Tensor ly = log_softmax(x2, dim);
    ly.backward(g);
    expect_close(x2.grad(), g - exp(ly.detach()) * g.sum({dim}, true), 1e-12, 1e-12);
  }
  // softmax(bfloat16 input, dtype=float32): the gradient comes back as bfloat16
  Tensor xb = random({2, 8}, kBFloat16, -2, 2, 42).requires_grad_();
  softmax(xb, 1, kFloat32).sum().backward();
  EXPECT_EQ(xb.grad().dtype(), kBFloat16);
  expect_error(ErrorKind::Value, "expected grad of shape", [&] {
    softmax_backward_data(random({2, 3}), random({3, 2}), 1);
  });
}

}  // namespace
}  // namespace kiln
