// tests/golden/mlp_golden_gen.cpp: PyTorch's (libtorch C++ API) loss and gradients of the small
// MLP of tests/autograd/mlp_golden_test.cpp, written to mlp_golden.bin. Built and run by
// make_mlp_golden.sh; CI never runs it (the committed file is what the test reads).
//
// The program (float64, no RNG; every value from a closed formula shared with the test):
//   x[b][j]  = sin(b * 1.3 + j * 0.07) * 0.5 + 0.25         (B=8, 784)
//   w1[i][j] = sin(i * 0.37 + j * 0.11) * 0.05              (64, 784)
//   b1[i]    = cos(i * 0.23) * 0.01                         (64)
//   w2[i][j] = sin(i * 0.53 + j * 0.29 + 1.0) * 0.1         (10, 64)
//   b2[i]    = cos(i * 0.71) * 0.02                         (10)
//   target[b] = (3 * b + 1) % 10
//   h = relu(x @ w1^T + b1); logits = h @ w2^T + b2
//   loss = -mean(gather(log_softmax(logits, 1), 1, target[:, None]))
//
// File format: golden_writer.h.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "golden_writer.h"

namespace {

torch::Tensor make(int64_t rows, int64_t cols, double (*f)(int64_t, int64_t)) {
  auto t = torch::empty({rows, cols}, torch::kFloat64);
  auto a = t.accessor<double, 2>();
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) a[i][j] = f(i, j);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : "mlp_golden.bin";
  const int64_t B = 8, IN = 784, H = 64, OUT = 10;
  torch::Tensor x = make(B, IN, [](int64_t b, int64_t j) { return std::sin(b * 1.3 + j * 0.07) * 0.5 + 0.25; });
  torch::Tensor w1 = make(H, IN, [](int64_t i, int64_t j) { return std::sin(i * 0.37 + j * 0.11) * 0.05; });
  torch::Tensor b1 = make(1, H, [](int64_t, int64_t i) { return std::cos(i * 0.23) * 0.01; }).view({H});
  torch::Tensor w2 = make(OUT, H, [](int64_t i, int64_t j) { return std::sin(i * 0.53 + j * 0.29 + 1.0) * 0.1; });
  torch::Tensor b2 = make(1, OUT, [](int64_t, int64_t i) { return std::cos(i * 0.71) * 0.02; }).view({OUT});
  torch::Tensor target = torch::empty({B}, torch::kInt64);
  for (int64_t b = 0; b < B; ++b) target[b] = (3 * b + 1) % 10;
  for (auto* p : {&w1, &b1, &w2, &b2}) p->requires_grad_(true);

  torch::Tensor h = torch::relu(torch::mm(x, w1.t()) + b1);
  torch::Tensor logits = torch::mm(h, w2.t()) + b2;
  torch::Tensor loss = -torch::log_softmax(logits, 1).gather(1, target.unsqueeze(1)).mean();
  loss.backward();

  golden::Writer out;
  out.add("loss", loss);
  out.add("w1.grad", w1.grad());
  out.add("b1.grad", b1.grad());
  out.add("w2.grad", w2.grad());
  out.add("b2.grad", b2.grad());
  if (out.save(path) != 0) return 1;
  std::printf("loss %.17g written to %s\n", loss.item<double>(), path);
  return 0;
}
