// The int8 quantization rows (tensor/ops/quantized.toml, Note [Quantization scheme] there)
// against naive references in double: quantize/dequantize (ties to even, clamping, NaN), the
// per-channel weight quantizer, linear_int8 / conv2d_int8 against the float computation on the
// dequantized operands (within 1 LSB), linear_int8_dynamic, the fake-quantize rows and their
// straight-through gradients; non-contiguous inputs, zero sizes and bad input; golden values from
// PyTorch's quantized ops (tests/golden/quantized_golden.bin, make_quantized_golden.py).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "golden/golden_file.h"
#include "kiln/autograd/autograd.h"
#include "kiln/kiln.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

using Dims = std::vector<int64_t>;

double q_ref(double v, double scale, double zp, double lo, double hi) {
  if (std::isnan(v)) return lo;
  return std::clamp(std::nearbyint(v / scale) + zp, lo, hi);  // ties to even
}

// Asserts every code of got is within `lsb` of the reference want (both integer tensors).
void expect_codes(const Tensor& got, const std::vector<double>& want, double lsb = 1) {
  std::vector<double> g = to_doubles(got);
  ASSERT_EQ(g.size(), want.size());
  int64_t off = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_LE(std::fabs(g[i] - want[i]), lsb)
        << "element " << i << ": " << g[i] << " vs " << want[i];
    off += g[i] != want[i];
  }
  // Off-by-one codes come only from float rounding near a tie: a handful, never most of them.
  EXPECT_LE(off, static_cast<int64_t>(g.size() / 20 + 1));
}

TEST(QuantizedTest, QuantizePerTensorRoundsHalfToEvenAndClamps) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = from_vector<float>({0.5f, 1.5f, 2.5f, -0.5f, -1.5f, 0.26f, 1e9f, -1e9f, nan, 0}, {10});
  Tensor q = quantize_per_tensor(x, 1.0, 10);
  EXPECT_EQ(q.dtype(), kUInt8);
  EXPECT_EQ(to_doubles(q), (std::vector<double>{10, 12, 12, 10, 8, 10, 255, 0, 0, 10}));
  // Random values, non-contiguous, float64 input.
  Tensor r = random({7, 9}, kFloat32, -3, 3);
  for (const Tensor& in : {r, non_contiguous(r), r.to(kFloat64)}) {
    std::vector<double> want;
    for (double v : to_doubles(in))
      want.push_back(q_ref(static_cast<float>(v), 0.02f, 100, 0, 255));
    expect_codes(quantize_per_tensor(in, 0.02, 100), want, 0);
  }
  EXPECT_EQ(quantize_per_tensor(random({0, 3}), 0.1, 0).sizes(), IntArrayRef(Dims{0, 3}));
}

TEST(QuantizedTest, DequantizeInvertsQuantize) {
  Tensor q = random({5, 6}, kUInt8, 0, 256);
  for (const Tensor& in : {q, non_contiguous(q)}) {
    Tensor x = dequantize_per_tensor(in, 0.25, 7);
    EXPECT_EQ(x.dtype(), kFloat32);
    std::vector<double> want;
    for (double v : to_doubles(in)) want.push_back((v - 7) * 0.25);
    EXPECT_EQ(to_doubles(x), want);
    EXPECT_EQ(to_doubles(quantize_per_tensor(x, 0.25, 7)), to_doubles(in));
  }
  EXPECT_EQ(dequantize_per_tensor(random({2, 0}, kUInt8, 0, 256), 1.0, 0).numel(), 0);
}

