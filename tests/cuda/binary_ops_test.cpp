// Binary pointwise ops and where on CUDA (kernels/cuda/arith_ops.cu, binary_math_ops.cu,
// compare_ops.cu) against host references: every dtype of the op's row, broadcasting,
// non-contiguous inputs, a CPU 0-dim operand on either side, in-place and out=, promotion.
#include <functional>

#include "cuda/pointwise_util.h"

using namespace kiln;
using namespace kiln::gputest;

namespace {

using BinaryFn = std::function<Tensor(const Tensor&, const Tensor&)>;
// Reference on the input values (as stored in the compute dtype t).
using BinaryRef = std::function<double(double, double, ScalarType)>;

// Checks fn(a, b) of dtype t (result dtype rt) with broadcasting, non-contiguous inputs and a
// CPU 0-dim operand on either side.
void run_binary(const std::string& name, const BinaryFn& fn, const BinaryRef& ref, ScalarType t,
                ScalarType rt, uint32_t seed) {
  std::string tag = name + " " + scalar_type_name(t);
  double rel = tol(rt);
  DimVector as{3, 1, 5}, bs{4, 5}, os{3, 4, 5};
  Tensor ha = host_tensor(t, as, seed), hb = host_tensor(t, bs, seed + 1);
  std::vector<double> va = values(ha), vb = values(hb), want;
  for (int64_t i = 0; i < 60; ++i)
    want.push_back(store(rt, ref(va[broadcast_index(i, os, as)], vb[broadcast_index(i, os, bs)], t)));
  Tensor c = fn(to_cuda(ha), to_cuda(hb));
  EXPECT_TRUE(c.device() == kCudaDev);
  EXPECT_EQ(c.dtype(), rt);
  EXPECT_TRUE(c.sizes() == os.ref());
  expect_close(c, want, rel, tag + " broadcast");

  Tensor hx = host_tensor(t, {6, 8}, seed + 2), hy = host_tensor(t, {6, 8}, seed + 3);
  std::vector<double> vx = values(hx), vy = values(hy);
  want.clear();
  for (size_t i = 0; i < vx.size(); ++i) want.push_back(store(rt, ref(vx[i], vy[i], t)));
  expect_close(fn(strided_copy_of(hx, kCudaDev), strided_copy_of(hy, kCudaDev)), want, rel, tag + " non-contiguous");
  expect_close(fn(to_cuda(hx), to_cuda(hy)), want, rel, tag + " contiguous");

  double s = vy[5];  // a CPU 0-dim tensor of the same dtype, on either side
  Tensor hs = host_scalar(t, s);
  std::vector<double> w2, w1;
  for (double x : vx) {
    w2.push_back(store(rt, ref(x, s, t)));
    w1.push_back(store(rt, ref(s, x, t)));
  }
  expect_close(fn(strided_copy_of(hx, kCudaDev), hs), w2, rel, tag + " (tensor, cpu scalar)");
  expect_close(fn(hs, to_cuda(hx)), w1, rel, tag + " (cpu scalar, tensor)");
  EXPECT_EQ(fn(kiln::empty({0, 1, 5}, t, kCudaDev), to_cuda(hb)).numel(), int64_t{0});
}

// Integer power by squaring with wrap-around, as the kernels (negative exponents: 0 except for
// bases 1 and -1).
double powi_ref(int64_t a, int64_t b, ScalarType t) {
  if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);
  uint64_t r = 1, base = static_cast<uint64_t>(a);
  while (b) {
    if (b & 1) r *= base;
    b /= 2;
    base *= base;
  }
  return wrap_int(t, static_cast<int64_t>(r));
}

double floor_div_ref(double a, double b, ScalarType t) {
  if (!is_floating(t)) {
    if (b == 0) return 0;  // Note [CUDA integer division by zero]
    int64_t x = static_cast<int64_t>(a), y = static_cast<int64_t>(b), q = x / y;
    if (x % y != 0 && ((x < 0) != (y < 0))) --q;
    return static_cast<double>(q);
  }
  return b == 0 ? a / b : std::floor(a / b);
}

