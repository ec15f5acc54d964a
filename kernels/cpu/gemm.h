// kernels/cpu/gemm.h: the one CPU GEMM. matmul.cpp and attention.cpp multiply with it, conv.cpp
// through kiln::matmul.
//
//   // a tile: c (m x n, row-major, ldc) = alpha * a @ b^T + beta * c, a: (m x k), b: (n x k)
//   int st = gemm('N', 'T', m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);  // float or double
//   // tensors: c (B, M, N) or (M, N), contiguous, float32 or float64
//   gemm_batched("bmm", c, blas_ready(a), blas_ready(b), alpha, beta);
//
// Note [CPU GEMM]: float32 goes to oneDNN's dnnl_sgemm (row-major) in builds with oneDNN
// (KILN_HAVE_DNNL), else to the portable blocked kernel of gemm.cpp; float64 (which oneDNN
// lacks) always uses the portable kernel. A transposed or row-padded operand is passed with the
// 'T' flag and its leading dimension instead of being copied; only layouts BLAS can't express
// (two non-unit strides, broadcast zero strides) are made contiguous first (blas_ready).
// bfloat16/float16 (matmul.cpp) use oneDNN's matmul primitive when it has an optimized
// implementation for this CPU, else they compute in float32 (converted copies, the float32 GEMM)
// and store rounded. The output is never zero-filled: with beta == 0 nothing reads it. The
// portable kernel sums each output element on one thread in a fixed order, so its results do not
// depend on the thread count.
#pragma once

#include <cstdint>

#include "kiln/tensor.h"

namespace kiln::kernels {

// c (m x n, row-major, leading dimension ldc) = alpha * op(a) @ op(b) + beta * c, where a and b
// are row-major with leading dimensions lda and ldb and op(x) is x for 'N', x^T for 'T'. Nothing
// happens when m or n is 0. Returns 0, or oneDNN's status when it refuses the arguments (the
// portable kernel never fails). Safe to call from inside a parallel region: it then runs on the
// calling thread.
[[nodiscard]] int gemm(char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha,
                       const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                       float* c, int64_t ldc);
[[nodiscard]] int gemm(char ta, char tb, int64_t m, int64_t n, int64_t k, double alpha,
                       const double* a, int64_t lda, const double* b, int64_t ldb, double beta,
                       double* c, int64_t ldc);

// t: (M, K) or (B, M, K) -> t itself when BLAS can read its matrices (and its batch is not a
// broadcast), else a contiguous copy.
Tensor blas_ready(const Tensor& t);

// c = alpha * a @ b + beta * c; a: (M, K) / (B, M, K), b: (K, N) / (B, K, N), both blas_ready,
// c: (M, N) / (B, M, N) contiguous, all float32 or all float64, K > 0. c is read only when
// beta != 0. A failing BLAS call raises a Runtime error naming `op`.
void gemm_batched(const char* op, const Tensor& c, const Tensor& a, const Tensor& b, double alpha,
                  double beta);

}  // namespace kiln::kernels
