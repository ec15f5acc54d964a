// kiln::nn layers against naive references (loops or compositions of tested ops), their
// PyTorch default initialisation bounds, modes and errors.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/autograd/grad_mode.h"
#include "kiln/nn/nn.h"
#include "test_util.h"

namespace kiln::nn {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::to_doubles;

double max_abs(const Tensor& t) { return t.abs().max().item<double>(); }

TEST(NnLayers, LinearMatchesLoopAndInitBounds) {
  Linear lin(5, 3);
  EXPECT_EQ(lin.weight.sizes(), (std::vector<int64_t>{3, 5}));
  const double bound = 1 / std::sqrt(5.0);
  EXPECT_LE(max_abs(lin.weight), bound);
  EXPECT_LE(max_abs(lin.bias), bound);
  EXPECT_GT(max_abs(lin.weight), bound / 2);  // not all zero: drawn over the whole range
  Tensor x = testing::random({2, 4, 5});
  std::vector<double> xs = to_doubles(x), w = to_doubles(lin.weight), b = to_doubles(lin.bias),
                      want(2 * 4 * 3);
  for (int r = 0; r < 8; ++r)
    for (int o = 0; o < 3; ++o) {
      double acc = b[o];
      for (int i = 0; i < 5; ++i) acc += xs[r * 5 + i] * w[o * 5 + i];
      want[r * 3 + o] = acc;
    }
  expect_close(lin.forward(x), testing::from_vector<float>(std::vector<float>(want.begin(), want.end()),
                                                           {2, 4, 3}), 1e-5, 1e-5);
  Linear nobias(5, 3, false);
  EXPECT_FALSE(nobias.bias.defined());
  EXPECT_EQ(nobias.parameters().size(), 1u);
  expect_close(nobias.forward(x), x.matmul(nobias.weight.t()), 1e-6, 1e-6);
  expect_error(ErrorKind::Value, "Linear: feature counts", [] { Linear(-1, 2); });
}

TEST(NnLayers, BilinearMatchesLoop) {
  Bilinear bl(3, 4, 2);
  EXPECT_LE(max_abs(bl.weight), 1 / std::sqrt(3.0));
  Tensor x1 = testing::random({5, 3}, kFloat64, -2, 2, 1), x2 = testing::random({5, 4}, kFloat64, -2, 2, 2);
  bl.to(kFloat64);
  std::vector<double> a = to_doubles(x1), c = to_doubles(x2), w = to_doubles(bl.weight),
                      b = to_doubles(bl.bias), want(10);
  for (int n = 0; n < 5; ++n)
    for (int o = 0; o < 2; ++o) {
      double acc = b[o];
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 4; ++j) acc += a[n * 3 + i] * w[(o * 3 + i) * 4 + j] * c[n * 4 + j];
      want[n * 2 + o] = acc;
    }
  expect_close(bl.forward(x1, x2), testing::from_vector<double>(want, {5, 2}), 1e-12, 1e-12);
  // leading dims are batch dims
  Tensor y = bl.forward(x1.reshape({5, 1, 3}), x2.reshape({5, 1, 4}));
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{5, 1, 2}));
  expect_error(ErrorKind::Value, "do not match weight",
               [&] { bl.forward(x2, x1); });
}

TEST(NnLayers, ConvLayersCallTheOpWithTheirParameters) {
  Conv2d c2(4, 6, {3, 1}, {.stride = {2}, .padding = {1, 0}, .groups = 2});
  EXPECT_EQ(c2.weight.sizes(), (std::vector<int64_t>{6, 2, 3, 1}));
  const double bound = 1 / std::sqrt(2.0 * 3);  // fan_in = in/groups · kernel
  EXPECT_LE(max_abs(c2.weight), bound);
  EXPECT_LE(max_abs(c2.bias), bound);
  Tensor x = testing::random({2, 4, 7, 5});
  expect_close(c2.forward(x), kiln::conv2d(x, c2.weight, c2.bias, {2, 2}, {1, 0}, {1, 1}, 2), 0, 0);
  EXPECT_EQ(c2.repr(), "Conv2d(4, 6, kernel_size=(3, 1), stride=(2, 2), padding=(1, 0), groups=2)");

  Conv1d c1(3, 2, {5}, {.dilation = {2}, .bias = false});
  Tensor x1 = testing::random({2, 3, 11});
  expect_close(c1.forward(x1), kiln::conv1d(x1, c1.weight, std::nullopt, std::vector<int64_t>{1}, std::vector<int64_t>{0}, std::vector<int64_t>{2}), 0, 0);
  EXPECT_EQ(c1.repr(), "Conv1d(3, 2, kernel_size=(5,), stride=(1,), dilation=(2,), bias=False)");

  ConvTranspose2d ct(4, 6, {3}, {.stride = {2}, .groups = 2, .output_padding = {1}});
  EXPECT_EQ(ct.weight.sizes(), (std::vector<int64_t>{4, 3, 3, 3}));
  EXPECT_LE(max_abs(ct.bias), 1 / std::sqrt(3.0 * 9));  // fan_in = size(1) · kernel
  Tensor y = ct.forward(x);
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 6, 16, 12}));
  expect_close(y, kiln::conv_transpose2d(x, ct.weight, ct.bias, {2, 2}, {0, 0}, {1, 1}, 2), 0, 0);
  expect_error(ErrorKind::Value, "must be divisible by groups", [] { Conv2d(3, 4, {3}, {.groups = 2}); });
  expect_error(ErrorKind::Value, "kernel_size must have 1 or 2 values", [] { Conv2d(3, 4, {3, 3, 3}); });
}

