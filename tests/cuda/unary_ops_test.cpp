// Unary pointwise ops on CUDA (kernels/cuda/unary_float_ops.cu, activation_ops.cu,
// unary_ops.cu) against host references: every dtype of the op's row, contiguous and
// non-contiguous inputs, in-place, out= into a non-contiguous out, zero-size inputs.
#include <functional>

#include "cuda/pointwise_util.h"

using namespace kiln;
using namespace kiln::gputest;

namespace {

struct UnaryCase {
  const char* name;
  std::function<Tensor(const Tensor&)> fn;
  std::function<void(const Tensor&)> inplace;
  std::function<void(const Tensor&, const Tensor&)> out_fn;  // (out, x)
  std::function<double(double)> ref;                         // on the input value as stored
  std::vector<ScalarType> dtypes;
  bool float_result;  // integer and bool inputs give float32
};

ScalarType result_dtype(const UnaryCase& c, ScalarType t) {
  return c.float_result && !is_floating(t) ? kFloat32 : t;
}

void run_unary(const UnaryCase& c) {
  uint32_t seed = 100;
  for (ScalarType t : c.dtypes) {
    ScalarType rt = result_dtype(c, t);
    std::string tag = std::string(c.name) + " " + scalar_type_name(t);
    Tensor h = host_tensor(t, {6, 7}, ++seed);
    std::vector<double> want;
    for (double v : values(h)) want.push_back(store(rt, c.ref(v)));
    double rel = tol(rt);

    Tensor y = c.fn(to_cuda(h));
    EXPECT_TRUE(y.device() == kCudaDev);
    EXPECT_EQ(y.dtype(), rt);
    expect_close(y, want, rel, tag + " contiguous");
    expect_close(c.fn(strided_copy_of(h, kCudaDev)), want, rel, tag + " non-contiguous");

    Tensor out = strided_copy_of(host_tensor(rt, {6, 7}, 1), kCudaDev);  // non-contiguous out=
    c.out_fn(out, to_cuda(h));
    expect_close(out, want, rel, tag + " out=");
    if (rt == t) {
      Tensor x = strided_copy_of(h, kCudaDev);
      c.inplace(x);
      expect_close(x, want, rel, tag + " in-place non-contiguous");
    }
    Tensor z = c.fn(kiln::empty({0, 3}, t, kCudaDev));
    EXPECT_EQ(z.numel(), int64_t{0});
  }
}

#define UNARY_CASE(NAME, REF, DTYPES, FLOAT_RESULT)                                   \
  UnaryCase {                                                                          \
    #NAME, [](const Tensor& x) { return kiln::NAME(x); },                             \
        [](const Tensor& x) { kiln::NAME##_(x); },                                     \
        [](const Tensor& o, const Tensor& x) { kiln::NAME##_out(o, x); }, REF, DTYPES, FLOAT_RESULT \
  }

double sigmoid_ref(double a) { return 1 / (1 + std::exp(-a)); }

}  // namespace

GPU_TEST(UnaryOps, FloatMathEveryDtype) {
  REQUIRE_GPU();
  std::vector<ScalarType> all = all_dtypes();
  std::vector<UnaryCase> cases = {
      UNARY_CASE(exp, [](double a) { return std::exp(a); }, all, true),
      UNARY_CASE(log, [](double a) { return std::log(a); }, all, true),
      UNARY_CASE(log1p, [](double a) { return std::log1p(a); }, all, true),
      UNARY_CASE(expm1, [](double a) { return std::expm1(a); }, all, true),
      UNARY_CASE(sqrt, [](double a) { return std::sqrt(a); }, all, true),
      UNARY_CASE(rsqrt, [](double a) { return 1 / std::sqrt(a); }, all, true),
      UNARY_CASE(reciprocal, [](double a) { return 1 / a; }, all, true),
      UNARY_CASE(sin, [](double a) { return std::sin(a); }, all, true),
      UNARY_CASE(cos, [](double a) { return std::cos(a); }, all, true),
      UNARY_CASE(tanh, [](double a) { return std::tanh(a); }, all, true),
      UNARY_CASE(sigmoid, sigmoid_ref, all, true),
      UNARY_CASE(erf, [](double a) { return std::erf(a); }, all, true),
      UNARY_CASE(silu, [](double a) { return a * sigmoid_ref(a); }, float_dtypes(), true),
  };
  for (const UnaryCase& c : cases) run_unary(c);
}

GPU_TEST(UnaryOps, GeluBothForms) {
  REQUIRE_GPU();
  UnaryCase erf_form{"gelu", [](const Tensor& x) { return kiln::gelu(x); },
                     [](const Tensor& x) { kiln::gelu_(x); },
                     [](const Tensor& o, const Tensor& x) { kiln::gelu_out(o, x); },
                     [](double a) { return 0.5 * a * (1 + std::erf(a / std::sqrt(2.0))); }, float_dtypes(), true};
  run_unary(erf_form);
  UnaryCase tanh_form{"gelu(tanh)", [](const Tensor& x) { return kiln::gelu(x, "tanh"); },
                      [](const Tensor& x) { kiln::gelu_(x, "tanh"); },
                      [](const Tensor& o, const Tensor& x) { kiln::gelu_out(o, x, "tanh"); },
                      [](double a) {
                        return 0.5 * a * (1 + std::tanh(std::sqrt(2 / M_PI) * (a + 0.044715 * a * a * a)));
                      },
                      float_dtypes(), true};
  run_unary(tanh_form);
  // Large inputs: gelu(x) -> x and -> 0 without nan from the tails.
  Tensor h = empty_on({4}, kFloat32, kCPU);
  write_values(h, {-30, -8, 8, 30});
  std::vector<double> we, wt;
  for (double a : values(h)) {
    we.push_back(store(kFloat32, erf_form.ref(a)));
    wt.push_back(store(kFloat32, tanh_form.ref(a)));
  }
  expect_close(kiln::gelu(to_cuda(h)), we, 1e-5, "gelu tails");
  expect_close(kiln::gelu(to_cuda(h), "tanh"), wt, 1e-5, "gelu(tanh) tails");
  EXPECT_ERROR(ErrorKind::Type, "gelu", { kiln::gelu(kiln::empty({3}, kInt32, kCudaDev)); });
  EXPECT_ERROR(ErrorKind::Value, "approximate", { kiln::gelu(kiln::empty({3}, kFloat32, kCudaDev), "fast"); });
}

GPU_TEST(UnaryOps, DtypeKeepingOps) {
  REQUIRE_GPU();
  std::vector<ScalarType> num = numeric_dtypes();
  std::vector<UnaryCase> cases = {
      UNARY_CASE(neg, [](double a) { return -a; }, num, false),
      UNARY_CASE(abs, [](double a) { return std::fabs(a); }, num, false),
      UNARY_CASE(relu, [](double a) { return a < 0 ? 0 : a; }, num, false),
      UNARY_CASE(floor, [](double a) { return std::floor(a); }, num, false),
      UNARY_CASE(ceil, [](double a) { return std::ceil(a); }, num, false),
      UNARY_CASE(round, [](double a) { return std::nearbyint(a); }, num, false),  // half to even
      UNARY_CASE(sign, [](double a) { return double((0 < a) - (a < 0)); }, all_dtypes(), false),
  };
  for (const UnaryCase& c : cases) run_unary(c);
  // Explicit half-to-even cases and nan handling.
  Tensor h = empty_on({8}, kFloat32, kCPU);
  write_values(h, {0.5, 1.5, 2.5, -0.5, -2.5, 3.7, NAN, -NAN});
  expect_close(kiln::round(to_cuda(h)), {0, 2, 2, -0.0, -2, 4, NAN, NAN}, 0, "round half to even");
  expect_close(kiln::relu(to_cuda(h)), {0.5, 1.5, 2.5, 0, 0, 3.7f, NAN, NAN}, 0, "relu keeps nan");
  expect_close(kiln::sign(to_cuda(h)), {1, 1, 1, -1, -1, 1, 0, 0}, 0, "sign of nan is 0");
  Tensor i8 = empty_on({2}, kInt8, kCPU);
  write_values(i8, {-128, 5});
  expect_close(kiln::abs(to_cuda(i8)), {-128, 5}, 0, "abs(int8 min) wraps");
  expect_close(kiln::neg(to_cuda(i8)), {-128, -5}, 0, "neg(int8 min) wraps");
  EXPECT_ERROR(ErrorKind::Type, "bool", { kiln::neg(kiln::empty({3}, kBool, kCudaDev)); });
}

GPU_TEST(UnaryOps, LogicalNotEveryDtype) {
  REQUIRE_GPU();
  for (ScalarType t : all_dtypes()) {
    Tensor h = host_tensor(t, {5, 6}, 7);
    std::vector<double> want;
    for (double v : values(h)) want.push_back(v == 0);
    Tensor y = kiln::logical_not(to_cuda(h));
    EXPECT_EQ(y.dtype(), kBool);
    expect_close(y, want, 0, std::string("logical_not ") + scalar_type_name(t));
    expect_close(kiln::logical_not(strided_copy_of(h, kCudaDev)), want, 0, "logical_not non-contiguous");
    Tensor out = kiln::empty({5, 6}, kBool, kCudaDev);
    kiln::logical_not_out(out, to_cuda(h));
    expect_close(out, want, 0, "logical_not out=");
  }
  Tensor f = empty_on({3}, kFloat32, kCPU);
  write_values(f, {NAN, 0, -0.0});
  expect_close(kiln::logical_not(to_cuda(f)), {0, 1, 1}, 0, "nan is true");
}

GPU_TEST(UnaryOps, ClampBoundsAndPromotion) {
  REQUIRE_GPU();
  for (ScalarType t : numeric_dtypes()) {
    Tensor h = host_tensor(t, {6, 7}, 9);
    std::vector<double> v = values(h), both, lo_only, hi_only;
    for (double x : v) {
      both.push_back(std::min(std::max(x, 2.0), 12.0));
      lo_only.push_back(std::max(x, 2.0));
      hi_only.push_back(std::min(x, 12.0));
    }
    std::string tag = std::string("clamp ") + scalar_type_name(t);
    expect_close(kiln::clamp(to_cuda(h), 2, 12), both, 0, tag);
    expect_close(kiln::clamp(strided_copy_of(h, kCudaDev), 2, std::nullopt), lo_only, 0, tag + " min only");
    expect_close(kiln::clamp(to_cuda(h), std::nullopt, 12), hi_only, 0, tag + " max only");
    Tensor x = strided_copy_of(h, kCudaDev);
    kiln::clamp_(x, 2, 12);
    expect_close(x, both, 0, tag + " in-place");
    Tensor out = kiln::empty({6, 7}, t, kCudaDev);
    kiln::clamp_out(out, to_cuda(h), 2, 12);
    expect_close(out, both, 0, tag + " out=");
  }
  // Float bounds promote an integer tensor to float32; min > max gives max; nan stays.
  Tensor hi = host_tensor(kInt32, {10}, 3);
  Tensor c = kiln::clamp(to_cuda(hi), -2.5, 3.5);
  EXPECT_EQ(c.dtype(), kFloat32);
  std::vector<double> want;
  for (double x : values(hi)) want.push_back(std::min(std::max(x, -2.5), 3.5));
  expect_close(c, want, 0, "clamp int32 with float bounds");
  Tensor f = empty_on({3}, kFloat32, kCPU);
  write_values(f, {NAN, -5, 5});
  expect_close(kiln::clamp(to_cuda(f), 3, 1), {NAN, 1, 1}, 0, "clamp min > max, nan");
  EXPECT_ERROR(ErrorKind::Value, "clamp", { kiln::clamp(to_cuda(f)); });
}
