// Tests of the reductions and softmax (tensor/ops/reduction.toml) on the CPU against a naive
// double-precision reference: every listed dtype, non-contiguous layouts, keepdim, negative dims,
// dim lists, zero-size inputs, bad inputs, accuracy and thread-count determinism.
#include <cstring>
#include <limits>

#include "kiln/meta.h"
#include "kiln/parallel.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

using Dims = std::vector<int64_t>;
using Group = std::vector<double>;
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr float kInfF = std::numeric_limits<float>::infinity();

// The input values (row-major order) that each output element of a reduction over `dim` sees.
std::vector<Group> groups(const Tensor& x, OptionalIntArrayRef dim) {
  std::vector<bool> mask = meta::dim_mask("reference", dim, x.dim());
  std::vector<double> vals = to_doubles(x);
  int64_t nout = 1;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (!mask[d]) nout *= x.size(d);
  std::vector<Group> g(nout);
  for (int64_t i = 0; i < static_cast<int64_t>(vals.size()); ++i) {
    int64_t rem = i, o = 0, mul = 1;
    for (int64_t d = x.dim() - 1; d >= 0; --d) {
      int64_t idx = rem % x.size(d);
      rem /= x.size(d);
      if (mask[d]) continue;
      o += idx * mul;
      mul *= x.size(d);
    }
    g[o].push_back(vals[i]);
  }
  return g;
}

DimVector out_shape(const Tensor& x, OptionalIntArrayRef dim, bool keepdim) {
  return meta::reduced_shape(x.sizes(), meta::dim_mask("reference", dim, x.dim()), keepdim);
}

// Checks got against ref(group) per output element.
template <typename Ref>
void check(const Tensor& got, const Tensor& x, OptionalIntArrayRef dim, bool keepdim, Ref ref,
           double rtol, double atol) {
  std::vector<double> want;
  for (const Group& g : groups(x, dim)) want.push_back(ref(g));
  expect_close(got, from_vector<double>(want, out_shape(x, dim, keepdim)), rtol, atol);
}

double ref_sum(const Group& g) {
  double s = 0;
  for (double v : g) s += v;
  return s;
}
double ref_prod(const Group& g) {
  double s = 1;
  for (double v : g) s *= v;
  return s;
}
double ref_mean(const Group& g) { return ref_sum(g) / static_cast<double>(g.size()); }
double ref_var(const Group& g, double correction) {
  double m = ref_mean(g), s = 0;
  for (double v : g) s += (v - m) * (v - m);
  return s / std::max(0.0, static_cast<double>(g.size()) - correction);
}
template <bool kMax>
double ref_extreme(const Group& g) {
  double m = kMax ? -kInf : kInf;
  for (double v : g) {
    if (std::isnan(v)) return v;
    m = kMax ? std::max(m, v) : std::min(m, v);
  }
  return m;
}
template <bool kMax>
double ref_arg(const Group& g) {
  int64_t best = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(g.size()); ++i) {
    if (std::isnan(g[i])) return static_cast<double>(i);
    if (kMax ? g[i] > g[best] : g[i] < g[best]) best = i;
  }
  return static_cast<double>(best);
}
double ref_norm(const Group& g, double p) {
  if (std::isinf(p)) {
    double m = p > 0 ? 0 : kInf;
    for (double v : g) m = p > 0 ? std::max(m, std::fabs(v)) : std::min(m, std::fabs(v));
    return m;
  }
  double s = 0;
  for (double v : g) s += p == 0 ? (v != 0) : std::pow(std::fabs(v), p);
  return p == 0 ? s : std::pow(s, 1 / p);
}
double ref_logsumexp(const Group& g) {
  double m = ref_extreme<true>(g);
  if (std::isinf(m)) m = 0;
  double s = 0;
  for (double v : g) s += std::exp(v - m);
  return std::log(s) + m;
}

