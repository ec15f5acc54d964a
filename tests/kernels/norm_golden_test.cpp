// Norms, losses, embedding and softmax against PyTorch (libtorch 1.13): outputs and gradients
// written by tests/golden/norm_loss_golden_gen.cpp into norm_loss_golden.bin, for the same
// float64 inputs (wave(sizes, a, b)[k] = sin(k * a + b)). Each output y is reduced to
// sum(y * wave(y.sizes, 0.37, 0.5)) (a scalar loss as is) and differentiated.
#include <gtest/gtest.h>

#include <cmath>

#include "golden/golden_file.h"
#include "kiln/autograd/autograd.h"
#include "kiln/kiln.h"
#include "test_util.h"

namespace kiln {
namespace {

using testing::Golden;

Tensor wave(IntArrayRef sizes, double a, double b) {
  Tensor t = kiln::empty(sizes, kFloat64);
  auto* p = static_cast<double*>(t.data_ptr());
  for (int64_t k = 0; k < t.numel(); ++k) p[k] = std::sin(k * a + b);
  return t;
}

Tensor leaf(IntArrayRef sizes, double a, double b) { return wave(sizes, a, b).requires_grad_(); }

class NormGolden : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { golden_ = new auto(testing::read_golden_file("norm_loss_golden.bin")); }
  static void TearDownTestSuite() { delete golden_; }

  void check(const std::string& key, const Tensor& got, double tol = 1e-10) {
    auto it = golden_->find(key);
    ASSERT_NE(it, golden_->end()) << key << " missing from norm_loss_golden.bin";
    const Golden& want = it->second;
    ASSERT_EQ(got.sizes().vec(), want.sizes) << key;
    std::vector<double> g = testing::to_doubles(got);
    int bad = 0;
    for (size_t i = 0; i < g.size(); ++i)
      if (!(std::fabs(g[i] - want.values[i]) <= tol * std::max(1.0, std::fabs(want.values[i]))) &&
          bad++ < 5)
        ADD_FAILURE() << key << "[" << i << "]: kiln " << g[i] << ", PyTorch " << want.values[i];
  }

  // y, then the gradients of sum(y * wave) (y itself when it is a scalar) for `args`.
  void record(const std::string& name, const Tensor& y,
              const std::vector<std::pair<std::string, Tensor>>& args) {
    check(name + ".y", y);
    Tensor s = y.dim() == 0 ? y : (y * wave(y.sizes(), 0.37, 0.5)).sum();
    s.backward();
    for (const auto& [n, t] : args) check(name + ".g" + n, t.grad());
  }

