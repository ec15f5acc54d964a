// conv1d, conv2d, conv_transpose2d and the `convolution` rows (tensor/ops/conv.toml) against a
// naive loop in double, forward and backward, on odd shapes, strides, padding ('same' too),
// dilation, groups, non-contiguous inputs, every floating dtype (bfloat16 accumulating in
// float32), zero sizes and bad input; per-example gradients under vmap, second derivatives, and
// golden values from PyTorch (tests/golden/conv_golden.bin).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>

#include "autograd/gradgradcheck.h"
#include "golden/golden_file.h"
#include "kiln/autograd/autograd.h"
#include "kiln/autograd/batched.h"
#include "kiln/autograd/functional.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

struct Geo {
  std::vector<int64_t> stride{1, 1}, padding{0, 0}, dilation{1, 1};
  int64_t groups = 1;
};

// Calls f(xi, wi, yi) for every product x[xi] * w[wi] that a plain convolution of x (N, C, H, W)
// with w (O, C / groups, KH, KW) adds into y[yi] (flat row-major indices). Returns y's sizes.
std::vector<int64_t> conv_taps(IntArrayRef xs, IntArrayRef ws, const Geo& g,
                               const std::function<void(int64_t, int64_t, int64_t)>& f) {
  const int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3], O = ws[0], Cg = ws[1], KH = ws[2],
                KW = ws[3];
  const int64_t OH = (H + 2 * g.padding[0] - g.dilation[0] * (KH - 1) - 1) / g.stride[0] + 1;
  const int64_t OW = (W + 2 * g.padding[1] - g.dilation[1] * (KW - 1) - 1) / g.stride[1] + 1;
  const int64_t Og = O / g.groups;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow)
          for (int64_t cg = 0; cg < Cg; ++cg)
            for (int64_t kh = 0; kh < KH; ++kh)
              for (int64_t kw = 0; kw < KW; ++kw) {
                const int64_t c = (o / Og) * Cg + cg;
                const int64_t ih = oh * g.stride[0] - g.padding[0] + kh * g.dilation[0];
                const int64_t iw = ow * g.stride[1] - g.padding[1] + kw * g.dilation[1];
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                f(((n * C + c) * H + ih) * W + iw, ((o * Cg + cg) * KH + kh) * KW + kw,
                  ((n * O + o) * OH + oh) * OW + ow);
              }
  return {N, O, OH, OW};
}

Tensor ref_conv(const Tensor& x, const Tensor& w, const Geo& g) {
  auto xv = to_doubles(x), wv = to_doubles(w);
  std::vector<int64_t> ys = conv_taps(x.sizes(), w.sizes(), g, [](int64_t, int64_t, int64_t) {});
  std::vector<double> y(numel_of(ys), 0.0);
  conv_taps(x.sizes(), w.sizes(), g,
            [&](int64_t xi, int64_t wi, int64_t yi) { y[yi] += xv[xi] * wv[wi]; });
  return from_vector<double>(y, ys);
}

// The transposed convolution: the adjoint of the plain convolution from its output (N, O, OH,
// OW) to x (N, C, H, W), w (C, O / groups, KH, KW).
Tensor ref_conv_transpose(const Tensor& x, const Tensor& w, const Geo& g,
                          IntArrayRef output_padding) {
  auto xv = to_doubles(x), wv = to_doubles(w);
  std::vector<int64_t> zs{x.size(0), w.size(1) * g.groups};
  for (int d = 0; d < 2; ++d)
    zs.push_back((x.size(d + 2) - 1) * g.stride[d] - 2 * g.padding[d] +
                 g.dilation[d] * (w.size(d + 2) - 1) + output_padding[d] + 1);
  std::vector<double> z(numel_of(zs), 0.0);
  conv_taps(zs, w.sizes(), g,
            [&](int64_t zi, int64_t wi, int64_t xi) { z[zi] += xv[xi] * wv[wi]; });
  return from_vector<double>(z, zs);
}

// Gradients of sum(conv(x, w) * gy) for x and w.
std::pair<Tensor, Tensor> ref_conv_grads(const Tensor& x, const Tensor& w, const Tensor& gy,
                                         const Geo& g) {
  auto xv = to_doubles(x), wv = to_doubles(w), gv = to_doubles(gy);
  std::vector<double> gx(x.numel(), 0.0), gw(w.numel(), 0.0);
  conv_taps(x.sizes(), w.sizes(), g, [&](int64_t xi, int64_t wi, int64_t yi) {
    gx[xi] += gv[yi] * wv[wi];
    gw[wi] += gv[yi] * xv[xi];
  });
  return {from_vector<double>(gx, x.sizes()), from_vector<double>(gw, w.sizes())};
}

