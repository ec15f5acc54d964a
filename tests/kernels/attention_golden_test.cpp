// The fused scaled_dot_product_attention (forward and backward) against PyTorch's written-out
// attention in float64: tests/golden/attention_golden.bin, made by
// tests/golden/attention_golden_gen.cpp (the cases and inputs are described there).
#include <gtest/gtest.h>

#include <cmath>

#include "golden/golden_file.h"
#include "kiln/autograd/autograd.h"
#include "kiln/kiln.h"
#include "test_util.h"

namespace kiln {
namespace {

using testing::from_vector;

Tensor fill(std::vector<int64_t> shape, double a, double b, double scale = 1.0) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = std::sin(static_cast<double>(i) * a + b) * scale;
  return from_vector<double>(v, shape).requires_grad_();
}

Tensor as_tensor(const testing::Golden& g) { return from_vector<double>(g.values, g.sizes); }

TEST(AttentionGolden, FusedKernelMatchesPyTorch) {
  auto golden = testing::read_golden_file("attention_golden.bin");
  ASSERT_EQ(golden.size(), 12u) << "tests/golden/attention_golden.bin missing or incomplete";
  struct Case {
    const char* name;
    std::vector<int64_t> qs, ks;
    double qscale;
    bool causal;
    double scale;
  };
  for (const Case& c : {Case{"causal", {2, 3, 70, 16}, {2, 3, 70, 16}, .5, true, 0.25},
                        Case{"cross", {2, 2, 33, 8}, {2, 2, 300, 8}, 1.0, false, 0.3},
                        Case{"skew", {1, 2, 5, 8}, {1, 2, 9, 8}, 1.0, true, 1.0 / std::sqrt(8.0)}}) {
    SCOPED_TRACE(c.name);
    const std::string n = c.name;
    Tensor q = fill(c.qs, .37, .1, c.qscale), k = fill(c.ks, .23, .5, c.qscale), v = fill(c.ks, .71, 0);
    Tensor y = scaled_dot_product_attention(q, k, v, 0.0, c.causal, c.scale);
    Tensor gy = fill(y.sizes().vec(), .53, .2).detach();
    std::vector<Tensor> g = autograd::grad({(y * gy).sum()}, {q, k, v});
    testing::expect_close(y, as_tensor(golden.at(n + ".y")), 1e-10, 1e-12);
    testing::expect_close(g[0], as_tensor(golden.at(n + ".q.grad")), 1e-10, 1e-12);
    testing::expect_close(g[1], as_tensor(golden.at(n + ".k.grad")), 1e-10, 1e-12);
    testing::expect_close(g[2], as_tensor(golden.at(n + ".v.grad")), 1e-10, 1e-12);
  }
}

}  // namespace
}  // namespace kiln