// Dim arguments every reduction test goes through, for a 3-d input.
struct DimCase {
  std::optional<Dims> dims;
  bool keepdim;
};
std::vector<DimCase> dim_cases() {
  return {{std::nullopt, false}, {Dims{}, true}, {Dims{0}, false}, {Dims{-1}, true},
          {Dims{1}, false},      {Dims{0, 2}, true}, {Dims{-1, 0}, false}, {Dims{2, 1, 0}, false}};
}
OptionalIntArrayRef opt(const std::optional<Dims>& d) { return d ? OptionalIntArrayRef(*d) : std::nullopt; }

// Inputs for a dtype: contiguous, non-contiguous, and a permuted (inner dim strided) layout.
std::vector<Tensor> inputs(ScalarType t, double lo = -2, double hi = 2) {
  Tensor a = random({3, 5, 4}, t, lo, hi, 7);
  return {a, non_contiguous(a), random({4, 3, 5}, t, lo, hi, 8).permute({1, 2, 0})};
}

double atol_for(ScalarType t, double scale) { return is_floating(t) ? rtol_for(t) * scale : 0; }

TEST(Reduction, SumEveryDtype) {
  for (ScalarType t : dtypes_of_set("all")) {
    for (const Tensor& x : inputs(t)) {
      for (const DimCase& c : dim_cases()) {
        SCOPED_TRACE(std::string(scalar_type_name(t)) + " keepdim " + std::to_string(c.keepdim));
        Tensor s = kiln::sum(x, opt(c.dims), c.keepdim);
        EXPECT_EQ(s.dtype(), is_integral(t, true) ? kInt64 : t);
        check(s, x, opt(c.dims), c.keepdim, ref_sum, rtol_for(t), atol_for(t, 4));
      }
    }
  }
  Tensor x = random({4, 6}, kInt8, -100, 100);
  check(kiln::sum(x, Dims{1}, false, kFloat16), x, Dims{1}, false, ref_sum, 2e-3, 0.5);
  EXPECT_EQ(kiln::sum(x, std::nullopt, false, kInt16).dtype(), kInt16);
}

TEST(Reduction, MeanAndProd) {
  for (ScalarType t : dtypes_of_set("all")) {
    for (const Tensor& x : inputs(t, 0.5, 1.5)) {
      for (const DimCase& c : dim_cases()) {
        SCOPED_TRACE(scalar_type_name(t));
        std::optional<ScalarType> mdt;
        if (!is_floating(t)) mdt = kFloat64;
        Tensor m = kiln::mean(x, opt(c.dims), c.keepdim, mdt);
        EXPECT_EQ(m.dtype(), mdt.value_or(t));
        check(m, x, opt(c.dims), c.keepdim, ref_mean, rtol_for(m.dtype()), atol_for(m.dtype(), 1));
        Tensor p = kiln::prod(x, opt(c.dims), c.keepdim);
        EXPECT_EQ(p.dtype(), is_integral(t, true) ? kInt64 : t);
        check(p, x, opt(c.dims), c.keepdim, ref_prod, rtol_for(t) * 4, atol_for(t, 1e-3));
      }
    }
  }
  Tensor x = random({3, 4}, kInt32, -3, 4);
  check(kiln::prod(x, Dims{0}), x, Dims{0}, false, ref_prod, 0, 0);
}

