// The PyTorch overloads and names of the op table against naive references: amax/amin over dim
// lists (every dtype, non-contiguous, zero-size), trunc, round.decimals, _binary_cross_entropy and
// its gradient at the edges, clamp.Tensor, scatter.value, split_with_sizes, floor_divide,
// softplus, max/min.other; and their bad inputs. Gradients against finite differences are the
// manifest gradcheck's (tests/autograd/manifest_gradcheck_test.cpp, samples in
// overload_samples.cpp).
#include <cmath>
#include <limits>

#include "kiln/autograd/autograd.h"
#include "kiln/kiln.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

// amax/amin of x over `dims` (empty: all), row-major over the kept dims, by brute force.
std::vector<double> naive_extreme(const Tensor& x, std::vector<int64_t> dims, bool is_max) {
  const int64_t nd = x.dim();
  std::vector<bool> red(nd, dims.empty());
  for (int64_t d : dims) red[d < 0 ? d + nd : d] = true;
  std::vector<int64_t> out_sizes;
  for (int64_t d = 0; d < nd; ++d)
    if (!red[d]) out_sizes.push_back(x.size(d));
  int64_t n_out = 1;
  for (int64_t s : out_sizes) n_out *= s;
  const double init = is_max ? -INFINITY : INFINITY;
  std::vector<double> out(n_out, init);
  const std::vector<double> v = to_doubles(x);
  for_each_index(x.sizes(), [&](const std::vector<int64_t>& i) {
    std::vector<int64_t> o;
    for (int64_t d = 0; d < nd; ++d)
      if (!red[d]) o.push_back(i[d]);
    double& acc = out[flat(out_sizes, o)];
    const double e = v[flat(x.sizes(), i)];
    if (std::isnan(e) || std::isnan(acc))
      acc = NAN;
    else
      acc = is_max ? std::max(acc, e) : std::min(acc, e);
  });
  return out;
}

TEST(Overloads, AmaxAminMatchTheReferenceForEveryDtypeAndLayout) {
  for (ScalarType dt : dtypes_of_set("all")) {
    SCOPED_TRACE(scalar_type_name(dt));
    Tensor x = random({3, 4, 5}, dt, -50, 50, 7);
    for (std::vector<int64_t> dims : {std::vector<int64_t>{}, {0}, {1}, {-1}, {0, 2}, {0, 1, 2}}) {
      for (bool is_max : {true, false}) {
        Tensor r = is_max ? amax(x, dims) : amin(x, dims);
        EXPECT_EQ(r.dtype(), dt);
        EXPECT_EQ(to_doubles(r), naive_extreme(x, dims, is_max));
        Tensor nc =
            is_max ? amax(non_contiguous(x), dims, true) : amin(non_contiguous(x), dims, true);
        EXPECT_EQ(nc.dim(), 3);
        EXPECT_EQ(to_doubles(nc), naive_extreme(x, dims, is_max));
      }
    }
  }
  Tensor e = zeros({0, 3});
  EXPECT_EQ(amax(e, {1}).sizes(), IntArrayRef({0}));
  EXPECT_EQ(to_doubles(amax(full({}, Scalar(2.5)))), std::vector<double>{2.5});
  Tensor nan = from_vector<float>({1, NAN, 3, 4}, {2, 2});
  EXPECT_TRUE(std::isnan(to_doubles(amax(nan, {1}))[0]));
  EXPECT_EQ(to_doubles(amax(nan, {1}))[1], 4);
  expect_error(ErrorKind::Index, "amax(): Expected reduction dim 0 to have non-zero size",
               [&] { amax(e, {0}); });
  expect_error(ErrorKind::Index, "amin(): Expected reduction dim 0", [&] { amin(zeros({0})); });
  expect_error(ErrorKind::Index, "out of range", [&] { amax(e, {2}); });
  expect_error(ErrorKind::Value, "appears multiple times", [] { amax(zeros({2, 2}), {0, 0}); });
}

