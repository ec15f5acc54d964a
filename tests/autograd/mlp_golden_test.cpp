// Golden gradients: a 784-64-10 MLP (ReLU, cross-entropy as log_softmax + gather + mean) in
// float64, whose loss and parameter gradients PyTorch computed (tests/golden/make_mlp_golden.sh,
// libtorch's C++ API) and committed as tests/golden/mlp_golden.bin. Every value is a closed
// formula of its indices (no RNG), written identically in tests/golden/mlp_golden_gen.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "golden/golden_file.h"
#include "kiln/autograd/autograd.h"
#include "test_util.h"

namespace kiln {
namespace {

using testing::Golden;

template <typename F>
Tensor formula(int64_t rows, int64_t cols, F f) {
  std::vector<double> v(rows * cols);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) v[i * cols + j] = f(i, j);
  return testing::from_vector<double>(v, {rows, cols});
}

// The same program as tests/golden/mlp_golden_gen.cpp.
struct Mlp {
  static constexpr int64_t B = 8, IN = 784, H = 64, OUT = 10;
  Tensor x, w1, b1, w2, b2, target;
  Mlp() {
    x = formula(B, IN, [](int64_t b, int64_t j) { return std::sin(b * 1.3 + j * 0.07) * 0.5 + 0.25; });
    w1 = formula(H, IN, [](int64_t i, int64_t j) { return std::sin(i * 0.37 + j * 0.11) * 0.05; });
    b1 = formula(1, H, [](int64_t, int64_t i) { return std::cos(i * 0.23) * 0.01; }).view({H});
    w2 = formula(OUT, H, [](int64_t i, int64_t j) { return std::sin(i * 0.53 + j * 0.29 + 1.0) * 0.1; });
    b2 = formula(1, OUT, [](int64_t, int64_t i) { return std::cos(i * 0.71) * 0.02; }).view({OUT});
    std::vector<int64_t> t(B);
    for (int64_t b = 0; b < B; ++b) t[b] = (3 * b + 1) % 10;
    target = testing::from_vector<int64_t>(t, {B});
    for (Tensor* p : {&w1, &b1, &w2, &b2}) p->requires_grad_();
  }
  // x: (B, 784) -> h: (B, 64) -> logits: (B, 10) -> loss: ()
  Tensor loss() const {
    Tensor h = relu(add(mm(x, w1.t()), b1));
    Tensor logits = add(mm(h, w2.t()), b2);
    return neg(log_softmax(logits, 1).gather(1, target.unsqueeze(1)).mean());
  }
};

void expect_rel_close(const Tensor& got, const Golden& want, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  ASSERT_EQ(std::vector<int64_t>(got.sizes().begin(), got.sizes().end()), want.sizes) << what;
  EXPECT_EQ(got.dtype(), kFloat64) << what;
  std::vector<double> g = testing::to_doubles(got);
  double scale = 0;
  for (double w : want.values) scale = std::max(scale, std::fabs(w));
  int bad = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    // Relative to the element, with the tensor's largest magnitude as the floor (elements that
    // are sums cancelling to ~0 carry absolute, not relative, rounding differences).
    double tol = 1e-10 * std::max(std::fabs(want.values[i]), 1e-3 * scale);
    if (std::fabs(g[i] - want.values[i]) > tol && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: kiln " << g[i] << ", PyTorch " << want.values[i];
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " elements differ";
}

TEST(MlpGolden, LossAndGradientsMatchPyTorch) {
  auto golden = testing::read_golden_file("mlp_golden.bin");
  const std::string path = "tests/golden/mlp_golden.bin";
  for (const char* k : {"loss", "w1.grad", "b1.grad", "w2.grad", "b2.grad"})
    ASSERT_TRUE(golden.count(k)) << k << " missing from " << path;

  Mlp m;
  Tensor loss = m.loss();
  loss.backward();
  expect_rel_close(loss.detach(), golden["loss"], "loss");
  expect_rel_close(m.w1.grad(), golden["w1.grad"], "w1.grad");
  expect_rel_close(m.b1.grad(), golden["b1.grad"], "b1.grad");
  expect_rel_close(m.w2.grad(), golden["w2.grad"], "w2.grad");
  expect_rel_close(m.b2.grad(), golden["b2.grad"], "b2.grad");

  // The program is not degenerate: some hidden units are active, some not, and every gradient
  // has non-zero entries.
  autograd::NoGradGuard ng;
  std::vector<double> pre = testing::to_doubles(add(mm(m.x, m.w1.t()), m.b1));
  int64_t active = 0;
  for (double v : pre) active += v > 0;
  EXPECT_GT(active, 0);
  EXPECT_LT(active, static_cast<int64_t>(pre.size()));
  for (const Tensor* p : {&m.w1, &m.b1, &m.w2, &m.b2}) {
    double mx = 0;
    for (double v : testing::to_doubles(p->grad())) mx = std::max(mx, std::fabs(v));
    EXPECT_GT(mx, 1e-6);
  }
}

}  // namespace
}  // namespace kiln
