// max_pool2d (with indices), avg_pool2d, adaptive_avg_pool2d and their backward rows
// (tensor/ops/pool.toml) against naive loops in double: padding, stride, dilation, ceil mode,
// count_include_pad, divisor_override, NaN, non-contiguous, 3-D inputs, every floating dtype,
// zero batch and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kiln/autograd/autograd.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

struct Pool {
  int64_t kh, kw, sh, sw, ph, pw, dh = 1, dw = 1;
  bool ceil = false;
};

int64_t pooled(int64_t in, int64_t k, int64_t p, int64_t s, int64_t d, bool ceil) {
  const int64_t span = in + 2 * p - d * (k - 1) - 1;
  int64_t out = (ceil ? (span + s - 1) / s : span / s) + 1;
  if (ceil && (out - 1) * s >= in + p) --out;
  return out;
}

// Calls f(plane, out index, window positions) for every output of a 2-D pool over (P, H, W).
void windows(IntArrayRef xs, const Pool& p, int64_t oh_n, int64_t ow_n,
             const std::function<void(int64_t, int64_t, const std::vector<int64_t>&, int64_t)>& f) {
  const int64_t H = xs[xs.size() - 2], W = xs.back(), P = numel_of(xs) / (H * W);
  for (int64_t pl = 0; pl < P; ++pl)
    for (int64_t oh = 0; oh < oh_n; ++oh)
      for (int64_t ow = 0; ow < ow_n; ++ow) {
        std::vector<int64_t> at;  // in-bounds positions h * W + w
        int64_t padded = 0;       // avg_pool's count_include_pad divisor
        for (int64_t i = 0; i < p.kh; ++i)
          for (int64_t j = 0; j < p.kw; ++j) {
            const int64_t h = oh * p.sh - p.ph + i * p.dh, w = ow * p.sw - p.pw + j * p.dw;
            if (h < H + p.ph && w < W + p.pw) ++padded;
            if (h >= 0 && h < H && w >= 0 && w < W) at.push_back(h * W + w);
          }
        f(pl, (pl * oh_n + oh) * ow_n + ow, at, padded);
      }
}

std::vector<int64_t> out_sizes(IntArrayRef xs, int64_t oh, int64_t ow) {
  std::vector<int64_t> s = xs.vec();
  s[s.size() - 2] = oh;
  s.back() = ow;
  return s;
}

// (values, indices) of max_pool2d; a NaN wins.
std::pair<Tensor, Tensor> ref_max_pool(const Tensor& x, const Pool& p) {
  const int64_t H = x.size(-2), W = x.size(-1);
  const int64_t oh = pooled(H, p.kh, p.ph, p.sh, p.dh, p.ceil);
  const int64_t ow = pooled(W, p.kw, p.pw, p.sw, p.dw, p.ceil);
  auto xv = to_doubles(x);
  std::vector<double> y(numel_of(x.sizes()) / (H * W) * oh * ow);
  std::vector<int64_t> idx(y.size());
  windows(x.sizes(), p, oh, ow,
          [&](int64_t pl, int64_t o, const std::vector<int64_t>& at, int64_t) {
            int64_t best = at[0];
            for (int64_t a : at) {
              double v = xv[pl * H * W + a], b = xv[pl * H * W + best];
              if (v > b || std::isnan(v)) best = a;
            }
            y[o] = xv[pl * H * W + best];
            idx[o] = best;
          });
  return {from_vector<double>(y, out_sizes(x.sizes(), oh, ow)),
          from_vector<int64_t>(idx, out_sizes(x.sizes(), oh, ow))};
}

// avg_pool2d and the gradient of sum(avg_pool2d(x) * gy).
std::pair<Tensor, Tensor> ref_avg_pool(const Tensor& x, const Pool& p, bool include_pad,
                                       std::optional<int64_t> divisor, const Tensor* gy) {
  const int64_t H = x.size(-2), W = x.size(-1);
  const int64_t oh = pooled(H, p.kh, p.ph, p.sh, 1, p.ceil),
                ow = pooled(W, p.kw, p.pw, p.sw, 1, p.ceil);
  auto xv = to_doubles(x);
  std::vector<double> y(numel_of(x.sizes()) / (H * W) * oh * ow), gx(x.numel(), 0.0), gv;
  if (gy) gv = to_doubles(*gy);
  windows(x.sizes(), p, oh, ow,
          [&](int64_t pl, int64_t o, const std::vector<int64_t>& at, int64_t padded) {
            double s = 0;
            for (int64_t a : at) s += xv[pl * H * W + a];
            const double div = divisor ? *divisor : include_pad ? padded : at.size();
            y[o] = at.empty() ? 0.0 : s / div;
            if (gy)
              for (int64_t a : at) gx[pl * H * W + a] += gv[o] / div;
          });
  return {from_vector<double>(y, out_sizes(x.sizes(), oh, ow)), from_vector<double>(gx, x.sizes())};
}

