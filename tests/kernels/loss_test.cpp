// Losses (tensor/ops/loss.toml) against naive double loops: cross_entropy's fused path (class
// indices: weights, ignore_index, label smoothing, every reduction, K-dim inputs) and its fused
// backward against the decomposition; probabilities; nll_loss and the elementwise losses; dtypes;
// bad input.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/autograd/autograd.h"
#include "kiln/generated/composite/loss.h"
#include "kiln/kiln.h"
#include "test_util.h"

namespace kiln {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::from_vector;
using testing::random;
using testing::to_doubles;

// Per-sample cross entropy of (N, C) logits; ignored samples 0. Also returns sum of w[y] over the
// samples that count (the 'mean' denominator).
std::vector<double> ref_cross_entropy(const Tensor& x, const std::vector<int64_t>& y,
                                      const std::vector<double>& w, int64_t ignore, double e,
                                      double& denom) {
  const int64_t N = x.size(0), C = x.size(1);
  std::vector<double> xd = to_doubles(x), out(N, 0.0);
  denom = 0;
  for (int64_t i = 0; i < N; ++i) {
    if (y[i] == ignore) continue;
    double m = -INFINITY, s = 0;
    for (int64_t c = 0; c < C; ++c) m = std::max(m, xd[i * C + c]);
    for (int64_t c = 0; c < C; ++c) s += std::exp(xd[i * C + c] - m);
    double lse = m + std::log(s), smooth = 0;
    for (int64_t c = 0; c < C; ++c) smooth += w[c] * (lse - xd[i * C + c]);
    out[i] = (1 - e) * w[y[i]] * (lse - xd[i * C + y[i]]) + e / C * smooth;
    denom += w[y[i]];
  }
  return out;
}

TEST(CrossEntropy, IndicesMatchReferenceForEveryReduction) {
  const std::vector<int64_t> y = {2, 0, 3, 3, 1, 2, 0};
  Tensor t = from_vector(y, {7});
  for (ScalarType dt : {kFloat64, kFloat32, kBFloat16}) {
    for (bool weighted : {false, true}) {
      for (double e : {0.0, 0.15}) {
        SCOPED_TRACE(std::string(scalar_type_name(dt)) + (weighted ? " weighted" : "") +
                     " smoothing " + std::to_string(e));
        Tensor x = random({7, 4}, dt, -3, 3, 1);
        Tensor wt = random({4}, dt, 0.5, 2, 2);
        std::vector<double> w = weighted ? to_doubles(wt) : std::vector<double>(4, 1.0);
        std::optional<Tensor> wopt = weighted ? std::optional<Tensor>(wt) : std::nullopt;
        double denom = 0;
        std::vector<double> per = ref_cross_entropy(x, y, w, 3, e, denom);
        double sum = 0;
        for (double v : per) sum += v;
        const double tol = dt == kBFloat16 ? 3e-2 : dt == kFloat32 ? 1e-5 : 1e-12;
        expect_close(cross_entropy(x, t, wopt, "none", 3, e), from_vector(per, {7}), tol, tol);
        EXPECT_NEAR(cross_entropy(x, t, wopt, "sum", 3, e).item<double>(), sum, tol * 10);
        EXPECT_NEAR(cross_entropy(x, t, wopt, "mean", 3, e).item<double>(), sum / denom, tol * 10);
      }
    }
  }
}

TEST(CrossEntropy, FusedBackwardMatchesDecompositionAndLogSoftmaxPath) {
  Tensor x = random({6, 5}, kFloat64, -3, 3, 3), w = random({5}, kFloat64, 0.5, 2, 4);
  Tensor t = from_vector<int64_t>({1, 4, 0, 4, 2, 3}, {6}), g = random({6}, kFloat64, -1, 1, 5);
  for (double e : {0.0, 0.2}) {
    expect_close(cross_entropy_indices_backward(g, x, t, w, 4, e),
                 composite::cross_entropy_indices_backward(g, x, t, w, 4, e), 1e-12, 1e-12);
    expect_close(cross_entropy_indices_backward(g, x, t, std::nullopt, -100, e),
                 composite::cross_entropy_indices_backward(g, x, t, std::nullopt, -100, e), 1e-12,
                 1e-12);
  }
  // autograd through the fused rows equals autograd through log_softmax + nll_loss
  Tensor a = x.detach().requires_grad_(), b = x.detach().requires_grad_();
  cross_entropy(a, t, w, "mean", 4).backward();
  nll_loss(log_softmax(b, 1), t, w, "mean", 4).backward();
  expect_close(a.grad(), b.grad(), 1e-12, 1e-12);
  // float32 and bfloat16 kernels agree with float64
  for (ScalarType dt : {kFloat32, kBFloat16}) {
    const double tol = dt == kFloat32 ? 1e-5 : 3e-2;
    expect_close(cross_entropy_indices_backward(g.to(dt), x.to(dt), t, w.to(dt), 4, 0.1),
                 cross_entropy_indices_backward(g, x, t, w, 4, 0.1), tol, tol);
  }
}

// Wide rows (the lane loops' full blocks and tails) and extreme logits: float32 rows agree with
// float64, forward and backward; -inf logits get a zero softmax term.
TEST(CrossEntropy, WideRowsAndExtremeLogits) {
  for (int64_t C : {1000, 37}) {
    SCOPED_TRACE("C " + std::to_string(C));
    Tensor x = random({9, C}, kFloat64, -90, 90, 6) + 50.0;
    Tensor t = from_vector<int64_t>({0, 5, 17, 36, 3, 9, 2, 1, 30}, {9});
    Tensor g = random({9}, kFloat64, -1, 1, 7);
    for (double e : {0.0, 0.1}) {
      expect_close(cross_entropy(x.to(kFloat32), t, std::nullopt, "none", -100, e),
                   cross_entropy(x, t, std::nullopt, "none", -100, e).to(kFloat32), 1e-4, 1e-5);
      expect_close(cross_entropy_indices_backward(g.to(kFloat32), x.to(kFloat32), t, std::nullopt, 2, e),
                   cross_entropy_indices_backward(g, x, t, std::nullopt, 2, e).to(kFloat32), 1e-5, 1e-5);
    }
  }
  // a row with -inf logits: their gradient is exactly -g e / C (0 without smoothing)
  std::vector<double> v(40, 0.0);
  for (int c = 0; c < 40; c += 3) v[c] = -INFINITY;
  Tensor xi = from_vector(v, {1, 40}).to(kFloat32);
  Tensor ti = from_vector<int64_t>({1}, {1});
  Tensor d = cross_entropy_indices_backward(kiln::ones({1}), xi, ti, std::nullopt, -100, 0.0);
  std::vector<double> dd = to_doubles(d);
  const double p = 1.0 / 26;  // 26 finite logits of 0
  for (int c = 0; c < 40; ++c)
    EXPECT_NEAR(dd[c], c % 3 == 0 ? 0.0 : (c == 1 ? p - 1 : p), 1e-6) << c;
}

TEST(CrossEntropy, KDimOneDimAndProbabilities) {
  // (N, C, d) equals the (N * d, C) problem with the class dim moved last
  Tensor x = random({2, 3, 4}, kFloat64, -2, 2, 6), t = random({2, 4}, kInt64, 0, 3, 7);
  Tensor flat = x.permute({0, 2, 1}).reshape({8, 3});
  expect_close(cross_entropy(x, t, std::nullopt, "none"),
               cross_entropy(flat, t.reshape({8}), std::nullopt, "none").reshape({2, 4}), 1e-12);
  // (C,) input with a 0-d target
  Tensor v = random({5}, kFloat64, -2, 2, 8);
  Tensor t0 = from_vector<int64_t>({3}, {1}).reshape({});
  EXPECT_NEAR(cross_entropy(v, t0).item<double>(),
              -log_softmax(v, 0).select(0, 3).item<double>(), 1e-12);
  // probabilities: -sum(p * log_softmax(x)), smoothed towards uniform
  Tensor p = softmax(random({4, 3}, kFloat64, -1, 1, 9), 1), z = random({4, 3}, kFloat64, -2, 2, 10);
  Tensor ps = p * 0.8 + 0.2 / 3;
  EXPECT_NEAR(cross_entropy(z, p, std::nullopt, "mean", -100, 0.2).item<double>(),
              (-(ps * log_softmax(z, 1)).sum({1})).mean().item<double>(), 1e-12);
  // everything ignored: 'mean' is 0 / 0 = nan (as PyTorch)
  Tensor all_ignored = from_vector<int64_t>({-100, -100}, {2});
  EXPECT_TRUE(std::isnan(cross_entropy(random({2, 3}), all_ignored).item<double>()));
}

TEST(Losses, ElementwiseLossesMatchReference) {
  Tensor a = random({3, 5}, kFloat64, -2, 2, 11), b = random({3, 5}, kFloat64, -2, 2, 12);
  std::vector<double> ad = to_doubles(a), bd = to_doubles(b);
  double mse = 0, l1 = 0, sl1 = 0, bce = 0, bcel = 0, kl = 0;
  Tensor pa = sigmoid(a), tb = (b + 2) / 4, q = log_softmax(a, 1), tp = softmax(b, 1);
  std::vector<double> pd = to_doubles(pa), td = to_doubles(tb), qd = to_doubles(q), tpd = to_doubles(tp);
  for (size_t i = 0; i < ad.size(); ++i) {
    double d = ad[i] - bd[i];
    mse += d * d;
    l1 += std::fabs(d);
    sl1 += std::fabs(d) < 0.7 ? 0.5 * d * d / 0.7 : std::fabs(d) - 0.35;
    bce += -(td[i] * std::log(pd[i]) + (1 - td[i]) * std::log(1 - pd[i]));
    bcel += -(td[i] * std::log(1 / (1 + std::exp(-ad[i]))) +
              (1 - td[i]) * std::log(1 - 1 / (1 + std::exp(-ad[i]))));
    kl += tpd[i] * (std::log(tpd[i]) - qd[i]);
  }
  EXPECT_NEAR(mse_loss(a, b).item<double>(), mse / 15, 1e-12);
  EXPECT_NEAR(l1_loss(a, b, "sum").item<double>(), l1, 1e-12);
  EXPECT_NEAR(smooth_l1_loss(a, b, "sum", 0.7).item<double>(), sl1, 1e-12);
  expect_close(smooth_l1_loss(a, b, "none", 0.0), abs(a - b), 1e-12);
  EXPECT_NEAR(binary_cross_entropy(pa, tb, std::nullopt, "sum").item<double>(), bce, 1e-10);
  EXPECT_NEAR(binary_cross_entropy_with_logits(a, tb, std::nullopt, std::nullopt, "sum").item<double>(),
              bcel, 1e-10);
  EXPECT_NEAR(kl_div(q, tp, "batchmean").item<double>(), kl / 3, 1e-12);
  EXPECT_NEAR(kl_div(q, log(tp), "sum", true).item<double>(), kl, 1e-12);
  // nll_loss picks -input[y] (weighted, ignored samples excluded)
  Tensor y = from_vector<int64_t>({0, 4, 2}, {3});
  EXPECT_NEAR(nll_loss(a, y, std::nullopt, "sum", 4).item<double>(), -(ad[0] + ad[12]), 1e-12);
  // mse broadcasts the target
  expect_close(mse_loss(a, b.select(0, 0), "none"), (a - b.select(0, 0)) * (a - b.select(0, 0)));
}

TEST(Losses, LogitsLossIsStableAndExactAtZero) {
  Tensor z = from_vector<double>({0.0, 200.0, -200.0}, {3}).requires_grad_();
  Tensor t = from_vector<double>({0.25, 1.0, 0.0}, {3});
  Tensor l = binary_cross_entropy_with_logits(z, t, std::nullopt, std::nullopt, "none");
  expect_close(l, from_vector<double>({std::log(2.0), 0.0, 0.0}, {3}), 1e-12, 1e-12);
  l.sum().backward();
  expect_close(z.grad(), from_vector<double>({0.5 - 0.25, 0.0, 0.0}, {3}), 1e-12, 1e-12);
}

TEST(Losses, BadInput) {
  Tensor x = random({4, 3});
  expect_error(ErrorKind::Value, "reduction must be 'none', 'mean', 'sum', got 'avg'", [&] {
    mse_loss(x, x, "avg");
  });
  expect_error(ErrorKind::Index, "target 3 is out of bounds for 3 classes", [&] {
    cross_entropy(x, from_vector<int64_t>({0, 1, 2, 3}, {4}));
  });
  expect_error(ErrorKind::Value, "expected target of shape [4] for input of shape [4, 3]", [&] {
    cross_entropy(x, kiln::zeros({4, 1}, kInt64));
  });
  expect_error(ErrorKind::Type, "expected class indices of dtype int64", [&] {
    nll_loss(x, kiln::zeros({4}, kInt32));
  });
  expect_error(ErrorKind::Value, "one value per class (3)", [&] {
    cross_entropy(x, kiln::zeros({4}, kInt64), kiln::ones({4}));
  });
  expect_error(ErrorKind::Value, "label_smoothing must be between 0.0 and 1.0", [&] {
    cross_entropy(x, kiln::zeros({4}, kInt64), std::nullopt, "mean", -100, 1.5);
  });
  expect_error(ErrorKind::Value, "expected target of the input's shape", [&] {
    binary_cross_entropy(sigmoid(x), kiln::ones({3}));
  });
}

}  // namespace
}  // namespace kiln