TEST(Reduction, MaxMinArg) {
  for (ScalarType t : dtypes_of_set("all")) {
    for (const Tensor& x : inputs(t)) {  // integer inputs have many ties: first index wins
      SCOPED_TRACE(scalar_type_name(t));
      check(kiln::max(x), x, std::nullopt, false, ref_extreme<true>, 0, 0);
      check(kiln::min(x), x, std::nullopt, false, ref_extreme<false>, 0, 0);
      EXPECT_EQ(kiln::max(x).dtype(), t);
      for (int64_t d : {0, 1, 2, -1, -3}) {
        for (bool keep : {false, true}) {
          auto [v, i] = kiln::max(x, d, keep);
          check(v, x, Dims{d}, keep, ref_extreme<true>, 0, 0);
          check(i, x, Dims{d}, keep, ref_arg<true>, 0, 0);
          EXPECT_EQ(i.dtype(), kInt64);
          auto [mv, mi] = kiln::min(x, d, keep);
          check(mv, x, Dims{d}, keep, ref_extreme<false>, 0, 0);
          check(mi, x, Dims{d}, keep, ref_arg<false>, 0, 0);
          if (t == kBool) continue;
          check(kiln::argmax(x, d, keep), x, Dims{d}, keep, ref_arg<true>, 0, 0);
          check(kiln::argmin(x, d, keep), x, Dims{d}, keep, ref_arg<false>, 0, 0);
        }
      }
      if (t == kBool) continue;
      check(kiln::argmax(x), x, std::nullopt, false, ref_arg<true>, 0, 0);
      check(kiln::argmin(x), x, std::nullopt, false, ref_arg<false>, 0, 0);
      EXPECT_EQ(DimVector(kiln::argmax(x, std::nullopt, true).sizes()), DimVector({1, 1, 1}));
    }
  }
  // A 0-d input reduces over "dim 0".
  Tensor s = scalar_tensor_of(Scalar(3.5), kFloat32);
  auto [v, i] = kiln::max(s, 0);
  EXPECT_EQ(v.item<float>(), 3.5f);
  EXPECT_EQ(i.item<int64_t>(), 0);
}

TEST(Reduction, NaNPropagatesInMaxMin) {
  for (ScalarType t : dtypes_of_set("floating")) {
    Tensor x = from_vector<double>({1, kNaN, 3, 2, 5, kNaN, 0, 1, -1}, {3, 3}).to(t);
    EXPECT_TRUE(std::isnan(kiln::max(x).item<double>()));
    EXPECT_TRUE(std::isnan(kiln::min(x).item<double>()));
    auto [v, i] = kiln::max(x, 1);
    check(v, x, Dims{1}, false, ref_extreme<true>, 0, 0);
    check(i, x, Dims{1}, false, ref_arg<true>, 0, 0);
    check(kiln::argmin(x, 0), x, Dims{0}, false, ref_arg<false>, 0, 0);
    check(kiln::argmax(x), x, std::nullopt, false, ref_arg<true>, 0, 0);
  }
}

TEST(Reduction, VarStd) {
  for (ScalarType t : dtypes_of_set("floating")) {
    for (const Tensor& x : inputs(t)) {
      for (const DimCase& c : dim_cases()) {
        for (double corr : {0.0, 1.0, 2.5}) {
          SCOPED_TRACE(std::string(scalar_type_name(t)) + " correction " + std::to_string(corr));
          auto var = [corr](const Group& g) { return ref_var(g, corr); };
          auto sd = [corr](const Group& g) { return std::sqrt(ref_var(g, corr)); };
          check(kiln::var(x, opt(c.dims), corr, c.keepdim), x, opt(c.dims), c.keepdim, var,
                rtol_for(t) * 2, atol_for(t, 1));
          check(kiln::std(x, opt(c.dims), corr, c.keepdim), x, opt(c.dims), c.keepdim, sd,
                rtol_for(t) * 2, atol_for(t, 1));
        }
      }
    }
  }
  // Stable for a large mean: values 1e4 + small noise in float32.
  Tensor x = (random({1000}, kFloat64, -1, 1) + 1e4).to(kFloat32);
  check(kiln::var(x), x, std::nullopt, false, [](const Group& g) { return ref_var(g, 1); }, 1e-4, 0);
  // One element with correction 1: 0 / 0.
  EXPECT_TRUE(std::isnan(kiln::var(random({1}), std::nullopt, 1.0).item<float>()));
}