double mod_ref(double a, double b, ScalarType t, bool python) {
  if (!is_floating(t)) {
    if (b == 0) return 0;
    int64_t x = static_cast<int64_t>(a), y = static_cast<int64_t>(b), r = x % y;
    if (python && r != 0 && ((r < 0) != (y < 0))) r += y;
    return static_cast<double>(r);
  }
  double r = std::fmod(a, b);
  if (python && r != 0 && ((b < 0) != (r < 0))) r += b;
  return r;
}

}  // namespace

GPU_TEST(BinaryOps, SubMulEveryDtype) {
  REQUIRE_GPU();
  for (ScalarType t : numeric_dtypes()) {
    run_binary("sub", [](const Tensor& a, const Tensor& b) { return kiln::sub(a, b); },
               [](double a, double b, ScalarType) { return a - b; }, t, t, 20);
    run_binary("sub alpha", [](const Tensor& a, const Tensor& b) { return kiln::sub(a, b, 3); },
               [](double a, double b, ScalarType) { return a - 3 * b; }, t, t, 21);
  }
  for (ScalarType t : all_dtypes()) {
    run_binary("mul", [](const Tensor& a, const Tensor& b) { return kiln::mul(a, b); },
               [](double a, double b, ScalarType) { return a * b; }, t, t, 22);
  }
  // Promotion: int32 tensor * wrapped 2.5 -> float32; float16 + wrapped 0.1 adds Half(0.1).
  Tensor hi = host_tensor(kInt32, {7}, 23);
  std::vector<double> want;
  for (double v : values(hi)) want.push_back(store(kFloat32, v * 2.5));
  Tensor p = to_cuda(hi) * 2.5;
  EXPECT_EQ(p.dtype(), kFloat32);
  expect_close(p, want, 0, "int32 * 2.5");
  Tensor hh = host_tensor(kFloat16, {7}, 24);
  want.clear();
  for (double v : values(hh)) want.push_back(round_to(kFloat16, float(v) - 2 * float(round_to(kFloat16, 0.1))));
  expect_close(kiln::sub(to_cuda(hh), scalar_to_tensor(0.1), 2), want, 0, "float16 - 2 * 0.1");
  // In-place and out= with a non-contiguous out.
  Tensor ha = host_tensor(kFloat32, {6, 8}, 25), hb = host_tensor(kFloat32, {6, 8}, 26);
  std::vector<double> va = values(ha), vb = values(hb);
  want.clear();
  for (size_t i = 0; i < va.size(); ++i) want.push_back(store(kFloat32, va[i] * vb[i]));
  Tensor x = strided_copy_of(ha, kCudaDev);
  x.mul_(to_cuda(hb));
  expect_close(x, want, 0, "mul_ non-contiguous self");
  Tensor out = strided_copy_of(ha, kCudaDev);
  kiln::mul_out(out, to_cuda(ha), strided_copy_of(hb, kCudaDev));
  expect_close(out, want, 0, "mul_out non-contiguous out");
  EXPECT_ERROR(ErrorKind::Type, "sub", { kiln::sub(kiln::empty({2}, kBool, kCudaDev), kiln::empty({2}, kBool, kCudaDev)); });
}

