// tests/golden/norm_loss_golden_gen.cpp: PyTorch's (libtorch C++ API) outputs and gradients of the
// norms, losses, embedding and softmax of tests/kernels/norm_golden_test.cpp, written to
// norm_loss_golden.bin (the format of mlp_golden_gen.cpp). Built and run by
// make_norm_loss_golden.sh; CI never runs it (the test reads the committed file).
//
// Inputs (float64, no RNG): wave(sizes, a, b)[k] = sin(k * a + b) over the row-major index k.
// Each case's output y is reduced to a scalar as sum(y * wave(y.sizes, 0.37, 0.5)) (a loss is used
// as is) and differentiated; "<case>.y" is the output, "<case>.g<arg>" a gradient.
// Libtorch 1.13 has no rms_norm: its reference is written out (x * rsqrt(mean(x^2) + eps) * w).

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "golden_writer.h"

namespace F = torch::nn::functional;

namespace {

golden::Writer g_writer;

torch::Tensor wave(std::vector<int64_t> sizes, double a, double b) {
  auto t = torch::empty(sizes, torch::kFloat64);
  auto* p = t.data_ptr<double>();
  for (int64_t k = 0; k < t.numel(); ++k) p[k] = std::sin(k * a + b);
  return t;
}

torch::Tensor leaf(std::vector<int64_t> sizes, double a, double b) {
  return wave(sizes, a, b).requires_grad_(true);
}

void put(const std::string& name, const torch::Tensor& t) { g_writer.add(name, t); }

// Writes y and the gradients of sum(y * wave) (or of y itself when it is a scalar) for `args`.
void record(const std::string& name, const torch::Tensor& y,
            const std::vector<std::pair<std::string, torch::Tensor>>& args) {
  put(name + ".y", y);
  torch::Tensor s = y.dim() == 0 ? y : (y * wave(y.sizes().vec(), 0.37, 0.5)).sum();
  s.backward();
  for (const auto& [n, t] : args) put(name + ".g" + n, t.grad());
}

}  // namespace

