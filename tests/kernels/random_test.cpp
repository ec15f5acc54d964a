// Random ops (tensor/ops/random.toml): Philox known answers, the counter layout against a naive
// reference, determinism across thread counts and generators, statistics, dtypes, layouts,
// zero-size and bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "test_util.h"

namespace kiln {
namespace {

using Sizes = std::vector<int64_t>;

// Restores the thread count a test changed.
struct ThreadGuard {
  int saved = get_num_threads();
  ~ThreadGuard() { set_num_threads(saved); }
};

bool bit_equal(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype()) return false;
  Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

struct Moments {
  double mean = 0, var = 0, lo = 0, hi = 0;
};
Moments moments(const Tensor& t) {
  auto v = testing::to_doubles(t);
  Moments m;
  m.lo = *std::min_element(v.begin(), v.end());
  m.hi = *std::max_element(v.begin(), v.end());
  for (double x : v) m.mean += x;
  m.mean /= static_cast<double>(v.size());
  for (double x : v) m.var += (x - m.mean) * (x - m.mean);
  m.var /= static_cast<double>(v.size() - 1);
  return m;
}

// ---- Philox --------------------------------------------------------------------------------

TEST(Random, PhiloxKnownAnswers) {
  // Random123 kat_vectors, "philox4x32 10": counter[4] key[2] -> output[4].
  struct Kat {
    uint32_t c[4], k[2], want[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats) {
    auto got = philox4x32_10(k.c[0], k.c[1], k.c[2], k.c[3], k.k[0], k.k[1]);
    for (int j = 0; j < 4; ++j) EXPECT_EQ(got[j], k.want[j]) << "word " << j;
  }
  // The 64-bit entry point is the 128-bit one with c2 = c3 = 0 and key = (lo, hi) of the seed.
  auto a = philox4x32(0x299f31d0a4093822ull, 0x85a308d3243f6a88ull);
  auto b = philox4x32_10(0x243f6a88, 0x85a308d3, 0, 0, 0xa4093822, 0x299f31d0);
  EXPECT_EQ(a, b);
  auto z = philox4x32(0, 0);
  EXPECT_EQ(z[0], 0x6627e8d5u);
}

// ---- The counter layout against a naive reference ------------------------------------------

TEST(Random, RandFloat32FollowsTheLayout) {
  Generator g(123);
  g.reserve(5);  // a nonzero offset
  Tensor t = rand({3, 7}, g);
  auto v = testing::to_doubles(t);
  for (int64_t i = 0; i < 21; ++i) {
    uint32_t w = philox4x32(123, 5 + i / 4)[i % 4];
    EXPECT_EQ(v[i], double(w >> 8) / 16777216.0) << i;
  }
  EXPECT_EQ(g.get_state().offset, 5u + 6u);  // ceil(21 / 4)
}

TEST(Random, RandFloat64AndRandintFollowTheLayout) {
  Generator g(9);
  Tensor d = rand({5}, g, kFloat64);
  Tensor r = randint(-3, 1000003, {5}, g);
  auto dv = testing::to_doubles(d), rv = testing::to_doubles(r);
  for (int64_t i = 0; i < 5; ++i) {
    auto blk = philox4x32(9, i / 2);
    uint64_t w = (uint64_t(blk[2 * (i % 2)]) << 32) | blk[2 * (i % 2) + 1];
    EXPECT_EQ(dv[i], double(w >> 11) / 9007199254740992.0) << i;
    auto blk2 = philox4x32(9, 3 + i / 2);  // rand reserved ceil(5 / 2) = 3 counters
    uint64_t w2 = (uint64_t(blk2[2 * (i % 2)]) << 32) | blk2[2 * (i % 2) + 1];
    long double frac = static_cast<long double>(w2) / 18446744073709551616.0L;
    int64_t want = -3 + static_cast<int64_t>(frac * 1000006.0L);
    EXPECT_EQ(static_cast<int64_t>(rv[i]), want) << i;
  }
}

TEST(Random, RandnMatchesBoxMullerReference) {
  Generator g(77);
  Tensor t = randn({11}, g, kFloat64);
  Tensor f = randn({11}, g);
  auto v = testing::to_doubles(t), fv = testing::to_doubles(f);
  for (int64_t i = 0; i < 11; ++i) {
    int64_t pair = i & ~int64_t{1};
    auto word = [&](int64_t e) {
      auto blk = philox4x32(77, e / 2);
      return (uint64_t(blk[2 * (e % 2)]) << 32) | blk[2 * (e % 2) + 1];
    };
    double u0 = double(word(pair) >> 11) / 9007199254740992.0;
    double u1 = double(word(pair + 1) >> 11) / 9007199254740992.0;
    double r = std::sqrt(-2 * std::log(1 - u0)), th = 2 * M_PI * u1;
    EXPECT_NEAR(v[i], i % 2 == 0 ? r * std::cos(th) : r * std::sin(th), 1e-12) << i;
    // float32: 32-bit words, 4 per counter, after the 6 counters of the float64 call.
    auto fw = [&](int64_t e) { return double(philox4x32(77, 6 + e / 4)[e % 4] >> 8) / 16777216.0; };
    double f0 = fw(pair), f1 = fw(pair + 1);
    double fr = std::sqrt(-2 * std::log(1 - f0)), fth = 2 * M_PI * f1;
    EXPECT_NEAR(fv[i], i % 2 == 0 ? fr * std::cos(fth) : fr * std::sin(fth), 1e-5) << i;
  }
}

TEST(Random, RandpermMatchesFisherYatesReference) {
  Generator g(31);
  Tensor p = randperm(50, g);
  std::vector<int64_t> want(50);
  std::iota(want.begin(), want.end(), 0);
  for (int64_t i = 49; i >= 1; --i) {
    auto blk = philox4x32(31, i / 2);
    uint64_t w = (uint64_t(blk[2 * (i % 2)]) << 32) | blk[2 * (i % 2) + 1];
    auto j = static_cast<int64_t>((static_cast<unsigned __int128>(w) * uint64_t(i + 1)) >> 64);
    std::swap(want[i], want[j]);
  }
  auto got = testing::to_doubles(p);
  for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(static_cast<int64_t>(got[i]), want[i]) << i;
}

// ---- Determinism ---------------------------------------------------------------------------

// Every op, twice under the same seed: once single-threaded and once with 2 threads. The
// sizes span several parallel chunks.
std::vector<Tensor> run_all_ops(uint64_t seed) {
  manual_seed(seed);
  std::vector<Tensor> out;
  const int64_t n = 300001;
  for (ScalarType t : {kFloat32, kFloat64, kBFloat16, kFloat16}) {
    out.push_back(rand({n}, std::nullopt, t));
    out.push_back(randn({n}, std::nullopt, t));
    out.push_back(empty({n}, t).uniform_(-2, 3));
    out.push_back(testing::non_contiguous(empty({n / 3, 3}, t)).normal_(1, 2));
    out.push_back(bernoulli(full({n}, 0.3, t)));
  }
  out.push_back(randint(-100, 100, {n}));
  out.push_back(randint(0, 7, {n}, std::nullopt, kInt16));
  out.push_back(randperm(n));
  return out;
}

TEST(Random, BitIdenticalAcrossThreadCounts) {
  ThreadGuard guard;
  set_num_threads(1);
  auto one = run_all_ops(2024);
  set_num_threads(2);
  auto two = run_all_ops(2024);
  ASSERT_EQ(one.size(), two.size());
  for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(bit_equal(one[i], two[i])) << "op " << i;
}

TEST(Random, ManualSeedReproduces) {
  auto a = run_all_ops(5);
  auto b = run_all_ops(5);
  auto c = run_all_ops(6);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(bit_equal(a[i], b[i])) << "op " << i;
    EXPECT_FALSE(bit_equal(a[i], c[i])) << "op " << i;
  }
}

TEST(Random, GeneratorsWithTheSameSeedAgreeAndCallsDiffer) {
  Generator g1(42), g2(42);
  Tensor a = randn({1000}, g1), b = randn({1000}, g2);
  EXPECT_TRUE(bit_equal(a, b));
  Tensor a2 = randn({1000}, g1);
  EXPECT_FALSE(bit_equal(a, a2));
  EXPECT_EQ(g1.get_state().offset, 2 * random_op_counters("randn", 1000, kFloat32));
  EXPECT_EQ(g1.get_state().offset, 500u);
  // An explicit generator leaves the default one alone.
  manual_seed(1);
  randn({10}, g1);
  EXPECT_EQ(default_generator().get_state().offset, 0u);
  // set_state rewinds.
  g2.set_state({42, 0});
  EXPECT_TRUE(bit_equal(randn({1000}, g2), a));
  EXPECT_TRUE(bit_equal(randn({1000}, g2), a2));
}

TEST(Random, OffsetAdvancesByTheDocumentedCounts) {
  Generator g(0);
  auto step = [&](auto&& fn) {
    uint64_t before = g.get_state().offset;
    fn();
    return g.get_state().offset - before;
  };
  EXPECT_EQ(step([&] { rand({9}, g); }), 3u);
  EXPECT_EQ(step([&] { rand({9}, g, kFloat64); }), 5u);
  EXPECT_EQ(step([&] { randn({9}, g, kFloat16); }), 3u);
  EXPECT_EQ(step([&] { randint(0, 3, {9}, g, kInt8); }), 5u);
  EXPECT_EQ(step([&] { randperm(9, g); }), 5u);
  EXPECT_EQ(step([&] { bernoulli(full({9}, 0.5), g); }), 3u);
  EXPECT_EQ(step([&] { rand({0}, g); }), 0u);
}

// ---- Statistics (1e6 samples; bounds are 6 standard errors) --------------------------------

constexpr int64_t kN = 1000000;

TEST(Random, UniformStatistics) {
  manual_seed(11);
  for (ScalarType t : testing::dtypes_of_set("floating")) {
    SCOPED_TRACE(scalar_type_name(t));
    Moments m = moments(rand({kN}, std::nullopt, t));
    EXPECT_GE(m.lo, 0.0);
    EXPECT_LT(m.hi, 1.0);
    // Uniforms are k / 2^digits (Note [Random transforms]): mean 1/2 - 2^-(digits + 1).
    int digits = t == kBFloat16 ? 8 : t == kFloat16 ? 11 : t == kFloat32 ? 24 : 53;
    EXPECT_NEAR(m.mean, 0.5 - std::ldexp(1.0, -(digits + 1)), 6 * std::sqrt(1.0 / 12 / kN));
    EXPECT_NEAR(m.var, 1.0 / 12, 0.002);
    Tensor u = empty({kN}, t).uniform_(-3, 5);
    Moments mu = moments(u);
    EXPECT_GE(mu.lo, -3.0);
    EXPECT_LT(mu.hi, 5.0);
    EXPECT_NEAR(mu.mean, 1.0, 6 * 8 * std::sqrt(1.0 / 12 / kN) + (t == kBFloat16 ? 0.02 : 0));
    EXPECT_NEAR(mu.var, 64.0 / 12, 64.0 * 0.002 + (t == kBFloat16 ? 0.05 : 0));
  }
}

TEST(Random, NormalStatistics) {
  manual_seed(12);
  for (ScalarType t : testing::dtypes_of_set("floating")) {
    SCOPED_TRACE(scalar_type_name(t));
    double tol_dtype = t == kBFloat16 ? 0.01 : 0;
    Moments m = moments(randn({kN}, std::nullopt, t));
    EXPECT_NEAR(m.mean, 0.0, 6 / std::sqrt(double(kN)) + tol_dtype);
    EXPECT_NEAR(m.var, 1.0, 6 * std::sqrt(2.0 / kN) + tol_dtype);
    Moments mn = moments(empty({kN}, t).normal_(3, 0.5));
    EXPECT_NEAR(mn.mean, 3.0, 6 * 0.5 / std::sqrt(double(kN)) + tol_dtype * 3);
    EXPECT_NEAR(mn.var, 0.25, 6 * 0.25 * std::sqrt(2.0 / kN) + tol_dtype);
  }
  // std = 0 gives the mean exactly.
  Moments z = moments(empty({100}).normal_(1.5, 0));
  EXPECT_EQ(z.lo, 1.5);
  EXPECT_EQ(z.hi, 1.5);
}

TEST(Random, RandintStatisticsAndDtypes) {
  manual_seed(13);
  for (ScalarType t : testing::dtypes_of_set("numeric")) {
    SCOPED_TRACE(scalar_type_name(t));
    int64_t lo = t == kUInt8 ? 3 : -7, hi = 20;
    Tensor r = randint(lo, hi, {kN}, std::nullopt, t);
    EXPECT_EQ(r.dtype(), t);
    Moments m = moments(r);
    EXPECT_EQ(m.lo, double(lo));
    EXPECT_EQ(m.hi, double(hi - 1));
    double range = double(hi - lo), var = (range * range - 1) / 12;
    EXPECT_NEAR(m.mean, (lo + hi - 1) / 2.0, 6 * std::sqrt(var / kN));
    EXPECT_NEAR(m.var, var, 0.01 * var);
  }
  EXPECT_EQ(randint(0, 5, {3}).dtype(), kInt64);
  // Extreme int64 range: no overflow.
  Tensor big = randint(std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), {1000});
  auto v = big.contiguous();
  const int64_t* p = v.data_ptr<int64_t>();
  EXPECT_TRUE(std::any_of(p, p + 1000, [](int64_t x) { return x < 0; }));
  EXPECT_TRUE(std::any_of(p, p + 1000, [](int64_t x) { return x > 0; }));
}

TEST(Random, BernoulliFrequency) {
  manual_seed(14);
  for (ScalarType t : testing::dtypes_of_set("floating")) {
    SCOPED_TRACE(scalar_type_name(t));
    for (double p : {0.0, 0.25, 0.5, 1.0}) {
      Tensor b = bernoulli(full({kN}, p, t));
      EXPECT_EQ(b.dtype(), t);
      Moments m = moments(b);
      EXPECT_GE(m.lo, 0.0);
      EXPECT_LE(m.hi, 1.0);
      EXPECT_NEAR(m.mean, p, 6 * std::sqrt(p * (1 - p) / kN) + 1e-12);
    }
  }
  // Per-element probabilities: a 0/1 pattern comes back exactly.
  Tensor p = testing::from_vector<double>({0, 1, 1, 0, 1, 0}, {2, 3});
  testing::expect_close(bernoulli(p), p);
  testing::expect_close(bernoulli(testing::non_contiguous(p)), p);
}

TEST(Random, RandpermIsAPermutation) {
  manual_seed(15);
  for (ScalarType t : testing::dtypes_of_set("numeric")) {
    SCOPED_TRACE(scalar_type_name(t));
    int64_t n = t == kInt8 ? 128 : (t == kUInt8 || t == kBFloat16 ? 256 : 1000);
    Tensor p = randperm(n, std::nullopt, t);
    EXPECT_EQ(p.dtype(), t);
    auto v = testing::to_doubles(p);
    std::sort(v.begin(), v.end());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(v[i], double(i));
  }
  // Position 0 is uniform over 0..9 (chi-square, 9 degrees of freedom, far tail at 40).
  Generator g(99);
  std::vector<int64_t> counts(10, 0);
  for (int k = 0; k < 20000; ++k) counts[randperm(10, g).select(0, 0).item<int64_t>()]++;
  double chi2 = 0;
  for (int64_t c : counts) chi2 += (c - 2000.0) * (c - 2000.0) / 2000.0;
  EXPECT_LT(chi2, 40.0);
  EXPECT_EQ(randperm(1).item<int64_t>(), 0);
}

// ---- Layouts, zero-size, bad input ---------------------------------------------------------

TEST(Random, InPlaceOpsOnNonContiguousSelf) {
  for (ScalarType t : testing::dtypes_of_set("floating")) {
    SCOPED_TRACE(scalar_type_name(t));
    Tensor base = full({4, 6}, -9.0, t);
    Tensor view = base.slice(1, 0, std::nullopt, 2);  // (4, 3), every other column
    ASSERT_FALSE(view.is_contiguous());
    Generator g1(8), g2(8);
    view.normal_(0, 1, g1);
    Tensor want = empty({4, 3}, t).normal_(0, 1, g2);  // element i in row-major order
    EXPECT_TRUE(bit_equal(view, want));
    view.uniform_(2, 3, g1);
    EXPECT_TRUE(bit_equal(view, empty({4, 3}, t).uniform_(2, 3, g2)));
    // The skipped columns are untouched.
    auto gaps = testing::to_doubles(base.slice(1, 1, std::nullopt, 2));
    for (double x : gaps) EXPECT_EQ(x, -9.0);
    Tensor tr = empty({3, 4}, t).t();
    Generator g3(8);
    tr.uniform_(2, 3, g3);
    Generator g4(8);
    EXPECT_TRUE(bit_equal(tr, empty({4, 3}, t).uniform_(2, 3, g4)));
  }
}

TEST(Random, ZeroSize) {
  Generator g(1);
  EXPECT_EQ(rand({0, 3}, g).numel(), 0);
  EXPECT_EQ(randn({2, 0}, g).sizes(), IntArrayRef({2, 0}));
  EXPECT_EQ(randint(0, 2, {0}, g).numel(), 0);
  EXPECT_EQ(empty({0}).normal_(0, 1, g).numel(), 0);
  EXPECT_EQ(empty({0, 2}).uniform_(0, 1, g).numel(), 0);
  EXPECT_EQ(bernoulli(empty({0}), g).numel(), 0);
  EXPECT_EQ(randperm(0, g).numel(), 0);
  EXPECT_EQ(g.get_state().offset, 0u);
  // 0-dim tensors are one element.
  EXPECT_EQ(rand({}, g).dim(), 0);
  EXPECT_EQ(g.get_state().offset, 1u);
}

TEST(Random, BadInput) {
  using testing::expect_error;
  expect_error(ErrorKind::Value, "rand: negative dimension", [] { rand({2, -1}); });
  expect_error(ErrorKind::Value, "randn: negative dimension", [] { randn({-3}); });
  expect_error(ErrorKind::Type, "rand: expected a floating dtype", [] { rand({2}, std::nullopt, kInt32); });
  expect_error(ErrorKind::Value, "randint: expected low < high", [] { randint(5, 5, {2}); });
  expect_error(ErrorKind::Value, "randint: expected low < high", [] { randint(6, 2, {2}); });
  expect_error(ErrorKind::Value, "does not fit in dtype", [] { randint(0, 300, {2}, std::nullopt, kUInt8); });
  expect_error(ErrorKind::Value, "does not fit in dtype", [] { randint(-1, 3, {2}, std::nullopt, kUInt8); });
  expect_error(ErrorKind::Value, "normal_: expected std >= 0.0", [] { empty({2}).normal_(0, -1); });
  expect_error(ErrorKind::Type, "normal_: expected a floating dtype", [] { empty({2}, kInt64).normal_(); });
  expect_error(ErrorKind::Value, "uniform_: expected a [from, to) range", [] { empty({2}).uniform_(2, 1); });
  expect_error(ErrorKind::Value, "bernoulli: expected all probabilities in [0, 1]",
               [] { bernoulli(testing::from_vector<float>({0.5f, 1.5f}, {2})); });
  expect_error(ErrorKind::Value, "bernoulli: expected all probabilities in [0, 1]",
               [] { bernoulli(testing::from_vector<double>({-0.1}, {1})); });
  expect_error(ErrorKind::Value, "bernoulli: expected all probabilities in [0, 1]",
               [] { bernoulli(testing::from_vector<float>({NAN}, {1})); });
  expect_error(ErrorKind::Type, "bernoulli: expected a floating dtype",
               [] { bernoulli(testing::from_vector<int64_t>({1}, {1})); });
  expect_error(ErrorKind::Value, "randperm: n must be non-negative", [] { randperm(-1); });
  expect_error(ErrorKind::Value, "too large for dtype", [] { randperm(300, std::nullopt, kInt8); });
  // A failed call reserves nothing.
  Generator g(3);
  expect_error(ErrorKind::Value, "bernoulli", [&] { bernoulli(full({4}, 2.0), g); });
  expect_error(ErrorKind::Value, "normal_", [&] { empty({4}).normal_(0, -2, g); });
  EXPECT_EQ(g.get_state().offset, 0u);
}

TEST(Random, MetaTensorsShapeOnly) {
  Tensor m = rand({2, 3}, std::nullopt, kFloat64, Device("meta"));
  EXPECT_TRUE(m.is_meta());
  EXPECT_EQ(m.dtype(), kFloat64);
  Tensor x = empty({4}, std::nullopt, Device("meta"));
  EXPECT_TRUE(x.normal_().is_same(x));
  EXPECT_EQ(randperm(5, std::nullopt, std::nullopt, Device("meta")).sizes(), IntArrayRef({5}));
}

}  // namespace
}  // namespace kiln