const std::vector<Pool> kPools = {
    {2, 2, 2, 2, 0, 0},
    {3, 2, 2, 1, 1, 1, 1, 2, false},
    {3, 3, 2, 2, 1, 1, 1, 1, true},
    {2, 3, 3, 2, 1, 0, 2, 1, true},
};

TEST(MaxPool2d, EveryDtypeAgainstReference) {
  for (ScalarType dt : dtypes_of_set("floating"))
    for (const Pool& p : kPools) {
      SCOPED_TRACE(scalar_type_name(dt));
      Tensor x = random({2, 3, 7, 8}, dt);
      auto [y, idx] = max_pool2d_with_indices(x, {p.kh, p.kw}, {p.sh, p.sw}, {p.ph, p.pw},
                                              {p.dh, p.dw}, p.ceil);
      auto [want, want_idx] = ref_max_pool(x, p);
      expect_close(y, want, 0, 0);
      EXPECT_EQ(to_doubles(idx), to_doubles(want_idx));
      EXPECT_EQ(y.dtype(), dt);
    }
}

TEST(MaxPool2d, BackwardAndNonContiguousAndUnbatched) {
  for (ScalarType dt : {kFloat32, kFloat64, kBFloat16}) {
    const Pool& p = kPools[1];  // overlapping windows: gradients add up
    Tensor x = non_contiguous(random({3, 9, 7}, dt)).requires_grad_();
    Tensor y = max_pool2d(x, {3, 2}, {2, 1}, {1, 1}, {1, 2});
    Tensor gy = random(y.sizes(), dt, -1, 1, 3);
    (y * gy).sum().backward();
    auto [want, idx] = ref_max_pool(x.detach(), p);
    expect_close(y, want, 0, 0);
    std::vector<double> gx(x.numel(), 0.0);
    auto gv = to_doubles(gy), iv = to_doubles(idx);
    for (size_t o = 0; o < gv.size(); ++o) gx[o / (y.size(1) * y.size(2)) * 63 + iv[o]] += gv[o];
    expect_close(x.grad(), from_vector<double>(gx, x.sizes()), rtol_for(dt), 1e-6);
  }
}

TEST(MaxPool2d, NanWins) {
  Tensor x = from_vector<float>({1, std::nanf(""), 3, 2}, {1, 1, 2, 2});
  auto [y, idx] = max_pool2d_with_indices(x, {2, 2});
  EXPECT_TRUE(std::isnan(to_doubles(y)[0]));
  EXPECT_EQ(to_doubles(idx)[0], 1.0);
}

TEST(AvgPool2d, EveryDtypeAndModeAgainstReference) {
  for (ScalarType dt : dtypes_of_set("floating"))
    for (const Pool& p : kPools) {
      if (p.dh != 1 || p.dw != 1) continue;
      for (bool include_pad : {true, false})
        for (std::optional<int64_t> div : {std::optional<int64_t>(), std::optional<int64_t>(5)}) {
          SCOPED_TRACE(scalar_type_name(dt));
          Tensor x = random({2, 3, 7, 8}, dt);
          Tensor y =
              avg_pool2d(x, {p.kh, p.kw}, {p.sh, p.sw}, {p.ph, p.pw}, p.ceil, include_pad, div);
          expect_close(y, ref_avg_pool(x, p, include_pad, div, nullptr).first, rtol_for(dt), 1e-6);
        }
    }
}

TEST(AvgPool2d, BackwardAgainstReference) {
  for (ScalarType dt : {kFloat32, kFloat64, kBFloat16})
    for (bool include_pad : {true, false}) {
      const Pool& p = kPools[2];
      Tensor x = non_contiguous(random({2, 3, 7, 8}, dt)).requires_grad_();
      Tensor y = avg_pool2d(x, {3, 3}, {2, 2}, {1, 1}, true, include_pad);
      Tensor gy = random(y.sizes(), dt, -1, 1, 4);
      (y * gy).sum().backward();
      expect_close(x.grad(), ref_avg_pool(x.detach(), p, include_pad, std::nullopt, &gy).second,
                   rtol_for(dt), 1e-3);
    }
}

