// fill_, add, arange, linspace and eye on CUDA against host references.
#include "cuda/gpu_util.h"
#include "cuda/harness.h"

using namespace kiln;
using namespace kiln::gputest;

namespace {
const Device kCuda("cuda");

double tol_for(ScalarType t) {
  switch (t) {
    case kFloat16: return 1e-2;
    case kBFloat16: return 1e-1;
    case kFloat32: return 1e-5;
    default: return 1e-12;
  }
}

void expect_values(const Tensor& got, const std::vector<double>& want, double tol) {
  std::vector<double> g = values(got);
  ASSERT_EQ(g.size(), want.size());
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], want[i], tol * (1 + std::fabs(want[i])));
}

}  // namespace

GPU_TEST(Ops, OnesPlusTensorEndToEnd) {
  REQUIRE_GPU();
  Tensor x = kiln::arange(0, 3, 1, kFloat32, kCuda);
  Tensor y = kiln::ones({3}, std::nullopt, kCuda) + x;
  EXPECT_TRUE(y.device().is_cuda());
  expect_values(y, {1, 2, 3}, 0);
  expect_values(y + 0.5, {1.5, 2.5, 3.5}, 0);  // a wrapped CPU number
  expect_values(1 + y, {2, 3, 4}, 0);
}

GPU_TEST(Ops, FillEveryDtypeAndLayout) {
  REQUIRE_GPU();
  for (ScalarType t : all_dtypes()) {
    Tensor a = kiln::empty({5, 9}, t, kCuda);
    a.fill_(t == kBool ? Scalar(true) : Scalar(3));
    expect_values(a, std::vector<double>(45, t == kBool ? 1 : 3), 0);
    a.fill_(0);
    expect_values(a, std::vector<double>(45, 0), 0);
    Tensor wide = kiln::zeros({4, 6}, t, kCuda);
    wide.slice(1, 1, std::nullopt, 2).fill_(1);  // non-contiguous: columns 1, 3, 5
    std::vector<double> want;
    for (int i = 0; i < 24; ++i) want.push_back(i % 2);
    expect_values(wide, want, 0);
  }
  Tensor h = kiln::full({3}, 0.1, kFloat16, kCuda);
  expect_values(h, std::vector<double>(3, round_to(kFloat16, 0.1)), 0);
  Tensor z = kiln::empty({0}, kFloat32, kCuda);
  z.fill_(1);
}

GPU_TEST(Ops, AddEveryDtypeWithBroadcasting) {
  REQUIRE_GPU();
  DimVector as{3, 1, 5}, bs{4, 5}, os{3, 4, 5};
  for (ScalarType t : all_dtypes()) {
    Tensor ha = host_tensor(t, as, 10), hb = host_tensor(t, bs, 11);
    Tensor c = kiln::add(ha.to(std::nullopt, kCuda), hb.to(std::nullopt, kCuda));
    EXPECT_EQ(c.dtype(), t);
    EXPECT_TRUE(c.sizes() == os.ref());
    std::vector<double> va = values(ha), vb = values(hb), want;
    for (int64_t i = 0; i < 60; ++i) {
      double x = va[broadcast_index(i, os, as)], y = vb[broadcast_index(i, os, bs)];
      want.push_back(round_to(t, t == kBool ? double(x || y) : x + y));
    }
    expect_values(c, want, tol_for(t));
  }
}

GPU_TEST(Ops, AddAlphaNonContiguousAndPromotion) {
  REQUIRE_GPU();
  Tensor ha = host_tensor(kFloat32, {6, 8}, 12), hb = host_tensor(kInt32, {6, 8}, 13);
  Tensor a = strided_copy_of(ha, kCuda), b = strided_copy_of(hb, kCuda);
  Tensor c = kiln::add(a, b, 2.5);  // float32 + int32 -> float32, non-contiguous inputs
  EXPECT_EQ(c.dtype(), kFloat32);
  std::vector<double> va = values(ha), vb = values(hb), want;
  for (size_t i = 0; i < va.size(); ++i) want.push_back(va[i] + 2.5 * vb[i]);
  expect_values(c, want, 1e-6);
  Tensor ai = hb.to(std::nullopt, kCuda);
  Tensor ci = kiln::add(ai, ai, 3);  // integer alpha
  want.clear();
  for (double v : vb) want.push_back(4 * v);
  expect_values(ci, want, 0);
  EXPECT_ERROR(ErrorKind::Type, "alpha", { kiln::add(ai, ai, 0.5); });
}