TEST(Reduction, Norm) {
  for (ScalarType t : dtypes_of_set("floating")) {
    for (const Tensor& x : inputs(t)) {
      for (const DimCase& c : dim_cases()) {
        for (double p : {2.0, 1.0, kInf, -kInf, 0.0, 3.0, 0.5}) {
          SCOPED_TRACE(std::string(scalar_type_name(t)) + " p " + std::to_string(p));
          check(kiln::norm(x, Scalar(p), opt(c.dims), c.keepdim), x, opt(c.dims), c.keepdim,
                [p](const Group& g) { return ref_norm(g, p); }, rtol_for(t) * 2, atol_for(t, 1));
        }
      }
    }
  }
  Tensor x = random({4, 5});
  EXPECT_EQ(kiln::norm(x, Scalar(int64_t{2})).item<float>(), kiln::norm(x).item<float>());
}

TEST(Reduction, LogSumExp) {
  for (ScalarType t : dtypes_of_set("all")) {
    for (const Tensor& x : inputs(t)) {
      for (const DimCase& c : dim_cases()) {
        if (!c.dims) continue;
        SCOPED_TRACE(scalar_type_name(t));
        Tensor r = kiln::logsumexp(x, *c.dims, c.keepdim);
        EXPECT_EQ(r.dtype(), is_floating(t) ? t : kFloat32);
        check(r, x, *c.dims, c.keepdim, ref_logsumexp, rtol_for(r.dtype()), atol_for(r.dtype(), 1));
      }
    }
  }
  // Stable for large values, -inf rows stay -inf, +inf wins.
  Tensor x = from_vector<float>({1000, 1000, -kInfF, -kInfF, kInfF, 1, 1e-3f, -1000}, {4, 2});
  check(kiln::logsumexp(x, Dims{1}), x, Dims{1}, false, ref_logsumexp, 1e-6, 0);
  EXPECT_EQ(kiln::logsumexp(x, Dims{1}).to(kFloat64).select(0, 1).item<double>(), -kInf);
}

TEST(Reduction, AnyAll) {
  for (ScalarType t : dtypes_of_set("all")) {
    for (const Tensor& x : inputs(t, 0, 2)) {  // integers 0 or 1: mixed rows
      for (const DimCase& c : dim_cases()) {
        SCOPED_TRACE(scalar_type_name(t));
        Tensor a = kiln::any(x, opt(c.dims), c.keepdim);
        EXPECT_EQ(a.dtype(), kBool);
        check(a, x, opt(c.dims), c.keepdim, [](const Group& g) {
          for (double v : g) if (v != 0) return 1.0;
          return 0.0;
        }, 0, 0);
        check(kiln::all(x, opt(c.dims), c.keepdim), x, opt(c.dims), c.keepdim, [](const Group& g) {
          for (double v : g) if (v == 0) return 0.0;
          return 1.0;
        }, 0, 0);
      }
    }
  }
}

// Reference softmax along `dim` of a contiguous double copy.
Tensor ref_softmax(const Tensor& x, int64_t dim, bool log) {
  int64_t d = dim < 0 ? dim + x.dim() : dim;
  std::vector<double> v = to_doubles(x), out(v.size());
  int64_t D = x.size(d), inner = 1;
  for (int64_t i = d + 1; i < x.dim(); ++i) inner *= x.size(i);
  for (int64_t base = 0; base < static_cast<int64_t>(v.size()); base += D * inner) {
    for (int64_t j = 0; j < inner; ++j) {
      double m = -kInf, s = 0;
      for (int64_t k = 0; k < D; ++k) m = std::max(m, v[base + k * inner + j]);
      for (int64_t k = 0; k < D; ++k) s += std::exp(v[base + k * inner + j] - m);
      for (int64_t k = 0; k < D; ++k) {
        double e = v[base + k * inner + j] - m;
        out[base + k * inner + j] = log ? e - std::log(s) : std::exp(e) / s;
      }
    }
  }
  return from_vector<double>(out, x.sizes());
}

