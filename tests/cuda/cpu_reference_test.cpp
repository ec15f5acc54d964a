// The CPU kernels that kiln_gpu_tests compare CUDA results with are linked into kiln_gpu_tests
// and compute correctly in a build without oneDNN, like the GPU machine's: mm and the three
// convolution passes against written-out loops. Needs no GPU. See Note [CPU GEMM].
#include "cuda/gpu_util.h"
#include "cuda/harness.h"

using namespace kiln;
using namespace kiln::gputest;

namespace {

// The inputs hold multiples of 0.5 up to 10, so float32 and float64 sums are exact; bfloat16
// outputs are rounded once.
double tol_for(ScalarType t, double want) { return t == kBFloat16 ? std::fabs(want) / 128 : 0.0; }

void expect_values(const Tensor& got, const std::vector<double>& want, ScalarType t) {
  EXPECT_EQ(got.dtype(), t);
  std::vector<double> g = values(got);
  ASSERT_EQ(g.size(), want.size());
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], want[i], tol_for(t, want[i]));
}

}  // namespace

GPU_TEST(CpuReference, MatmulAgainstLoop) {
  for (ScalarType t : {kFloat32, kFloat64, kBFloat16}) {
    const int64_t M = 5, K = 7, N = 3;
    Tensor a = host_tensor(t, {M, K}, 1), b = host_tensor(t, {K, N}, 2);
    Tensor at = host_tensor(t, {K, M}, 3).t();  // a transposed operand: BLAS 'T', no copy
    std::vector<double> av = values(a), bv = values(b), atv = values(at);
    std::vector<double> want(M * N, 0.0), want_t(M * N, 0.0);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j)
        for (int64_t p = 0; p < K; ++p) {
          want[i * N + j] += av[i * K + p] * bv[p * N + j];
          want_t[i * N + j] += atv[i * K + p] * bv[p * N + j];
        }
    expect_values(kiln::mm(a, b), want, t);
    expect_values(kiln::mm(at, b), want_t, t);
  }
}

// x: (N, C, H, W), w: (O, C, 3, 3), padding 1 -> y: (N, O, H, W); gy: y's shape. The forward,
// the backward data pass (a transposed convolution of gy) and the backward weights pass.
GPU_TEST(CpuReference, ConvolutionPassesAgainstLoops) {
  for (ScalarType t : {kFloat32, kFloat64, kBFloat16}) {
    const int64_t N = 2, C = 2, O = 3, H = 5, W = 4, KS = 3;
    Tensor x = host_tensor(t, {N, C, H, W}, 4), w = host_tensor(t, {O, C, KS, KS}, 5);
    Tensor gy = host_tensor(t, {N, O, H, W}, 6);
    std::vector<double> xv = values(x), wv = values(w), gyv = values(gy);
    std::vector<double> y(N * O * H * W, 0.0), gx(N * C * H * W, 0.0), gw(O * C * KS * KS, 0.0);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < O; ++o)
        for (int64_t c = 0; c < C; ++c)
          for (int64_t r = 0; r < H; ++r)
            for (int64_t s = 0; s < W; ++s)
              for (int64_t kh = 0; kh < KS; ++kh)
                for (int64_t kw = 0; kw < KS; ++kw) {
                  const int64_t ih = r + kh - 1, iw = s + kw - 1;
                  if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                  const int64_t xi = ((n * C + c) * H + ih) * W + iw;
                  const int64_t yi = ((n * O + o) * H + r) * W + s;
                  const int64_t wi = ((o * C + c) * KS + kh) * KS + kw;
                  y[yi] += xv[xi] * wv[wi];
                  gx[xi] += gyv[yi] * wv[wi];
                  gw[wi] += gyv[yi] * xv[xi];
                }
    expect_values(kiln::convolution(x, w, {1, 1}, {1, 1}, {1, 1}, false, {0, 0}, 1), y, t);
    expect_values(kiln::convolution(gy, w, {1, 1}, {1, 1}, {1, 1}, true, {0, 0}, 1), gx, t);
    expect_values(
        kiln::convolution_backward_weight(gy, x, {O, C, KS, KS}, {1, 1}, {1, 1}, {1, 1}, 1), gw, t);
  }
}