TEST(Overloads, AmaxGradientIsSharedAmongTies) {
  Tensor x = from_vector<double>({1, 3, 3, 2, 2, 0}, {2, 3}).requires_grad_();
  Tensor g = autograd::grad({amax(x, {1}).sum()}, {x})[0];
  EXPECT_EQ(to_doubles(g), (std::vector<double>{0, 0.5, 0.5, 0.5, 0.5, 0}));
  g = autograd::grad({amin(x, {}, true).sum()}, {x})[0];
  EXPECT_EQ(to_doubles(g), (std::vector<double>{0, 0, 0, 0, 0, 1}));
}

TEST(Overloads, TruncRoundsTowardZero) {
  Tensor f = from_vector<float>({1.7f, -1.7f, 0.5f, -0.5f, 2.f, -0.f}, {2, 3});
  EXPECT_EQ(to_doubles(trunc(f)), (std::vector<double>{1, -1, 0, -0., 2, -0.}));
  EXPECT_EQ(to_doubles(trunc(non_contiguous(f))), to_doubles(trunc(f)));
  for (ScalarType dt : {kInt8, kInt32, kInt64, kUInt8, kFloat16, kBFloat16, kFloat64}) {
    Tensor x = random({7}, dt, -9, 9, 3);
    std::vector<double> want;
    for (double v : to_doubles(x)) want.push_back(std::trunc(v));
    EXPECT_EQ(to_doubles(trunc(x)), want) << scalar_type_name(dt);
    EXPECT_EQ(trunc(x).dtype(), dt);
  }
  Tensor y = f.clone();
  y.trunc_();
  EXPECT_EQ(to_doubles(y), to_doubles(trunc(f)));
  expect_error(ErrorKind::Type, "trunc: not supported for bool", [] { trunc(ones({2}, kBool)); });
}

TEST(Overloads, RoundDecimalsIsPyTorchsKernel) {
  Tensor x = from_vector<float>({1.2345f, -2.5551f, 0.5f, 0.125f}, {4});
  std::vector<double> want;
  for (float v : {1.2345f, -2.5551f, 0.5f, 0.125f})
    want.push_back(std::nearbyint(v * 100.f) / 100.f);
  EXPECT_EQ(to_doubles(round(x, 2)), want);
  want.clear();
  for (float v : {1.2345f, -2.5551f, 0.5f, 0.125f}) want.push_back(std::nearbyint(v / 10.f) * 10.f);
  EXPECT_EQ(to_doubles(round(x, -1)), want);
  EXPECT_EQ(to_doubles(round(x, 0)), to_doubles(round(x)));
  EXPECT_EQ(to_doubles(round(from_vector<int32_t>({3, -4}, {2}), 0)), (std::vector<double>{3, -4}));
  expect_error(ErrorKind::Type, "decimals=2 needs a floating point tensor",
               [] { round(from_vector<int32_t>({3}, {1}), 2); });
  Tensor i = from_vector<int32_t>({3}, {1});
  EXPECT_EQ(to_doubles(i.round_(0)), std::vector<double>{3});
  expect_error(ErrorKind::Type, "decimals=1 needs a floating point tensor", [&] { i.round_(1); });
}