TEST(Softmax, MatchesReference) {
  for (ScalarType t : dtypes_of_set("floating")) {
    for (const Tensor& x : inputs(t, -5, 5)) {
      for (int64_t d : {-1, 0, 1, 2}) {
        SCOPED_TRACE(std::string(scalar_type_name(t)) + " dim " + std::to_string(d));
        Tensor s = kiln::softmax(x, d), l = kiln::log_softmax(x, d);
        EXPECT_EQ(s.dtype(), t);
        expect_close(s, ref_softmax(x, d, false), rtol_for(t) * 2, atol_for(t, 0.01));
        expect_close(l, ref_softmax(x, d, true), rtol_for(t) * 2, atol_for(t, 1));
      }
    }
  }
  // dtype= casts first; a long last dim goes through the chunked row sums.
  Tensor x = random({2, 70000}, kFloat16, -3, 3);
  expect_close(kiln::softmax(x, 1, kFloat64), ref_softmax(x, 1, false), 1e-9, 1e-12);
  Tensor xi = random({3, 4}, kInt32, -3, 3);
  Tensor li = kiln::log_softmax(xi, 0, kFloat32);
  EXPECT_EQ(li.dtype(), kFloat32);
  expect_close(li, ref_softmax(xi, 0, true), 1e-6, 1e-6);
  // Large values are stable; -inf entries get probability 0.
  Tensor y = from_vector<float>({1000, 999, -kInfF, 0, -kInfF, -kInfF}, {2, 3});
  expect_close(kiln::softmax(y, 1), ref_softmax(y, 1, false), 1e-6, 1e-7);
  expect_close(kiln::log_softmax(y, 1), ref_softmax(y, 1, true), 1e-6, 1e-6);
  // A NaN (or +inf) makes its row NaN, as in PyTorch; masked entries of a long row are exactly 0
  // (Note [Softmax rows]).
  std::vector<float> row(40, 0.5f);
  row[3] = std::numeric_limits<float>::quiet_NaN();
  row[20] = -kInfF;
  for (int64_t i = 40; i < 80; ++i) row.push_back(i % 3 == 0 ? -kInfF : 0.25f * static_cast<float>(i % 7));
  row[41] = kInfF;
  row.resize(120, -kInfF);
  row[100] = 1.0f;
  Tensor z = kiln::softmax(from_vector<float>(row, {3, 40}), 1);
  for (int64_t j = 0; j < 40; ++j) {
    EXPECT_TRUE(std::isnan(z.select(0, 0).select(0, j).item<float>())) << j;
    EXPECT_TRUE(std::isnan(z.select(0, 1).select(0, j).item<float>())) << j;
    EXPECT_EQ(z.select(0, 2).select(0, j).item<float>(), j == 20 ? 1.0f : 0.0f) << j;
  }
  // Many rows over the threads (each prefetching the next, Note [Softmax prefetch], the last
  // one past the end) agree with rows computed one at a time and with the reference.
  for (int64_t D : {1024, 1000}) {
    SCOPED_TRACE("D " + std::to_string(D));
    Tensor big = random({(2 << 20) / (4 * D) + 1, D}, kFloat32, -4, 4);
    Tensor sb = kiln::softmax(big, 1);
    for (int64_t r : {int64_t{0}, big.size(0) / 2, big.size(0) - 1}) {
      Tensor row = big.select(0, r).unsqueeze(0);
      expect_close(sb.select(0, r).unsqueeze(0), kiln::softmax(row, 1), 0, 0);
      expect_close(sb.select(0, r).unsqueeze(0), ref_softmax(row, 1, false), 2e-6, 1e-8);
    }
  }
  // 0-d input: softmax over "dim 0" is 1.
  EXPECT_EQ(kiln::softmax(scalar_tensor_of(Scalar(2.0), kFloat32), 0).item<float>(), 1.0f);
  EXPECT_EQ(DimVector(kiln::softmax(random({0, 3}), 1).sizes()), DimVector({0, 3}));
}