// Tolerance for sums of k products of values in [-2, 2] in dtype dt.
void expect_conv_close(const Tensor& got, const Tensor& want, ScalarType dt, int64_t k) {
  EXPECT_EQ(got.dtype(), dt);
  const double kk = static_cast<double>(std::max<int64_t>(k, 1));
  if (dt == kFloat64) return expect_close(got, want, 1e-12, 1e-12 * kk);
  if (dt == kFloat32) return expect_close(got, want, 1e-5, 4e-6 * kk);
  expect_close(got, want, rtol_for(dt), 4e-3 * std::sqrt(kk));
}

struct Case {
  std::vector<int64_t> x, w;
  Geo g;
};
const std::vector<Case> kCases = {
    {{2, 3, 7, 6}, {5, 3, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 1}},
    {{1, 4, 9, 8}, {6, 2, 3, 2}, {{2, 3}, {1, 0}, {2, 1}, 2}},
    {{3, 6, 5, 5}, {6, 1, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, 6}},
    {{2, 1, 2, 3}, {2, 1, 4, 4}, {{1, 1}, {1, 1}, {1, 1}, 1}},  // kernel == padded input
};

TEST(Conv2d, EveryDtypeAgainstReference) {
  for (ScalarType dt : dtypes_of_set("floating"))
    for (const Case& c : kCases) {
      SCOPED_TRACE(scalar_type_name(dt));
      Tensor x = random(c.x, dt), w = random(c.w, dt, -2, 2, 99);
      Tensor y = conv2d(x, w, std::nullopt, c.g.stride, c.g.padding, c.g.dilation, c.g.groups);
      expect_conv_close(y, ref_conv(x, w, c.g), dt, c.w[1] * c.w[2] * c.w[3]);
    }
}

TEST(Conv2d, NonContiguousAndBias) {
  const Case& c = kCases[1];
  Tensor x = non_contiguous(random(c.x)), w = non_contiguous(random(c.w, kFloat32, -2, 2, 5));
  Tensor b = random({c.w[0]}, kFloat32, -1, 1, 6);
  Tensor y = conv2d(x, w, b, c.g.stride, c.g.padding, c.g.dilation, c.g.groups);
  Tensor want = ref_conv(x, w, c.g) + b.to(kFloat64).view({1, -1, 1, 1});
  expect_conv_close(y, want, kFloat32, 12);
  // An unbatched (C, H, W) input gives an unbatched output.
  Tensor y3 = conv2d(x.select(0, 0), w, b, c.g.stride, c.g.padding, c.g.dilation, c.g.groups);
  expect_close(y3, y.select(0, 0), 1e-6, 1e-6);
}

TEST(Conv2d, GradientsAgainstReference) {
  for (ScalarType dt : {kFloat32, kFloat64, kBFloat16})
    for (const Case& c : kCases) {
      SCOPED_TRACE(scalar_type_name(dt));
      Tensor x = random(c.x, dt).requires_grad_(), w = random(c.w, dt, -2, 2, 7).requires_grad_();
      Tensor b = random({c.w[0]}, dt, -1, 1, 8).requires_grad_();
      Tensor y = conv2d(x, w, b, c.g.stride, c.g.padding, c.g.dilation, c.g.groups);
      Tensor gy = random(y.sizes(), dt, -1, 1, 9);
      (y * gy).sum().backward();
      auto [gx, gw] = ref_conv_grads(x.detach(), w.detach(), gy, c.g);
      const int64_t k = c.w[0] / c.g.groups * c.w[2] * c.w[3];
      expect_conv_close(x.grad(), gx, dt, k);
      expect_conv_close(w.grad(), gw, dt, c.x[0] * y.size(2) * y.size(3));
      expect_conv_close(b.grad(), gy.to(kFloat64).sum({0, 2, 3}), dt, gy.numel());
    }
}

