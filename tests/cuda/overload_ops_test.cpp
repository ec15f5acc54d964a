// trunc (kernels/cuda/unary_ops.cu) and _binary_cross_entropy (kernels/cuda/loss_ops.cu), the
// kernels of two PyTorch names of the op table, against host references: every dtype, contiguous
// and non-contiguous inputs, broadcasting, in-place, zero-size inputs, the edges of BCE's domain.
#include <cmath>

#include "cuda/pointwise_util.h"

using namespace kiln;
using namespace kiln::gputest;

GPU_TEST(OverloadOps, TruncEveryDtype) {
  REQUIRE_GPU();
  for (ScalarType t : numeric_dtypes()) {
    std::string tag = std::string("trunc ") + scalar_type_name(t);
    Tensor h = host_tensor(t, {6, 7}, 31);
    std::vector<double> want;
    for (double v : values(h)) want.push_back(store(t, std::trunc(v)));
    expect_close(kiln::trunc(to_cuda(h)), want, 0, tag + " contiguous");
    expect_close(kiln::trunc(strided_copy_of(h, kCudaDev)), want, 0, tag + " non-contiguous");
    Tensor x = strided_copy_of(h, kCudaDev);
    kiln::trunc_(x);
    expect_close(x, want, 0, tag + " in-place");
    EXPECT_EQ(kiln::trunc(kiln::empty({0, 3}, t, kCudaDev)).numel(), int64_t{0});
  }
  Tensor h = empty_on({6}, kFloat32, kCPU);
  write_values(h, {1.7, -1.7, 0.5, -0.5, NAN, -INFINITY});
  expect_close(kiln::trunc(to_cuda(h)), {1, -1, 0, -0.0, NAN, -INFINITY}, 0, "trunc edges");
}

GPU_TEST(OverloadOps, BinaryCrossEntropyMatchesTheHostFormula) {
  REQUIRE_GPU();
  for (ScalarType t : float_dtypes()) {
    std::string tag = std::string("_binary_cross_entropy ") + scalar_type_name(t);
    Tensor x = empty_on({2, 4}, t, kCPU), y = empty_on({4}, t, kCPU);
    write_values(x, {0, 1, 0, 1, 0.3, 0.5, 0.25, 0.9});
    write_values(y, {0, 1, 1, 0});  // broadcast over x's rows
    std::vector<double> xs = values(x), ys = values(y), want;
    for (size_t i = 0; i < xs.size(); ++i) {
      const double a = xs[i], b = ys[i % 4];
      want.push_back(
          store(t, (b - 1) * std::max(std::log1p(-a), -100.0) - b * std::max(std::log(a), -100.0)));
    }
    expect_close(kiln::_binary_cross_entropy(to_cuda(x), to_cuda(y)), want, tol(t), tag);
    expect_close(kiln::_binary_cross_entropy(strided_copy_of(x, kCudaDev), to_cuda(y)), want,
                 tol(t), tag + " non-contiguous");
  }
  EXPECT_EQ(kiln::_binary_cross_entropy(kiln::empty({0}, kFloat32, kCudaDev),
                                        kiln::empty({0}, kFloat32, kCudaDev))
                .numel(),
            int64_t{0});
}