TEST(Reduction, ZeroSize) {
  Tensor e = random({2, 0, 3});
  EXPECT_EQ(kiln::sum(random({0})).item<float>(), 0.0f);
  EXPECT_EQ(kiln::sum(random({0}, kInt32)).item<int64_t>(), 0);
  EXPECT_EQ(kiln::prod(random({0})).item<float>(), 1.0f);
  EXPECT_TRUE(std::isnan(kiln::mean(random({0})).item<float>()));
  EXPECT_TRUE(std::isnan(kiln::var(random({0})).item<float>()));
  EXPECT_EQ(kiln::norm(random({0})).item<float>(), 0.0f);
  EXPECT_EQ(kiln::logsumexp(random({0}), Dims{0}).item<float>(), -std::numeric_limits<float>::infinity());
  EXPECT_FALSE(kiln::any(random({0})).item<bool>());
  EXPECT_TRUE(kiln::all(random({0})).item<bool>());
  // Reducing an empty dim gives identities; reducing another dim gives an empty result.
  check(kiln::sum(e, Dims{1}), e, Dims{1}, false, ref_sum, 0, 0);
  EXPECT_EQ(DimVector(kiln::sum(e, Dims{1}).sizes()), DimVector({2, 3}));
  EXPECT_EQ(DimVector(kiln::sum(e, Dims{2}, true).sizes()), DimVector({2, 0, 1}));
  EXPECT_EQ(DimVector(std::get<0>(kiln::max(e, 2)).sizes()), DimVector({2, 0}));
  EXPECT_EQ(DimVector(kiln::argmax(e, 0).sizes()), DimVector({0, 3}));
  // No identity for max/min/argmax/inf-norm: errors as in PyTorch.
  expect_error(ErrorKind::Runtime, "max(): Expected reduction dim to be specified for input.numel() == 0",
               [&] { kiln::max(e); });
  expect_error(ErrorKind::Runtime, "min(): Expected reduction dim", [&] { kiln::min(e); });
  expect_error(ErrorKind::Runtime, "argmax(): Expected reduction dim", [&] { kiln::argmax(e); });
  expect_error(ErrorKind::Index, "max(): Expected reduction dim 1 to have non-zero size", [&] { kiln::max(e, 1); });
  expect_error(ErrorKind::Index, "min(): Expected reduction dim 1", [&] { kiln::min(e, -2); });
  expect_error(ErrorKind::Index, "argmin(): Expected reduction dim 1", [&] { kiln::argmin(e, 1); });
  expect_error(ErrorKind::Runtime, "inf norm on an empty tensor", [&] { kiln::norm(e, Scalar(kInf), Dims{1}); });
  expect_error(ErrorKind::Runtime, "norm on an empty tensor", [&] { kiln::norm(e, Scalar(-kInf)); });
}

TEST(Reduction, BadInputs) {
  Tensor x = random({2, 3});
  expect_error(ErrorKind::Index, "but got 2)", [&] { kiln::sum(x, Dims{2}); });
  expect_error(ErrorKind::Index, "but got -3)", [&] { kiln::mean(x, Dims{0, -3}); });
  expect_error(ErrorKind::Index, "but got 5)", [&] { kiln::max(x, 5); });
  expect_error(ErrorKind::Index, "but got 2)", [&] { kiln::argmax(x, 2); });
  expect_error(ErrorKind::Index, "but got 3)", [&] { kiln::softmax(x, 3); });
  expect_error(ErrorKind::Index, "but got 2)", [&] { kiln::logsumexp(x, Dims{2}); });
  expect_error(ErrorKind::Value, "dim 1 appears multiple times", [&] { kiln::sum(x, Dims{1, -1}); });
  expect_error(ErrorKind::Value, "appears multiple times", [&] { kiln::var(x, Dims{0, 0}); });
  expect_error(ErrorKind::Type, "mean(): could not infer output dtype. Input dtype must be either a floating point",
               [&] { kiln::mean(random({3}, kInt64)); });
  expect_error(ErrorKind::Type, "Optional dtype must be either a floating point",
               [&] { kiln::mean(x, std::nullopt, false, kInt32); });
  expect_error(ErrorKind::Type, "std and var only support floating point", [&] { kiln::var(random({3}, kInt32)); });
  expect_error(ErrorKind::Type, "std and var only support floating point", [&] { kiln::std(random({3}, kBool)); });
  expect_error(ErrorKind::Type, "norm", [&] { kiln::norm(random({3}, kInt64)); });
  expect_error(ErrorKind::Type, "softmax", [&] { kiln::softmax(random({3}, kInt64), 0); });
  expect_error(ErrorKind::Type, "argmax", [&] { kiln::argmax(random({3}, kBool)); });
}

