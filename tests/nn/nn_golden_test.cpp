// kiln::nn modules against PyTorch's (tests/golden/nn_golden.bin, written by
// tests/golden/nn_golden_gen.cpp with the same wave parameters and inputs): outputs and every
// parameter's gradient, in float64.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "golden/golden_file.h"
#include "kiln/autograd/grad_mode.h"
#include "kiln/nn/nn.h"
#include "test_util.h"

namespace kiln::nn {
namespace {

using testing::Golden;

Tensor wave(std::vector<int64_t> sizes, double a, double b) {
  Tensor t = kiln::empty(sizes, kFloat64);
  double* p = t.data_ptr<double>();
  for (int64_t k = 0; k < t.numel(); ++k) p[k] = std::sin(k * a + b);
  return t;
}

// The generator's parameter values (see nn_golden_gen.cpp).
void set_params(Module& m) {
  m.to(kFloat64);
  autograd::NoGradGuard g;
  for (auto& [key, p] : m.named_parameters()) {
    int s = 0;
    for (unsigned char c : key) s += c;
    std::vector<int64_t> sizes(p.sizes().begin(), p.sizes().end());
    p.copy_(wave(sizes, 0.05 + (s % 97) * 0.003, (s % 13) * 0.1) * 0.5);
  }
}

void expect_golden(const Tensor& got, const Golden& want, const std::string& what) {
  ASSERT_EQ(std::vector<int64_t>(got.sizes().begin(), got.sizes().end()), want.sizes) << what;
  std::vector<double> v = testing::to_doubles(got);
  for (size_t i = 0; i < v.size(); ++i)
    ASSERT_NEAR(v[i], want.values[i], 1e-10 + 1e-9 * std::abs(want.values[i])) << what << "[" << i << "]";
}

void check(const std::map<std::string, Golden>& golden, const std::string& name, Module& m,
           const Tensor& y) {
  expect_golden(y, golden.at(name + ".y"), name + ".y");
  std::vector<int64_t> sizes(y.sizes().begin(), y.sizes().end());
  (y * wave(sizes, 0.37, 0.5)).sum().backward();
  for (auto& [key, p] : m.named_parameters()) {
    std::string k = name + ".grad." + key;
    ASSERT_TRUE(golden.count(k)) << k;
    expect_golden(p.grad(), golden.at(k), k);
  }
}

class NnGolden : public ::testing::Test {
 protected:
  std::map<std::string, Golden> golden = testing::read_golden_file("nn_golden.bin");
};

TEST_F(NnGolden, Bilinear) {
  Bilinear m(3, 4, 2);
  set_params(m);
  check(golden, "bilinear", m, m.forward(wave({5, 3}, 0.3, 0.1), wave({5, 4}, 0.2, 0.7)));
}

TEST_F(NnGolden, MultiheadAttentionWithKeyPaddingMask) {
  MultiheadAttention m(8, 2);
  set_params(m);
  Tensor x = wave({4, 2, 8}, 0.21, 0.3);
  Tensor kpm = testing::from_vector<bool>({false, false, true, false, false, false, false, true}, {2, 4});
  auto [out, w] = m.forward(x, x, x, {.key_padding_mask = kpm, .need_weights = true});
  expect_golden(w, golden.at("mha.weights"), "mha.weights");
  check(golden, "mha", m, out);
}

TEST_F(NnGolden, TransformerEncoderLayer) {
  TransformerEncoderLayer m(8, 2, {.dim_feedforward = 16, .dropout = 0.0, .activation = "gelu"});
  set_params(m);
  check(golden, "encoder", m, m.forward(wave({5, 2, 8}, 0.17, 0.2)));
}

TEST_F(NnGolden, TransformerDecoderLayerCausal) {
  TransformerDecoderLayer m(8, 2, {.dim_feedforward = 12, .dropout = 0.0});
  set_params(m);
  Tensor mask = kiln::zeros({3, 3}, kFloat64)
                    .masked_fill(kiln::ones({3, 3}, kBool).triu(1),
                                 -std::numeric_limits<double>::infinity());
  check(golden, "decoder", m,
        m.forward(wave({3, 2, 8}, 0.23, 0.4), wave({5, 2, 8}, 0.11, 0.9), {.tgt_mask = mask}));
}

TEST_F(NnGolden, BatchNorm2dTrainingStep) {
  BatchNorm2d m(3);
  set_params(m);
  Tensor y = m.forward(wave({4, 3, 2, 2}, 0.29, 0.6) * 2 + 0.5);
  expect_golden(m.running_mean, golden.at("batchnorm.running_mean"), "running_mean");
  expect_golden(m.running_var, golden.at("batchnorm.running_var"), "running_var");
  check(golden, "batchnorm", m, y);
}

}  // namespace
}  // namespace kiln::nn
