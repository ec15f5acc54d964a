// upsample_nearest, upsample_bilinear, their backward ops and interpolate against references
// (tensor/ops/interpolate.toml, Note [Interpolation coordinates] in kernels/cpu/interpolate.cpp).
// Values known from PyTorch (F.interpolate) are spelled out.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/gradgradcheck.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

using V = std::vector<Tensor>;
using Ints = std::vector<int64_t>;

TEST(Interpolate, NearestKnownValues) {
  Tensor x = from_vector<float>({10, 20, 30}, {1, 1, 3});
  // PyTorch: F.interpolate(x, size=7) picks [0, 0, 0, 1, 1, 2, 2].
  EXPECT_EQ(to_doubles(interpolate(x, Ints{7})), (std::vector<double>{10, 10, 10, 20, 20, 30, 30}));
  // Downsampling 3 -> 2 picks floor(o * 1.5) = [0, 1].
  EXPECT_EQ(to_doubles(upsample_nearest(x, {2})), (std::vector<double>{10, 20}));
  // scale_factor 2.5 reads floor(o / 2.5): out size 7, [0, 0, 0, 1, 1, 2, 2].
  EXPECT_EQ(to_doubles(interpolate(x, std::nullopt, 2.5)),
            (std::vector<double>{10, 10, 10, 20, 20, 30, 30}));
}

TEST(Interpolate, BilinearKnownValues) {
  Tensor x = from_vector<float>({1, 2, 3, 4}, {1, 1, 2, 2});
  // PyTorch: F.interpolate(x, scale_factor=2, mode='bilinear', align_corners=False).
  expect_close(interpolate(x, std::nullopt, 2.0, "bilinear"),
               from_vector<float>({1.0, 1.25, 1.75, 2.0, 1.5, 1.75, 2.25, 2.5, 2.5, 2.75, 3.25, 3.5,
                                   3.0, 3.25, 3.75, 4.0},
                                  {1, 1, 4, 4}));
  // align_corners=True: the corners stay, steps of 1/3.
  Tensor ac = interpolate(x, Ints{4, 4}, std::nullopt, "bilinear", true);
  expect_close(ac.select(2, 0).reshape({4}), from_vector<float>({1, 4.f / 3, 5.f / 3, 2}, {4}));
  expect_close(ac.select(3, 0).reshape({4}), from_vector<float>({1, 5.f / 3, 7.f / 3, 3}, {4}));
}

// The nearest reference over any rank: source index min(floor(o * in / out), in - 1).
TEST(Interpolate, NearestAgainstReferenceEveryRankAndDtype) {
  for (ScalarType dt : dtypes_of_set("floating")) {
    SCOPED_TRACE(scalar_type_name(dt));
    Tensor x = random({2, 3, 3, 4, 5}, dt);
    std::vector<int64_t> out{5, 2, 8};
    Tensor y = upsample_nearest(non_contiguous(x), out);
    auto xv = to_doubles(x), yv = to_doubles(y);
    for_each_index(y.sizes(), [&](const std::vector<int64_t>& i) {
      std::vector<int64_t> s = i;
      for (int k = 0; k < 3; ++k) {
        const int64_t in = x.size(2 + k), o = out[k];
        s[2 + k] = o == in ? i[2 + k]
                           : std::min<int64_t>(std::floor(i[2 + k] * (static_cast<float>(in) / o)), in - 1);
      }
      EXPECT_EQ(yv[flat(y.sizes(), i)], xv[flat(x.sizes(), s)]);
    });
  }
}

TEST(Interpolate, BackwardIsTheAdjoint) {
  // <up(x), g> == <x, up_backward(g)> for random x, g: the backward ops are exact adjoints.
  Tensor x = random({2, 2, 3, 5}, kFloat64, -1, 1, 3);
  for (bool ac : {false, true}) {
    Tensor g = random({2, 2, 7, 4}, kFloat64, -1, 1, 4);
    double lhs = (upsample_bilinear(x, {7, 4}, ac) * g).sum().item<double>();
    double rhs = (x * upsample_bilinear_backward(g, {7, 4}, x.sizes(), ac)).sum().item<double>();
    EXPECT_NEAR(lhs, rhs, 1e-10);
  }
  Tensor g = random({2, 2, 7, 4}, kFloat64, -1, 1, 5);
  double lhs = (upsample_nearest(x, {7, 4}) * g).sum().item<double>();
  double rhs = (x * upsample_nearest_backward(g, {7, 4}, x.sizes())).sum().item<double>();
  EXPECT_NEAR(lhs, rhs, 1e-10);
  // bfloat16 backward accumulates in float: 16 equal contributions of 1/64 sum exactly.
  Tensor gb = full({1, 1, 8, 8}, 1.0 / 64, kBFloat16);
  Tensor xb = upsample_nearest_backward(gb, {8, 8}, std::vector<int64_t>{1, 1, 2, 2});
  EXPECT_EQ(to_doubles(xb), (std::vector<double>{0.25, 0.25, 0.25, 0.25}));
}

TEST(Interpolate, GradientsAndErrors) {
  Tensor x = random({1, 2, 3, 3}, kFloat64, -1, 1, 6);
  EXPECT_TRUE(gradgradcheck([](const V& a) { return V{upsample_bilinear(a[0], {5, 4}, false)}; }, {x}));
  EXPECT_TRUE(gradgradcheck([](const V& a) { return V{upsample_bilinear(a[0], {2, 5}, true)}; }, {x}));
  EXPECT_TRUE(gradgradcheck([](const V& a) { return V{interpolate(a[0], Ints{4, 7})}; }, {x}));
  expect_error(ErrorKind::Value, "exactly one of size and scale_factor",
               [&] { interpolate(x, Ints{4, 4}, 2.0); });
  expect_error(ErrorKind::NotImplemented, "mode 'bicubic' is not supported",
               [&] { interpolate(x, Ints{4, 4}, std::nullopt, "bicubic"); });
  expect_error(ErrorKind::Value, "align_corners can only be set",
               [&] { interpolate(x, Ints{4, 4}, std::nullopt, "nearest", true); });
  expect_error(ErrorKind::Value, "must have one size per spatial dimension",
               [&] { upsample_nearest(x, {4}); });
  expect_error(ErrorKind::Value, "expected an input of 4 to 4 dimensions",
               [&] { upsample_bilinear(random({1, 2, 3}), {4}); });
  expect_error(ErrorKind::Value, "expected grad_output of shape [1, 2, 4, 4]",
               [&] { upsample_nearest_backward(random({1, 2, 4, 5}), {4, 4}, x.sizes()); });
}

}  // namespace
}  // namespace kiln::testing
