// Integer edge values on CUDA (See Note [Integer edge values] and Note [Float to integer casts]
// in kiln/scalar_math.h): every pair of {MIN, MIN+1, -2, -1, 0, 1, 2, MAX-1, MAX} through each
// integer kernel, exactly equal to the host's kiln/scalar_math.h functions (which
// tests/kernels/int_edge_test.cpp checks against 128-bit references), plus float -> integer
// casts and integer division by zero (0 on CUDA: Note [CUDA integer division by zero]).
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>

#include "cuda/gpu_util.h"
#include "cuda/harness.h"
#include "kiln/scalar_math.h"
#include "int_edge_values.h"

using namespace kiln;
using namespace kiln::gputest;

namespace {
const Device kCuda("cuda");

using kiln::testing::int_edges;

template <typename T>
Tensor host_of(const std::vector<T>& v, IntArrayRef sizes) {
  Tensor t = kiln::empty_on(sizes, CppTypeToScalarType<T>::value, Device(kCPU));
  std::memcpy(t.impl()->raw_data(), v.data(), v.size() * sizeof(T));
  return t;
}

// The elements of a contiguous result, bit for bit (copied to the host first).
template <typename T>
std::vector<T> elements(const Tensor& t) {
  Tensor h = t.to(std::nullopt, Device(kCPU));
  EXPECT_TRUE(h.is_contiguous());
  EXPECT_EQ(h.dtype(), CppTypeToScalarType<T>::value);
  std::vector<T> out(h.numel());
  std::memcpy(out.data(), h.impl()->raw_data(), out.size() * sizeof(T));
  return out;
}

using Fn = std::function<Tensor(const Tensor&, const Tensor&)>;

// fn(x, y) on CUDA over every pair (as (n, 1) x (1, n)) and with y a CPU wrapped scalar, against
// ref(x, y) on the host; division by zero gives 0.
template <typename T>
void check_binary(const std::string& name, const Fn& fn, T (*ref)(T, T), bool zero_gives_zero) {
  std::vector<T> xs = int_edges<T>(), ys = int_edges<T>();
  const int64_t n = static_cast<int64_t>(xs.size());
  Tensor x = host_of(xs, {n, 1}).to(std::nullopt, kCuda), y = host_of(ys, {1, n}).to(std::nullopt, kCuda);
  std::vector<T> got = elements<T>(fn(x, y));
  ASSERT_EQ(static_cast<int64_t>(got.size()), n * n);
  int bad = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      T want = (zero_gives_zero && ys[j] == 0) ? T(0) : ref(xs[i], ys[j]);
      if (got[i * n + j] != want && bad++ < 5)
        add_failure(__FILE__, __LINE__,
                    name + "(" + std::to_string(int64_t(xs[i])) + ", " + std::to_string(int64_t(ys[j])) +
                        ") gave " + std::to_string(int64_t(got[i * n + j])) + ", want " +
                        std::to_string(int64_t(want)));
    }
  for (T s : ys) {
    if (name == "pow" && int64_t(s) < 0) {  // an integer tensor to a negative scalar power: refused
      EXPECT_ERROR(ErrorKind::Value, "negative integer powers", { fn(x, scalar_to_tensor(Scalar(int64_t(s)))); });
      continue;
    }
    std::vector<T> col = elements<T>(fn(x, scalar_to_tensor(Scalar(int64_t(s)))));
    for (int64_t i = 0; i < n; ++i) {
      T want = (zero_gives_zero && s == 0) ? T(0) : ref(xs[i], s);
      EXPECT_EQ(int64_t(col[i]), int64_t(want));
    }
  }
}

template <typename T>
void check_all() {
  check_binary<T>("add", [](const Tensor& a, const Tensor& b) { return add(a, b, 3); },
                  [](T a, T b) { return wrapping_add(a, wrapping_mul(T(3), b)); }, false);
  check_binary<T>("sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }, wrapping_sub<T>, false);
  check_binary<T>("mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }, wrapping_mul<T>, false);
  check_binary<T>("div(trunc)", [](const Tensor& a, const Tensor& b) { return div(a, b, "trunc"); },
                  int_div_trunc<T>, true);
  check_binary<T>("div(floor)", [](const Tensor& a, const Tensor& b) { return div(a, b, "floor"); },
                  int_div_floor<T>, true);
  check_binary<T>("fmod", [](const Tensor& a, const Tensor& b) { return fmod(a, b); }, int_mod_trunc<T>, true);
  check_binary<T>("remainder", [](const Tensor& a, const Tensor& b) { return remainder(a, b); },
                  int_mod_floor<T>, true);
  check_binary<T>("pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); }, int_pow<T>, false);

  std::vector<T> xs = int_edges<T>();
  Tensor x = host_of(xs, {static_cast<int64_t>(xs.size())}).to(std::nullopt, kCuda);
  std::vector<T> ng = elements<T>(neg(x)), ab = elements<T>(abs(x));
  for (size_t i = 0; i < xs.size(); ++i) {
    EXPECT_EQ(int64_t(ng[i]), int64_t(wrapping_neg(xs[i])));
    EXPECT_EQ(int64_t(ab[i]), int64_t(wrapping_abs(xs[i])));
  }
}

}  // namespace

GPU_TEST(IntEdges, Int8) { REQUIRE_GPU(); check_all<int8_t>(); }
GPU_TEST(IntEdges, Int16) { REQUIRE_GPU(); check_all<int16_t>(); }
GPU_TEST(IntEdges, Int32) { REQUIRE_GPU(); check_all<int32_t>(); }
GPU_TEST(IntEdges, Int64) { REQUIRE_GPU(); check_all<int64_t>(); }
GPU_TEST(IntEdges, UInt8) { REQUIRE_GPU(); check_all<uint8_t>(); }

// Casts on the device follow the same rule as on the host: truncate, saturate, NaN -> 0.
GPU_TEST(IntEdges, FloatToIntegerCasts) {
  REQUIRE_GPU();
  const std::vector<double> in{std::nan(""), INFINITY, -INFINITY, 1e30, -1e30, 3e9, -3e9, 300.5, -300.5, -0.9, 42.7};
  Tensor d = host_of(in, {static_cast<int64_t>(in.size())}).to(std::nullopt, kCuda);
  auto check = [&](auto zero) {
    using T = decltype(zero);
    const ScalarType t = CppTypeToScalarType<T>::value;
    std::vector<T> g64 = elements<T>(d.to(t)), g32 = elements<T>(d.to(kFloat32).to(t));
    for (size_t i = 0; i < in.size(); ++i) {
      EXPECT_EQ(int64_t(g64[i]), int64_t(convert<T>(in[i])));
      EXPECT_EQ(int64_t(g32[i]), int64_t(convert<T>(static_cast<float>(in[i]))));
    }
  };
  check(uint8_t{});
  check(int8_t{});
  check(int16_t{});
  check(int32_t{});
  check(int64_t{});
}