GPU_TEST(Ops, AddInPlaceOutAndHalfComputedInFloat) {
  REQUIRE_GPU();
  Tensor h = kiln::full({1000}, 1024.0, kFloat16, kCuda);
  Tensor one = kiln::full({1000}, 0.75, kFloat16, kCuda);
  h.add_(one);  // 1024.75 rounds to 1024.5 or 1025 in float16 (spacing 1 at 1024): 1025 (RNE)
  expect_values(h, std::vector<double>(1000, round_to(kFloat16, 1024.75)), 0);
  Tensor big = kiln::arange(0, 1 << 20, 1, kFloat32, kCuda);
  Tensor out = kiln::empty({1 << 20}, kFloat32, kCuda);
  kiln::add_out(out, big, big, 1);
  std::vector<double> v = values(out);
  EXPECT_EQ(v[12345], 2.0 * 12345);
  EXPECT_EQ(v[(1 << 20) - 1], 2.0 * ((1 << 20) - 1));
  Tensor misaligned = big.slice(0, 1, std::nullopt, 1);  // contiguous but not 16-byte aligned
  Tensor m = misaligned + misaligned;
  EXPECT_EQ(values(m)[0], 2.0);
  Tensor e = kiln::empty({0, 4}, kFloat32, kCuda) + kiln::empty({4}, kFloat32, kCuda);
  EXPECT_EQ(e.numel(), int64_t{0});
  EXPECT_ERROR(ErrorKind::Value, "", { kiln::empty({3}, kFloat32, kCuda) + kiln::empty({4}, kFloat32, kCuda); });
  EXPECT_ERROR(ErrorKind::Value, "same device",
               { kiln::empty({3}, kFloat32, kCuda) + kiln::empty({3}, kFloat32, Device(kCPU)); });
}

GPU_TEST(Ops, ArangeLinspaceEyeMatchTheCpuFormulas) {
  REQUIRE_GPU();
  for (ScalarType t : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kUInt8, kInt16, kInt8}) {
    Tensor a = kiln::arange(2, 50, 3, t, kCuda);
    std::vector<double> want;
    for (int64_t v = 2; v < 50; v += 3) want.push_back(round_to(t, double(v)));
    expect_values(a, want, 0);
    if (!is_floating(t)) continue;
    Tensor l = kiln::linspace(-1, 2, 7, t, kCuda);
    want.clear();
    double step = 3.0 / 6;
    for (int i = 0; i < 7; ++i) want.push_back(round_to(t, i < 3 ? -1 + step * i : 2 - step * (6 - i)));
    expect_values(l, want, 0);
  }
  Tensor af = kiln::arange(0.0, 1.0, 0.1, std::nullopt, kCuda);
  EXPECT_EQ(af.dtype(), kFloat32);
  std::vector<double> want;
  for (int i = 0; i < 10; ++i) want.push_back(round_to(kFloat32, 0.0 + 0.1 * i));
  expect_values(af, want, 0);
  EXPECT_ERROR(ErrorKind::Value, "step must be nonzero", { kiln::arange(0, 5, 0, std::nullopt, kCuda); });
  for (ScalarType t : all_dtypes()) {
    Tensor e = kiln::eye(3, 5, t, kCuda);
    want.clear();
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 5; ++j) want.push_back(i == j);
    expect_values(e, want, 0);
  }
  EXPECT_EQ(kiln::eye(4, std::nullopt, std::nullopt, kCuda).numel(), int64_t{16});
  EXPECT_EQ(kiln::linspace(0, 1, 0, std::nullopt, kCuda).numel(), int64_t{0});
}