// Inner, outer and non-adjacent dims of permuted, strided and sliced layouts; shapes that take
// the multi-chunk row path and the column path with partials (Note [Reduction layouts]).
TEST(Reduction, LayoutsAndPaths) {
  auto layouts = [](const Tensor& b) {
    return std::vector<Tensor>{b, b.permute({2, 0, 3, 1}), non_contiguous(b), b.transpose(0, 3),
                               b.slice(2, 1, 8, 3)};
  };
  std::vector<Tensor> xs = layouts(random({6, 7, 8, 9}, kFloat32, -2, 2, 11));
  std::vector<Tensor> ms = layouts(random({6, 7, 8, 9}, kInt32, -1, 2, 12));  // mostly zeros
  std::vector<Dims> dims = {{0}, {3}, {1}, {0, 2}, {1, 3}, {0, 3}, {0, 1, 3}, {-1, -2}};
  for (size_t k = 0; k < xs.size(); ++k) {
    const Tensor& x = xs[k];
    for (const Dims& d : dims) {
      for (bool keep : {false, true}) {
        check(kiln::sum(x, d, keep), x, d, keep, ref_sum, 1e-5, 1e-5);
        check(kiln::var(x, d, 1.0, keep), x, d, keep, [](const Group& g) { return ref_var(g, 1); }, 1e-5, 1e-5);
        check(kiln::norm(x, Scalar(2), d, keep), x, d, keep, [](const Group& g) { return ref_norm(g, 2); }, 1e-5, 1e-5);
        check(kiln::logsumexp(x, d, keep), x, d, keep, ref_logsumexp, 1e-5, 1e-5);
        check(kiln::all(ms[k], d, keep), ms[k], d, keep, [](const Group& g) {
          for (double v : g) if (v == 0) return 0.0;
          return 1.0;
        }, 0, 0);
        if (d.size() != 1) continue;
        auto [v, i] = kiln::min(x, d[0], keep);
        check(v, x, d, keep, ref_extreme<false>, 0, 0);
        check(i, x, d, keep, ref_arg<false>, 0, 0);
      }
    }
    check(kiln::argmax(x), x, std::nullopt, false, ref_arg<true>, 0, 0);
  }
  struct Big {
    Tensor x;
    Dims d;
  };
  std::vector<Big> bigs = {{random({70000, 3}), {0}},                  // column path, 7 partials
                           {random({3, 70000}), {1}},                  // row path, 3 chunks
                           {random({300, 1000}), {0}},                 // column path, 4 blocks
                           {non_contiguous(random({40000, 3})), {0, 1}},  // short strided runs
                           {random({2000, 40}).t(), {1}}};             // transposed: column path
  for (const Big& b : bigs) {
    double n = static_cast<double>(b.x.numel());
    check(kiln::sum(b.x, b.d), b.x, b.d, false, ref_sum, 1e-5, 5e-7 * n);
    check(kiln::mean(b.x, b.d), b.x, b.d, false, ref_mean, 1e-5, 1e-6);
    check(kiln::var(b.x, b.d), b.x, b.d, false, [](const Group& g) { return ref_var(g, 1); }, 1e-5, 1e-6);
    check(kiln::logsumexp(b.x, b.d), b.x, b.d, false, ref_logsumexp, 1e-5, 1e-6);
    check(std::get<0>(kiln::max(b.x, b.d[0])), b.x, Dims{b.d[0]}, false, ref_extreme<true>, 0, 0);
    check(kiln::argmin(b.x, b.d[0]), b.x, Dims{b.d[0]}, false, ref_arg<false>, 0, 0);
  }
}