TEST(QuantizedTest, QuantizeWeightPerChannel) {
  Tensor w = random({4, 3, 2}, kFloat32, -1, 1);
  w.select(0, 2).zero_();  // a channel of zeros gets scale 1 and codes 0
  for (int64_t axis : {0, 1, -1}) {
    Tensor in = axis == 0 ? non_contiguous(w) : w;
    auto [q, s] = quantize_weight_per_channel(in, axis);
    const int64_t a = axis < 0 ? axis + 3 : axis;
    ASSERT_EQ(q.dtype(), kInt8);
    ASSERT_EQ(s.sizes(), IntArrayRef(Dims{w.size(a)}));
    Tensor wt = w.transpose(0, a).contiguous(), qt = q.transpose(0, a).contiguous();
    auto wv = to_doubles(wt), qv = to_doubles(qt), sv = to_doubles(s);
    const int64_t C = w.size(a), R = w.numel() / C;
    for (int64_t c = 0; c < C; ++c) {
      double m = 0;
      for (int64_t i = 0; i < R; ++i) m = std::max(m, std::fabs(wv[c * R + i]));
      const double want_s = m > 0 ? static_cast<float>(static_cast<float>(m) / 127.0f) : 1.0;
      EXPECT_EQ(sv[c], want_s) << "channel " << c;
      for (int64_t i = 0; i < R; ++i)
        EXPECT_EQ(qv[c * R + i], q_ref(static_cast<float>(wv[c * R + i]),
                                       static_cast<float>(want_s), 0, -127, 127));
    }
  }
  auto [q0, s0] = quantize_weight_per_channel(random({0, 5}), 0);
  EXPECT_EQ(s0.numel(), 0);
}

// The float reference of the int8 rows: real values of x (codes, scale, zp) and w (codes,
// per-channel scales).
Tensor real_x(const Tensor& q, double s, int64_t zp) { return (q.to(kFloat64) - double(zp)) * s; }
Tensor real_w(const Tensor& q, const Tensor& s) {
  Dims shape(q.dim(), 1);
  shape[0] = q.size(0);
  return q.to(kFloat64) * s.to(kFloat64).reshape(shape);
}
std::vector<double> quantize_ref(const Tensor& y, double s, int64_t zp) {
  std::vector<double> out;
  for (double v : to_doubles(y)) out.push_back(q_ref(v, s, zp, 0, 255));
  return out;
}

TEST(QuantizedTest, LinearInt8MatchesTheFloatComputation) {
  struct Case {
    Dims x;
    int64_t n;
    bool bias, relu, transposed;
  };
  for (const Case& c :
       {Case{{5, 8}, 6, true, false, false}, Case{{1, 37}, 13, true, true, false},
        Case{{2, 3, 16}, 4, false, true, false}, Case{{64, 33}, 70, true, false, true},
        Case{{9, 256}, 31, true, true, false}}) {
    const int64_t K = c.x.back();
    Tensor qx = random(c.x, kUInt8, 0, 256, 11);
    if (c.transposed) qx = random({c.x[1], c.x[0]}, kUInt8, 0, 256, 11).transpose(0, 1);
    Tensor qw = random({c.n, K}, kInt8, -127, 128, 12);
    Tensor ws = random({c.n}, kFloat32, 0.002, 0.01, 13);
    std::optional<Tensor> b;
    if (c.bias) b = random({c.n}, kFloat32, -1, 1, 14);
    const double sx = 0.03, sy = 0.05;
    const int64_t zx = 117, zy = 90;
    Tensor y = matmul(real_x(qx, sx, zx), real_w(qw, ws).transpose(0, 1));
    if (b) y = y + b->to(kFloat64);
    if (c.relu) y = relu(y);
    Tensor got = linear_int8(qx, sx, zx, qw, ws, b, sy, zy, c.relu);
    SCOPED_TRACE("input " + std::to_string(qx.dim()) + "-d, K=" + std::to_string(K));
    EXPECT_EQ(got.dtype(), kUInt8);
    Dims out = c.x;
    out.back() = c.n;
    EXPECT_EQ(got.sizes(), IntArrayRef(out));
    expect_codes(got, quantize_ref(y, sy, zy));
  }
}