TEST(Overloads, BinaryCrossEntropyIsPyTorchsKernelAndGradient) {
  const std::vector<double> xs{0, 1, 0, 1, 0.3, 1e-13, 0.5}, ts{0, 1, 1, 0, 0.8, 0, 0.5};
  Tensor x = from_vector<double>(xs, {7}).requires_grad_();
  Tensor t = from_vector<double>(ts, {7});
  Tensor loss = _binary_cross_entropy(x, t);
  std::vector<double> want_loss, want_grad;
  for (size_t i = 0; i < xs.size(); ++i) {
    want_loss.push_back((ts[i] - 1) * std::max(std::log1p(-xs[i]), -100.0) -
                        ts[i] * std::max(std::log(xs[i]), -100.0));
    want_grad.push_back((xs[i] - ts[i]) / std::max((1 - xs[i]) * xs[i], 1e-12));
  }
  expect_close(loss, from_vector<double>(want_loss, {7}), 1e-15, 0);
  Tensor g = autograd::grad({loss.sum()}, {x})[0];
  expect_close(g, from_vector<double>(want_grad, {7}), 1e-15, 0);
  // reduction and weight go through the composite: mean divides by numel
  Tensor w = from_vector<double>({1, 2, 3, 4, 5, 6, 7}, {7});
  Tensor gm = autograd::grad({binary_cross_entropy(x, t, w, "mean")}, {x})[0];
  for (size_t i = 0; i < xs.size(); ++i) want_grad[i] *= (i + 1) / 7.0;
  expect_close(gm, from_vector<double>(want_grad, {7}), 1e-14, 0);
  // broadcast, non-contiguous and zero-size operands of the pointwise row
  Tensor xb = random({2, 3}, kFloat32, 0.1, 0.9, 5), tb = random({3}, kFloat32, 0, 1, 6);
  expect_close(_binary_cross_entropy(non_contiguous(xb), tb),
               _binary_cross_entropy(xb.contiguous(), tb.expand({2, 3}).contiguous()));
  EXPECT_EQ(_binary_cross_entropy(zeros({0, 3}), zeros({3})).sizes(), IntArrayRef({0, 3}));
  expect_error(ErrorKind::Value, "between 0 and 1",
               [] { _binary_cross_entropy(full({3}, Scalar(-0.5)), zeros({3})); });
  expect_error(ErrorKind::Type, "floating point",
               [] { _binary_cross_entropy(zeros({3}, kInt64), zeros({3})); });
}

TEST(Overloads, ClampWithTensorBounds) {
  Tensor x = from_vector<float>({-2, 0, 2, 5}, {4});
  Tensor lo = from_vector<float>({-1, 1, 1, 1}, {4}), hi = from_vector<float>({1, 2, 3, 4}, {4});
  EXPECT_EQ(to_doubles(clamp(x, lo, hi)), (std::vector<double>{-1, 1, 2, 4}));
  EXPECT_EQ(to_doubles(clamp(x, lo, std::nullopt)), (std::vector<double>{-1, 1, 2, 5}));
  EXPECT_EQ(to_doubles(x.clamp(std::nullopt, hi)), (std::vector<double>{-2, 0, 2, 4}));
  Tensor b = clamp(non_contiguous(random({3, 4})), zeros({4}), ones({3, 1}));
  EXPECT_EQ(b.sizes(), IntArrayRef({3, 4}));
  for (double v : to_doubles(b)) EXPECT_TRUE(v >= 0 && v <= 1);
  EXPECT_EQ(clamp(from_vector<int32_t>({-3}, {1}), full({1}, Scalar(0.5)), std::nullopt).dtype(),
            kFloat32);
  Tensor y = x.clone();
  y.clamp_(lo, hi);
  EXPECT_EQ(to_doubles(y), (std::vector<double>{-1, 1, 2, 4}));
  expect_error(ErrorKind::Value, "at least one of 'min' or 'max'",
               [&] { clamp(x, std::optional<Tensor>(), std::optional<Tensor>()); });
  expect_error(ErrorKind::Value, "not broadcastable", [&] { clamp(x, zeros({3}), std::nullopt); });
  expect_error(ErrorKind::Type, "bool",
               [] { clamp(ones({2}, kBool), ones({2}, kBool), std::nullopt); });
  expect_error(ErrorKind::Type, "can't be cast", [&] {
    from_vector<int32_t>({1}, {1}).clamp_(full({1}, Scalar(0.5)), std::nullopt);
  });
}

