// Integer edge values through every integer kernel on the CPU (See Note [Integer edge values]
// and Note [Float to integer casts] in kiln/scalar_math.h): every pair of {MIN, MIN+1, -2, -1,
// 0, 1, 2, MAX-1, MAX} per dtype, against references computed in 128-bit arithmetic, on the
// broadcast path, the contiguous (vectorized, multi-threaded) path and with a scalar operand.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "test_util.h"
#include "int_edge_values.h"

namespace kiln {
namespace {

using i128 = __int128;
using u128 = unsigned __int128;

// v modulo 2^bits of T, as T.
template <typename T>
T wrap(i128 v) {
  return static_cast<T>(static_cast<u128>(v));
}

template <typename T>
Tensor column(const std::vector<T>& v) {
  return testing::from_vector<T>(v, {static_cast<int64_t>(v.size()), 1});
}
template <typename T>
Tensor row(const std::vector<T>& v) {
  return testing::from_vector<T>(v, {1, static_cast<int64_t>(v.size())});
}

template <typename T>
std::vector<T> values_of(const Tensor& t) {
  Tensor c = t.contiguous();
  EXPECT_EQ(c.dtype(), CppTypeToScalarType<T>::value);
  const T* p = static_cast<const T*>(c.data_ptr());
  return std::vector<T>(p, p + c.numel());
}

template <typename T>
T ref_div(T a, T b, bool floor) {
  i128 q = i128(a) / i128(b);
  if (floor && i128(a) % i128(b) != 0 && ((a < 0) != (b < 0))) --q;
  return wrap<T>(q);
}
template <typename T>
T ref_mod(T a, T b, bool python) {
  return wrap<T>(i128(a) - i128(b) * i128(ref_div<i128>(a, b, python)));
}
template <typename T>
T ref_pow(T a, T b) {
  if constexpr (std::is_signed_v<T>) {
    if (b < 0) return a == 1 ? T(1) : (a == -1 ? ((b % 2) ? T(-1) : T(1)) : T(0));
  }
  u128 r = 1, base = static_cast<u128>(i128(a));
  for (u128 e = static_cast<u128>(i128(b)); e != 0; e >>= 1) {
    if (e & 1) r *= base;
    base *= base;
  }
  return wrap<T>(static_cast<i128>(r));
}

using BinaryFn = Tensor (*)(const Tensor&, const Tensor&);
template <typename T>
using BinaryRef = T (*)(T, T);

// fn over every pair of edge values (b = 0 left out when skip_zero), broadcast (n, 1) x (1, n),
// then the same pairs as long contiguous operands (the threaded, vectorized loop), then with b
// as a wrapped scalar.
template <typename T>
void check_binary(const char* name, BinaryFn fn, BinaryRef<T> ref, bool skip_zero) {
  std::vector<T> xs = testing::int_edges<T>(), ys;
  for (T y : testing::int_edges<T>())
    if (!skip_zero || y != 0) ys.push_back(y);
  std::string tag = std::string(name) + " " + scalar_type_name(CppTypeToScalarType<T>::value);
  std::vector<T> got = values_of<T>(fn(column(xs), row(ys))), want;
  for (T x : xs)
    for (T y : ys) want.push_back(ref(x, y));
  ASSERT_EQ(got.size(), want.size()) << tag;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_EQ(int64_t(got[i]), int64_t(want[i]))
        << tag << "(" << int64_t(xs[i / ys.size()]) << ", " << int64_t(ys[i % ys.size()]) << ")";

  // 100k elements cycling through the pairs: contiguous inputs, several OpenMP chunks.
  const int64_t n = 100000, pairs = static_cast<int64_t>(xs.size() * ys.size());
  std::vector<T> lx(n), ly(n);
  for (int64_t i = 0; i < n; ++i) {
    lx[i] = xs[(i % pairs) / ys.size()];
    ly[i] = ys[(i % pairs) % ys.size()];
  }
  got = values_of<T>(fn(testing::from_vector<T>(lx, {n}), testing::from_vector<T>(ly, {n})));
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad += got[i] != want[i % pairs];
  EXPECT_EQ(bad, 0) << tag << " contiguous";

  for (T y : ys) {
    Tensor s = scalar_to_tensor(Scalar(int64_t(y)));
    if (fn == static_cast<BinaryFn>(pow) && int64_t(y) < 0) {  // a negative scalar power: refused
      EXPECT_THROW(fn(column(xs), s), Error) << tag;
      continue;
    }
    std::vector<T> col = values_of<T>(fn(column(xs), s));
    for (size_t i = 0; i < xs.size(); ++i)
      EXPECT_EQ(int64_t(col[i]), int64_t(ref(xs[i], y))) << tag << " scalar " << int64_t(y);
  }
}

Tensor div_trunc(const Tensor& a, const Tensor& b) { return div(a, b, "trunc"); }
Tensor div_floor(const Tensor& a, const Tensor& b) { return div(a, b, "floor"); }
Tensor add_alpha(const Tensor& a, const Tensor& b) { return add(a, b, 3); }
Tensor sub_one(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor sub_alpha(const Tensor& a, const Tensor& b) { return sub(a, b, -1); }
Tensor add_one(const Tensor& a, const Tensor& b) { return add(a, b); }

template <typename T>
void check_all_binary() {
  check_binary<T>("add", add_one, [](T a, T b) { return wrap<T>(i128(a) + b); }, false);
  check_binary<T>("add(alpha=3)", add_alpha, [](T a, T b) { return wrap<T>(i128(a) + 3 * i128(b)); }, false);
  check_binary<T>("sub", sub_one, [](T a, T b) { return wrap<T>(i128(a) - b); }, false);
  check_binary<T>("sub(alpha=-1)", sub_alpha, [](T a, T b) { return wrap<T>(i128(a) + b); }, false);
  check_binary<T>("mul", mul, [](T a, T b) { return wrap<T>(i128(a) * b); }, false);
  check_binary<T>("div(trunc)", div_trunc, [](T a, T b) { return ref_div(a, b, false); }, true);
  check_binary<T>("div(floor)", div_floor, [](T a, T b) { return ref_div(a, b, true); }, true);
  check_binary<T>("fmod", fmod, [](T a, T b) { return ref_mod(a, b, false); }, true);
  check_binary<T>("remainder", remainder, [](T a, T b) { return ref_mod(a, b, true); }, true);
  check_binary<T>("pow", pow, ref_pow<T>, false);
  check_binary<T>("maximum", maximum, [](T a, T b) { return a < b ? b : a; }, false);
  check_binary<T>("minimum", minimum, [](T a, T b) { return b < a ? b : a; }, false);
}

TEST(IntEdges, BinaryInt8) { check_all_binary<int8_t>(); }
TEST(IntEdges, BinaryInt16) { check_all_binary<int16_t>(); }
TEST(IntEdges, BinaryInt32) { check_all_binary<int32_t>(); }
TEST(IntEdges, BinaryInt64) { check_all_binary<int64_t>(); }
TEST(IntEdges, BinaryUInt8) { check_all_binary<uint8_t>(); }

template <typename T>
void check_all_unary() {
  std::vector<T> xs = testing::int_edges<T>();
  Tensor x = testing::from_vector<T>(xs, {static_cast<int64_t>(xs.size())});
  std::vector<T> ng = values_of<T>(neg(x)), ab = values_of<T>(abs(x)), sg = values_of<T>(sign(x));
  for (size_t i = 0; i < xs.size(); ++i) {
    i128 v = xs[i];
    EXPECT_EQ(int64_t(ng[i]), int64_t(wrap<T>(-v))) << "neg " << int64_t(xs[i]);
    EXPECT_EQ(int64_t(ab[i]), int64_t(wrap<T>(v < 0 ? -v : v))) << "abs " << int64_t(xs[i]);
    EXPECT_EQ(int64_t(sg[i]), int64_t((v > 0) - (v < 0))) << "sign " << int64_t(xs[i]);
  }
}

TEST(IntEdges, UnaryNegAbsSign) {
  check_all_unary<int8_t>();
  check_all_unary<int16_t>();
  check_all_unary<int32_t>();
  check_all_unary<int64_t>();
  check_all_unary<uint8_t>();
}

// The probe's reproduction: INT_MIN // -1 (and %, fmod, trunc) must wrap, not trap.
template <typename T>
void check_min_by_minus_one() {
  constexpr T lo = std::numeric_limits<T>::lowest();
  Tensor x = testing::from_vector<T>({lo, lo, lo}, {3});
  Tensor m1 = scalar_to_tensor(Scalar(int64_t{-1}));
  const std::vector<T> mins{lo, lo, lo}, zero{0, 0, 0};
  EXPECT_EQ(values_of<T>(div(x, m1, "floor")), mins);
  EXPECT_EQ(values_of<T>(div(x, m1, "trunc")), mins);
  EXPECT_EQ(values_of<T>(remainder(x, m1)), zero);
  EXPECT_EQ(values_of<T>(fmod(x, m1)), zero);
  EXPECT_EQ(values_of<T>(neg(x)), mins);
  EXPECT_EQ(values_of<T>(abs(x)), mins);
}
TEST(IntEdges, MinByMinusOneDoesNotTrap) {
  check_min_by_minus_one<int32_t>();
  check_min_by_minus_one<int64_t>();
}

TEST(IntEdges, DivisionByZeroRaises) {
  for (ScalarType t : {kUInt8, kInt8, kInt16, kInt32, kInt64}) {
    Tensor x = full({4}, 7, t), z = zeros({4}, t);
    EXPECT_THROW(div(x, z, "floor"), Error) << t;
    EXPECT_THROW(div(x, z, "trunc"), Error) << t;
    EXPECT_THROW(remainder(x, z), Error) << t;
    EXPECT_THROW(fmod(x, scalar_to_tensor(Scalar(int64_t{0}))), Error) << t;
    try {
      div(x, z, "floor");
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("ZeroDivisionError"), std::string::npos) << e.what();
    }
  }
}

TEST(IntEdges, NegativeScalarPowerOfIntegersIsRefused) {
  Tensor x = testing::from_vector<int64_t>({2, 3}, {2});
  try {
    pow(x, scalar_to_tensor(Scalar(int64_t{-1})));
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Value);
    EXPECT_NE(std::string(e.what()).find("negative integer powers"), std::string::npos) << e.what();
  }
  // An exponent tensor follows the element rule; a float base or exponent is ordinary pow.
  EXPECT_EQ(values_of<int64_t>(pow(x, testing::from_vector<int64_t>({-1, -1}, {2}))),
            (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(values_of<int64_t>(pow(x, scalar_to_tensor(Scalar(int64_t{0})))), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(values_of<float>(pow(x.to(kFloat32), scalar_to_tensor(Scalar(int64_t{-1})))),
            (std::vector<float>{0.5f, 1.0f / 3}));
}

// Sums, products and running sums of integers wrap like the pointwise ops.
TEST(IntEdges, ReductionsWrap) {
  constexpr int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
  Tensor a = testing::from_vector<int64_t>({hi, 1}, {2});
  EXPECT_EQ(sum(a).item<int64_t>(), lo);
  EXPECT_EQ(prod(testing::from_vector<int64_t>({int64_t{1} << 62, 4}, {2})).item<int64_t>(), 0);
  EXPECT_EQ(values_of<int64_t>(cumsum(a, 0)), (std::vector<int64_t>{hi, lo}));
  EXPECT_EQ(values_of<int64_t>(cumprod(testing::from_vector<int64_t>({lo, -1}, {2}), 0)),
            (std::vector<int64_t>{lo, lo}));
  // int32 sums accumulate (and return) int64, as in PyTorch.
  Tensor b = testing::from_vector<int32_t>({std::numeric_limits<int32_t>::max(), 1}, {2});
  EXPECT_EQ(sum(b).item<int64_t>(), int64_t{1} << 31);
}

// Truncate, saturate, NaN -> 0, for copies, fills and scalars
// (See Note [Float to integer casts] in kiln/scalar_math.h).
template <typename T>
void check_casts() {
  constexpr T lo = std::numeric_limits<T>::lowest(), hi = std::numeric_limits<T>::max();
  const double nan = std::nan(""), inf = INFINITY;
  std::vector<double> in{nan, inf, -inf, 1e30, -1e30, 9223372036854775808.0, -9223372036854775808.0,
                         2147483648.0, -2147483649.0, 300.5, -300.5, 127.9, -128.9, -0.9, 0.99, 42.7};
  auto saturate = [&](double v) -> T {
    if (std::isnan(v)) return 0;
    if (v <= double(lo)) return lo;
    if (v >= double(hi)) return hi;
    return static_cast<T>(std::trunc(v));
  };
  std::vector<T> want;
  for (double v : in) want.push_back(saturate(v));
  const ScalarType t = CppTypeToScalarType<T>::value;
  Tensor d = testing::from_vector<double>(in, {static_cast<int64_t>(in.size())});
  std::string tag = scalar_type_name(t);
  EXPECT_EQ(values_of<T>(d.to(t)), want) << tag << " from float64";
  EXPECT_EQ(values_of<T>(d.to(kFloat32).to(t)), values_of<T>(d.to(kFloat32).to(kFloat64).to(t)))
      << tag << " from float32";
  EXPECT_EQ(values_of<T>(testing::non_contiguous(d.view({4, 4})).to(t).view({16})), want) << tag << " strided";
  // A Scalar that does not fit is an error, as in PyTorch; one that fits truncates.
  for (size_t i = 0; i < in.size(); ++i) {
    const bool fits = !std::isnan(in[i]) && in[i] >= double(lo) && in[i] <= double(hi);
    if (fits) {
      EXPECT_EQ(int64_t(Scalar(in[i]).to<T>()), int64_t(want[i])) << tag << " Scalar " << in[i];
      EXPECT_EQ(int64_t(values_of<T>(full({1}, in[i], t))[0]), int64_t(want[i])) << tag << " fill " << in[i];
      continue;
    }
    try {
      full({1}, in[i], t);
      ADD_FAILURE() << tag << " fill " << in[i] << " did not raise";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("without overflow"), std::string::npos) << e.what();
    }
  }
  if constexpr (sizeof(T) < 8) {
    EXPECT_THROW(full({1}, Scalar(int64_t(hi) + 1), t), Error) << tag;
  }
  if constexpr (std::is_unsigned_v<T>) {
    EXPECT_EQ(values_of<T>(full({1}, Scalar(int64_t{-1}), t))[0], hi) << tag;  // -1 is 255
  }
  // float16 and bfloat16 sources: inf and their largest finite values.
  Tensor h = testing::from_vector<double>({inf, -inf, 65504, -65504, nan}, {5});
  std::vector<T> hw{hi, lo, saturate(65504), saturate(-65504), 0};
  EXPECT_EQ(values_of<T>(h.to(kFloat16).to(t)), hw) << tag << " from float16";
  EXPECT_EQ(values_of<T>(h.to(kBFloat16).to(t))[0], hi) << tag << " from bfloat16";
}

TEST(IntEdges, FloatToIntegerCastsSaturate) {
  check_casts<uint8_t>();
  check_casts<int8_t>();
  check_casts<int16_t>();
  check_casts<int32_t>();
  check_casts<int64_t>();
}

}  // namespace
}  // namespace kiln