TEST(QuantizedTest, Conv2dInt8MatchesTheFloatComputation) {
  struct Case {
    Dims x, w, stride, padding, dilation;
    int64_t groups;
    bool bias, relu;
  };
  for (const Case& c :
       {Case{{2, 4, 7, 6}, {6, 2, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 2, true, false},
        Case{{1, 3, 9, 8}, {8, 3, 3, 2}, {2, 1}, {0, 1}, {1, 2}, 1, true, true},
        Case{{3, 1, 5, 5}, {4, 1, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 1, false, true},
        Case{{1, 16, 6, 6}, {16, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 16, true, false}}) {
    Tensor qx = random(c.x, kUInt8, 0, 256, 21);
    Tensor qw = random(c.w, kInt8, -127, 128, 22);
    Tensor ws = random({c.w[0]}, kFloat32, 0.002, 0.01, 23);
    std::optional<Tensor> b;
    if (c.bias) b = random({c.w[0]}, kFloat32, -1, 1, 24);
    const double sx = 0.02, sy = 0.04;
    const int64_t zx = 128, zy = 64;
    Tensor y = conv2d(real_x(qx, sx, zx), real_w(qw, ws),
                      b ? std::optional<Tensor>(b->to(kFloat64)) : std::nullopt, c.stride,
                      c.padding, c.dilation, c.groups);
    if (c.relu) y = relu(y);
    for (const Tensor& in : {qx, non_contiguous(qx)}) {
      Tensor got = conv2d_int8(in, sx, zx, qw, ws, b, c.stride, c.padding, c.dilation, c.groups, sy,
                               zy, c.relu);
      EXPECT_EQ(got.sizes(), y.sizes());
      expect_codes(got, quantize_ref(y, sy, zy));
    }
  }
}

TEST(QuantizedTest, LinearInt8Dynamic) {
  for (bool relu : {false, true}) {
    Tensor x = random({2, 7, 40}, kFloat32, -3, 2, 31);
    Tensor w = random({12, 40}, kFloat32, -0.5, 0.5, 32);
    Tensor b = random({12}, kFloat32, -1, 1, 33);
    auto [qw, ws] = quantize_weight_per_channel(w, 0);
    for (const Tensor& in : {x, non_contiguous(x)}) {
      Tensor got = linear_int8_dynamic(in, qw, ws, b, relu);
      EXPECT_EQ(got.dtype(), kFloat32);
      // The reference quantizes x as the kernel does (range widened to 0, per tensor).
      double lo = 0, hi = 0;
      for (double v : to_doubles(x)) lo = std::min(lo, v), hi = std::max(hi, v);
      const float sx = static_cast<float>((hi - lo) / 255.0f);
      const int64_t zx = static_cast<int64_t>(std::nearbyint(-lo / sx));
      Tensor qx = quantize_per_tensor(x, sx, zx);
      Tensor y = matmul(real_x(qx, sx, zx), real_w(qw, ws).transpose(0, 1)) + b.to(kFloat64);
      if (relu) y = kiln::relu(y);
      expect_close(got, y.to(kFloat32), 1e-4, 1e-4);
      // And the float linear it approximates: within the quantization error.
      Tensor yf = matmul(x, w.transpose(0, 1)) + b;
      if (relu) yf = kiln::relu(yf);
      expect_close(got, yf, 0, 0.1);
    }
  }
}

TEST(QuantizedTest, ZeroSizes) {
  Tensor qw = random({3, 4}, kInt8, -127, 128), ws = random({3}, kFloat32, 0.01, 0.02);
  Tensor b = from_vector<float>({0.5f, -0.5f, 1.0f}, {3});
  EXPECT_EQ(linear_int8(random({0, 4}, kUInt8, 0, 256), 0.1, 0, qw, ws, b, 0.1, 0).sizes(),
            IntArrayRef(Dims{0, 3}));
  EXPECT_EQ(linear_int8_dynamic(random({0, 4}), qw, ws, b).sizes(), IntArrayRef(Dims{0, 3}));
  // K = 0: the output is the bias alone.
  Tensor q0 = random({2, 0}, kUInt8, 0, 256), w0 = random({3, 0}, kInt8, 0, 1);
  EXPECT_EQ(to_doubles(linear_int8(q0, 0.1, 0, w0, ws, b, 0.5, 10, true)),
            (std::vector<double>{11, 10, 12, 11, 10, 12}));
  EXPECT_EQ(to_doubles(linear_int8_dynamic(random({2, 0}), w0, ws, b)),
            (std::vector<double>{0.5, -0.5, 1, 0.5, -0.5, 1}));
  Tensor cw = random({3, 2, 2, 2}, kInt8, -127, 128);
  EXPECT_EQ(conv2d_int8(random({0, 2, 4, 4}, kUInt8, 0, 256), 0.1, 0, cw, ws, b, {1, 1}, {0, 0},
                        {1, 1}, 1, 0.1, 0)
                .sizes(),
            IntArrayRef(Dims{0, 3, 3, 3}));
}

TEST(QuantizedTest, BadInputNamesTheArgument) {
  Tensor x = random({2, 4}), q = random({2, 4}, kUInt8, 0, 256);
  Tensor qw = random({3, 4}, kInt8, -127, 128), ws = random({3}, kFloat32, 0.01, 0.02);
  const double nan = std::nan("");
  expect_error(ErrorKind::Value, "scale", [&] { quantize_per_tensor(x, 0.0, 0); });
  expect_error(ErrorKind::Value, "scale", [&] { quantize_per_tensor(x, nan, 0); });
  expect_error(ErrorKind::Value, "scale", [&] { quantize_per_tensor(x, -1.0, 0); });
  expect_error(ErrorKind::Value, "zero_point", [&] { quantize_per_tensor(x, 1.0, 256); });
  expect_error(ErrorKind::Type, "input", [&] { quantize_per_tensor(q, 1.0, 0); });
  expect_error(ErrorKind::Type, "input", [&] { dequantize_per_tensor(x, 1.0, 0); });
  expect_error(ErrorKind::Value, "zero_point", [&] { dequantize_per_tensor(q, 1.0, -1); });
  expect_error(ErrorKind::Type, "weight", [&] { quantize_weight_per_channel(q, 0); });
  expect_error(ErrorKind::Index, "", [&] { quantize_weight_per_channel(x, 2); });
  expect_error(ErrorKind::Type, "input", [&] { linear_int8(x, 0.1, 0, qw, ws, {}, 0.1, 0); });
  expect_error(ErrorKind::Type, "weight", [&] { linear_int8(q, 0.1, 0, x, ws, {}, 0.1, 0); });
  expect_error(ErrorKind::Value, "weight_scale of size [3]",
               [&] { linear_int8(q, 0.1, 0, qw, random({4}), {}, 0.1, 0); });
  expect_error(ErrorKind::Type, "weight_scale",
               [&] { linear_int8(q, 0.1, 0, qw, ws.to(kFloat64), {}, 0.1, 0); });
  expect_error(ErrorKind::Value, "bias of size [3]",
               [&] { linear_int8(q, 0.1, 0, qw, ws, random({2}), 0.1, 0); });
  expect_error(ErrorKind::Value, "input_scale",
               [&] { linear_int8(q, nan, 0, qw, ws, {}, 0.1, 0); });
  expect_error(ErrorKind::Value, "output_scale", [&] { linear_int8(q, 0.1, 0, qw, ws, {}, 0, 0); });
  expect_error(ErrorKind::Value, "input_zero_point",
               [&] { linear_int8(q, 0.1, 300, qw, ws, {}, 0.1, 0); });
  expect_error(ErrorKind::Value, "output_zero_point",
               [&] { linear_int8(q, 0.1, 0, qw, ws, {}, 0.1, -3); });
  expect_error(ErrorKind::Value, "input [*, 4]", [&] {
    linear_int8(random({2, 5}, kUInt8, 0, 256), 0.1, 0, qw, ws, {}, 0.1, 0);
  });
  expect_error(ErrorKind::Value, "weight_scale", [&] {
    linear_int8(q, 0.1, 0, qw, from_vector<float>({1, -1, 1}, {3}), {}, 0.1, 0);
  });
  expect_error(ErrorKind::Type, "input", [&] { linear_int8_dynamic(q, qw, ws, {}); });
  expect_error(ErrorKind::Value, "finite", [&] {
    linear_int8_dynamic(from_vector<float>({1, 2, INFINITY, 0}, {1, 4}), qw, ws, {});
  });
  Tensor cq = random({1, 4, 5, 5}, kUInt8, 0, 256), cw = random({2, 4, 3, 3}, kInt8, -127, 128);
  Tensor cs = random({2}, kFloat32, 0.01, 0.02);
  expect_error(ErrorKind::Value, "channels", [&] {
    conv2d_int8(cq, 0.1, 0, random({2, 3, 3, 3}, kInt8, -127, 128), cs, {}, {1, 1}, {0, 0}, {1, 1},
                1, 0.1, 0);
  });
  expect_error(ErrorKind::Value, "4-D", [&] {
    conv2d_int8(random({4, 5, 5}, kUInt8, 0, 256), 0.1, 0, cw, cs, {}, {1, 1}, {0, 0}, {1, 1}, 1,
                0.1, 0);
  });
  expect_error(ErrorKind::Value, "weight_scale", [&] {
    conv2d_int8(cq, 0.1, 0, cw, ws, {}, {1, 1}, {0, 0}, {1, 1}, 1, 0.1, 0);
  });
  expect_error(ErrorKind::Value, "quant_min",
               [&] { fake_quantize_per_tensor_affine(x, 0.1, 0, 10, 5); });
  expect_error(ErrorKind::Value, "zero_point",
               [&] { fake_quantize_per_tensor_affine(x, 0.1, 300, 0, 255); });
  expect_error(ErrorKind::Value, "scale[1]", [&] {
    fake_quantize_per_channel_affine(x, from_vector<float>({1, 0, 1, 1}, {4}),
                                     from_vector<int64_t>({0, 0, 0, 0}, {4}), 1, 0, 255);
  });
  expect_error(ErrorKind::Value, "scale of size [2]", [&] {
    fake_quantize_per_channel_affine(x, ws, from_vector<int64_t>({0, 0, 0}, {3}), 0, 0, 255);
  });
}

std::vector<double> fake_ref(const Tensor& x, double s, double zp, double lo, double hi) {
  std::vector<double> out;
  for (double v : to_doubles(x)) out.push_back((q_ref(v, s, zp, lo, hi) - zp) * s);
  return out;
}

TEST(QuantizedTest, FakeQuantizeForward) {
  for (ScalarType dt : {kFloat32, kFloat64}) {
    Tensor x = random({6, 5}, dt, -3, 3, 41);
    for (const Tensor& in : {x, non_contiguous(x)}) {
      Tensor got = fake_quantize_per_tensor_affine(in, 0.05, 10, 0, 255);
      EXPECT_EQ(got.dtype(), dt);
      expect_close(got, from_vector<double>(fake_ref(x, 0.05, 10, 0, 255), {6, 5}).to(dt), 1e-6,
                   1e-7);
    }
    Tensor s = from_vector<float>({0.1f, 0.02f, 0.05f, 0.2f, 0.01f}, {5});
    Tensor z = from_vector<int64_t>({0, 3, -5, 7, 0}, {5});
    Tensor got = fake_quantize_per_channel_affine(x, s, z, 1, -127, 127);
    std::vector<double> xv = to_doubles(x), want;
    for (int64_t i = 0; i < x.numel(); ++i) {
      const int64_t c = i % 5;
      const double sc = static_cast<float>(to_doubles(s)[c]), zc = to_doubles(z)[c];
      want.push_back((q_ref(xv[i], sc, zc, -127, 127) - zc) * sc);
    }
    expect_close(got, from_vector<double>(want, {6, 5}).to(dt), 1e-6, 1e-7);
    EXPECT_EQ(fake_quantize_per_tensor_affine(random({0, 2}, dt), 0.1, 0, 0, 255).numel(), 0);
  }
}

// Note [Straight-through gradients] (tests/autograd/manifest_gradcheck_test.cpp): the gradient
// of fake quantization is that of x clamped to the range whose codes are not clamped,
// [(qmin - zp - 1/2) s, (qmax - zp + 1/2) s]. Checked against that function's central finite
// differences in float64 (inputs kept away from the range's ends).
void expect_ste(const Tensor& x, const Tensor& grad, const Tensor& lo, const Tensor& hi) {
  auto xv = to_doubles(x), gv = to_doubles(grad), lv = to_doubles(lo), hv = to_doubles(hi);
  const double eps = 1e-6;
  int inside = 0, outside = 0;
  for (size_t i = 0; i < xv.size(); ++i) {
    auto f = [&](double v) { return std::clamp(v, lv[i], hv[i]); };
    const double fd = (f(xv[i] + eps) - f(xv[i] - eps)) / (2 * eps);
    EXPECT_NEAR(gv[i], fd, 1e-6) << "element " << i << " x=" << xv[i];
    (fd > 0.5 ? inside : outside)++;
  }
  EXPECT_GT(inside, 0);
  EXPECT_GT(outside, 0);
}

TEST(QuantizedTest, FakeQuantizePerTensorGradient) {
  Tensor x = random({8, 9}, kFloat64, -4, 4, 51).requires_grad_();
  const double s = 0.1;
  const int64_t zp = 5, qmin = -20, qmax = 30;  // real range [-2.55, 2.55]
  Tensor y = fake_quantize_per_tensor_affine(x, s, zp, qmin, qmax);
  Tensor g = random({8, 9}, kFloat64, 0.5, 1.5, 52);
  autograd::backward({(y * g).sum()});
  Tensor per_unit = x.grad() / g;
  expect_ste(x.detach(), per_unit, full({8, 9}, (qmin - zp - 0.5) * s, kFloat64),
             full({8, 9}, (qmax - zp + 0.5) * s, kFloat64));
}

TEST(QuantizedTest, FakeQuantizePerChannelGradient) {
  Tensor x = random({4, 3}, kFloat64, -6, 6, 61).requires_grad_();
  Tensor s = from_vector<double>({0.1, 0.02, 0.05}, {3});
  Tensor z = from_vector<int64_t>({0, 10, -3}, {3});
  Tensor y = fake_quantize_per_channel_affine(x, s, z, 1, -64, 63);
  autograd::backward({y.sum()});
  std::vector<double> lo, hi;
  for (int64_t i = 0; i < 12; ++i) {
    const int64_t c = i % 3;
    const double sc = to_doubles(s)[c], zc = to_doubles(z)[c];
    lo.push_back((-64 - zc - 0.5) * sc), hi.push_back((63 - zc + 0.5) * sc);
  }
  expect_ste(x.detach(), x.grad(), from_vector<double>(lo, {4, 3}),
             from_vector<double>(hi, {4, 3}));
}

Tensor golden_tensor(const std::map<std::string, Golden>& g, const std::string& name,
                     ScalarType dtype) {
  const Golden& v = g.at(name);
  return from_vector<double>(v.values, v.sizes).to(dtype);
}

TEST(QuantizedGolden, MatchesPyTorch) {
  auto g = read_golden_file("quantized_golden.bin");
  ASSERT_FALSE(g.empty());
  auto t = [&](const std::string& name, ScalarType dtype = kFloat32) {
    return golden_tensor(g, name, dtype);
  };
  EXPECT_EQ(to_doubles(quantize_per_tensor(t("quantize.x"), 0.05, 120)),
            g.at("quantize.codes").values);
  {
    Tensor x = t("fake.x").requires_grad_();
    Tensor y = fake_quantize_per_tensor_affine(x, 0.1, 10, 0, 63);
    autograd::backward({y.sum()});
    expect_close(y, t("fake.y"), 1e-6, 1e-6);
    EXPECT_EQ(to_doubles(x.grad()), g.at("fake.grad").values);
  }
  {
    Tensor x = t("fake_pc.x").requires_grad_();
    Tensor y = fake_quantize_per_channel_affine(x, t("fake_pc.scale"),
                                                t("fake_pc.zero_point", kInt32), 1, -64, 63);
    autograd::backward({y.sum()});
    expect_close(y, t("fake_pc.y"), 1e-6, 1e-6);
    EXPECT_EQ(to_doubles(x.grad()), g.at("fake_pc.grad").values);
  }
  for (bool relu : {false, true}) {
    Tensor y = linear_int8(t("linear.x", kUInt8), 0.03, 117, t("linear.w", kInt8),
                           t("linear.w_scale"), t("linear.b"), 0.05, 100, relu);
    expect_codes(y, g.at(relu ? "linear.y_relu" : "linear.y").values);
  }
  Tensor y = conv2d_int8(t("conv.x", kUInt8), 0.02, 128, t("conv.w", kInt8), t("conv.w_scale"),
                         t("conv.b"), {1, 1}, {1, 1}, {1, 1}, 2, 0.04, 64);
  expect_codes(y, g.at("conv.y").values);
}

}  // namespace
}  // namespace kiln::testing