int main(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : "norm_loss_golden.bin";

  {  // layer_norm over the last two dims
    auto x = leaf({3, 4, 5}, 0.7, 0.1), w = leaf({4, 5}, 0.3, 1.0), b = leaf({4, 5}, 0.9, 0.2);
    auto y = torch::layer_norm(x, {4, 5}, w, b, 1e-5);
    record("layer_norm", y, {{"x", x}, {"w", w}, {"b", b}});
  }
  {  // rms_norm, written out
    auto x = leaf({3, 6}, 0.7, 0.3), w = leaf({6}, 0.5, 0.4);
    auto y = x * torch::rsqrt(x.pow(2).mean({-1}, true) + 1e-6) * w;
    record("rms_norm", y, {{"x", x}, {"w", w}});
  }
  {  // group_norm
    auto x = leaf({2, 6, 3, 2}, 0.45, 0.2), w = leaf({6}, 0.8, 0.3), b = leaf({6}, 0.6, 0.9);
    auto y = torch::group_norm(x, 3, w, b, 1e-5);
    record("group_norm", y, {{"x", x}, {"w", w}, {"b", b}});
  }
  {  // batch_norm, training (running statistics updated) and evaluation
    auto x = leaf({4, 3, 5}, 0.55, 0.7), w = leaf({3}, 0.8, 0.3), b = leaf({3}, 0.6, 0.9);
    auto rm = wave({3}, 0.4, 0.1), rv = wave({3}, 0.4, 0.1).abs() + 0.5;
    auto y = torch::batch_norm(x, w, b, rm, rv, true, 0.2, 1e-5, false);
    record("batch_norm_train", y, {{"x", x}, {"w", w}, {"b", b}});
    put("batch_norm_train.running_mean", rm);
    put("batch_norm_train.running_var", rv);
    auto x2 = leaf({4, 3, 5}, 0.55, 0.7), w2 = leaf({3}, 0.8, 0.3), b2 = leaf({3}, 0.6, 0.9);
    auto y2 = torch::batch_norm(x2, w2, b2, rm, rv, false, 0.2, 1e-5, false);
    record("batch_norm_eval", y2, {{"x", x2}, {"w", w2}, {"b", b2}});
  }
  {  // softmax / log_softmax over a middle dim
    auto x = leaf({3, 4, 2}, 0.9, 0.4);
    record("softmax", torch::softmax(x, 1), {{"x", x}});
    auto x2 = leaf({3, 4, 2}, 0.9, 0.4);
    record("log_softmax", torch::log_softmax(x2, -1), {{"x", x2}});
  }
  {  // embedding with padding_idx and scale_grad_by_freq
    auto w = leaf({6, 3}, 0.3, 0.2);
    auto idx = torch::tensor({1, 4, 4, 0, 2, 4, 1, 5}, torch::kInt64).view({2, 4});
    auto y = torch::embedding(w, idx, 2, true, false);
    record("embedding", y, {{"w", w}});
  }
  auto target = torch::tensor({1, 0, 4, 2, 3, 2}, torch::kInt64);
  for (const char* red : {"mean", "sum", "none"}) {  // cross_entropy with class indices
    auto x = leaf({6, 5}, 0.7, 0.3);
    auto wc = wave({5}, 0.9, 0.1).abs() + 0.5;
    auto reduction = std::string(red) == "mean" ? at::Reduction::Mean
                     : std::string(red) == "sum" ? torch::Reduction::Sum : torch::Reduction::None;
    auto y = torch::cross_entropy_loss(x, target, wc, reduction, 2, 0.1);
    record(std::string("cross_entropy_") + red, y, {{"x", x}});
  }
  {  // cross_entropy over (N, C, d): plain, and with class probabilities
    auto x = leaf({2, 4, 3}, 0.6, 0.2);
    auto t = torch::tensor({0, 3, 1, 2, 2, 0}, torch::kInt64).view({2, 3});
    record("cross_entropy_kdim", torch::cross_entropy_loss(x, t), {{"x", x}});
    auto x2 = leaf({3, 4}, 0.6, 0.2);
    auto p = torch::softmax(wave({3, 4}, 0.8, 0.1), 1);
    record("cross_entropy_probs",
           torch::cross_entropy_loss(x2, p, {}, at::Reduction::Mean, -100, 0.2), {{"x", x2}});
  }
  {  // nll_loss with weights and ignore_index
    auto x = leaf({6, 5}, 0.7, 0.3);
    auto wc = wave({5}, 0.9, 0.1).abs() + 0.5;
    record("nll_loss", torch::nll_loss(x, target, wc, at::Reduction::Mean, 2), {{"x", x}});
  }
  {  // elementwise losses
    auto a = leaf({3, 4}, 0.7, 0.3), t = wave({3, 4}, 0.5, 1.1);
    record("mse_loss", torch::mse_loss(a, t), {{"a", a}});
    auto a2 = leaf({3, 4}, 0.7, 0.3);
    record("l1_loss", torch::l1_loss(a2, t, torch::Reduction::Sum), {{"a", a2}});
    auto a3 = leaf({3, 4}, 0.7, 0.3);
    record("smooth_l1_loss", torch::smooth_l1_loss(a3, t, at::Reduction::Mean, 0.5),
           {{"a", a3}});
    auto p = torch::sigmoid(wave({3, 4}, 0.7, 0.3)).detach().requires_grad_(true);
    auto tb = (wave({3, 4}, 0.5, 1.1) + 1) / 2;
    auto wb = wave({4}, 0.3, 0.3).abs() + 0.5;
    record("binary_cross_entropy", torch::binary_cross_entropy(p, tb, wb), {{"p", p}});
    auto z = leaf({3, 4}, 0.9, 0.0);  // z[0] = 0 exactly: the gradient at a zero logit
    auto pw = wave({4}, 0.2, 0.7).abs() + 0.5;
    record("bce_with_logits",
           torch::binary_cross_entropy_with_logits(z, tb, wb, pw, torch::Reduction::Sum),
           {{"z", z}});
    auto lq = torch::log_softmax(wave({3, 4}, 0.7, 0.3), 1).detach().requires_grad_(true);
    auto tp = torch::softmax(wave({3, 4}, 0.5, 1.1), 1);
    record("kl_div", F::kl_div(lq, tp, F::KLDivFuncOptions().reduction(torch::kBatchMean)),
           {{"q", lq}});
  }

  return g_writer.save(path);
}
