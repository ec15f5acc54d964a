// The loss modules (kiln/nn/loss.h): each equals its functional form bit for bit with its
// options, HuberLoss matches a naive loop, weights are buffers, reprs read like PyTorch's, and
// bad options or inputs fail with messages naming the module or op and the shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "kiln/nn/nn.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

namespace F = nn::functional;

void expect_same(const Tensor& got, const Tensor& want) {
  ASSERT_EQ(got.dtype(), want.dtype());
  ASSERT_EQ(got.sizes().vec(), want.sizes().vec());
  EXPECT_EQ(to_doubles(got), to_doubles(want));
}

std::string repr_of(const nn::Module& m) {
  std::ostringstream os;
  os << m;
  return os.str();
}

const char* kReductions[] = {"none", "mean", "sum"};

TEST(LossModule, CrossEntropyAndNllMatchFunctional) {
  Tensor logits = random({6, 5}, kFloat32, -2, 2, 1);
  Tensor target = from_vector<int64_t>({0, 4, 2, 2, 1, 3}, {6});
  Tensor w = random({5}, kFloat32, 0.5, 2, 2);
  Tensor probs = softmax(random({6, 5}, kFloat32, -1, 1, 3), 1);
  for (const char* r : kReductions) {
    SCOPED_TRACE(r);
    nn::CrossEntropyLoss plain({.reduction = r});
    expect_same(plain(logits, target), F::cross_entropy(logits, target, std::nullopt, r));
    nn::CrossEntropyLoss full(
        {.weight = w, .ignore_index = 2, .reduction = r, .label_smoothing = 0.1});
    expect_same(full(logits, target), F::cross_entropy(logits, target, w, r, 2, 0.1));
    expect_same(full(logits, probs), F::cross_entropy(logits, probs, w, r, 2, 0.1));
    Tensor logp = log_softmax(logits, 1);
    nn::NLLLoss nll({.weight = w, .ignore_index = 4, .reduction = r});
    expect_same(nll(logp, target), F::nll_loss(logp, target, w, r, 4));
  }
  // (N, C, d) inputs.
  Tensor img = random({2, 3, 4}, kFloat32, -1, 1, 4);
  Tensor img_target = from_vector<int64_t>({0, 1, 2, 0, 2, 2, 1, 0}, {2, 4});
  expect_same(nn::CrossEntropyLoss()(img, img_target), F::cross_entropy(img, img_target));
}

TEST(LossModule, RegressionLossesMatchFunctional) {
  Tensor x = random({3, 4}, kFloat32, -2, 2, 5), y = random({3, 4}, kFloat32, -2, 2, 6);
  for (const char* r : kReductions) {
    SCOPED_TRACE(r);
    expect_same(nn::MSELoss(r)(x, y), F::mse_loss(x, y, r));
    expect_same(nn::L1Loss(r)(x, y), F::l1_loss(x, y, r));
    expect_same(nn::SmoothL1Loss(r, 0.5)(x, y), F::smooth_l1_loss(x, y, r, 0.5));
    expect_same(nn::SmoothL1Loss(r)(x, y), F::smooth_l1_loss(x, y, r, 1.0));
  }
  // Non-contiguous arguments.
  Tensor xt = non_contiguous(x);
  expect_same(nn::MSELoss()(xt, y), F::mse_loss(x, y));
}

TEST(LossModule, HuberMatchesANaiveLoop) {
  Tensor x = random({5, 3}, kFloat64, -3, 3, 7), y = random({5, 3}, kFloat64, -3, 3, 8);
  for (double delta : {0.3, 1.0, 2.5}) {
    SCOPED_TRACE(delta);
    std::vector<double> xs = to_doubles(x), ys = to_doubles(y), want;
    double sum = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      const double d = std::abs(xs[i] - ys[i]);
      want.push_back(d < delta ? 0.5 * d * d : delta * (d - 0.5 * delta));
      sum += want.back();
    }
    expect_close(nn::HuberLoss("none", delta)(x, y), from_vector<double>(want, {5, 3}), 1e-12,
                 1e-12);
    EXPECT_NEAR(nn::HuberLoss("sum", delta)(x, y).item<double>(), sum, 1e-12);
    EXPECT_NEAR(nn::HuberLoss("mean", delta)(x, y).item<double>(), sum / 15, 1e-12);
  }
  // The gradient flows like smooth_l1's, scaled by delta.
  Tensor xg = x.detach().requires_grad_(true);
  nn::HuberLoss("sum", 2.0)(xg, y).backward();
  std::vector<double> g = to_doubles(xg.grad()), xs = to_doubles(x), ys = to_doubles(y);
  for (size_t i = 0; i < g.size(); ++i) {
    const double d = xs[i] - ys[i];
    EXPECT_NEAR(g[i], std::abs(d) < 2.0 ? d : 2.0 * (d > 0 ? 1 : -1), 1e-12);
  }
}