TEST(NnLayers, Pools) {
  Tensor x = testing::random({2, 3, 6, 7});
  MaxPool2d mp({2});
  expect_close(mp.forward(x), kiln::max_pool2d(x, {2, 2}, {2, 2}), 0, 0);
  EXPECT_EQ(mp.repr(), "MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)");
  AvgPool2d ap({3, 2}, {1}, {1, 0});
  expect_close(ap.forward(x), kiln::avg_pool2d(x, {3, 2}, {1, 1}, {1, 0}), 0, 0);
  EXPECT_EQ(ap.repr(), "AvgPool2d(kernel_size=(3, 2), stride=1, padding=(1, 0))");
  AdaptiveAvgPool2d aap({1});
  expect_close(aap.forward(x), x.mean({2, 3}, true), 1e-6, 1e-6);
  EXPECT_EQ(aap.repr(), "AdaptiveAvgPool2d(output_size=1)");
}

TEST(NnLayers, BatchNormTrainingUpdatesRunningStatsEvalUsesThem) {
  BatchNorm2d bn(3);
  Tensor x = testing::random({4, 3, 2, 5}, kFloat32, -1, 3);
  Tensor mean = x.mean({0, 2, 3}), var_b = x.var({0, 2, 3}, 1.0), var_p = x.var({0, 2, 3}, 0.0);
  auto ch = [](const Tensor& t) { return t.reshape({1, 3, 1, 1}); };
  Tensor y = bn.forward(x);
  expect_close(y, (x - ch(mean)) / kiln::sqrt(ch(var_p) + 1e-5), 1e-4, 1e-5);
  expect_close(bn.running_mean, mean * 0.1, 1e-5, 1e-6);
  expect_close(bn.running_var, var_b * 0.1 + 0.9, 1e-5, 1e-6);  // unbiased, as PyTorch
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 1);
  bn.eval();
  expect_close(bn.forward(x), (x - ch(bn.running_mean)) / kiln::sqrt(ch(bn.running_var) + 1e-5),
               1e-5, 1e-5);
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 1);  // eval does not count

  BatchNorm1d cumulative(3, 1e-5, std::nullopt);  // momentum None: the running average
  Tensor a = testing::random({6, 3}, kFloat32, -1, 1, 3), b = testing::random({6, 3}, kFloat32, -1, 1, 4);
  cumulative.forward(a);
  cumulative.forward(b);
  expect_close(cumulative.running_mean, (a.mean({0}) + b.mean({0})) * 0.5, 1e-5, 1e-6);
  EXPECT_EQ(cumulative.repr(),
            "BatchNorm1d(3, eps=1e-05, momentum=None, affine=True, track_running_stats=True)");

  BatchNorm1d nostats(3, 1e-5, 0.1, false, false);  // batch statistics in eval too
  nostats.eval();
  EXPECT_TRUE(nostats.buffers().empty() && nostats.parameters().empty());
  Tensor a3 = a.unsqueeze(2);
  expect_close(nostats.forward(a3), (a3 - a3.mean({0, 2}, true)) / kiln::sqrt(a3.var({0, 2}, 0.0, true) + 1e-5),
               1e-4, 1e-5);
  expect_error(ErrorKind::Value, "expected 4D input (got 2D input", [&] { bn.forward(a); });
  expect_error(ErrorKind::Value, "expected 3 channels", [&] { cumulative.forward(x.reshape({8, 15})); });
}