  static std::map<std::string, Golden>* golden_;
};
std::map<std::string, Golden>* NormGolden::golden_ = nullptr;

TEST_F(NormGolden, LayerNormRmsNorm) {
  Tensor x = leaf({3, 4, 5}, 0.7, 0.1), w = leaf({4, 5}, 0.3, 1.0), b = leaf({4, 5}, 0.9, 0.2);
  record("layer_norm", layer_norm(x, {4, 5}, w, b, 1e-5), {{"x", x}, {"w", w}, {"b", b}});
  Tensor x2 = leaf({3, 6}, 0.7, 0.3), w2 = leaf({6}, 0.5, 0.4);
  record("rms_norm", rms_norm(x2, {6}, w2, 1e-6), {{"x", x2}, {"w", w2}});
  // float32 forward within float32 rounding of PyTorch's float64 values
  Tensor y32 = layer_norm(wave({3, 4, 5}, 0.7, 0.1).to(kFloat32), {4, 5},
                          wave({4, 5}, 0.3, 1.0).to(kFloat32), wave({4, 5}, 0.9, 0.2).to(kFloat32));
  check("layer_norm.y", y32, 1e-5);
}

TEST_F(NormGolden, GroupNormBatchNorm) {
  Tensor x = leaf({2, 6, 3, 2}, 0.45, 0.2), w = leaf({6}, 0.8, 0.3), b = leaf({6}, 0.6, 0.9);
  record("group_norm", group_norm(x, 3, w, b, 1e-5), {{"x", x}, {"w", w}, {"b", b}});

  Tensor rm = wave({3}, 0.4, 0.1), rv = wave({3}, 0.4, 0.1).abs() + 0.5;
  Tensor xt = leaf({4, 3, 5}, 0.55, 0.7), wt = leaf({3}, 0.8, 0.3), bt = leaf({3}, 0.6, 0.9);
  record("batch_norm_train", batch_norm(xt, wt, bt, rm, rv, true, 0.2, 1e-5),
         {{"x", xt}, {"w", wt}, {"b", bt}});
  check("batch_norm_train.running_mean", rm);
  check("batch_norm_train.running_var", rv);
  Tensor xe = leaf({4, 3, 5}, 0.55, 0.7), we = leaf({3}, 0.8, 0.3), be = leaf({3}, 0.6, 0.9);
  record("batch_norm_eval", batch_norm(xe, we, be, rm, rv, false, 0.2, 1e-5),
         {{"x", xe}, {"w", we}, {"b", be}});
}

TEST_F(NormGolden, SoftmaxAndEmbedding) {
  Tensor x = leaf({3, 4, 2}, 0.9, 0.4);
  record("softmax", softmax(x, 1), {{"x", x}});
  Tensor x2 = leaf({3, 4, 2}, 0.9, 0.4);
  record("log_softmax", log_softmax(x2, -1), {{"x", x2}});
  Tensor w = leaf({6, 3}, 0.3, 0.2);
  Tensor idx = testing::from_vector<int64_t>({1, 4, 4, 0, 2, 4, 1, 5}, {2, 4});
  record("embedding", embedding(w, idx, 2, true, false), {{"w", w}});
}

TEST_F(NormGolden, CrossEntropyAndNllLoss) {
  Tensor target = testing::from_vector<int64_t>({1, 0, 4, 2, 3, 2}, {6});
  Tensor wc = wave({5}, 0.9, 0.1).abs() + 0.5;
  for (const char* red : {"mean", "sum", "none"}) {
    Tensor x = leaf({6, 5}, 0.7, 0.3);
    record(std::string("cross_entropy_") + red, cross_entropy(x, target, wc, red, 2, 0.1),
           {{"x", x}});
  }
  Tensor xk = leaf({2, 4, 3}, 0.6, 0.2);
  Tensor tk = testing::from_vector<int64_t>({0, 3, 1, 2, 2, 0}, {2, 3});
  record("cross_entropy_kdim", cross_entropy(xk, tk), {{"x", xk}});
  Tensor xp = leaf({3, 4}, 0.6, 0.2);
  Tensor probs = softmax(wave({3, 4}, 0.8, 0.1), 1);
  record("cross_entropy_probs", cross_entropy(xp, probs, std::nullopt, "mean", -100, 0.2),
         {{"x", xp}});
  Tensor xn = leaf({6, 5}, 0.7, 0.3);
  record("nll_loss", nll_loss(xn, target, wc, "mean", 2), {{"x", xn}});
}

TEST_F(NormGolden, ElementwiseLosses) {
  Tensor t = wave({3, 4}, 0.5, 1.1);
  Tensor a = leaf({3, 4}, 0.7, 0.3);
  record("mse_loss", mse_loss(a, t), {{"a", a}});
  Tensor a2 = leaf({3, 4}, 0.7, 0.3);
  record("l1_loss", l1_loss(a2, t, "sum"), {{"a", a2}});
  Tensor a3 = leaf({3, 4}, 0.7, 0.3);
  record("smooth_l1_loss", smooth_l1_loss(a3, t, "mean", 0.5), {{"a", a3}});
  Tensor p = sigmoid(wave({3, 4}, 0.7, 0.3)).requires_grad_();
  Tensor tb = (wave({3, 4}, 0.5, 1.1) + 1) / 2;
  Tensor wb = wave({4}, 0.3, 0.3).abs() + 0.5;
  record("binary_cross_entropy", binary_cross_entropy(p, tb, wb), {{"p", p}});
  Tensor z = leaf({3, 4}, 0.9, 0.0);  // z[0] = 0: the gradient at a zero logit
  Tensor pw = wave({4}, 0.2, 0.7).abs() + 0.5;
  record("bce_with_logits", binary_cross_entropy_with_logits(z, tb, wb, pw, "sum"), {{"z", z}});
  Tensor q = log_softmax(wave({3, 4}, 0.7, 0.3), 1).requires_grad_();
  Tensor tp = softmax(wave({3, 4}, 0.5, 1.1), 1);
  record("kl_div", kl_div(q, tp, "batchmean"), {{"q", q}});
}

}  // namespace
}  // namespace kiln
