// The CPU GEMM: oneDNN's dnnl_sgemm for float32 where the build has oneDNN, a portable blocked
// kernel otherwise and for float64. See Note [CPU GEMM] (gemm.h).
#include "gemm.h"

#include <algorithm>
#include <atomic>
#include <optional>
#include <type_traits>
#include <vector>

#include "loops.h"

#if KILN_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>

#include "dnnl_util.h"
#endif

namespace kiln::kernels {
namespace {

// How BLAS sees an (r x c) matrix with element strides (rs, cs): 'N' = rows of length c spaced
// by ld, 'T' = the transpose of such a (c x r) matrix. nullopt when neither fits.
struct BlasLayout {
  char trans;
  int64_t ld;
};
std::optional<BlasLayout> blas_layout(int64_t r, int64_t c, int64_t rs, int64_t cs) {
  if ((cs == 1 || c == 1) && (r == 1 || rs >= std::max<int64_t>(c, 1)))
    return BlasLayout{'N', r == 1 ? std::max<int64_t>(c, 1) : rs};
  if ((rs == 1 || r == 1) && (c == 1 || cs >= std::max<int64_t>(r, 1)))
    return BlasLayout{'T', c == 1 ? std::max<int64_t>(r, 1) : cs};
  return std::nullopt;
}
std::optional<BlasLayout> blas_layout(const Tensor& t) {
  return blas_layout(t.size(-2), t.size(-1), t.stride(-2), t.stride(-1));
}
int64_t batch_stride(const Tensor& t) { return t.dim() == 3 ? t.stride(0) : 0; }

// The portable kernel's blocking. (Not locals of gemm_strided: GCC 12 has an internal error on
// constexpr locals of a template that its lambda uses as an array size.)
constexpr int64_t kKc = 256, kNc = 512, kMr = 4, kNr = 16;

// The portable kernel: C(M, N) = alpha * A(M, K) @ B(K, N) + beta * C. A and B take any strides;
// C is row-major with ldc. Blocks of B (up to kKc x kNc) are packed contiguous and shared by all
// threads; each thread packs kMr rows of A at a time and keeps a kMr x kNr tile of C in
// registers while it runs over the block's kKc.

template <typename T>
void gemm_strided(int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t ars, int64_t acs,
                  const T* B, int64_t brs, int64_t bcs, T beta, T* C, int64_t ldc) {
  parallel_for(M, std::max<int64_t>(1, kGrainSize / std::max<int64_t>(N, 1)),
               [&](int64_t i0, int64_t i1) {
                 for (int64_t i = i0; i < i1; ++i)
                   for (int64_t j = 0; j < N; ++j)
                     C[i * ldc + j] = beta == 0 ? T(0) : beta * C[i * ldc + j];
               });
  std::vector<T> packed(std::min(kKc, K) * std::min(kNc, N));
  int64_t groups = (M + kMr - 1) / kMr;
  for (int64_t jc = 0; jc < N; jc += kNc) {
    int64_t nc = std::min(kNc, N - jc);
    for (int64_t pc = 0; pc < K; pc += kKc) {
      int64_t kc = std::min(kKc, K - pc);
      for (int64_t p = 0; p < kc; ++p)
        for (int64_t j = 0; j < nc; ++j) packed[p * nc + j] = B[(pc + p) * brs + (jc + j) * bcs];
      int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / (kc * nc));
      parallel_for(groups, grain, [&](int64_t g0, int64_t g1) {
        T ap[kKc * kMr];
        for (int64_t g = g0; g < g1; ++g) {
          int64_t r0 = g * kMr, rows = std::min(kMr, M - r0);
          for (int64_t p = 0; p < kc; ++p)
            for (int64_t r = 0; r < kMr; ++r)
              ap[p * kMr + r] = r < rows ? alpha * A[(r0 + r) * ars + (pc + p) * acs] : T(0);
          for (int64_t j0 = 0; j0 < nc; j0 += kNr) {
            int64_t nj = std::min(kNr, nc - j0);
            T acc[kMr][kNr] = {};
            const T* bp = packed.data() + j0;
            if (nj == kNr) {
              for (int64_t p = 0; p < kc; ++p) {
                const T* brow = bp + p * nc;
                for (int64_t r = 0; r < kMr; ++r) {
                  T av = ap[p * kMr + r];
#pragma omp simd
                  for (int64_t j = 0; j < kNr; ++j) acc[r][j] += av * brow[j];
                }
              }
            } else {
              for (int64_t p = 0; p < kc; ++p)
                for (int64_t r = 0; r < kMr; ++r)
                  for (int64_t j = 0; j < nj; ++j) acc[r][j] += ap[p * kMr + r] * bp[p * nc + j];
            }
            for (int64_t r = 0; r < rows; ++r)
              for (int64_t j = 0; j < nj; ++j) C[(r0 + r) * ldc + jc + j0 + j] += acc[r][j];
          }
        }
      });
    }
  }
}

// gemm() on the portable kernel: op(x) of an (r x c) operand stored with leading dimension ld
// has element strides (ld, 1) for 'N' and (1, ld) for 'T'.
template <typename T>
void gemm_portable(char ta, char tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                   int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  const bool at = ta == 'T', bt = tb == 'T';
  gemm_strided<T>(m, n, k, alpha, a, at ? 1 : lda, at ? lda : 1, b, bt ? 1 : ldb, bt ? ldb : 1,
                  beta, c, ldc);
}

template <typename T>
struct Operand {
  const T* data;
  BlasLayout layout;
};

#if KILN_HAVE_DNNL
// Note [GEMM leading dimensions]: an operand whose rows lie a multiple of 1 KiB apart (a leading
// dimension that is a multiple of 256 floats: 256, 768, 1024, ...) maps its rows onto the same
// few cache sets, and oneDNN's AVX2 sgemm then runs at 70-120 GFLOP/s here instead of 150-180
// (the weight gradients of a width-256 transformer's linears: dY^T @ X with 2048 rows of K).
// It matters for the operands whose rows run along K (A transposed, B not): a large GEMM copies
// such an operand to rows padded by 16 floats first, which reads and writes it once against
// 2 * (other dimension) flops per element. Padding the other operands too only added copies
// (GPT step, interleaved A/B). The portable kernel packs its operands itself and needs none of it.
Operand<float> unaliased(const Operand<float>& op, int64_t lines, int64_t len,
                         std::vector<float>& buffer) {
  if (op.layout.ld % 256 != 0 || lines < 256) return op;
  const int64_t ld = (len + 15) / 16 * 16 + 16;
  if (buffer.size() < static_cast<size_t>(lines * ld)) buffer.resize(lines * ld);
  float* dst = buffer.data();
  parallel_for(lines, 64, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) std::copy_n(op.data + j * op.layout.ld, len, dst + j * ld);
  });
  return {dst, {op.layout.trans, ld}};
}