TEST(Overloads, ScatterValueFloorDivideSoftplusMaxOther) {
  Tensor idx = from_vector<int64_t>({0, 3, 1, 2}, {2, 2});
  EXPECT_EQ(to_doubles(zeros({2, 4}).scatter(1, idx, Scalar(2.5))),
            (std::vector<double>{2.5, 0, 0, 2.5, 0, 2.5, 2.5, 0}));
  EXPECT_EQ(to_doubles(zeros({2, 4}, kInt32).scatter(1, idx, Scalar(2.5))),
            (std::vector<double>{2, 0, 0, 2, 0, 2, 2, 0}));
  Tensor s = zeros({2, 4});
  s.scatter_(1, idx, Scalar(-1));
  EXPECT_EQ(to_doubles(s), (std::vector<double>{-1, 0, 0, -1, 0, -1, -1, 0}));
  expect_error(ErrorKind::Type, "scatter: expected index to have dtype int64",
               [] { zeros({2}).scatter(0, zeros({1}), Scalar(1)); });
  expect_error(ErrorKind::Value, "same number of dimensions",
               [&] { zeros({2}).scatter(0, idx, Scalar(1)); });

  EXPECT_EQ(
      to_doubles(floor_divide(from_vector<int64_t>({7, -7}, {2}), full({}, Scalar(2), kInt64))),
      (std::vector<double>{3, -4}));
  expect_error(ErrorKind::Type, "can't be cast",
               [] { from_vector<int64_t>({7}, {1}).floor_divide_(full({1}, Scalar(2.5))); });

  Tensor sp = softplus(from_vector<double>({-1, 0, 30, 1}, {4}), Scalar(1), Scalar(20));
  expect_close(sp,
               from_vector<double>(
                   {std::log1p(std::exp(-1.0)), std::log(2.0), 30, std::log1p(std::exp(1.0))}, {4}),
               1e-15, 0);
  Tensor big = from_vector<double>({800}, {1}).requires_grad_();  // exp(800) is inf
  Tensor gb = autograd::grad({softplus(big, Scalar(1), Scalar(20))}, {big})[0];
  EXPECT_EQ(to_doubles(gb), std::vector<double>{1});
  expect_error(ErrorKind::Value, "beta must not be 0",
               [] { softplus(ones({1}), Scalar(0), Scalar(20)); });

  Tensor a = from_vector<float>({1, 5}, {2}), c = from_vector<float>({4, 2}, {2});
  EXPECT_EQ(to_doubles(max(a, c)), (std::vector<double>{4, 5}));
  EXPECT_EQ(to_doubles(a.min(c)), (std::vector<double>{1, 2}));
}

TEST(Overloads, SplitWithSizes) {
  Tensor x = arange(Scalar(0), Scalar(10), Scalar(1), kInt64).view({5, 2});
  std::vector<Tensor> p = split_with_sizes(x, {2, 0, 3});
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(to_doubles(p[0]), (std::vector<double>{0, 1, 2, 3}));
  EXPECT_EQ(p[1].sizes(), IntArrayRef({0, 2}));
  EXPECT_EQ(to_doubles(p[2]), (std::vector<double>{4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(p[2].data_ptr(), static_cast<int64_t*>(x.data_ptr()) + 4);  // a view
  std::vector<Tensor> q = x.split_with_sizes({1, 1}, -1);
  EXPECT_EQ(to_doubles(q[1]), (std::vector<double>{1, 3, 5, 7, 9}));
  EXPECT_EQ(split_with_sizes(non_contiguous(random({4, 3})), {3, 1}, 0)[1].sizes(),
            IntArrayRef({1, 3}));
  expect_error(ErrorKind::Value, "sum exactly to 5", [&] { split_with_sizes(x, {2, 2}); });
  expect_error(ErrorKind::Value, "non-negative", [&] { split_with_sizes(x, {-1, 6}); });
  expect_error(ErrorKind::Value, "at least a 1-dimensional",
               [] { split_with_sizes(ones({}), {1}); });
  // the gradient of every piece lands in its rows; a piece without one counts as zeros
  Tensor w = ones({5, 2}, kFloat64).requires_grad_();
  std::vector<Tensor> r = split_with_sizes(w, {2, 3});
  Tensor g = autograd::grad({(r[0] * 2).sum()}, {w})[0];
  EXPECT_EQ(to_doubles(g), (std::vector<double>{2, 2, 2, 2, 0, 0, 0, 0, 0, 0}));
}

}  // namespace
}  // namespace kiln::testing