TEST(Conv2d, SamePaddingEvenKernelPadsTheExtraAtTheEnd) {
  // Total padding (1, 3) is odd along both dims: PyTorch pads (0, 1) and (1, 2).
  Tensor x = random({2, 3, 6, 7}), w = random({4, 3, 2, 4}, kFloat32, -2, 2, 3);
  Tensor y = conv2d(x, w, std::nullopt, {1, 1}, "same");
  ASSERT_EQ(y.sizes(), IntArrayRef({2, 4, 6, 7}));
  Tensor padded = kiln::zeros({2, 3, 7, 10});
  padded.narrow(2, 0, 6).narrow(3, 1, 7).copy_(x);
  expect_conv_close(y, ref_conv(padded, w, Geo{}), kFloat32, 24);
  Tensor v = conv2d(x, w, std::nullopt, {1, 1}, "valid");
  expect_conv_close(v, ref_conv(x, w, Geo{}), kFloat32, 24);
}

TEST(Conv1d, AgainstReference) {
  for (ScalarType dt : {kFloat32, kFloat64, kBFloat16}) {
    Tensor x = random({2, 4, 11}, dt), w = random({6, 2, 3}, dt, -2, 2, 4);
    Tensor y = conv1d(x, w, std::nullopt, {2}, {2}, {3}, 2);
    Geo g{{1, 2}, {0, 2}, {1, 3}, 2};
    expect_conv_close(
        y, ref_conv(x.unsqueeze(2), w.unsqueeze(2), g).squeeze(std::vector<int64_t>{2}), dt, 6);
  }
  Tensor x = random({2, 3, 9}), w = random({4, 3, 4}, kFloat32, -2, 2, 2);
  EXPECT_EQ(conv1d(x, w, std::nullopt, {1}, "same").sizes(), IntArrayRef({2, 4, 9}));
}

TEST(ConvTranspose2d, ForwardAndGradientsAgainstReference) {
  for (ScalarType dt : {kFloat32, kFloat64, kBFloat16}) {
    SCOPED_TRACE(scalar_type_name(dt));
    Geo g{{2, 3}, {1, 0}, {1, 2}, 2};
    Tensor x = random({2, 4, 3, 4}, dt).requires_grad_();
    Tensor w = random({4, 3, 3, 2}, dt, -2, 2, 11).requires_grad_();
    Tensor y =
        conv_transpose2d(x, w, std::nullopt, g.stride, g.padding, {1, 2}, g.groups, g.dilation);
    Tensor want = ref_conv_transpose(x.detach(), w.detach(), g, {1, 2});
    expect_conv_close(y, want, dt, 12);
    Tensor gy = random(y.sizes(), dt, -1, 1, 12);
    (y * gy).sum().backward();
    // y = T(x) is the adjoint of the plain convolution P from y's shape: dx = P(gy), and dw is
    // P's weight gradient with the roles of input and output gradient swapped.
    auto [unused, gw] = ref_conv_grads(gy, w.detach(), x.detach(), g);
    expect_conv_close(x.grad(), ref_conv(gy, w.detach(), g), dt, 18);
    expect_conv_close(w.grad(), gw, dt, 2 * 12);
  }
}

TEST(Conv, LowPrecisionAccumulatesInFloat32) {
  // 576 = 64 * 3 * 3 and 1024 are exact in bfloat16, but a bfloat16 running sum stops at 256.
  Tensor x = kiln::ones({1, 64, 8, 8}, kBFloat16), w = kiln::ones({1, 64, 3, 3}, kBFloat16);
  EXPECT_EQ(to_doubles(conv2d(x, w, std::nullopt, {1, 1}, {1, 1}))[3 * 8 + 3], 576.0);
  Tensor xs = kiln::ones({4, 1, 16, 16}, kBFloat16).requires_grad_();
  Tensor w1 = kiln::ones({1, 1, 1, 1}, kBFloat16).requires_grad_();
  conv2d(xs, w1).sum().backward();
  EXPECT_EQ(to_doubles(w1.grad())[0], 1024.0);
  Tensor a = kiln::ones({2, 4096}, kBFloat16), b = kiln::ones({4096, 3}, kBFloat16);
  EXPECT_EQ(to_doubles(kiln::mm(a, b))[0], 4096.0);
  EXPECT_EQ(to_doubles(kiln::matmul(a.unsqueeze(0), b))[5], 4096.0);
}