// The accuracy bar: 2^24 float32 values of 0.1 within 1e-4 of the float64 sum. A
// sequential float sum misses it by far (checked below, so the bar is a real one).
TEST(Reduction, CascadeSumAccuracy) {
  const int64_t n = int64_t{1} << 24;
  Tensor x = kiln::full({n}, Scalar(0.1), kFloat32);
  const double want = static_cast<double>(n) * static_cast<double>(0.1f);
  EXPECT_NEAR(x.sum().item<float>(), want, 1e-4 * want);
  EXPECT_NEAR(x.mean().item<float>(), 0.1f, 1e-4 * 0.1);
  float naive = 0;
  for (int64_t i = 0; i < n; ++i) naive += 0.1f;
  EXPECT_GT(std::fabs(naive - want), 1e-4 * want);
  // float16 accumulates in float32 (a float16 accumulator would stop growing at 256).
  Tensor h = kiln::full({int64_t{1} << 20}, Scalar(0.1), kFloat16);
  EXPECT_NEAR(h.mean().item<float>(), static_cast<float>(Half(0.1f)), 1e-3);
  EXPECT_NEAR(h.sum(std::nullopt, false, kFloat32).item<float>(), (1 << 20) * double(float(Half(0.1f))), 1e-2);
}

// Same bits with 1 and 2 threads (Note [Deterministic reductions]).
template <typename F>
void expect_same_bits(const char* what, F f) {
  SCOPED_TRACE(what);
  int saved = get_num_threads();
  set_num_threads(1);
  Tensor a = f().contiguous();
  set_num_threads(2);
  Tensor b = f().contiguous();
  set_num_threads(saved);
  ASSERT_EQ(a.sizes(), b.sizes());
  ASSERT_EQ(a.dtype(), b.dtype());
  EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()), 0);
}

TEST(Reduction, DeterministicAcrossThreadCounts) {
  Tensor c = random({512, 4096}, kFloat32, -2, 2, 3);
  std::vector<std::pair<const char*, Tensor>> xs = {
      {"contiguous", c}, {"transposed", random({4096, 512}, kFloat32, -2, 2, 4).t()},
      {"strided", non_contiguous(c)}};
  Tensor inner = random({64, 512, 64}, kFloat32, -2, 2, 5);
  for (auto& [name, x] : xs) {
    SCOPED_TRACE(name);
    for (const std::optional<Dims>& d : {std::optional<Dims>(), std::optional<Dims>(Dims{-1}),
                                          std::optional<Dims>(Dims{0})}) {
      OptionalIntArrayRef od = opt(d);
      Dims ld = d.value_or(Dims{0, 1});
      expect_same_bits("sum", [&] { return kiln::sum(x, od); });
      expect_same_bits("mean", [&] { return kiln::mean(x, od); });
      expect_same_bits("var", [&] { return kiln::var(x, od); });
      expect_same_bits("norm", [&] { return kiln::norm(x, Scalar(2), od); });
      expect_same_bits("norm3", [&] { return kiln::norm(x, Scalar(3), od); });
      expect_same_bits("logsumexp", [&] { return kiln::logsumexp(x, ld); });
    }
    expect_same_bits("softmax last", [&] { return kiln::softmax(x, -1); });
    expect_same_bits("softmax 0", [&] { return kiln::log_softmax(x, 0); });
  }
  expect_same_bits("sum inner", [&] { return kiln::sum(inner, Dims{1}); });
  expect_same_bits("var inner", [&] { return kiln::var(inner, Dims{1}); });
  expect_same_bits("logsumexp inner", [&] { return kiln::logsumexp(inner, Dims{1}); });
  expect_same_bits("softmax inner", [&] { return kiln::softmax(inner, 1); });
  Tensor h = random({1 << 21}, kBFloat16, -2, 2, 6);
  expect_same_bits("bf16 sum", [&] { return kiln::sum(h); });
}

}  // namespace
}  // namespace kiln::testing