GPU_TEST(BinaryOps, DivAllRoundingModes) {
  REQUIRE_GPU();
  for (ScalarType t : all_dtypes()) {
    ScalarType rt = is_floating(t) ? t : kFloat32;
    run_binary("div", [](const Tensor& a, const Tensor& b) { return kiln::div(a, b); },
               [](double a, double b, ScalarType) { return a / b; }, t, rt, 30);
  }
  for (ScalarType t : numeric_dtypes()) {
    run_binary("div trunc", [](const Tensor& a, const Tensor& b) { return kiln::div(a, b, "trunc"); },
               [](double a, double b, ScalarType t) {
                 if (!is_floating(t)) return b == 0 ? 0.0 : double(static_cast<int64_t>(a) / static_cast<int64_t>(b));
                 return std::trunc(a / b);
               },
               t, t, 31);
    run_binary("div floor", [](const Tensor& a, const Tensor& b) { return kiln::div(a, b, "floor"); },
               floor_div_ref, t, t, 32);
  }
  // Integer division by zero gives 0 on CUDA (Note [CUDA integer division by zero]).
  Tensor h = empty_on({3}, kInt32, kCPU);
  write_values(h, {7, -7, 0});
  Tensor d = to_cuda(h), zero = kiln::zeros({3}, kInt32, kCudaDev);
  expect_close(kiln::div(d, zero, "trunc"), {0, 0, 0}, 0, "int / 0 trunc");
  expect_close(kiln::div(d, zero, "floor"), {0, 0, 0}, 0, "int / 0 floor");
  expect_close(kiln::div(d, zero), {INFINITY, -INFINITY, NAN}, 0, "int / 0 true division");
  // Floor division of floats is exact at integer boundaries (Python's //).
  Tensor f = empty_on({2}, kFloat64, kCPU), g = empty_on({2}, kFloat64, kCPU);
  write_values(f, {1.0, -1.0});
  write_values(g, {0.1, 0.1});
  expect_close(kiln::div(to_cuda(f), to_cuda(g), "floor"), {9, -10}, 0, "1.0 // 0.1");
  EXPECT_ERROR(ErrorKind::Value, "rounding_mode", { kiln::div(d, d, "round"); });
}

GPU_TEST(BinaryOps, MaximumMinimumNan) {
  REQUIRE_GPU();
  for (ScalarType t : all_dtypes()) {
    run_binary("maximum", [](const Tensor& a, const Tensor& b) { return kiln::maximum(a, b); },
               [](double a, double b, ScalarType) { return std::max(a, b); }, t, t, 40);
    run_binary("minimum", [](const Tensor& a, const Tensor& b) { return kiln::minimum(a, b); },
               [](double a, double b, ScalarType) { return std::min(a, b); }, t, t, 41);
  }
  Tensor a = empty_on({3}, kFloat32, kCPU), b = empty_on({3}, kFloat32, kCPU);
  write_values(a, {NAN, 1, 2});
  write_values(b, {1, NAN, 3});
  expect_close(kiln::maximum(to_cuda(a), to_cuda(b)), {NAN, NAN, 3}, 0, "maximum nan");
  expect_close(kiln::minimum(to_cuda(a), to_cuda(b)), {NAN, NAN, 2}, 0, "minimum nan");
}

GPU_TEST(BinaryOps, PowFmodRemainder) {
  REQUIRE_GPU();
  for (ScalarType t : numeric_dtypes()) {
    run_binary("pow", [](const Tensor& a, const Tensor& b) { return kiln::pow(a, b); },
               [](double a, double b, ScalarType t) {
                 if (!is_floating(t)) return powi_ref(static_cast<int64_t>(a), static_cast<int64_t>(b), t);
                 return std::pow(a, b);
               },
               t, t, 50);
    run_binary("fmod", [](const Tensor& a, const Tensor& b) { return kiln::fmod(a, b); },
               [](double a, double b, ScalarType t) { return mod_ref(a, b, t, false); }, t, t, 51);
    run_binary("remainder", [](const Tensor& a, const Tensor& b) { return kiln::remainder(a, b); },
               [](double a, double b, ScalarType t) { return mod_ref(a, b, t, true); }, t, t, 52);
  }
  Tensor h = empty_on({4}, kInt64, kCPU);
  write_values(h, {2, -1, 1, 3});
  Tensor e = empty_on({4}, kInt64, kCPU);
  write_values(e, {62, -3, -5, -1});
  expect_close(kiln::pow(to_cuda(h), to_cuda(e)), {double(int64_t{1} << 62), -1, 1, 0}, 0, "int64 pow");
  Tensor m = host_scalar(kInt32, 0);
  expect_close(kiln::remainder(to_cuda(host_tensor(kInt32, {2}, 5)), m), {0, 0}, 0, "int % 0");
}