TEST(Conv, ZeroSizes) {
  Tensor x = random({0, 3, 5, 5}).requires_grad_(), w = random({4, 3, 3, 3}).requires_grad_();
  Tensor y = conv2d(x, w, std::nullopt, {1, 1}, {1, 1});
  EXPECT_EQ(y.sizes(), IntArrayRef({0, 4, 5, 5}));
  y.sum().backward();
  EXPECT_EQ(x.grad().sizes(), x.sizes());
  EXPECT_EQ(to_doubles(w.grad()), std::vector<double>(w.numel(), 0.0));
  // No input channels: every output is 0.
  Tensor y0 = conv2d(random({2, 0, 4, 4}), random({3, 0, 2, 2}));
  EXPECT_EQ(y0.sizes(), IntArrayRef({2, 3, 3, 3}));
  EXPECT_EQ(to_doubles(y0), std::vector<double>(y0.numel(), 0.0));
}

TEST(Conv, BadInputNamesTheShapes) {
  Tensor x = random({1, 3, 8, 8});
  expect_error(ErrorKind::Value,
               "conv2d: Given groups=1, weight of size [8, 4, 3, 3], expected "
               "input[1, 3, 8, 8] to have 4 channels, but got 3 channels",
               [&] {
                 conv2d(x, random({8, 4, 3, 3}));
               });
  expect_error(ErrorKind::Value,
               "Calculated padded input size per channel: (10 x 10). Kernel "
               "size: (11 x 11). Kernel size can't be greater",
               [&] {
                 conv2d(x, random({2, 3, 11, 11}), std::nullopt, {1, 1}, {1, 1});
               });
  expect_error(ErrorKind::Value, "conv2d: expected bias of size [2]", [&] {
    conv2d(x, random({2, 3, 3, 3}), random({3}));
  });
  expect_error(ErrorKind::Value, "padding='same' is not supported for strided convolutions", [&] {
    conv2d(x, random({2, 3, 3, 3}), std::nullopt, {2, 2}, "same");
  });
  expect_error(ErrorKind::Value, "invalid padding string 'full'", [&] {
    conv2d(x, random({2, 3, 3, 3}), std::nullopt, {1, 1}, "full");
  });
  expect_error(ErrorKind::Value, "conv2d: expected 3-D (unbatched) or 4-D (batched) input", [&] {
    conv2d(random({3, 8}), random({2, 3, 3, 3}));
  });
  expect_error(ErrorKind::Type, "conv2d: expected input and weight to have the same dtype", [&] {
    conv2d(x, random({2, 3, 3, 3}, kFloat64));
  });
  expect_error(ErrorKind::Value, "expected weight to be divisible by 2 at dimension 0", [&] {
    conv2d(random({1, 4, 5, 5}), random({3, 2, 3, 3}), std::nullopt, {1, 1},
           std::vector<int64_t>{0, 0}, {1, 1}, 2);
  });
  expect_error(ErrorKind::Value,
               "conv_transpose2d: Given transposed=1, weight of size [4, 2, 3, "
               "3], expected input[1, 3, 8, 8] to have 4 channels",
               [&] {
                 conv_transpose2d(x, random({4, 2, 3, 3}));
               });
  expect_error(ErrorKind::Value, "output padding must be non-negative and smaller than stride",
               [&] {
                 conv_transpose2d(x, random({3, 2, 3, 3}), std::nullopt, {1, 1}, {0, 0}, {1, 1});
               });
  expect_error(ErrorKind::Value, "convolution_backward_weight: expected grad_output of size", [&] {
    convolution_backward_weight(random({1, 2, 7, 7}), x, {2, 3, 3, 3}, {1, 1}, {0, 0}, {1, 1}, 1);
  });
}

// Per-example weight gradients of a conv-pool-linear loss: vmap(grad) against a loop, with no
// op taking the per-example fallback.
TEST(Conv, PerExampleGradientsUnderVmap) {
  auto loss = [](const std::vector<Tensor>& p) {  // p: w (4, 2, 3, 3), x (2, 6, 6)
    Tensor h = relu(conv2d(p[1], p[0], std::nullopt, {1, 1}, {1, 1}));
    Tensor pooled = max_pool2d(h, {2, 2}) + avg_pool2d(h, {2, 2}) + adaptive_avg_pool2d(h, {3, 3});
    return (pooled * pooled).sum();
  };
  Tensor w = random({4, 2, 3, 3}, kFloat64, -1, 1, 21), xs = random({3, 2, 6, 6}, kFloat64);
  func::clear_vmap_fallback_ops();
  Tensor per = func::vmap(func::grad(loss, 0), {std::nullopt, 0})({w, xs});
  EXPECT_TRUE(func::vmap_fallback_ops().empty()) << func::vmap_fallback_ops()[0];
  ASSERT_EQ(per.sizes(), IntArrayRef({3, 4, 2, 3, 3}));
  for (int64_t b = 0; b < 3; ++b)
    expect_close(per.select(0, b), func::grad(loss, 0)({w, xs.select(0, b)}), 1e-10, 1e-10);
}