TEST(LossModule, BinaryAndKlLossesMatchFunctional) {
  Tensor logits = random({4, 3}, kFloat32, -3, 3, 9);
  Tensor p = sigmoid(logits), t = random({4, 3}, kFloat32, 0, 1, 10);
  Tensor w = random({3}, kFloat32, 0.5, 2, 11), pw = random({3}, kFloat32, 0.5, 4, 12);
  Tensor logq = log_softmax(random({4, 3}, kFloat32, -1, 1, 13), 1);
  Tensor q = softmax(random({4, 3}, kFloat32, -1, 1, 14), 1);
  for (const char* r : kReductions) {
    SCOPED_TRACE(r);
    expect_same(nn::BCELoss({.reduction = r})(p, t),
                F::binary_cross_entropy(p, t, std::nullopt, r));
    expect_same(nn::BCELoss({.weight = w, .reduction = r})(p, t),
                F::binary_cross_entropy(p, t, w, r));
    expect_same(nn::BCEWithLogitsLoss({.weight = w, .reduction = r, .pos_weight = pw})(logits, t),
                F::binary_cross_entropy_with_logits(logits, t, w, pw, r));
    expect_same(nn::KLDivLoss(r)(logq, q), F::kl_div(logq, q, r, false));
    expect_same(nn::KLDivLoss(r, true)(logq, log(q)), F::kl_div(logq, log(q), r, true));
  }
  expect_same(nn::KLDivLoss("batchmean")(logq, q), F::kl_div(logq, q, "batchmean"));
  // pos_weight against the formula: -(pw t log s(x) + (1 - t) log(1 - s(x))).
  std::vector<double> x = to_doubles(logits), tv = to_doubles(t), pwv = to_doubles(pw), want;
  for (size_t i = 0; i < x.size(); ++i) {
    const double s = 1 / (1 + std::exp(-x[i]));
    want.push_back(-(pwv[i % 3] * tv[i] * std::log(s) + (1 - tv[i]) * std::log(1 - s)));
  }
  expect_close(nn::BCEWithLogitsLoss({.reduction = "none", .pos_weight = pw})(logits, t),
               from_vector<float>(std::vector<float>(want.begin(), want.end()), {4, 3}), 1e-5,
               1e-5);
}

TEST(LossModule, WeightsAreBuffersAndReprsReadLikePyTorch) {
  nn::CrossEntropyLoss ce({.weight = ones({3}), .label_smoothing = 0.2});
  EXPECT_EQ(repr_of(ce), "CrossEntropyLoss()");
  EXPECT_EQ(ce.state_dict().keys(), std::vector<std::string>{"weight"});
  EXPECT_TRUE(nn::CrossEntropyLoss().state_dict().empty());
  ce.to(kFloat64);
  EXPECT_EQ(ce.weight.dtype(), kFloat64);
  nn::BCEWithLogitsLoss bce({.pos_weight = ones({3})});
  EXPECT_EQ(bce.state_dict().keys(), std::vector<std::string>{"pos_weight"});
  EXPECT_TRUE(ce.parameters().empty());
  EXPECT_EQ(repr_of(nn::MSELoss()), "MSELoss()");
  EXPECT_EQ(repr_of(nn::SmoothL1Loss("sum", 0.5)), "SmoothL1Loss()");
  EXPECT_EQ(repr_of(nn::KLDivLoss("batchmean", true)), "KLDivLoss()");
  auto seq = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
      std::make_shared<nn::Linear>(2, 2), std::make_shared<nn::HuberLoss>()});
  EXPECT_NE(repr_of(*seq).find("(1): HuberLoss()"), std::string::npos);
}

TEST(LossModule, BadOptionsAndInputsAreClearErrors) {
  expect_error(ErrorKind::Value, "MSELoss: reduction must be 'none', 'mean', 'sum', got 'avg'",
               [] { nn::MSELoss("avg"); });
  expect_error(ErrorKind::Value, "CrossEntropyLoss: reduction must be",
               [] { nn::CrossEntropyLoss({.reduction = "batchmean"}); });
  expect_error(ErrorKind::Value, "or 'batchmean', got 'avg'", [] { nn::KLDivLoss("avg"); });
  expect_error(ErrorKind::Value, "SmoothL1Loss: beta must be non-negative, got -1",
               [] { nn::SmoothL1Loss("mean", -1); });
  expect_error(ErrorKind::Value, "HuberLoss: delta must be positive, got 0",
               [] { nn::HuberLoss("mean", 0); });
  Tensor logits = random({4, 3});
  expect_error(ErrorKind::Value, "label_smoothing must be between 0.0 and 1.0, got 1.5",
               [&] { nn::CrossEntropyLoss({.label_smoothing = 1.5})(logits, zeros({4}, kInt64)); });
  expect_error(ErrorKind::Value, "expected a weight with one value per class",
               [&] { nn::CrossEntropyLoss({.weight = ones({5})})(logits, zeros({4}, kInt64)); });
  expect_error(ErrorKind::Value, "expected target of the input's shape [4, 3], got [4, 2]", [&] {
    nn::BCEWithLogitsLoss()(logits, zeros({4, 2}));
  });
  expect_error(ErrorKind::Value, "mse_loss", [&] { nn::MSELoss()(logits, zeros({5, 3})); });
  // A caller holding a plain Module gets the one-argument forward's error.
  nn::MSELoss mse;
  nn::Module& as_module = mse;
  expect_error(ErrorKind::NotImplemented, "MSELoss", [&] { as_module.forward(logits); });
}

}  // namespace
}  // namespace kiln::testing
