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
  return 0;
}
