// mm, bmm and addmm on the CPU (tensor/ops/linalg.toml).
//
// Note [CPU GEMM]: float32 goes to oneDNN's dnnl_sgemm (row-major). A transposed or
// row-padded operand is passed with the 'T' flag and its leading dimension instead of being
// copied; only layouts BLAS can't express (two non-unit strides, broadcast zero strides) are made
// contiguous first. bfloat16/float16 use oneDNN's matmul primitive when it has an optimized
// implementation for this CPU, else they compute in float32 (converted copies, sgemm) and store
// rounded. float64 (which oneDNN's matmul lacks) uses gemm_f64 below. The output is never
// zero-filled: with beta == 0 nothing reads it.
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <vector>

#include "dnnl_util.h"
#include "kiln/generated/op_handles.h"
#include "loops.h"

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

// t itself when BLAS can read its matrices (and its batch is not a broadcast), else a copy.
Tensor blas_ready(const Tensor& t) {
  bool ok = blas_layout(t).has_value() && (t.dim() == 2 || t.size(0) == 1 || t.stride(0) != 0);
  return ok ? t : t.contiguous();
}

// Note [GEMM leading dimensions]: an operand whose rows lie a multiple of 1 KiB apart (a leading
// dimension that is a multiple of 256 floats: 256, 768, 1024, ...) maps its rows onto the same
// few cache sets, and oneDNN's AVX2 sgemm then runs at 70-120 GFLOP/s here instead of 150-180
// (the weight gradients of a width-256 transformer's linears: dY^T @ X with 2048 rows of K).
// It matters for the operands whose rows run along K (A transposed, B not): a large GEMM copies
// such an operand to rows padded by 16 floats first, which reads and writes it once against
// 2 * (other dimension) flops per element. Padding the other operands too only added copies
// (GPT step, interleaved A/B).
struct Operand {
  const float* data;
  BlasLayout layout;
};

Operand unaliased(const Operand& op, int64_t lines, int64_t len, std::vector<float>& buffer) {
  if (op.layout.ld % 256 != 0 || lines < 256) return op;
  const int64_t ld = (len + 15) / 16 * 16 + 16;
  if (buffer.size() < static_cast<size_t>(lines * ld)) buffer.resize(lines * ld);
  float* dst = buffer.data();
  parallel_for(lines, 64, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j)
      std::copy_n(op.data + j * op.layout.ld, len, dst + j * ld);
  });
  return {dst, {op.layout.trans, ld}};
}

// c: (B, M, N) or (M, N) contiguous float32 = alpha * a @ b + beta * c, via dnnl_sgemm per batch.
void sgemm_batched(const char* op, const Tensor& c, const Tensor& a, const Tensor& b, float alpha,
                   float beta) {
  int64_t B = c.dim() == 3 ? c.size(0) : 1, M = c.size(-2), N = c.size(-1), K = a.size(-1);
  BlasLayout la = *blas_layout(a), lb = *blas_layout(b);
  const float* pa = static_cast<const float*>(a.impl()->raw_data());
  const float* pb = static_cast<const float*>(b.impl()->raw_data());
  float* pc = static_cast<float*>(c.impl()->raw_data());
  int64_t sa = batch_stride(a), sb = batch_stride(b);
  std::atomic<int> status{dnnl_success};
  auto gemm = [&](const Operand& x, const Operand& y, float* out) {
    dnnl_status_t st = dnnl_sgemm(x.layout.trans, y.layout.trans, M, N, K, alpha, x.data,
                                  x.layout.ld, y.data, y.layout.ld, beta, out, N);
    if (st != dnnl_success) status = st;
  };
  sync_omp_threads();
  if (B > 1 && M * N * K <= 128 * 128 * 128) {
    // Small matrices: one single-threaded GEMM per batch entry, batches across threads.
    parallel_for(B, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t i = b0; i < b1; ++i) gemm({pa + i * sa, la}, {pb + i * sb, lb}, pc + i * M * N);
    });
  } else {
    const bool large = M * N * K >= (int64_t{1} << 24);
    thread_local std::vector<float> a_buffer, b_buffer;
    for (int64_t i = 0; i < B; ++i) {
      Operand x{pa + i * sa, la}, y{pb + i * sb, lb};
      if (large) {  // Note [GEMM leading dimensions]
        if (la.trans == 'T') x = unaliased(x, K, M, a_buffer);
        if (lb.trans == 'N') y = unaliased(y, K, N, b_buffer);
      }
      gemm(x, y, pc + i * M * N);
    }
  }
  KILN_CHECK(status == dnnl_success, Runtime, op, ": dnnl_sgemm failed with status ",
             status.load());
}