// x (M x K) and y (K x N), one batch entry's operands, moved to padded copies where a large
// GEMM needs them (See Note [GEMM leading dimensions]).
void unalias_large(Operand<float>& x, Operand<float>& y, int64_t M, int64_t N, int64_t K) {
  if (M * N * K < (int64_t{1} << 24)) return;
  thread_local std::vector<float> a_buffer, b_buffer;
  if (x.layout.trans == 'T') x = unaliased(x, K, M, a_buffer);
  if (y.layout.trans == 'N') y = unaliased(y, K, N, b_buffer);
}
#endif

template <typename T>
void gemm_batched_typed(const char* op, const Tensor& c, const Tensor& a, const Tensor& b, T alpha,
                        T beta) {
  int64_t B = c.dim() == 3 ? c.size(0) : 1, M = c.size(-2), N = c.size(-1), K = a.size(-1);
  BlasLayout la = *blas_layout(a), lb = *blas_layout(b);
  const T* pa = static_cast<const T*>(a.impl()->raw_data());
  const T* pb = static_cast<const T*>(b.impl()->raw_data());
  T* pc = static_cast<T*>(c.impl()->raw_data());
  int64_t sa = batch_stride(a), sb = batch_stride(b);
  std::atomic<int> status{0};
  auto run = [&](const Operand<T>& x, const Operand<T>& y, T* out) {
    int st = gemm(x.layout.trans, y.layout.trans, M, N, K, alpha, x.data, x.layout.ld, y.data,
                  y.layout.ld, beta, out, N);
    if (st != 0) status = st;
  };
#if KILN_HAVE_DNNL
  sync_omp_threads();
#endif
  if (B > 1 && M * N * K <= 128 * 128 * 128) {
    // Small matrices: one single-threaded GEMM per batch entry, batches across threads.
    parallel_for(B, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t i = b0; i < b1; ++i) run({pa + i * sa, la}, {pb + i * sb, lb}, pc + i * M * N);
    });
  } else {
    for (int64_t i = 0; i < B; ++i) {
      Operand<T> x{pa + i * sa, la}, y{pb + i * sb, lb};
#if KILN_HAVE_DNNL
      if constexpr (std::is_same_v<T, float>) unalias_large(x, y, M, N, K);
#endif
      run(x, y, pc + i * M * N);
    }
  }
  KILN_CHECK(status == 0, Runtime, op, ": dnnl_sgemm failed with status ", status.load());
}

}  // namespace

int gemm(char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
         int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return 0;
#if KILN_HAVE_DNNL
  return dnnl_sgemm(ta, tb, m, n, k, alpha, a, std::max<int64_t>(lda, 1), b,
                    std::max<int64_t>(ldb, 1), beta, c, ldc);
#else
  gemm_portable<float>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  return 0;
#endif
}

int gemm(char ta, char tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
         int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  if (m == 0 || n == 0) return 0;
  gemm_portable<double>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  return 0;
}

Tensor blas_ready(const Tensor& t) {
  bool ok = blas_layout(t).has_value() && (t.dim() == 2 || t.size(0) == 1 || t.stride(0) != 0);
  return ok ? t : t.contiguous();
}

void gemm_batched(const char* op, const Tensor& c, const Tensor& a, const Tensor& b, double alpha,
                  double beta) {
  if (c.dtype() == kFloat64) return gemm_batched_typed<double>(op, c, a, b, alpha, beta);
  KILN_ASSERT(c.dtype() == kFloat32, op, ": gemm_batched got ", scalar_type_name(c.dtype()));
  gemm_batched_typed<float>(op, c, a, b, static_cast<float>(alpha), static_cast<float>(beta));
}

}  // namespace kiln::kernels