GPU_TEST(BinaryOps, ComparisonsEveryDtypeAndPromotion) {
  REQUIRE_GPU();
  using Cmp = std::function<bool(double, double)>;
  std::vector<std::tuple<const char*, BinaryFn, Cmp>> ops = {
      {"eq", [](const Tensor& a, const Tensor& b) { return kiln::eq(a, b); }, [](double a, double b) { return a == b; }},
      {"ne", [](const Tensor& a, const Tensor& b) { return kiln::ne(a, b); }, [](double a, double b) { return a != b; }},
      {"lt", [](const Tensor& a, const Tensor& b) { return kiln::lt(a, b); }, [](double a, double b) { return a < b; }},
      {"le", [](const Tensor& a, const Tensor& b) { return kiln::le(a, b); }, [](double a, double b) { return a <= b; }},
      {"gt", [](const Tensor& a, const Tensor& b) { return kiln::gt(a, b); }, [](double a, double b) { return a > b; }},
      {"ge", [](const Tensor& a, const Tensor& b) { return kiln::ge(a, b); }, [](double a, double b) { return a >= b; }},
  };
  for (auto& [name, fn, cmp] : ops) {
    for (ScalarType t : all_dtypes()) {
      Cmp c = cmp;
      run_binary(name, fn, [c](double a, double b, ScalarType) { return double(c(a, b)); }, t, kBool, 60);
    }
    // Mixed dtypes compare in result_type: int32 vs float16 -> float16; int32 vs 2.5 -> float32.
    Tensor hi = host_tensor(kInt32, {9}, 61), hh = host_tensor(kFloat16, {9}, 62);
    std::vector<double> vi = values(hi), vh = values(hh), want, want_s;
    for (size_t i = 0; i < vi.size(); ++i) {
      want.push_back(cmp(round_to(kFloat16, vi[i]), vh[i]));
      want_s.push_back(cmp(vi[i], 2.5));
    }
    expect_close(fn(to_cuda(hi), to_cuda(hh)), want, 0, std::string(name) + " int32 vs float16");
    expect_close(fn(to_cuda(hi), scalar_to_tensor(2.5)), want_s, 0, std::string(name) + " int32 vs 2.5");
  }
  // The CPU scalar is first stored in the compute dtype, as on the CPU.
  Tensor h = empty_on({2}, kFloat16, kCPU);
  write_values(h, {0.1, 0.2});
  expect_close(kiln::eq(to_cuda(h), scalar_to_tensor(0.1)), {1, 0}, 0, "float16 == 0.1");
  Tensor u = empty_on({2}, kUInt8, kCPU);
  write_values(u, {255, 1});
  expect_close(kiln::eq(to_cuda(u), scalar_to_tensor(-1)), {1, 0}, 0, "uint8 == -1 (wraps to 255)");
  Tensor out = kiln::empty({2}, kBool, kCudaDev);
  kiln::lt_out(out, to_cuda(u), scalar_to_tensor(100));
  expect_close(out, {0, 1}, 0, "lt_out");
}

