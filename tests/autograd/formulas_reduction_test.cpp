// Tests of the derivative-formula helpers for reductions and softmax
// (autograd/src/formulas_reduction.cpp) against central differences of the forward op in float64.
#include <limits>

#include "autograd/formula_util.h"

namespace kiln::autograd {
namespace {

using testing::cotangent;
using testing::expect_close;
using testing::expect_vjp;
using testing::from_vector;
using testing::random;
using testing::to_doubles;

// The (dim, keepdim) combinations the reduction tests run: one dim, two dims (one negative),
// every dim (absent and empty), each with and without keepdim.
struct Reduce {
  OptionalIntArrayRef dim;
  bool keepdim;
};
std::vector<Reduce> reduce_cases() {
  static const std::vector<int64_t> one{1}, two{0, -1}, none_listed{};
  std::vector<Reduce> out;
  for (bool k : {false, true})
    for (OptionalIntArrayRef d : {OptionalIntArrayRef(one), OptionalIntArrayRef(two),
                                  OptionalIntArrayRef(std::nullopt), OptionalIntArrayRef(none_listed)})
      out.push_back({d, k});
  return out;
}

TEST(FormulasReduction, UnsqueezeHelpers) {
  Tensor r = zeros({2, 4}, kFloat64);
  EXPECT_EQ(unsqueeze_dims(r, std::vector<int64_t>{1, -1}, 4).sizes(),
            (std::vector<int64_t>{2, 1, 4, 1}));
  EXPECT_EQ(unsqueeze_dims(zeros({}, kFloat64), std::nullopt, 3).sizes(),
            (std::vector<int64_t>{1, 1, 1}));
  EXPECT_TRUE(restore_reduced(r, std::vector<int64_t>{0}, 3, true).is_same(r));
  EXPECT_EQ(unsqueeze_to(zeros({3}, kFloat64), {1, 3, 1}).sizes(), (std::vector<int64_t>{1, 3, 1}));
  EXPECT_EQ(unsqueeze_to(zeros({3}, kFloat64), -1, {3, 1}).sizes(), (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(unsqueeze_to(zeros({3}, kFloat64), 0, {3}).sizes(), (std::vector<int64_t>{3}));
}

TEST(FormulasReduction, SumMeanBackward) {
  Tensor x = random({2, 3, 4}, kFloat64);
  for (const Reduce& c : reduce_cases()) {
    auto fs = [&](const Tensor& t) { return t.sum(c.dim, c.keepdim); };
    Tensor v = cotangent(fs(x));
    expect_vjp(fs, x, sum_backward(v, x.sizes(), c.dim, c.keepdim), v);
    expect_vjp(fs, x, expand_grad(v, x.sizes(), c.dim, c.keepdim), v);
    auto fm = [&](const Tensor& t) { return t.mean(c.dim, c.keepdim); };
    expect_vjp(fm, x, mean_backward(v, x.sizes(), c.dim, x.numel(), c.keepdim), v);
  }
}

TEST(FormulasReduction, ProdBackwardWithZeros) {
  // Row 0: no zero; row 1: one zero; row 2: two zeros; row 3: all nonzero negatives.
  Tensor x = from_vector<double>({1.5, -2, 0.5, 3, 0, 2, 0, 1, 0, -1, -2, -0.5}, {4, 3});
  for (bool keepdim : {false, true}) {
    auto f = [&](const Tensor& t) { return t.prod(std::vector<int64_t>{1}, keepdim); };
    Tensor v = cotangent(f(x));
    expect_vjp(f, x, prod_backward(v, x, f(x), std::vector<int64_t>{1}, keepdim), v);
  }
  for (const Tensor& t : {x, x.narrow(0, 0, 2), random({2, 3}, kFloat64, 0.5, 1.5)}) {
    auto f = [](const Tensor& s) { return s.prod(); };
    Tensor v = cotangent(f(t));
    expect_vjp(f, t, prod_backward(v, t, f(t), std::nullopt, false), v);
  }
  // Exactly one zero overall: its gradient is the product of the rest, every other one is 0.
  Tensor one_zero = from_vector<double>({2, 0, 3}, {3});
  expect_close(prod_backward(ones({}, kFloat64), one_zero, one_zero.prod(), std::nullopt, false),
               from_vector<double>({0, 6, 0}, {3}), 0, 0);
}

TEST(FormulasReduction, MinMaxBackward) {
  Tensor x = from_vector<double>({1, 4, 4, -2, 4, 0}, {2, 3});
  Tensor g = scalar_tensor_of(6.0, kFloat64);
  expect_close(evenly_distribute_backward(g, x, x.max()),
               from_vector<double>({0, 2, 2, 0, 2, 0}, {2, 3}), 0, 0);
  expect_close(minmax_backward(g, x, x.min()), from_vector<double>({0, 0, 0, 6, 0, 0}, {2, 3}), 0, 0);
  Tensor nan = from_vector<double>({1, std::numeric_limits<double>::quiet_NaN(), 3}, {3});
  expect_close(evenly_distribute_backward(g, nan, nan.max()),
               from_vector<double>({0, 6, 0}, {3}), 0, 0);
  Tensor y = random({3, 4, 2}, kFloat64);
  for (int64_t dim : {1, -1})
    for (bool keepdim : {false, true}) {
      auto f = [&](const Tensor& t) { return std::get<0>(t.max(dim, keepdim)); };
      Tensor idx = std::get<1>(y.max(dim, keepdim));
      Tensor v = cotangent(f(y));
      expect_vjp(f, y, value_selecting_reduction_backward(v, dim, idx, y.sizes(), keepdim), v);
      auto fmin = [&](const Tensor& t) { return std::get<0>(t.min(dim, keepdim)); };
      Tensor imin = std::get<1>(y.min(dim, keepdim));
      expect_vjp(fmin, y, minmax_backward(v, dim, imin, y.sizes(), keepdim), v);
    }
}

TEST(FormulasReduction, VarStdBackward) {
  Tensor x = random({3, 4, 2}, kFloat64);
  for (const Reduce& c : reduce_cases())
    for (double correction : {0.0, 1.0}) {
      auto fv = [&](const Tensor& t) { return t.var(c.dim, correction, c.keepdim); };
      Tensor v = cotangent(fv(x));
      expect_vjp(fv, x, var_backward(v, x, c.dim, correction, c.keepdim), v);
      auto fs = [&](const Tensor& t) { return t.std(c.dim, correction, c.keepdim); };
      expect_vjp(fs, x, std_backward(fs(x), v, x, c.dim, correction, c.keepdim), v);
    }
  // A constant slice has std 0: its gradient is 0, not NaN.
  Tensor flat = ones({2, 3}, kFloat64);
  Tensor g = std_backward(flat.std(std::vector<int64_t>{1}), ones({2}, kFloat64), flat,
                          std::vector<int64_t>{1}, 1.0, false);
  expect_close(g, zeros({2, 3}, kFloat64), 0, 0);
}

TEST(FormulasReduction, NormBackward) {
  Tensor x = random({3, 4}, kFloat64);
  const double inf = std::numeric_limits<double>::infinity();
  for (double p : {1.0, 2.0, 3.0, 1.5, 0.5, inf, -inf})
    for (const Reduce& c : reduce_cases()) {
      auto f = [&](const Tensor& t) { return t.norm(p, c.dim, c.keepdim); };
      Tensor v = cotangent(f(x));
      expect_vjp(f, x, norm_backward(v, x, p, f(x), c.dim, c.keepdim), v, 1e-5);
    }
  Tensor v = ones({}, kFloat64);
  expect_close(norm_backward(v, x, 0, x.norm(0), std::nullopt, false), zeros({3, 4}, kFloat64), 0, 0);
  // A zero vector: the 2-norm's gradient is 0 there (not NaN).
  Tensor z = zeros({3}, kFloat64);
  expect_close(norm_backward(v, z, 2, z.norm(), std::nullopt, false), z, 0, 0);
  expect_close(norm_backward(v, z, 3, z.norm(3), std::nullopt, false), z, 0, 0);
}

TEST(FormulasReduction, LogsumexpBackward) {
  Tensor x = random({3, 4, 2}, kFloat64, -3, 3);
  for (bool keepdim : {false, true})
    for (const std::vector<int64_t>& dim : {std::vector<int64_t>{1}, std::vector<int64_t>{0, 2}}) {
      auto f = [&](const Tensor& t) { return t.logsumexp(dim, keepdim); };
      Tensor v = cotangent(f(x));
      expect_vjp(f, x, logsumexp_backward(v, x, f(x), dim, keepdim), v);
    }
}

TEST(FormulasReduction, SoftmaxBackward) {
  Tensor x = random({3, 5}, kFloat64, -3, 3);
  for (int64_t dim : {0, 1, -1}) {
    auto fs = [&](const Tensor& t) { return t.softmax(dim); };
    Tensor v = cotangent(fs(x));
    expect_vjp(fs, x, softmax_backward(v, fs(x), dim, x), v);
    auto fl = [&](const Tensor& t) { return t.log_softmax(dim); };
    expect_vjp(fl, x, log_softmax_backward(v, fl(x), dim, x), v);
  }
}

}  // namespace
}  // namespace kiln::autograd
