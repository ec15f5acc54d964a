// copy_ between CPU and CUDA (every dtype and dtype pair, layouts, broadcasting) and pinned
// host memory (kernels/cuda/copy.cu, pinned_allocator.cpp).
#include "cuda/gpu_util.h"
#include "cuda/harness.h"
#include "kiln/cuda/pinned.h"
#include "kiln/cuda/stream.h"

using namespace kiln;
using namespace kiln::gputest;

namespace {
const Device kCuda("cuda");

void expect_values(const Tensor& got, const std::vector<double>& want, double tol = 0) {
  std::vector<double> g = values(got);
  ASSERT_EQ(g.size(), want.size());
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], want[i], tol);
}
}  // namespace

GPU_TEST(Copy, RoundTripEveryDtypeContiguous) {
  REQUIRE_GPU();
  for (ScalarType t : all_dtypes()) {
    Tensor h = host_tensor(t, {5, 7}, 1);
    Tensor d = h.to(std::nullopt, kCuda);
    EXPECT_TRUE(d.device().is_cuda());
    EXPECT_EQ(d.dtype(), t);
    Tensor back = d.to(std::nullopt, Device(kCPU));
    EXPECT_TRUE(back.device().is_cpu());
    expect_values(back, values(h));
  }
}

GPU_TEST(Copy, RoundTripEveryDtypeNonContiguous) {
  REQUIRE_GPU();
  for (ScalarType t : all_dtypes()) {
    Tensor h = host_tensor(t, {4, 3, 5}, 2);
    Tensor hv = strided_copy_of(h, kCPU);                 // non-contiguous CPU source
    EXPECT_FALSE(hv.is_contiguous());
    Tensor d = kiln::empty({4, 3, 5}, t, kCuda);
    d.copy_(hv);                                          // strided H2D
    expect_values(d, values(h));
    Tensor dv = strided_copy_of(d, kCuda);                // non-contiguous CUDA (D2D strided)
    EXPECT_FALSE(dv.is_contiguous());
    expect_values(dv, values(h));
    Tensor dt = d.transpose(0, 2);                        // non-contiguous CUDA source, D2H
    Tensor ht = kiln::empty({5, 3, 4}, t, Device(kCPU));
    ht.copy_(dt);
    std::vector<double> want;
    std::vector<double> hvals = values(h);
    for (int k = 0; k < 5; ++k)
      for (int j = 0; j < 3; ++j)
        for (int i = 0; i < 4; ++i) want.push_back(hvals[(i * 3 + j) * 5 + k]);
    expect_values(ht, want);
    Tensor hdst = strided_copy_of(host_tensor(t, {4, 3, 5}, 9), kCPU);  // non-contiguous D2H dst
    hdst.copy_(d);
    expect_values(hdst, values(h));
  }
}

GPU_TEST(Copy, EveryDtypePairCastsOnDevice) {
  REQUIRE_GPU();
  for (ScalarType from : all_dtypes()) {
    Tensor h = host_tensor(from, {33}, 3);
    Tensor d = h.to(std::nullopt, kCuda);
    for (ScalarType to : all_dtypes()) {
      Tensor c = d.to(to, std::nullopt);  // CUDA -> CUDA with a dtype change
      EXPECT_EQ(c.dtype(), to);
      // A negative float converted to uint8 is undefined behaviour (in C++ and in PyTorch):
      // those elements are not compared.
      std::vector<double> src = values(h), want;
      for (double v : src) want.push_back(round_to(to, v));
      Tensor hc = kiln::empty({33}, to, Device(kCPU));
      hc.copy_(d);  // D2H with a cast
      Tensor dc = kiln::empty({33}, to, kCuda);
      dc.copy_(h);  // H2D with a cast
      for (const Tensor& got : {c, hc, dc}) {
        std::vector<double> g = values(got);
        for (size_t i = 0; i < g.size(); ++i) {
          if (is_floating(from) && to == kUInt8 && src[i] < 0) continue;
          EXPECT_EQ(g[i], want[i]);
        }
      }
    }
  }
}

GPU_TEST(Copy, CastFromNonContiguousIntoNonContiguous) {
  REQUIRE_GPU();
  Tensor h = host_tensor(kFloat32, {6, 4}, 4);
  Tensor src = strided_copy_of(h, kCuda);
  Tensor dst = strided_copy_of(host_tensor(kBFloat16, {6, 4}, 5), kCuda);
  dst.copy_(src);
  std::vector<double> want;
  for (double v : values(h)) want.push_back(round_to(kBFloat16, v));
  expect_values(dst, want);
}

GPU_TEST(Copy, BroadcastsTheSource) {
  REQUIRE_GPU();
  Tensor row = host_tensor(kInt32, {4}, 6);
  std::vector<double> r = values(row), want;
  for (int i = 0; i < 3; ++i) want.insert(want.end(), r.begin(), r.end());
  Tensor d = kiln::empty({3, 4}, kInt32, kCuda);
  d.copy_(row);  // H2D broadcast
  expect_values(d, want);
  Tensor d2 = kiln::empty({3, 4}, kFloat64, kCuda);
  d2.copy_(row.to(std::nullopt, kCuda).view({1, 4}));  // D2D broadcast with a cast
  expect_values(d2, want);
  Tensor h = kiln::empty({3, 4}, kInt64, Device(kCPU));
  h.copy_(row.to(std::nullopt, kCuda));  // D2H broadcast with a cast
  expect_values(h, want);
  EXPECT_ERROR(ErrorKind::Value, "cannot be broadcast", { row.to(std::nullopt, kCuda).copy_(d); });
}

GPU_TEST(Copy, ZeroSizeAndScalars) {
  REQUIRE_GPU();
  Tensor z = kiln::empty({0, 3}, kFloat32, kCuda);
  z.copy_(kiln::empty({0, 3}, kFloat32, Device(kCPU)));
  EXPECT_EQ(values(z).size(), size_t{0});
  Tensor s = scalar_tensor_of(Scalar(2.5), kFloat32, kCuda);
  EXPECT_EQ(s.item<double>(), 2.5);
}

GPU_TEST(Pinned, PinnedEmptyIsAPinnedCpuTensor) {
  REQUIRE_GPU();
  Tensor p = cuda::pinned_empty({256}, kFloat32);
  EXPECT_TRUE(p.device().is_cpu());
  EXPECT_TRUE(p.is_contiguous());
  EXPECT_TRUE(cuda::is_pinned(p));
  EXPECT_FALSE(cuda::is_pinned(kiln::empty({256}, kFloat32, Device(kCPU))));
  void* first = p.data_ptr();
  p = Tensor();
  Tensor q = cuda::pinned_empty({200}, kFloat32);  // same size class: the cached block
  EXPECT_EQ(q.data_ptr(), first);
}

GPU_TEST(Pinned, AsyncRoundTripOnASideStream) {
  REQUIRE_GPU();
  cuda::Stream s = cuda::getStreamFromPool(0);
  cuda::StreamGuard g(s);
  for (ScalarType t : {kFloat32, kFloat16, kInt64, kUInt8}) {
    Tensor src = cuda::pinned_empty({1 << 16}, t);
    std::vector<double> want = sample_values(t, 1 << 16, 8);
    write_values(src, want);
    Tensor d = kiln::empty({1 << 16}, t, kCuda);
    d.copy_(src, /*non_blocking=*/true);
    Tensor back = cuda::pinned_empty({1 << 16}, t);
    back.copy_(d, /*non_blocking=*/true);
    s.synchronize();
    expect_values(back, want);
  }
}
