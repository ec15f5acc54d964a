// Gradient clipping (kiln/optim/clip_grad.h) against hand-computed norms and a naive loop.
#include "kiln/optim/clip_grad.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "test_util.h"

namespace kiln::testing {
namespace {

Tensor with_grad(std::vector<float> g, std::vector<int64_t> sizes, ScalarType dt = kFloat32) {
  Tensor p = zeros(sizes, dt);
  p.requires_grad_(true);
  p.set_grad(from_vector<float>(g, sizes).to(dt));
  return p;
}

TEST(ClipGradNorm, ScalesByMaxNormOverTheTotalNorm) {
  // Gradients (3, 4) and (12): total 2-norm sqrt(9 + 16 + 144) = 13.
  std::vector<Tensor> ps = {with_grad({3, 4}, {2}), with_grad({12}, {1}), zeros({2})};
  Tensor total = optim::clip_grad_norm_(ps, 1.3);
  EXPECT_NEAR(total.item<double>(), 13.0, 1e-5);
  const double c = 1.3 / (13.0 + 1e-6);
  expect_close(ps[0].grad(), from_vector<float>({float(3 * c), float(4 * c)}, {2}), 1e-6, 1e-7);
  expect_close(ps[1].grad(), from_vector<float>({float(12 * c)}, {1}), 1e-6, 1e-7);
  // Under max_norm: unchanged (coefficient clamped to 1).
  std::vector<Tensor> small = {with_grad({0.3f, -0.4f}, {2})};
  EXPECT_NEAR(optim::clip_grad_norm_(small, 1.0).item<double>(), 0.5, 1e-6);
  expect_close(small[0].grad(), from_vector<float>({0.3f, -0.4f}, {2}), 0, 0);
}

TEST(ClipGradNorm, OtherNormsAndDtypes) {
  std::vector<Tensor> ps = {with_grad({3, -4}, {2}), with_grad({-12, 1, 2, 0}, {2, 2})};
  EXPECT_NEAR(optim::clip_grad_norm_(ps, 100, 1).item<double>(), 22, 1e-5);
  const double inf = std::numeric_limits<double>::infinity();
  Tensor total = optim::clip_grad_norm_(ps, 6, inf);
  EXPECT_NEAR(total.item<double>(), 12, 1e-5);
  EXPECT_NEAR(to_doubles(ps[1].grad())[0], -12 * 6 / (12 + 1e-6), 1e-5);
  // Many random gradients in float64 against a naive loop; bfloat16 with a loose tolerance.
  for (ScalarType dt : {kFloat64, kBFloat16}) {
    std::vector<Tensor> rs;
    double sq = 0;
    for (uint32_t i = 0; i < 4; ++i) {
      Tensor p = zeros({5, 7}, dt);
      p.requires_grad_(true);
      p.set_grad(random({5, 7}, dt, -1, 1, i));
      for (double v : to_doubles(p.grad())) sq += v * v;
      rs.push_back(p);
    }
    std::vector<double> before = to_doubles(rs[2].grad());
    const double tol = dt == kFloat64 ? 1e-12 : 2e-2;
    EXPECT_NEAR(optim::clip_grad_norm_(rs, 0.5).item<double>(), std::sqrt(sq), tol * std::sqrt(sq));
    std::vector<double> after = to_doubles(rs[2].grad());
    for (size_t i = 0; i < after.size(); ++i)
      EXPECT_NEAR(after[i], before[i] * 0.5 / (std::sqrt(sq) + 1e-6), tol);
    EXPECT_EQ(rs[0].grad().dtype(), dt);
  }
}

TEST(ClipGradNorm, NonFiniteAndEmpty) {
  std::vector<Tensor> none = {zeros({3})};
  EXPECT_EQ(optim::clip_grad_norm_(none, 1.0).item<double>(), 0.0);
  std::vector<Tensor> ps = {with_grad({1, std::numeric_limits<float>::infinity()}, {2})};
  expect_error(ErrorKind::Runtime,
               "clip_grad_norm_: the total norm of order 2 of the gradients is inf",
               [&] { optim::clip_grad_norm_(ps, 1.0, 2, true); });
  EXPECT_TRUE(std::isinf(optim::clip_grad_norm_(ps, 1.0).item<double>()));
}

TEST(ClipGradValue, ClampsEachElement) {
  std::vector<Tensor> ps = {with_grad({-3, 0.2f, 0.7f}, {3}), zeros({2})};
  optim::clip_grad_value_(ps, 0.5);
  expect_close(ps[0].grad(), from_vector<float>({-0.5f, 0.2f, 0.5f}, {3}), 0, 0);
  EXPECT_FALSE(ps[1].grad().defined());
}

}  // namespace
}  // namespace kiln::testing
