// The PyTorch C++ API reference for scripts/bench --vs-torch (Debian's libtorch-dev): the same
// workloads as kiln_bench, timed the same way, printed with impl "torch-<version>-cpp".
//
//   g++ -O2 -std=c++17 bench/torch_cpp_ref.cpp -I/usr/include/torch/csrc/api/include \
//       -ltorch -ltorch_cpu -lc10 -o build/torch_cpp_ref && build/torch_cpp_ref [--quick]
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <set>
#include <sstream>
#include <string>

#include "torch_gpt.h"  // torch_reference.py's GPT, attention written out

namespace {

std::string impl() { return std::string("torch-") + TORCH_VERSION + "-cpp"; }

void emit(const char* workload, const std::string& metric, double value, const char* unit) {
  std::printf("{\"workload\": \"%s\", \"metric\": \"%s\", \"value\": %.4f, \"unit\": \"%s\", \"impl\": \"%s\"}\n",
              workload, metric.c_str(), value, unit, impl().c_str());
  std::fflush(stdout);
}

double best_time(const std::function<void()>& fn, int repeat = 5) {
  fn();
  double best = 1e30;
  for (int r = 0; r < repeat; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// shared/bench/torch_reference.py's train_ms: zero_grad(set_to_none=True), forward, loss,
// backward, step, loss.item(); two warm-up steps, then the mean over `steps` (ms per step).
template <typename Model, typename Loss>
double train_ms(Model& model, torch::optim::Optimizer& opt, const torch::Tensor& x,
                const torch::Tensor& y, Loss loss_fn, int steps) {
  auto params = model->parameters();
  volatile float sink = 0;
  auto step = [&] {
    for (auto& p : params) p.mutable_grad().reset();  // set_to_none (1.13's C++ zero_grad zeroes)
    auto loss = loss_fn(model->forward(x), y);
    loss.backward();
    opt.step();
    sink = loss.template item<float>();
  };
  for (int i = 0; i < 2; ++i) step();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step();
  (void)sink;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps * 1e3;
}

torch::Tensor ce(const torch::Tensor& logits, const torch::Tensor& y) {
  return torch::cross_entropy_loss(logits, y);
}

void w_train(bool quick, const std::function<bool(const char*)>& want) {
  namespace nn = torch::nn;
  if (want("mlp")) {
    torch::manual_seed(0);
    nn::Sequential m(nn::Linear(784, 1024), nn::ReLU(), nn::Linear(1024, 1024), nn::ReLU(),
                     nn::Linear(1024, 10));
    torch::optim::AdamW opt(m->parameters(), torch::optim::AdamWOptions(1e-3));
    auto x = torch::randn({512, 784}), y = torch::randint(0, 10, {512});
    emit("mlp_train", "step_b512", train_ms(m, opt, x, y, ce, quick ? 5 : 20), "ms/step");
  }
  if (want("cnn")) {
    torch::manual_seed(0);
    auto conv = [](int64_t in, int64_t out) {
      return nn::Conv2d(nn::Conv2dOptions(in, out, 3).padding(1));
    };
    nn::Sequential m(conv(3, 32), nn::ReLU(), nn::MaxPool2d(nn::MaxPool2dOptions(2)), conv(32, 64),
                     nn::ReLU(), nn::MaxPool2d(nn::MaxPool2dOptions(2)), nn::Flatten(),
                     nn::Linear(64 * 8 * 8, 10));
    torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
    auto x = torch::randn({64, 3, 32, 32}), y = torch::randint(0, 10, {64});
    emit("cnn_train", "step_b64", train_ms(m, opt, x, y, ce, quick ? 5 : 20), "ms/step");
  }
  if (want("gpt")) {
    torch::manual_seed(0);
    torch_gpt::GPT m(/*vocab=*/256, /*block=*/128, /*layers=*/4, /*heads=*/4, /*d=*/256);
    torch::optim::AdamW opt(m->parameters(), torch::optim::AdamWOptions(3e-4));
    const int64_t B = 16, T = 128;
    auto x = torch::randint(0, 256, {B, T}), y = torch::randint(0, 256, {B, T});
    auto loss = [](const torch::Tensor& logits, const torch::Tensor& t) {
      return torch::cross_entropy_loss(logits.view({-1, 256}), t.view({-1}));
    };
    double ms = train_ms(m, opt, x, y, loss, quick ? 3 : 10);
    emit("gpt_train", "step_b16_t128", ms, "ms/step");
    emit("gpt_train", "tokens_per_s", B * T / ms * 1e3, "tokens/s");
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::set<std::string> only;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--quick") quick = true;
    if (arg == "--only" && i + 1 < argc) {
      std::stringstream ss(argv[++i]);
      for (std::string name; std::getline(ss, name, ',');) only.insert(name);
    }
  }
  auto want = [&](const char* name) { return only.empty() || only.count(name) > 0; };
  if (want("dispatch")) {
    torch::NoGradGuard no_grad;
    int n = quick ? 20000 : 200000;
    auto a = torch::ones({1}), b = torch::ones({1});
    torch::Tensor c;
    double t = best_time([&] {
      for (int i = 0; i < n; ++i) c = a + b;
    }, 3);
    emit("dispatch", "add_1elem", t / n * 1e9, "ns/op");
  }
  if (want("dispatch")) {
    int n = quick ? 20000 : 200000;
    auto a = torch::ones({1}).requires_grad_(true), b = torch::ones({1});
    torch::Tensor c;
    torch::AutoGradMode enable(true);
    double t = best_time([&] {
      for (int i = 0; i < n; ++i) c = a * b;
    }, 3);
    emit("dispatch", "mul_1elem_requires_grad", t / n * 1e9, "ns/op");
  }
  if (want("autograd")) {
    auto x = torch::ones({1}).requires_grad_(true);
    double tc = best_time([&] {
      auto y = x;
      for (int i = 0; i < 1000; ++i) y = y * 1.0001;
      y.backward();
    }, 3);
    emit("autograd", "backward_chain_1000_tiny", tc * 1e3, "ms");
  }
  if (want("kernels")) {  // as shared/bench/torch_reference.py: no bias, ones as the gradient
    auto x = torch::randn({32, 32, 16, 16}).requires_grad_(true);
    auto w = torch::randn({64, 32, 3, 3}).requires_grad_(true), gy = torch::ones({32, 64, 16, 16});
    double t = best_time([&] { torch::conv2d(x, w, {}, 1, 1).backward(gy); }, 7);
    emit("kernels", "conv2d_fwd_bwd_b32_c32_16x16", t * 1e3, "ms");
  }
  for (int64_t T : {128, 512}) {  // causal attention written out: matmul, softmax, matmul
    if (!want("kernels")) continue;
    torch::manual_seed(0);
    auto q = torch::randn({8, 8, T, 64}).requires_grad_(), k = torch::randn({8, 8, T, 64}).requires_grad_();
    auto v = torch::randn({8, 8, T, 64}).requires_grad_(), g = torch::randn({8, 8, T, 64});
    auto mask = torch::ones({T, T}, torch::kBool).triu(1);
    double t = best_time([&] {
      auto s = torch::matmul(q, k.transpose(-2, -1)) / 8.0;
      auto out = torch::matmul(torch::softmax(s.masked_fill(mask, -INFINITY), -1), v);
      torch::autograd::grad({out}, {q, k, v}, {g});
    }, quick ? 2 : 5);
    emit("kernels", "attention_fwd_bwd_b8_h8_t" + std::to_string(T) + "_d64", t * 1e3, "ms");
  }
  torch::NoGradGuard no_grad;
  for (int64_t n : {512, 1024, 2048}) {
    if (!want("gemm") || (quick && n == 2048)) continue;
    auto A = torch::randn({n, n}), B = torch::randn({n, n});
    double t = best_time([&] { torch::mm(A, B); });
    emit("gemm", "sgemm_" + std::to_string(n), 2.0 * n * n * n / t / 1e9, "GFLOP/s");
  }
  const int64_t n = int64_t{1} << 24;
  auto a = torch::randn({n}), b = torch::randn({n}), c = torch::empty({n});
  if (want("elementwise")) {
    emit("elementwise", "add_16M", 12.0 * n / best_time([&] { torch::add_out(c, a, b); }) / 1e9, "GB/s");
    emit("elementwise", "gelu_16M", 8.0 * n / best_time([&] { torch::gelu(a); }) / 1e9, "GB/s");
  }
  if (want("reduction")) {
    emit("reduction", "sum_16M", 4.0 * n / best_time([&] { a.sum(); }) / 1e9, "GB/s");
    auto x = torch::randn({4096, 1024});
    emit("reduction", "softmax_4096x1024", 8.0 * x.numel() / best_time([&] { torch::softmax(x, -1); }) / 1e9, "GB/s");
  }
  if (want("kernels")) {
    torch::AutoGradMode enable(true);
    auto x = torch::randn({4096, 1024}).requires_grad_(true), g = torch::randn({4096, 1024});
    auto w = torch::ones({1024}).requires_grad_(true), b = torch::zeros({1024}).requires_grad_(true);
    double t = best_time([&] {
      auto y = torch::layer_norm(x, {1024}, w, b);
      torch::autograd::grad({y}, {x, w, b}, {g});
    });
    emit("kernels", "layer_norm_fwd_bwd_4096x1024", t * 1e3, "ms");
    auto logits = torch::randn({4096, 1000}).requires_grad_(true);
    auto target = torch::randint(0, 1000, {4096}, torch::kInt64);
    double tc = best_time([&] {
      auto loss = torch::cross_entropy_loss(logits, target);
      torch::autograd::grad({loss}, {logits});
    });
    emit("kernels", "cross_entropy_fwd_bwd_4096x1000", tc * 1e3, "ms");
  }
  torch::AutoGradMode enable(true);
  w_train(quick, want);
  return 0;
}