TEST(AdaptiveAvgPool2d, ForwardAndBackwardAgainstReference) {
  struct Case {
    std::vector<int64_t> x, out;
  };
  for (ScalarType dt : {kFloat32, kFloat64, kBFloat16})
    for (const Case& c :
         {Case{{2, 3, 7, 5}, {3, 2}}, Case{{3, 4, 4}, {1, 1}}, Case{{1, 2, 3, 3}, {5, 4}}}) {
      SCOPED_TRACE(scalar_type_name(dt));
      Tensor x = random(c.x, dt).requires_grad_();
      Tensor y = adaptive_avg_pool2d(x, c.out);
      Tensor gy = random(y.sizes(), dt, -1, 1, 5);
      (y * gy).sum().backward();
      // Window o along a dim of size n pooled to m: [floor(o n / m), ceil((o + 1) n / m)).
      const int64_t H = c.x[c.x.size() - 2], W = c.x.back(), OH = c.out[0], OW = c.out[1];
      auto xv = to_doubles(x.detach()), gv = to_doubles(gy);
      std::vector<double> want(y.numel()), gx(x.numel(), 0.0);
      for (int64_t pl = 0; pl < x.numel() / (H * W); ++pl)
        for (int64_t oh = 0; oh < OH; ++oh)
          for (int64_t ow = 0; ow < OW; ++ow) {
            int64_t h0 = oh * H / OH, h1 = ((oh + 1) * H + OH - 1) / OH;
            int64_t w0 = ow * W / OW, w1 = ((ow + 1) * W + OW - 1) / OW;
            double s = 0, n = static_cast<double>((h1 - h0) * (w1 - w0));
            const int64_t o = (pl * OH + oh) * OW + ow;
            for (int64_t h = h0; h < h1; ++h)
              for (int64_t w = w0; w < w1; ++w) {
                s += xv[pl * H * W + h * W + w];
                gx[pl * H * W + h * W + w] += gv[o] / n;
              }
            want[o] = s / n;
          }
      expect_close(y, from_vector<double>(want, y.sizes()), rtol_for(dt), 1e-6);
      expect_close(x.grad(), from_vector<double>(gx, x.sizes()), rtol_for(dt), 1e-6);
    }
}

TEST(Pool, ZeroBatch) {
  Tensor x = random({0, 3, 6, 6}).requires_grad_();
  Tensor y = max_pool2d(x, {2, 2}) + avg_pool2d(x, {2, 2}) + adaptive_avg_pool2d(x, {3, 3});
  EXPECT_EQ(y.sizes(), IntArrayRef({0, 3, 3, 3}));
  y.sum().backward();
  EXPECT_EQ(x.grad().sizes(), x.sizes());
}

TEST(Pool, BadInputNamesTheShapes) {
  Tensor x = random({1, 3, 4, 4});
  expect_error(ErrorKind::Value, "max_pool2d: pad should be at most half of effective kernel size",
               [&] {
                 max_pool2d(x, {2, 2}, {}, {2, 2});
               });
  expect_error(ErrorKind::Value,
               "Given input size: (3x4x4). Calculated output size: (3x0x0). "
               "Output size is too small",
               [&] {
                 max_pool2d(x, {5, 5}, {1, 1});
               });
  expect_error(ErrorKind::Value, "avg_pool2d: Expected 3D or 4D (batch mode) tensor", [&] {
    avg_pool2d(random({4, 4}), {2, 2});
  });
  expect_error(ErrorKind::Value, "avg_pool2d: divisor must be not zero", [&] {
    avg_pool2d(x, {2, 2}, {}, {0, 0}, false, true, 0);
  });
  expect_error(ErrorKind::Value, "adaptive_avg_pool2d: Expected 3D or 4D", [&] {
    adaptive_avg_pool2d(random({2, 3, 0, 4}), {2, 2});
  });
  expect_error(ErrorKind::Type, "max_pool2d: expected a floating-point input", [&] {
    max_pool2d(random({1, 2, 4, 4}, kInt64), {2, 2});
  });
  expect_error(ErrorKind::Index, "max_pool2d_backward: an index is out of range", [&] {
    max_pool2d_backward(random({1, 1, 1, 1}), from_vector<int64_t>({16}, {1, 1, 1, 1}),
                        {1, 1, 4, 4});
  });
}

}  // namespace
}  // namespace kiln::testing