// C(M, N) = alpha * A(M, K) @ B(K, N) + beta * C for float64. A and B take any strides; C is
// row-major with ldc. Blocks of B (kKc x kNc, 1 MiB) are packed contiguous and shared by all
// threads; each thread packs 4 rows of A at a time and keeps a 4 x 16 tile of C in registers
// while it runs over the block's kKc.
void gemm_f64(int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t ars,
              int64_t acs, const double* B, int64_t brs, int64_t bcs, double beta, double* C,
              int64_t ldc) {
  constexpr int64_t kKc = 256, kNc = 512, kMr = 4, kNr = 16;
  parallel_for(M, std::max<int64_t>(1, kGrainSize / std::max<int64_t>(N, 1)),
               [&](int64_t i0, int64_t i1) {
                 for (int64_t i = i0; i < i1; ++i)
                   for (int64_t j = 0; j < N; ++j)
                     C[i * ldc + j] = beta == 0 ? 0.0 : beta * C[i * ldc + j];
               });
  std::vector<double> packed(kKc * kNc);
  int64_t groups = (M + kMr - 1) / kMr;
  for (int64_t jc = 0; jc < N; jc += kNc) {
    int64_t nc = std::min(kNc, N - jc);
    for (int64_t pc = 0; pc < K; pc += kKc) {
      int64_t kc = std::min(kKc, K - pc);
      for (int64_t p = 0; p < kc; ++p)
        for (int64_t j = 0; j < nc; ++j) packed[p * nc + j] = B[(pc + p) * brs + (jc + j) * bcs];
      int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / (kc * nc));
      parallel_for(groups, grain, [&](int64_t g0, int64_t g1) {
        double ap[kKc * kMr];
        for (int64_t g = g0; g < g1; ++g) {
          int64_t r0 = g * kMr, rows = std::min(kMr, M - r0);
          for (int64_t p = 0; p < kc; ++p)
            for (int64_t r = 0; r < kMr; ++r)
              ap[p * kMr + r] = r < rows ? alpha * A[(r0 + r) * ars + (pc + p) * acs] : 0.0;
          for (int64_t j0 = 0; j0 < nc; j0 += kNr) {
            int64_t nj = std::min(kNr, nc - j0);
            double acc[kMr][kNr] = {};
            const double* bp = packed.data() + j0;
            if (nj == kNr) {
              for (int64_t p = 0; p < kc; ++p) {
                const double* brow = bp + p * nc;
                for (int64_t r = 0; r < kMr; ++r) {
                  double av = ap[p * kMr + r];
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

// c (contiguous) = beta * c, without reading c when beta == 0 (no NaN from uninitialized memory).
void scale_output(const Tensor& c, double beta) {
  KILN_DISPATCH_FLOAT_TYPES(c.dtype(), "mm", [&] {
    auto* p = static_cast<scalar_t*>(c.impl()->raw_data());
    for (int64_t i = 0; i < c.numel(); ++i)
      p[i] = beta == 0 ? scalar_t(0)
                       : scalar_t(static_cast<double>(static_cast<acc_t<scalar_t>>(p[i])) * beta);
  });
}

// bfloat16/float16 through oneDNN's matmul primitive; false when oneDNN has only its reference
// implementation (or none) for this dtype on this CPU. oneDNN caches primitives internally.
bool dnnl_lowp_matmul(const Tensor& c, const Tensor& a, const Tensor& b, float alpha, float beta) {
  using dnnl::memory;
  dnnl::engine& engine = dnnl_engine();
  memory::data_type dt = c.dtype() == kBFloat16 ? memory::data_type::bf16 : memory::data_type::f16;
  auto md = [&](const Tensor& t) {
    memory::dims dims(t.sizes().begin(), t.sizes().end()),
        strides(t.strides().begin(), t.strides().end());
    for (int64_t d = t.dim() - 1, inner = 1; d >= 0; inner *= t.size(d), --d)
      if (t.size(d) == 1) strides[d] = inner;  // any stride is valid there: pick a plain one
    return memory::desc(dims, dt, strides);
  };
  try {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
    if (beta != 0.0f) {
      dnnl::post_ops po;
      po.append_sum(beta);
      attr.set_post_ops(po);
    }
    memory::desc amd = md(a), bmd = md(b), cmd = md(c);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(amd, bmd, cmd), attr, engine);
    if (is_reference_impl(pd)) return false;
    Tensor scratch =
        empty_on({static_cast<int64_t>(pd.scratchpad_desc().get_size())}, kUInt8, kCPU);
    memory am(amd, engine, a.impl()->raw_data()), bm(bmd, engine, b.impl()->raw_data());
    memory cm(cmd, engine, c.impl()->raw_data()),
        sm(pd.scratchpad_desc(), engine, scratch.impl()->raw_data());
    sync_omp_threads();
    dnnl::stream stream(engine);
    dnnl::matmul(pd).execute(stream, {{DNNL_ARG_SRC, am},
                                      {DNNL_ARG_WEIGHTS, bm},
                                      {DNNL_ARG_DST, cm},
                                      {DNNL_ARG_SCRATCHPAD, sm}});
    stream.wait();
    return true;
  } catch (const dnnl::error& e) {
    if (e.status == dnnl_unimplemented) return false;
    KILN_FAIL(Runtime, "matmul: oneDNN failed: ", e.what());
  }
}

// c = alpha * a @ b + beta * c; a: (M, K) / (B, M, K), b: (K, N) / (B, K, N), c: (M, N) /
// (B, M, N) contiguous, all of c's dtype. c is read only when beta != 0.
void gemm(const char* op, const Tensor& c, const Tensor& a_in, const Tensor& b_in, double alpha,
          double beta) {
  KILN_ASSERT(c.is_contiguous());
  if (c.numel() == 0) return;
  if (a_in.size(-1) == 0) return scale_output(c, beta);
  Tensor a = blas_ready(a_in), b = blas_ready(b_in);
  switch (c.dtype()) {
    case kFloat32:
      return sgemm_batched(op, c, a, b, static_cast<float>(alpha), static_cast<float>(beta));
    case kFloat64: {
      int64_t B = c.dim() == 3 ? c.size(0) : 1, M = c.size(-2), N = c.size(-1), K = a.size(-1);
      const double* pa = static_cast<const double*>(a.impl()->raw_data());
      const double* pb = static_cast<const double*>(b.impl()->raw_data());
      double* pc = static_cast<double*>(c.impl()->raw_data());
      for (int64_t i = 0; i < B; ++i)
        gemm_f64(M, N, K, alpha, pa + i * batch_stride(a), a.stride(-2), a.stride(-1),
                 pb + i * batch_stride(b), b.stride(-2), b.stride(-1), beta, pc + i * M * N, N);
      return;
    }
    case kBFloat16:
    case kFloat16: {
      if (dnnl_lowp_matmul(c, a, b, static_cast<float>(alpha), static_cast<float>(beta))) return;
      // Compute in float32, store rounded.
      Tensor cf = beta != 0 ? c.to(kFloat32) : empty_on(c.sizes(), kFloat32, kCPU);
      sgemm_batched(op, cf, a.to(kFloat32), b.to(kFloat32), static_cast<float>(alpha),
                    static_cast<float>(beta));
      c.copy_(cf);
      return;
    }
    default:
      unsupported_dtype(op, c.dtype());
  }
}

// self: (M, K), mat2: (K, N) -> out: (M, N)
void mm_cpu(const Tensor& out, const Tensor& self, const Tensor& mat2) {
  gemm("mm", out, self, mat2, 1.0, 0.0);
}

// self: (B, M, K), mat2: (B, K, N) -> out: (B, M, N)
void bmm_cpu(const Tensor& out, const Tensor& self, const Tensor& mat2) {
  gemm("bmm", out, self, mat2, 1.0, 0.0);
}

// self: broadcastable to (M, N), mat1: (M, K), mat2: (K, N) -> out = beta * self + alpha * mat1 @
// mat2 (self is ignored when beta == 0, as in PyTorch).
void addmm_cpu(const Tensor& out, const Tensor& self, const Tensor& mat1, const Tensor& mat2,
               const Scalar& beta, const Scalar& alpha) {
  double be = beta.to_double();
  if (be != 0) out.copy_(self);
  gemm("addmm", out, mat1, mat2, alpha.to_double(), be);
}

KILN_LIBRARY(CPU, m) {
  m.structured<ops::mm>(mm_cpu);
  m.structured<ops::bmm>(bmm_cpu);
  m.structured<ops::addmm>(addmm_cpu);
}

}  // namespace
}  // namespace kiln::kernels