TEST(Conv, SecondDerivatives) {
  auto conv = [](const std::vector<Tensor>& t) {
    return std::vector<Tensor>{conv2d(t[0], t[1], t[2], {2, 1}, {1, 0}, {1, 2}, 2)};
  };
  EXPECT_TRUE(gradgradcheck(conv, {random({1, 4, 5, 5}, kFloat64), random({2, 2, 2, 2}, kFloat64),
                                   random({2}, kFloat64)}));
  auto convt = [](const std::vector<Tensor>& t) {
    return std::vector<Tensor>{conv_transpose2d(t[0], t[1], std::nullopt, {2, 2}, {1, 0}, {1, 1})};
  };
  EXPECT_TRUE(
      gradgradcheck(convt, {random({1, 2, 3, 3}, kFloat64), random({2, 3, 2, 2}, kFloat64)}));
}

// ---- golden values from PyTorch (tests/golden/conv_golden_gen.cpp) ------------------------------

// tests/golden/conv_golden.bin as tensors.
std::map<std::string, Tensor> read_golden(const std::string& name) {
  std::map<std::string, Tensor> out;
  for (const auto& [key, g] : testing::read_golden_file(name))
    out[key] = from_vector<double>(g.values, g.sizes);
  return out;
}

// fill(i, a, b) = sin(i * a + b) * scale at flat index i, as the generator makes its inputs.
Tensor fill(std::vector<int64_t> shape, double a, double b, double scale = 1.0) {
  std::vector<double> v(numel_of(shape));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(static_cast<double>(i) * a + b) * scale;
  return from_vector<double>(v, shape).requires_grad_();
}

TEST(ConvGolden, MatchesPyTorch) {
  auto golden = read_golden("conv_golden.bin");
  ASSERT_EQ(golden.size(), 18u) << "tests/golden/conv_golden.bin missing or incomplete";
  auto check = [&](const std::string& name, const Tensor& y,
                   std::vector<std::pair<std::string, Tensor>> inputs) {
    SCOPED_TRACE(name);
    (y * fill(y.sizes().vec(), 0.53, 0.2).detach()).sum().backward();
    expect_close(y, golden.at(name + ".y"), 1e-10, 1e-12);
    for (auto& [n, t] : inputs)
      expect_close(t.grad(), golden.at(name + "." + n + ".grad"), 1e-10, 1e-12);
  };
  {
    Tensor x = fill({2, 4, 7, 6}, .37, .1), w = fill({6, 2, 3, 2}, .23, .5, .3),
           b = fill({6}, .71, 0, .1);
    check("conv2d", conv2d(x, w, b, {2, 1}, {1, 1}, {1, 2}, 2), {{"x", x}, {"w", w}, {"b", b}});
  }
  {
    Tensor x = fill({2, 3, 9}, .37, .1), w = fill({4, 3, 4}, .23, .5, .3),
           b = fill({4}, .71, 0, .1);
    check("conv1d", conv1d(x, w, b, {1}, "same"), {{"x", x}, {"w", w}, {"b", b}});
  }
  {
    Tensor x = fill({2, 4, 3, 4}, .37, .1), w = fill({4, 3, 3, 3}, .23, .5, .3),
           b = fill({6}, .71, 0, .1);
    check("convt2d", conv_transpose2d(x, w, b, {2}, {1, 0}, {1}, 2),
          {{"x", x}, {"w", w}, {"b", b}});
  }
  {
    Tensor x = fill({2, 3, 7, 6}, .37, .1);
    check("maxpool", max_pool2d(x, {3, 2}, {2}, {1}, {1}, true), {{"x", x}});
  }
  {
    Tensor x = fill({2, 3, 7, 6}, .37, .1);
    check("avgpool", avg_pool2d(x, {3}, {2}, {1}, true, false), {{"x", x}});
  }
  {
    Tensor x = fill({2, 3, 7, 5}, .37, .1);
    check("adaptive", adaptive_avg_pool2d(x, {3, 2}), {{"x", x}});
  }
}

}  // namespace
}  // namespace kiln::testing