TEST(NnLayers, LayerRmsGroupNorm) {
  Tensor x = testing::random({2, 4, 6}, kFloat64);
  LayerNorm ln({6});
  ln.to(kFloat64);
  { autograd::NoGradGuard g; ln.weight.copy_(testing::random({6}, kFloat64, 0.5, 2, 9)); }
  Tensor mu = x.mean({2}, true), var = x.var({2}, 0.0, true);
  expect_close(ln.forward(x), (x - mu) / kiln::sqrt(var + 1e-5) * ln.weight + ln.bias, 1e-10, 1e-10);
  EXPECT_EQ(ln.repr(), "LayerNorm((6,), eps=1e-05, elementwise_affine=True)");
  LayerNorm nob({4, 6}, 1e-6, true, false);
  EXPECT_EQ(nob.named_parameters().size(), 1u);

  RMSNorm rms({6}, 1e-6);
  rms.to(kFloat64);
  expect_close(rms.forward(x), x / kiln::sqrt((x * x).mean({2}, true) + 1e-6), 1e-10, 1e-10);
  EXPECT_EQ(RMSNorm({6}).repr(), "RMSNorm((6,), eps=None, elementwise_affine=True)");

  GroupNorm gn(2, 4);
  gn.to(kFloat64);
  Tensor xg = x.reshape({2, 2, 2, 6});
  Tensor want = ((xg - xg.mean({2, 3}, true)) / kiln::sqrt(xg.var({2, 3}, 0.0, true) + 1e-5)).reshape({2, 4, 6});
  expect_close(gn.forward(x), want, 1e-10, 1e-10);
  EXPECT_EQ(gn.repr(), "GroupNorm(2, 4, eps=1e-05, affine=True)");
  expect_error(ErrorKind::Value, "divisible by num_groups", [] { GroupNorm(3, 4); });
}

TEST(NnLayers, EmbeddingPaddingRowIsZeroAndGetsNoGradient) {
  Embedding emb(10, 4, -1);  // padding_idx -1 -> 9
  EXPECT_EQ(emb.padding_idx, 9);
  EXPECT_EQ(max_abs(emb.weight.select(0, 9)), 0);
  EXPECT_GT(max_abs(emb.weight), 1);  // N(0, 1) draws, 36 of them
  Tensor idx = testing::from_vector<int64_t>({1, 9, 1, 3, 0, 9}, {2, 3});
  Tensor y = emb.forward(idx);
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 3, 4}));
  expect_close(y.select(0, 0).select(0, 0), emb.weight.select(0, 1), 0, 0);
  y.sum().backward();
  std::vector<double> g = to_doubles(emb.weight.grad().sum({1}));
  EXPECT_EQ(g, (std::vector<double>{4, 8, 0, 4, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(emb.repr(), "Embedding(10, 4, padding_idx=9)");
  expect_error(ErrorKind::Value, "padding_idx 10 must be within", [] { Embedding(10, 4, 10); });
}

TEST(NnLayers, DropoutFollowsTrainingMode) {
  Dropout d(0.5);
  Tensor x = kiln::ones({1000});
  std::vector<double> v = to_doubles(d.forward(x));
  int zeros = 0;
  for (double e : v) {
    EXPECT_TRUE(e == 0 || e == 2);
    zeros += e == 0;
  }
  EXPECT_GT(zeros, 400);
  EXPECT_LT(zeros, 600);
  d.eval();
  expect_close(d.forward(x), x, 0, 0);
  expect_error(ErrorKind::Value, "between 0 and 1", [] { Dropout(1.5); });
}

TEST(NnLayers, ActivationsAndShapeModules) {
  Tensor x = testing::random({3, 5});
  expect_close(ReLU().forward(x), kiln::relu(x), 0, 0);
  expect_close(GELU("tanh").forward(x), kiln::gelu(x, "tanh"), 0, 0);
  expect_close(SiLU().forward(x), x * kiln::sigmoid(x), 1e-6, 1e-6);
  expect_close(Tanh().forward(x), kiln::tanh(x), 0, 0);
  expect_close(Sigmoid().forward(x), kiln::sigmoid(x), 0, 0);
  expect_close(Softmax(1).forward(x).sum({1}), kiln::ones({3}), 1e-6, 1e-6);
  expect_close(LogSoftmax(0).forward(x), kiln::log(kiln::softmax(x, 0)), 1e-5, 1e-6);
  EXPECT_TRUE(Identity().forward(x).is_same(x));
  EXPECT_EQ(Flatten().forward(kiln::zeros({2, 3, 4})).sizes(), (std::vector<int64_t>{2, 12}));
  EXPECT_EQ(GELU().repr(), "GELU(approximate='none')");
  EXPECT_EQ(Softmax(-1).repr(), "Softmax(dim=-1)");
}

TEST(NnLayers, SmallCnnTrainsOneStep) {
  manual_seed(0);
  Sequential net({std::make_shared<Conv2d>(1, 4, std::vector<int64_t>{3}, ConvArgs{.padding = {1}}),
                  std::make_shared<BatchNorm2d>(4), std::make_shared<ReLU>(),
                  std::make_shared<MaxPool2d>(std::vector<int64_t>{2}), std::make_shared<Flatten>(),
                  std::make_shared<Linear>(4 * 4 * 4, 10)});
  Tensor x = testing::random({8, 1, 8, 8});
  Tensor target = testing::random({8}, kInt64, 0, 10);
  Tensor loss0 = functional::cross_entropy(net.forward(x), target);
  loss0.backward();
  {
    autograd::NoGradGuard g;
    for (const Tensor& p : net.parameters()) p.sub_(p.grad() * 0.1);
  }
  Tensor loss1 = functional::cross_entropy(net.forward(x), target);
  EXPECT_LT(loss1.item<float>(), loss0.item<float>());
}

}  // namespace
}  // namespace kiln::nn
