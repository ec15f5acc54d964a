// The fast paths of kernels/cpu that the training benchmarks run through, each against a naive
// loop: tiled transposing copies (Note [Transposing copies]), the contiguous where, and
// max_pool2d's windows that never leave the plane (2x2 stride 2, and the general unchecked loop).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "test_util.h"

namespace kiln::testing {
namespace {

// got (contiguous) holds view's elements in row-major order, bit for bit.
void expect_same_elements(const Tensor& got, const Tensor& view) {
  ASSERT_TRUE(got.is_contiguous());
  ASSERT_EQ(got.sizes(), view.sizes());
  const size_t es = view.element_size();
  const char* g = static_cast<const char*>(got.data_ptr());
  const char* s = static_cast<const char*>(view.data_ptr());
  int64_t bad = 0;
  for_each_index(view.sizes(), [&](const std::vector<int64_t>& idx) {
    int64_t off = 0;
    for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * view.stride(d);
    bad += std::memcmp(g + flat(view.sizes(), idx) * es, s + off * es, es) != 0;
  });
  EXPECT_EQ(bad, 0);
}

TEST(FastPaths, TransposingCopyEveryElementSize) {
  for (ScalarType dt : {kFloat32, kFloat64, kBFloat16, kInt8, kBool, kInt64}) {
    SCOPED_TRACE(scalar_type_name(dt));
    Tensor m = random({47, 33}, dt, -100, 100);
    expect_same_elements(m.t().contiguous(), m.t());
    Tensor x = random({2, 37, 3, 45}, dt, -100, 100);       // (B, T, H, D)
    expect_same_elements(x.transpose(1, 2).contiguous(), x.transpose(1, 2));  // -> (B, H, T, D)
    Tensor y = random({3, 20, 70}, dt, -100, 100);
    expect_same_elements(y.permute({2, 0, 1}).contiguous(), y.permute({2, 0, 1}));
    // A strided destination and a row-padded, transposed source.
    Tensor big = random({50, 40}, dt, -100, 100);
    Tensor src = big.narrow(0, 1, 48).narrow(1, 2, 35).t();  // (35, 48), non-unit leading dim
    Tensor out = empty_on({35, 48}, dt, kCPU);
    out.copy_(src);
    expect_same_elements(out, src);
  }
}

TEST(FastPaths, ContiguousWhereEveryDtypeKeepsBits) {
  for (ScalarType dt : {kFloat32, kFloat64, kBFloat16, kInt16, kBool, kInt64}) {
    SCOPED_TRACE(scalar_type_name(dt));
    Tensor c = random({1001}, kBool, 0, 2, 7), x = random({1001}, dt, -50, 50, 8);
    Tensor y = random({1001}, dt, -50, 50, 9);
    Tensor got = where(c, x, y);
    auto cv = to_doubles(c), xv = to_doubles(x), yv = to_doubles(y), gv = to_doubles(got);
    for (size_t i = 0; i < gv.size(); ++i) ASSERT_EQ(gv[i], cv[i] != 0 ? xv[i] : yv[i]) << i;
  }
  Tensor nan = full({4}, std::nan(""), kFloat32), zero = zeros({4});
  auto gv = to_doubles(where(from_vector<bool>({true, false, true, false}, {4}), nan, zero));
  EXPECT_TRUE(std::isnan(gv[0]) && std::isnan(gv[2]));
  EXPECT_EQ(gv[1], 0.0);
}

// Max over windows of (P, H, W) without padding: first maximum wins, a NaN wins (the last one).
std::pair<std::vector<double>, std::vector<double>> ref_pool(const Tensor& x, int64_t k,
                                                               int64_t s, int64_t d) {
  const int64_t H = x.size(-2), W = x.size(-1), P = x.numel() / (H * W);
  const int64_t OH = (H - d * (k - 1) - 1) / s + 1, OW = (W - d * (k - 1) - 1) / s + 1;
  auto xv = to_doubles(x);
  std::vector<double> y, idx;
  for (int64_t p = 0; p < P; ++p)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        int64_t at = -1;
        for (int64_t i = 0; i < k; ++i)
          for (int64_t j = 0; j < k; ++j) {
            const int64_t h = oh * s + i * d, w = ow * s + j * d;
            const double v = xv[p * H * W + h * W + w];
            if (at < 0 || v > xv[p * H * W + at] || std::isnan(v)) at = h * W + w;
          }
        y.push_back(xv[p * H * W + at]);
        idx.push_back(static_cast<double>(at));
      }
  return {y, idx};
}

TEST(FastPaths, MaxPoolWindowsInsideThePlane) {
  struct Case { int64_t k, s, d; };
  for (ScalarType dt : {kFloat32, kFloat64, kBFloat16})
    for (Case c : {Case{2, 2, 1}, Case{3, 2, 1}, Case{2, 1, 2}}) {
      SCOPED_TRACE(std::string(scalar_type_name(dt)) + " k" + std::to_string(c.k));
      Tensor x = random({2, 3, 9, 11}, dt, -3, 3);  // few distinct values: ties
      x = (x * 2).round();
      x.select(3, 4).select(2, 5).fill_(std::nan(""));
      x.select(3, 5).select(2, 5).fill_(std::nan(""));
      auto [y, idx] = max_pool2d_with_indices(x, {c.k, c.k}, {c.s, c.s}, {0, 0}, {c.d, c.d});
      auto [want, want_idx] = ref_pool(x, c.k, c.s, c.d);
      auto yv = to_doubles(y);
      ASSERT_EQ(yv.size(), want.size());
      for (size_t i = 0; i < yv.size(); ++i)
        ASSERT_TRUE(yv[i] == want[i] || (std::isnan(yv[i]) && std::isnan(want[i]))) << i;
      EXPECT_EQ(to_doubles(idx), want_idx);
    }
}

}  // namespace
}  // namespace kiln::testing
