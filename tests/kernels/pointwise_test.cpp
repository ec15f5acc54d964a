// Tests of the pointwise ops (tensor/ops/pointwise.toml, unary.toml) on the CPU against naive
// std:: references in double: every dtype of each row, non-contiguous, broadcast, 0-dim,
// zero-size and large (parallel) inputs, in-place and out= variants, type promotion and errors.
#include <cmath>
#include <functional>

#include "../../kernels/cpu/vec_math.h"
#include "kiln/operators.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

using UFn = std::function<Tensor(const Tensor&)>;
using UOut = std::function<Tensor(const Tensor&, const Tensor&)>;
using Ref1 = std::function<double(double)>;

enum class Res { Same, Float, Bool };  // result dtype: input's, default float, bool

ScalarType result_of(Res r, ScalarType in) {
  if (r == Res::Bool) return kBool;
  if (r == Res::Float) return is_floating(in) ? in : kFloat32;
  return in;
}

// Expected values of `ref` applied to `x`, as a tensor of dtype `out` (bool: nonzero).
Tensor expected1(const Tensor& x, const Ref1& ref) {
  auto v = to_doubles(x);
  for (double& d : v) d = ref(d);
  return from_vector<double>(v, x.sizes());
}

// Wraps each value to the range of integer dtype `t` (modular, as C++20 conversions are).
#define KILN_DISPATCH_INT_TYPES_CASES_WRAP(t, v)                                   \
  KILN_DISPATCH_NUMERIC_TYPES(t, "wrap", [&] {                                    \
    for (double& d : v) d = static_cast<double>(static_cast<scalar_t>(static_cast<int64_t>(d))); \
  })

void check_values(const Tensor& got, const Tensor& want_f64, ScalarType dtype, double tol_scale = 1) {
  ASSERT_EQ(got.dtype(), dtype);
  Tensor want = want_f64;
  if (dtype == kBool) want = want_f64.ne(scalar_to_tensor(Scalar(0)));
  if (is_floating(dtype)) want = want_f64.to(dtype);  // the correctly rounded result (overflow: inf)
  if (is_integral(dtype)) {  // integer results wrap around like the kernels' arithmetic
    auto v = to_doubles(want_f64);
    KILN_DISPATCH_INT_TYPES_CASES_WRAP(dtype, v);
    want = from_vector<double>(v, want_f64.sizes());
  }
  double rtol = rtol_for(dtype) * tol_scale;
  expect_close(got, want, rtol, is_floating(dtype) ? rtol : 1e-9);
}

struct UnaryCase {
  const char* name;
  UFn fn, inplace;
  UOut out;
  Ref1 ref;
  const char* dtypes;
  Res res;
  double lo, hi;
};

