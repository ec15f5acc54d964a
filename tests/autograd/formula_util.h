// tests/autograd/formula_util.h: checks a backward helper against central finite differences.
//
//   Tensor x = testing::random({3, 4}, kFloat64);
//   auto f = [](const Tensor& t) { return t.select(1, 2); };
//   Tensor v = cotangent(f(x));                       // a random incoming gradient
//   expect_vjp(f, x, select_backward(v, x.sizes(), 1, 2), v);
#pragma once

#include <functional>

#include "kiln/autograd/formulas.h"
#include "test_util.h"

namespace kiln::testing {

using ForwardFn = std::function<Tensor(const Tensor&)>;

// A random float64 gradient shaped like `out` (a different seed from testing::random's default).
inline Tensor cotangent(const Tensor& out, uint32_t seed = 77) {
  return random(out.sizes(), kFloat64, -1, 1, seed);
}

// The vector-Jacobian product of f at x for the cotangent v, by central differences of
// L(x) = sum(f(x) * v) (x float64; every element perturbed by +-h).
inline std::vector<double> numeric_vjp(const ForwardFn& f, const Tensor& x, const Tensor& v,
                                       double h = 1e-6) {
  std::vector<double> out(x.numel());
  for (int64_t i = 0; i < x.numel(); ++i) {
    auto loss = [&](double delta) {
      Tensor xp = x.clone();
      xp.data_ptr<double>()[i] += delta;
      return (f(xp) * v).sum().item<double>();
    };
    out[i] = (loss(h) - loss(-h)) / (2 * h);
  }
  return out;
}

// `analytic` (what a backward helper returned for cotangent v) against numeric_vjp.
inline void expect_vjp(const ForwardFn& f, const Tensor& x, const Tensor& analytic, const Tensor& v,
                       double tol = 1e-6) {
  ASSERT_EQ(analytic.sizes(), x.sizes()) << "the gradient must have the input's shape";
  std::vector<double> want = numeric_vjp(f, x, v), got = to_doubles(analytic);
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i]))) << "element " << i;
}

}  // namespace kiln::testing