GPU_TEST(BinaryOps, LogicalOps) {
  REQUIRE_GPU();
  using L = std::function<bool(bool, bool)>;
  std::vector<std::tuple<const char*, BinaryFn, L>> ops = {
      {"logical_and", [](const Tensor& a, const Tensor& b) { return kiln::logical_and(a, b); }, [](bool a, bool b) { return a && b; }},
      {"logical_or", [](const Tensor& a, const Tensor& b) { return kiln::logical_or(a, b); }, [](bool a, bool b) { return a || b; }},
      {"logical_xor", [](const Tensor& a, const Tensor& b) { return kiln::logical_xor(a, b); }, [](bool a, bool b) { return a != b; }},
  };
  for (auto& [name, fn, f] : ops) {
    L g = f;
    for (ScalarType t : all_dtypes())
      run_binary(name, fn, [g](double a, double b, ScalarType) { return double(g(a != 0, b != 0)); }, t, kBool, 70);
    // Mixed dtypes, nan is true.
    Tensor hf = empty_on({4}, kFloat32, kCPU), hi = empty_on({4}, kInt64, kCPU);
    write_values(hf, {NAN, 0, 0.5, 0});
    write_values(hi, {0, 3, 1, 0});
    std::vector<double> want{double(g(true, false)), double(g(false, true)), double(g(true, true)), double(g(false, false))};
    expect_close(fn(to_cuda(hf), to_cuda(hi)), want, 0, std::string(name) + " float32 vs int64");
  }
}

GPU_TEST(BinaryOps, WhereEveryDtype) {
  REQUIRE_GPU();
  DimVector cs{3, 1, 5}, xs{4, 5}, os{3, 4, 5};
  Tensor hc = host_tensor(kBool, cs, 80);
  std::vector<double> vc = values(hc);
  for (ScalarType t : all_dtypes()) {
    std::string tag = std::string("where ") + scalar_type_name(t);
    Tensor hx = host_tensor(t, xs, 81), hy = host_tensor(t, os, 82);
    std::vector<double> vx = values(hx), vy = values(hy), want, want_s;
    double s = vx[3];
    for (int64_t i = 0; i < 60; ++i) {
      bool c = vc[broadcast_index(i, os, cs)] != 0;
      want.push_back(c ? vx[broadcast_index(i, os, xs)] : vy[i]);
      want_s.push_back(c ? s : vy[i]);
    }
    Tensor w = kiln::where(to_cuda(hc), to_cuda(hx), to_cuda(hy));
    EXPECT_EQ(w.dtype(), t);
    expect_close(w, want, 0, tag + " broadcast");
    expect_close(kiln::where(strided_copy_of(hc, kCudaDev), strided_copy_of(hx, kCudaDev), strided_copy_of(hy, kCudaDev)),
                 want, 0, tag + " non-contiguous");
    expect_close(kiln::where(to_cuda(hc), host_scalar(t, s), to_cuda(hy)), want_s, 0, tag + " cpu scalar self");
    Tensor hc2 = host_tensor(kBool, os, 83);
    std::vector<double> vc2 = values(hc2), want2;
    for (int64_t i = 0; i < 60; ++i) want2.push_back(vc2[i] != 0 ? vy[i] : s);
    expect_close(kiln::where(to_cuda(hc2), to_cuda(hy), host_scalar(t, s)), want2, 0, tag + " contiguous, cpu scalar other");
    Tensor out = strided_copy_of(hy, kCudaDev);
    kiln::where_out(out, to_cuda(hc), to_cuda(hx), to_cuda(hy));
    expect_close(out, want, 0, tag + " out=");
  }
  // Promotion: where(c, int32, 0.5) -> float32; a CPU scalar condition.
  Tensor hx = host_tensor(kInt32, {4, 5}, 84);
  Tensor w = kiln::where(to_cuda(host_tensor(kBool, {4, 5}, 85)), to_cuda(hx), scalar_to_tensor(0.5));
  EXPECT_EQ(w.dtype(), kFloat32);
  expect_close(kiln::where(host_scalar(kBool, 1), to_cuda(hx), scalar_to_tensor(0.5)), values(hx), 0,
               "where(cpu true, x, 0.5)");
  EXPECT_ERROR(ErrorKind::Type, "condition", { kiln::where(to_cuda(hx), to_cuda(hx), to_cuda(hx)); });
}