#define UCASE(NAME, REF, DTYPES, RES, LO, HI)                                              \
  UnaryCase {                                                                             \
    #NAME, [](const Tensor& x) { return NAME(x); }, [](const Tensor& x) { return x.NAME##_(); }, \
        [](const Tensor& o, const Tensor& x) { return NAME##_out(o, x); }, REF, DTYPES, RES, LO, HI \
  }

double ref_sign(double a) { return (0 < a) - (a < 0); }

std::vector<UnaryCase> unary_cases() {
  return {
      UCASE(neg, [](double a) { return -a; }, "numeric", Res::Same, -5, 5),
      UCASE(abs, [](double a) { return std::fabs(a); }, "numeric", Res::Same, -5, 5),
      UCASE(exp, [](double a) { return std::exp(a); }, "all", Res::Float, -5, 5),
      UCASE(log, [](double a) { return std::log(a); }, "all", Res::Float, 1, 9),
      UCASE(log1p, [](double a) { return std::log1p(a); }, "all", Res::Float, 0, 5),
      UCASE(expm1, [](double a) { return std::expm1(a); }, "all", Res::Float, -3, 3),
      UCASE(sqrt, [](double a) { return std::sqrt(a); }, "all", Res::Float, 0, 9),
      UCASE(rsqrt, [](double a) { return 1 / std::sqrt(a); }, "all", Res::Float, 1, 9),
      UCASE(sin, [](double a) { return std::sin(a); }, "all", Res::Float, -4, 4),
      UCASE(cos, [](double a) { return std::cos(a); }, "all", Res::Float, -4, 4),
      UCASE(tanh, [](double a) { return std::tanh(a); }, "all", Res::Float, -4, 4),
      UCASE(sigmoid, [](double a) { return 1 / (1 + std::exp(-a)); }, "all", Res::Float, -6, 6),
      UCASE(relu, [](double a) { return a < 0 ? 0 : a; }, "numeric", Res::Same, -5, 5),
      UCASE(silu, [](double a) { return a / (1 + std::exp(-a)); }, "floating", Res::Same, -6, 6),
      UCASE(erf, [](double a) { return std::erf(a); }, "all", Res::Float, -3, 3),
      UCASE(floor, [](double a) { return std::floor(a); }, "numeric", Res::Same, -5, 5),
      UCASE(ceil, [](double a) { return std::ceil(a); }, "numeric", Res::Same, -5, 5),
      UCASE(round, [](double a) { return std::nearbyint(a); }, "numeric", Res::Same, -5, 5),
      UCASE(sign, ref_sign, "all", Res::Same, -5, 5),
      UCASE(reciprocal, [](double a) { return 1 / a; }, "all", Res::Float, 1, 9),
      UCASE(logical_not, [](double a) { return a == 0; }, "all", Res::Bool, -2, 2),
  };
}

TEST(PointwiseUnary, EveryDtypeAgainstReference) {
  for (const auto& c : unary_cases()) {
    for (ScalarType dt : dtypes_of_set(c.dtypes)) {
      SCOPED_TRACE(std::string(c.name) + " " + scalar_type_name(dt));
      Tensor x = random({7, 5}, dt, c.lo, c.hi);
      ScalarType rt = result_of(c.res, dt);
      check_values(c.fn(x), expected1(x, c.ref), rt);
      check_values(c.fn(non_contiguous(x)), expected1(x, c.ref), rt);
      check_values(c.fn(x.select(0, 2).select(0, 1)), expected1(x.select(0, 2).select(0, 1), c.ref), rt);
      Tensor z = c.fn(random({0, 3}, dt));
      EXPECT_EQ(z.sizes(), IntArrayRef({0, 3}));
      EXPECT_EQ(z.dtype(), rt);
    }
  }
}

TEST(PointwiseUnary, InplaceAndOut) {
  for (const auto& c : unary_cases()) {
    SCOPED_TRACE(c.name);
    Tensor x = random({4, 6}, kFloat32, c.lo, c.hi);
    Tensor want = c.fn(x);
    // In place into a non-contiguous float32 tensor: same values (bool results cast to float).
    Tensor y = non_contiguous(x);
    Tensor r = c.inplace(y);
    EXPECT_TRUE(r.is_same(y));
    expect_close(y, want.to(kFloat32));
    // out= resizes an empty out and casts to its dtype.
    Tensor o = empty_on({0}, kFloat64, kCPU);
    c.out(o, x);
    EXPECT_EQ(o.sizes(), x.sizes());
    EXPECT_EQ(o.dtype(), kFloat64);
    expect_close(o, want.to(kFloat64));
    if (c.res == Res::Float) {  // an int32 tensor cannot hold the float32 result
      expect_error(ErrorKind::Type, "can't be cast", [&] { c.inplace(random({3}, kInt32, 1, 4)); });
    }
  }
}

TEST(PointwiseUnary, LargeInputsRunInParallel) {
  set_num_threads(2);
  int64_t n = 3 * 32768 + 17;  // > kGrainSize
  for (const auto& c : unary_cases()) {
    SCOPED_TRACE(c.name);
    Tensor x = random({n}, kFloat32, c.lo, c.hi, 7);
    check_values(c.fn(x), expected1(x, c.ref), result_of(c.res, kFloat32));
  }
}

TEST(PointwiseUnary, DtypeRules) {
  EXPECT_EQ(exp(random({3}, kInt64)).dtype(), kFloat32);
  EXPECT_EQ(sigmoid(random({3}, kBool)).dtype(), kFloat32);
  EXPECT_EQ(exp(random({3}, kBFloat16)).dtype(), kBFloat16);
  EXPECT_EQ(abs(random({3}, kInt8)).dtype(), kInt8);
  EXPECT_EQ(floor(random({3}, kInt32)).dtype(), kInt32);
  EXPECT_EQ(sign(random({3}, kBool)).dtype(), kBool);
  expect_error(ErrorKind::Type, "neg: not supported for bool", [] { neg(random({2, 2}, kBool)); });
  expect_error(ErrorKind::Type, "logical_not", [] { -random({2}, kBool); });
  expect_error(ErrorKind::Type, "relu", [] { relu(random({2}, kBool)); });
  expect_error(ErrorKind::Type, "silu", [] { silu(random({2}, kInt32)); });
  expect_error(ErrorKind::Type, "gelu", [] { gelu(random({2}, kInt32)); });
}

TEST(PointwiseUnary, SpecialValues) {
  Tensor x = from_vector<float>({INFINITY, -INFINITY, NAN, 0.0f, -0.0f, 1e-40f, 100.0f, -100.0f}, {8});
  Tensor xd = x.to(kFloat64);
  auto close = [&](const Tensor& got, const Tensor& want) { expect_close(got, want.to(kFloat32), 1e-5, 1e-30); };
  close(exp(x), exp(xd));
  close(log(abs(x)), log(abs(xd)));
  close(tanh(x), tanh(xd));
  close(sigmoid(x), sigmoid(xd));
  close(erf(x), erf(xd));
  close(relu(x), relu(xd));
  close(gelu(x), gelu(xd));
  close(clamp(x, Scalar(-1), Scalar(1)), clamp(xd, Scalar(-1), Scalar(1)));
  EXPECT_TRUE(std::isnan(log(from_vector<float>({-1.0f}, {1})).item<float>()));
}

// gelu, both forms and every float dtype, plus the argument check.
TEST(PointwiseUnary, Gelu) {
  for (ScalarType dt : dtypes_of_set("floating")) {
    Tensor x = random({3, 50}, dt, -6, 6);
    check_values(gelu(x), expected1(x, [](double a) { return 0.5 * a * (1 + std::erf(a / std::sqrt(2.0))); }), dt);
    check_values(gelu(non_contiguous(x), "tanh"), expected1(x, [](double a) {
                   return 0.5 * a * (1 + std::tanh(std::sqrt(2 / M_PI) * (a + 0.044715 * a * a * a)));
                 }), dt);
  }
  Tensor x = random({5});
  Tensor y = x.clone();
  y.gelu_("tanh");
  expect_close(y, gelu(x, "tanh"));
  expect_error(ErrorKind::Value, "approximate argument must be either 'none' or 'tanh'", [&] { gelu(x, "bad"); });
  expect_error(ErrorKind::Value, "'bad'", [&] { gelu_out(empty_on({0}, kFloat32, kCPU), x, "bad"); });
}

// gelu_backward (gelu's fused backward) against the derivative in double and against its
// decomposition; broadcast, non-contiguous, every float dtype, large (parallel) inputs.
TEST(PointwiseUnary, GeluBackward) {
  auto d_erf = [](double a) { return 0.5 * (1 + std::erf(a / std::sqrt(2.0))) + a * std::exp(-a * a / 2) / std::sqrt(2 * M_PI); };
  auto d_tanh = [](double a) {
    const double k = std::sqrt(2 / M_PI), t = std::tanh(k * (a + 0.044715 * a * a * a));
    return 0.5 * (1 + t) + 0.5 * a * (1 - t * t) * k * (1 + 3 * 0.044715 * a * a);
  };
  for (ScalarType dt : dtypes_of_set("floating")) {
    SCOPED_TRACE(scalar_type_name(dt));
    for (int64_t n : {50, 70000}) {
      Tensor x = random({3, n}, dt, -8, 8, 1), g = random({3, n}, dt, -2, 2, 2);
      Tensor xd = x.to(kFloat64), gd = g.to(kFloat64);
      check_values(gelu_backward(g, x), gd * expected1(xd, d_erf), dt, 4);
      check_values(gelu_backward(non_contiguous(g), x, "tanh"), gd * expected1(xd, d_tanh), dt, 4);
    }
    // grad broadcast against self.
    Tensor x = random({4, 5}, dt, -3, 3, 3), g = random({5}, dt, -2, 2, 4);
    check_values(gelu_backward(g, x), g.to(kFloat64).expand({4, 5}) * expected1(x.to(kFloat64), d_erf), dt, 4);
  }
  // The kernel agrees with the decomposition that double backward differentiates.
  Tensor x = random({64}, kFloat64, -5, 5, 5), g = random({64}, kFloat64, -2, 2, 6);
  Tensor xr = x.clone().requires_grad_(), gr = g.clone().requires_grad_();
  expect_close(gelu_backward(g, x, "tanh"), gelu_backward(gr, xr, "tanh").detach(), 1e-12, 1e-12);
  EXPECT_EQ(gelu_backward(random({0, 3}), random({0, 3})).numel(), 0);
  expect_error(ErrorKind::Value, "gelu_backward: approximate argument must be either 'none' or 'tanh', but got 'erf'",
               [] { gelu_backward(random({2}), random({2}), "erf"); });
  expect_error(ErrorKind::Type, "gelu_backward: expected floating point tensors, but got int32 and int32 (shapes [2] and [2])",
               [] { gelu_backward(random({2}, kInt32), random({2}, kInt32)); });
  expect_error(ErrorKind::Value, "[3]", [] { gelu_backward(random({3}), random({2})); });
}

// threshold_backward (relu's fused backward): grad where self > threshold, else 0, in every
// numeric dtype; nan in self passes the gradient (as PyTorch).
TEST(PointwiseUnary, ThresholdBackward) {
  for (ScalarType dt : dtypes_of_set("numeric")) {
    SCOPED_TRACE(scalar_type_name(dt));
    for (int64_t n : {7, 70000}) {
      Tensor x = random({2, n}, dt, -5, 5, 7), g = random({2, n}, dt, -5, 5, 8);
      auto xv = to_doubles(x), gv = to_doubles(g);
      const double th = dt == kUInt8 ? 2 : 0.5;
      for (size_t i = 0; i < xv.size(); ++i) gv[i] = xv[i] <= (is_floating(dt) ? th : std::floor(th)) ? 0 : gv[i];
      check_values(threshold_backward(g, non_contiguous(x), Scalar(th)), from_vector<double>(gv, x.sizes()), dt);
    }
  }
  Tensor x = from_vector<float>({-1, 0, 2, NAN}, {4}), g = from_vector<float>({1, 2, 3, 4}, {4});
  expect_close(threshold_backward(g, x, Scalar(0)), from_vector<float>({0, 0, 3, 4}, {4}), 0, 0);
  // Broadcast: a (3,) gradient against a (2, 3) self.
  Tensor xb = from_vector<float>({-1, 1, 1, 1, -1, 1}, {2, 3});
  expect_close(threshold_backward(from_vector<float>({1, 2, 3}, {3}), xb, Scalar(0)),
               from_vector<float>({0, 2, 3, 1, 0, 3}, {2, 3}), 0, 0);
  // relu's gradient goes through it.
  Tensor r = from_vector<float>({-2, 0.5, 0, 3}, {4}).requires_grad_();
  relu(r).sum().backward();
  expect_close(r.grad(), from_vector<float>({0, 1, 0, 1}, {4}), 0, 0);
  expect_error(ErrorKind::Type, "threshold_backward: not supported for bool tensors (shapes [2] and [2])",
               [] { threshold_backward(random({2}, kBool), random({2}, kBool), Scalar(0)); });
  expect_error(ErrorKind::Value, "[3]", [] { threshold_backward(random({3}), random({2}), Scalar(0)); });
}

TEST(PointwiseUnary, Clamp) {
  for (ScalarType dt : dtypes_of_set("numeric")) {
    SCOPED_TRACE(scalar_type_name(dt));
    Tensor x = random({6, 7}, dt, -5, 5);
    auto both = [](double a) { return std::min(std::max(a, 1.0), 3.0); };
    check_values(clamp(non_contiguous(x), Scalar(1), Scalar(3)), expected1(x, both), dt);
    check_values(clamp(x, Scalar(1)), expected1(x, [](double a) { return std::max(a, 1.0); }), dt);
    check_values(clamp(x, std::nullopt, Scalar(3)), expected1(x, [](double a) { return std::min(a, 3.0); }), dt);
  }
  // min > max gives max; float bounds promote an int tensor; in place the result must fit.
  Tensor xi = from_vector<int32_t>({-3, 0, 4}, {3});
  EXPECT_EQ(to_doubles(clamp(xi, Scalar(2), Scalar(1))), std::vector<double>({1, 1, 1}));
  Tensor cf = clamp(xi, Scalar(0.5));
  EXPECT_EQ(cf.dtype(), kFloat32);
  EXPECT_EQ(to_doubles(cf), std::vector<double>({0.5, 0.5, 4}));
  expect_error(ErrorKind::Type, "can't be cast", [&] { xi.clamp_(Scalar(0.5)); });
  xi.clamp_(Scalar(0));
  EXPECT_EQ(to_doubles(xi), std::vector<double>({0, 0, 4}));
  expect_error(ErrorKind::Value, "at least one of 'min' or 'max'", [&] { clamp(xi); });
  Tensor big = random({100000}, kFloat32, -3, 3, 5);
  check_values(clamp(big, Scalar(-1), Scalar(1)), expected1(big, [](double a) { return std::min(std::max(a, -1.0), 1.0); }), kFloat32);
}

// ---- binary

using BFn = std::function<Tensor(const Tensor&, const Tensor&)>;
using BOut = std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>;
using Ref2 = std::function<double(double, double)>;

struct BinaryCase {
  const char* name;
  BFn fn, inplace;
  BOut out;
  Ref2 ref;
  const char* dtypes;
  Res res;
  double blo, bhi;  // range of the second operand (the first is [-5, 5))
};

#define BCASE(NAME, CALL, REF, DTYPES, RES, BLO, BHI)                                         \
  BinaryCase {                                                                              \
    #NAME, [](const Tensor& a, const Tensor& b) { return NAME(a, b CALL); },                \
        [](const Tensor& a, const Tensor& b) { return a.NAME##_(b CALL); },                 \
        [](const Tensor& o, const Tensor& a, const Tensor& b) { return NAME##_out(o, a, b CALL); }, \
        REF, DTYPES, RES, BLO, BHI                                                          \
  }
#define NOARG
#define ARG(x) , x

double ref_floor_div(double a, double b) { return std::floor(a / b); }
double ref_remainder(double a, double b) { return a - std::floor(a / b) * b; }

std::vector<BinaryCase> binary_cases() {
  return {
      BCASE(add, NOARG, [](double a, double b) { return a + b; }, "all", Res::Same, -5, 5),
      BCASE(sub, NOARG, [](double a, double b) { return a - b; }, "numeric", Res::Same, -5, 5),
      BCASE(sub, ARG(Scalar(2)), [](double a, double b) { return a - 2 * b; }, "numeric", Res::Same, -5, 5),
      BCASE(mul, NOARG, [](double a, double b) { return a * b; }, "all", Res::Same, -5, 5),
      BCASE(div, NOARG, [](double a, double b) { return a / b; }, "all", Res::Float, 1, 5),
      BCASE(div, ARG("trunc"), [](double a, double b) { return std::trunc(a / b); }, "numeric", Res::Same, -7, -1),
      BCASE(div, ARG("floor"), ref_floor_div, "numeric", Res::Same, 1, 7),
      BCASE(maximum, NOARG, [](double a, double b) { return std::max(a, b); }, "all", Res::Same, -5, 5),
      BCASE(minimum, NOARG, [](double a, double b) { return std::min(a, b); }, "all", Res::Same, -5, 5),
      BCASE(pow, NOARG, [](double a, double b) { return std::pow(a, b); }, "numeric", Res::Same, 0, 4),
      BCASE(fmod, NOARG, [](double a, double b) { return std::fmod(a, b); }, "numeric", Res::Same, 1, 4),
      BCASE(remainder, NOARG, ref_remainder, "numeric", Res::Same, -4, -1),
      BCASE(eq, NOARG, [](double a, double b) { return a == b; }, "all", Res::Bool, -5, 5),
      BCASE(ne, NOARG, [](double a, double b) { return a != b; }, "all", Res::Bool, -5, 5),
      BCASE(lt, NOARG, [](double a, double b) { return a < b; }, "all", Res::Bool, -5, 5),
      BCASE(le, NOARG, [](double a, double b) { return a <= b; }, "all", Res::Bool, -5, 5),
      BCASE(gt, NOARG, [](double a, double b) { return a > b; }, "all", Res::Bool, -5, 5),
      BCASE(ge, NOARG, [](double a, double b) { return a >= b; }, "all", Res::Bool, -5, 5),
      BCASE(logical_and, NOARG, [](double a, double b) { return a != 0 && b != 0; }, "all", Res::Bool, -2, 2),
      BCASE(logical_or, NOARG, [](double a, double b) { return a != 0 || b != 0; }, "all", Res::Bool, -2, 2),
      BCASE(logical_xor, NOARG, [](double a, double b) { return (a != 0) != (b != 0); }, "all", Res::Bool, -2, 2),
  };
}

// ref over a and b broadcast to `shape`.
Tensor expected2(const Tensor& a, const Tensor& b, IntArrayRef shape, const Ref2& ref) {
  auto va = to_doubles(a.expand(shape)), vb = to_doubles(b.expand(shape));
  for (size_t i = 0; i < va.size(); ++i) va[i] = ref(va[i], vb[i]);
  return from_vector<double>(va, shape);
}

// Integer pow with a zero-or-positive exponent and bool inputs need care: restrict operands.
Tensor operand(ScalarType dt, IntArrayRef shape, double lo, double hi, uint32_t seed) {
  if (dt == kBool) return random(shape, dt, 0, 2, seed);
  return random(shape, dt, lo, hi, seed);
}

TEST(PointwiseBinary, EveryDtypeBroadcastAgainstReference) {
  for (const auto& c : binary_cases()) {
    for (ScalarType dt : dtypes_of_set(c.dtypes)) {
      SCOPED_TRACE(std::string(c.name) + " " + scalar_type_name(dt));
      double alo = std::string(c.name) == "pow" ? 0 : -5;
      Tensor a = operand(dt, {4, 1, 5}, alo, 5, 11), b = operand(dt, {3, 1}, c.blo, c.bhi, 12);
      ScalarType rt = result_of(c.res, dt);
      double tol = std::string(c.name) == "pow" ? 4 : 1;
      check_values(c.fn(a, b), expected2(a, b, {4, 3, 5}, c.ref), rt, tol);
      check_values(c.fn(non_contiguous(a), non_contiguous(b)), expected2(a, b, {4, 3, 5}, c.ref), rt, tol);
      // 0-dim tensor operand and zero-size broadcast.
      Tensor s = operand(dt, {}, c.blo, c.bhi, 13);
      check_values(c.fn(a, s), expected2(a, s, {4, 1, 5}, c.ref), rt, tol);
      Tensor z = c.fn(operand(dt, {0, 5}, alo, 5, 1), b.select(0, 0));
      EXPECT_EQ(z.sizes(), IntArrayRef({0, 5}));
      EXPECT_EQ(z.dtype(), rt);
    }
  }
}

TEST(PointwiseBinary, LargeInputsRunInParallel) {
  set_num_threads(2);
  int64_t n = 2 * 32768 + 5;
  for (const auto& c : binary_cases()) {
    SCOPED_TRACE(c.name);
    Tensor a = random({n}, kFloat32, -5, 5, 3), b = random({n}, kFloat32, c.blo, c.bhi, 4);
    if (std::string(c.name) == "pow") a = random({n}, kFloat32, 0, 5, 3);
    check_values(c.fn(a, b), expected2(a, b, {n}, c.ref), result_of(c.res, kFloat32), 4);
    Tensor w = scalar_to_tensor(Scalar(1.5));  // contiguous op scalar path
    check_values(c.fn(a, w), expected2(a, w, {n}, c.ref), result_of(c.res, kFloat32), 4);
    Tensor a2 = random({n / 5, 5}, kFloat32, 0.5, 5, 5), b2 = random({5}, kFloat32, 1, 3, 6);
    check_values(c.fn(a2.t(), b2.unsqueeze(1)), expected2(a2.t(), b2.unsqueeze(1), {5, n / 5}, c.ref),
                 result_of(c.res, kFloat32), 4);
  }
}

TEST(PointwiseBinary, InplaceAndOut) {
  for (const auto& c : binary_cases()) {
    SCOPED_TRACE(c.name);
    Tensor a = random({3, 4}, kFloat32, 0.5, 5, 21), b = random({4}, kFloat32, c.blo, c.bhi, 22);
    Tensor want = c.fn(a, b);
    Tensor y = non_contiguous(a);
    EXPECT_TRUE(c.inplace(y, b).is_same(y));
    expect_close(y, want.to(kFloat32));
    Tensor o = empty_on({7}, kFloat64, kCPU);
    EXPECT_TRUE(c.out(o, a, b).is_same(o));
    EXPECT_EQ(o.sizes(), IntArrayRef({3, 4}));
    expect_close(o, want.to(kFloat64));
    // Broadcasting self in place is a ValueError naming both shapes.
    expect_error(ErrorKind::Value, "[4]", [&] { c.inplace(b.clone(), a); });
  }
}

TEST(PointwiseBinary, TypePromotion) {
  auto rt = [](const Tensor& a, const Tensor& b) { return add(a, b).dtype(); };
  auto w = [](Scalar s) { return scalar_to_tensor(s); };
  EXPECT_EQ(rt(random({2}, kInt32), random({2}, kFloat64)), kFloat64);
  EXPECT_EQ(rt(random({2}, kUInt8), random({2}, kInt8)), kInt16);
  EXPECT_EQ(rt(random({2}, kBool), random({2}, kInt32)), kInt32);
  EXPECT_EQ(rt(random({2}, kInt32), w(Scalar(1.5))), kFloat32);
  EXPECT_EQ(rt(random({2}, kInt8), w(Scalar(1000))), kInt8);
  EXPECT_EQ(rt(random({2}, kFloat16), random({2}, kBFloat16)), kFloat32);
  EXPECT_EQ(rt(random({}, kFloat64), random({2}, kFloat32)), kFloat32);
  EXPECT_EQ(rt(random({}, kFloat64), random({2}, kInt32)), kFloat64);
  EXPECT_EQ(rt(random({2}, kBool), w(Scalar(true))), kBool);
  EXPECT_EQ(mul(random({2}, kFloat16), w(Scalar(2.0))).dtype(), kFloat16);
  EXPECT_EQ(div(random({2}, kInt64), random({2}, kInt64)).dtype(), kFloat32);
  EXPECT_EQ(div(random({2}, kInt64), random({2}, kInt64, 1, 3), "floor").dtype(), kInt64);
  EXPECT_EQ(lt(random({2}, kInt32), w(Scalar(0.5))).dtype(), kBool);
  EXPECT_EQ(pow(random({2}, kInt32), w(Scalar(2.0))).dtype(), kFloat32);
  // An int tensor compared with a float scalar compares in float: 1 < 1.5.
  EXPECT_TRUE(lt(from_vector<int32_t>({1}, {1}), w(Scalar(1.5))).item<bool>());
  // out= casts to its dtype; results that cannot be cast are TypeErrors.
  Tensor o = empty_on({2}, kInt32, kCPU);
  expect_error(ErrorKind::Type, "can't be cast", [&] { add_out(o, random({2}), random({2})); });
  expect_error(ErrorKind::Type, "can't be cast", [&] { random({2}, kInt32).add_(w(Scalar(1.5))); });
  expect_error(ErrorKind::Type, "can't be cast", [&] { random({2}, kInt64).div_(random({2}, kInt64)); });
  Tensor ob = empty_on({2}, kFloat32, kCPU);
  eq_out(ob, random({2}), random({2}));
  EXPECT_EQ(ob.dtype(), kFloat32);
}

TEST(PointwiseBinary, BadInputs) {
  Tensor a = random({2, 3}), b = random({4});
  for (const auto& c : binary_cases()) {
    SCOPED_TRACE(c.name);
    expect_error(ErrorKind::Value, "[2, 3] and [4] are not broadcastable", [&] { c.fn(a, b); });
    expect_error(ErrorKind::Value, std::string(c.name) + ": shapes", [&] { c.fn(a, b); });
  }
  Tensor t = random({2}, kBool);
  expect_error(ErrorKind::Type, "sub: subtraction", [&] { sub(t, t); });
  expect_error(ErrorKind::Type, "sub: subtraction", [&] { sub(random({2}), t); });
  expect_error(ErrorKind::Type, "alpha must not be a floating", [&] { sub(random({2}, kInt32), random({2}, kInt32), Scalar(0.5)); });
  expect_error(ErrorKind::Type, "pow: not supported for bool", [&] { pow(t, t); });
  expect_error(ErrorKind::Value, "rounding_mode to be one of", [&] { div(a, a, "round"); });
  expect_error(ErrorKind::Type, "div: rounding_mode='floor'", [&] { div(t, t, "floor"); });
  Tensor i = from_vector<int32_t>({4, 5}, {2}), z = from_vector<int32_t>({2, 0}, {2});
  expect_error(ErrorKind::Runtime, "ZeroDivisionError", [&] { div(i, z, "trunc"); });
  expect_error(ErrorKind::Runtime, "ZeroDivisionError", [&] { fmod(i, z); });
  expect_error(ErrorKind::Runtime, "ZeroDivisionError", [&] { remainder(i, z); });
  EXPECT_TRUE(std::isinf(to_doubles(div(i, z))[1]));  // true division of ints by zero: inf
}


TEST(PointwiseBinary, IntegerSemantics) {
  Tensor a = from_vector<int32_t>({7, -7, 7, -7}, {4}), b = from_vector<int32_t>({2, 2, -2, -2}, {4});
  EXPECT_EQ(to_doubles(div(a, b, "trunc")), std::vector<double>({3, -3, -3, 3}));
  EXPECT_EQ(to_doubles(div(a, b, "floor")), std::vector<double>({3, -4, -4, 3}));
  EXPECT_EQ(to_doubles(fmod(a, b)), std::vector<double>({1, -1, 1, -1}));
  EXPECT_EQ(to_doubles(remainder(a, b)), std::vector<double>({1, 1, -1, -1}));
  Tensor fa = a.to(kFloat32), fb = b.to(kFloat32);
  EXPECT_EQ(to_doubles(remainder(fa, fb)), std::vector<double>({1, 1, -1, -1}));
  EXPECT_EQ(to_doubles(div(fa, fb, "floor")), std::vector<double>({3, -4, -4, 3}));
  Tensor base = from_vector<int64_t>({2, -1, 1, 3}, {4}), ex = from_vector<int64_t>({10, -3, -2, -1}, {4});
  EXPECT_EQ(to_doubles(pow(base, ex)), std::vector<double>({1024, -1, 1, 0}));
  Tensor n = from_vector<float>({NAN, 1, 2}, {3}), m = from_vector<float>({0, NAN, 1}, {3});
  auto mx = to_doubles(maximum(n, m)), mn = to_doubles(minimum(n, m));
  EXPECT_TRUE(std::isnan(mx[0]) && std::isnan(mx[1]) && mx[2] == 2);
  EXPECT_TRUE(std::isnan(mn[0]) && std::isnan(mn[1]) && mn[2] == 1);
  EXPECT_TRUE(logical_and(n, m).select(0, 0).item<bool>() == false);  // nan is true, 0 is false
}

TEST(PointwiseWhere, BroadcastPromotionAndErrors) {
  for (ScalarType dt : dtypes_of_set("all")) {
    SCOPED_TRACE(scalar_type_name(dt));
    Tensor c = random({3, 1, 4}, kBool, 0, 2, 1), x = random({2, 1}, dt, -5, 5, 2), y = random({4}, dt, -5, 5, 3);
    Tensor r = where(non_contiguous(c), x, non_contiguous(y));
    auto vc = to_doubles(c.expand({3, 2, 4})), vx = to_doubles(x.expand({3, 2, 4})),
         vy = to_doubles(y.expand({3, 2, 4}));
    for (size_t i = 0; i < vc.size(); ++i) vx[i] = vc[i] != 0 ? vx[i] : vy[i];
    EXPECT_EQ(r.sizes(), IntArrayRef({3, 2, 4}));
    EXPECT_EQ(r.dtype(), dt);
    EXPECT_EQ(to_doubles(r), vx);
  }
  Tensor c = random({70000}, kBool, 0, 2, 4), x = random({70000}, kFloat64, -5, 5, 5);
  Tensor r = where(c, x, scalar_to_tensor(Scalar(0.5)));
  EXPECT_EQ(r.dtype(), kFloat64);
  auto vc = to_doubles(c), vx = to_doubles(x), vr = to_doubles(r);
  for (size_t i = 0; i < vc.size(); ++i) ASSERT_EQ(vr[i], vc[i] != 0 ? vx[i] : 0.5);
  EXPECT_EQ(where(random({2}, kBool), random({2}, kInt32), random({2}, kFloat16)).dtype(), kFloat16);
  EXPECT_EQ(where(random({0, 2}, kBool), random({2}), random({1})).sizes(), IntArrayRef({0, 2}));
  Tensor o = empty_on({0}, kFloat64, kCPU);
  where_out(o, random({2, 2}, kBool), random({2}), random({2, 1}));
  EXPECT_EQ(o.sizes(), IntArrayRef({2, 2}));
  expect_error(ErrorKind::Type, "where: expected condition to be a bool tensor", [] {
    where(random({2}, kInt32), random({2}), random({2}));
  });
  expect_error(ErrorKind::Value, "not broadcastable", [] { where(random({3}, kBool), random({2}), random({2})); });
}

TEST(PointwiseOperators, ArithmeticComparisonAndInplace) {
  Tensor a = from_vector<float>({1, 2, 4}, {3}), b = from_vector<float>({2, 2, 2}, {3});
  EXPECT_EQ(to_doubles(a + b), std::vector<double>({3, 4, 6}));
  EXPECT_EQ(to_doubles(a - b), std::vector<double>({-1, 0, 2}));
  EXPECT_EQ(to_doubles(a * 2), std::vector<double>({2, 4, 8}));
  EXPECT_EQ(to_doubles(8 / a), std::vector<double>({8, 4, 2}));
  EXPECT_EQ(to_doubles(1 - a), std::vector<double>({0, -1, -3}));
  EXPECT_EQ(to_doubles(-a), std::vector<double>({-1, -2, -4}));
  EXPECT_EQ((a * 2).dtype(), kFloat32);
  Tensor i = from_vector<int32_t>({1, 2, 3}, {3});
  EXPECT_EQ((i / 2).dtype(), kFloat32);
  EXPECT_EQ((i * 2).dtype(), kInt32);
  EXPECT_EQ((i * 2.5).dtype(), kFloat32);
  Tensor m = a > 1.5;
  EXPECT_EQ(m.dtype(), kBool);
  EXPECT_EQ(to_doubles(m), std::vector<double>({0, 1, 1}));
  EXPECT_EQ(to_doubles(a == b), std::vector<double>({0, 1, 0}));
  EXPECT_EQ(to_doubles(a != b), std::vector<double>({1, 0, 1}));
  EXPECT_EQ(to_doubles(a <= b), std::vector<double>({1, 1, 0}));
  EXPECT_EQ(to_doubles(a >= 2), std::vector<double>({0, 1, 1}));
  EXPECT_EQ(to_doubles(3 < a), std::vector<double>({0, 0, 1}));
  Tensor c = a.clone();
  c += 1;
  c -= b;
  c *= 3;
  c /= b;
  EXPECT_EQ(to_doubles(c), std::vector<double>({0, 1.5, 4.5}));
  EXPECT_EQ(c.dtype(), kFloat32);
  expect_error(ErrorKind::Type, "can't be cast", [&] { i += 1.5; });
  expect_error(ErrorKind::Type, "can't be cast", [&] { i /= 2; });
}

// kiln::vec functions against std:: (and the activations against their kiln::math formulas) in
// double, in float32 ulps (See Note [Vectorizable math], Note [One home per formula]).
double ulp_error(float got, double want) {
  if (std::isnan(want)) return std::isnan(got) ? 0 : 1e9;
  if (std::isinf(want) || std::fabs(want) > 3.4028234663852886e38) return got == static_cast<float>(want) ? 0 : 1e9;
  float w = static_cast<float>(want);
  double ulp = std::fabs(w) < 1.17549435e-38f ? 1.401298464e-45
                                               : std::nextafter(std::fabs(w), INFINITY) - std::fabs(w);
  return std::fabs(static_cast<double>(got) - want) / ulp;
}

TEST(VecMath, AccuracyAgainstStd) {
  std::vector<float> xs;
  for (double v = -110; v <= 110; v += 0.0071) xs.push_back(static_cast<float>(v));
  for (int e = -149; e < 128; ++e) {
    for (float m : {1.0f, 1.37f, 1.9999f}) {
      xs.push_back(std::ldexp(m, e));
      xs.push_back(-std::ldexp(m, e));
    }
  }
  for (float v : {INFINITY, -INFINITY, NAN, 0.0f, -0.0f, 88.72f, 88.73f, -103.9f, -104.0f}) xs.push_back(v);
  struct Fn {
    const char* name;
    float (*f)(float);
    double (*ref)(double);
    bool denormals = true;  // silu = x * sigmoid(x) rounds the denormal sigmoid first
  };
  const Fn fns[] = {
      {"exp", vec::exp, [](double x) { return std::exp(x); }},
      {"log", vec::log, [](double x) { return std::log(x); }},
      {"tanh", vec::tanh, [](double x) { return std::tanh(x); }},
      {"sigmoid", vec::sigmoid, [](double x) { return math::sigmoid(x); }},
      {"erf", vec::erf, [](double x) { return std::erf(x); }},
      {"silu", vec::silu, [](double x) { return math::silu(x); }, false},
  };
  for (const Fn& f : fns) {
    double worst = 0;
    float at = 0;
    for (float x : xs) {
      double want = f.ref(static_cast<double>(x));
      if (!f.denormals && std::fabs(want) < 1.17549435e-38 * std::max(1.0, std::fabs(double{x}))) continue;
      double e = ulp_error(f.f(x), want);
      if (e > worst) worst = e, at = x;
    }
    EXPECT_LE(worst, 3.0) << f.name << " worst at x = " << at;
  }
  double worst = 0;
  for (float x : xs) worst = std::max(worst, ulp_error(vec::erf_rational(x), std::erf(double{x})));
  EXPECT_LE(worst, 5.0) << "erf_rational";
  // gelu's 1 + erf cancels for x << 0 (as in PyTorch): check it in absolute terms there.
  double worst_backward[2] = {0, 0};
  for (float x : xs) {
    if (!std::isfinite(x)) continue;
    const double xd = x;
    double want = math::gelu_erf(xd);
    // gelu uses erf_rational (<= 5 ulp near +-1 instead of <= 3): for x in [-5.6, -3] the
    // cancellation in 1 + erf then costs up to ~7e-7 absolute, on values below 4e-3.
    EXPECT_NEAR(vec::gelu_erf(x), want, 8e-7 * std::max(1.0, std::fabs(want))) << x;
    double dwant = math::gelu_erf_backward(xd);
    worst_backward[0] = std::max(worst_backward[0], std::fabs(vec::gelu_erf_backward(x) - dwant));
    if (std::fabs(x) >= 1e12f) continue;  // x^3 overflows float
    double wt = math::gelu_tanh(xd);
    EXPECT_NEAR(vec::gelu_tanh(x), wt, 4e-7 * std::max(1.0, std::fabs(wt))) << x;
    double dwt = math::gelu_tanh_backward(xd);
    worst_backward[1] = std::max(worst_backward[1], std::fabs(vec::gelu_tanh_backward(x) - dwt));
  }
  // The derivatives lie in [-0.17, 1.13] (measured worst: 1.5e-7 at 3.66, 5.3e-7 at -5.16, where
  // the tanh form's 1 - t^2 cancels in float).
  EXPECT_LE(worst_backward[0], 4e-7) << "gelu_erf_backward";
  EXPECT_LE(worst_backward[1], 1e-6) << "gelu_tanh_backward";
}

// The scalar home itself (Note [One home per formula]): gelu's erf form against x Phi(x) through
// erfc (another libm function), and every derivative against central differences of its
// function, in double.
TEST(PointwiseMath, FormulasAgreeWithTheirDefinitions) {
  for (double x = -12; x <= 12; x += 0.013) {
    const double scale = std::max(1.0, std::fabs(x));
    EXPECT_NEAR(math::gelu_erf(x), x * 0.5 * std::erfc(-x / std::sqrt(2.0)), 1e-15 * scale) << x;
    const double h = 1e-5;
    auto diff = [&](double (*f)(double)) { return (f(x + h) - f(x - h)) / (2 * h); };
    EXPECT_NEAR(math::gelu_erf_backward(x), diff(math::gelu_erf<double>), 1e-8) << x;
    EXPECT_NEAR(math::gelu_tanh_backward(x), diff(math::gelu_tanh<double>), 1e-8) << x;
    EXPECT_NEAR(math::silu(x), x * math::sigmoid(x), 1e-15 * scale) << x;
    // float: the same formulas in float32 (CUDA's math type for float16/bfloat16/float32).
    const float xf = static_cast<float>(x);
    EXPECT_NEAR(math::gelu_erf(xf), math::gelu_erf(double{xf}), 1e-6 * scale) << x;
    EXPECT_NEAR(math::gelu_tanh(xf), math::gelu_tanh(double{xf}), 1e-6 * scale) << x;
    EXPECT_NEAR(math::sigmoid(xf), math::sigmoid(double{xf}), 1e-7) << x;
  }
  EXPECT_GT(math::sigmoid(-100.0f), 0.0f);  // float keeps e^-100, a denormal, rather than 0
  EXPECT_TRUE(std::isnan(math::binary_cross_entropy(std::nan(""), 1.0)));
  EXPECT_EQ(math::binary_cross_entropy(0.0, 1.0), 100.0);  // log(0) clamped at -100
}

}  // namespace
}  // namespace kiln::testing
