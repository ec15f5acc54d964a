// mm, bmm and addmm on the CPU (tensor/ops/linalg.toml).
//
// float32 and float64 run on the CPU GEMM (gemm.h); bfloat16/float16 on oneDNN's matmul primitive
// where the build has oneDNN and it is optimized for this CPU, else in float32.
// See Note [CPU GEMM].
#include "gemm.h"
#include "kiln/generated/ops/linalg.h"
#include "loops.h"

#if KILN_HAVE_DNNL
#include "dnnl_util.h"
#endif

namespace kiln::kernels {
namespace {

// c (contiguous) = beta * c, without reading c when beta == 0 (no NaN from uninitialized memory).
void scale_output(const Tensor& c, double beta) {
  KILN_DISPATCH_FLOAT_TYPES(c.dtype(), "mm", [&] {
    auto* p = static_cast<scalar_t*>(c.impl()->raw_data());
    for (int64_t i = 0; i < c.numel(); ++i)
      p[i] = beta == 0 ? scalar_t(0)
                       : scalar_t(static_cast<double>(static_cast<acc_t<scalar_t>>(p[i])) * beta);
  });
}

#if KILN_HAVE_DNNL
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
#endif

// c = alpha * a @ b + beta * c; a: (M, K) / (B, M, K), b: (K, N) / (B, K, N), c: (M, N) /
// (B, M, N) contiguous, all of c's dtype. c is read only when beta != 0.
void matmul_into(const char* op, const Tensor& c, const Tensor& a_in, const Tensor& b_in,
                 double alpha, double beta) {
  KILN_ASSERT(c.is_contiguous());
  if (c.numel() == 0) return;
  if (a_in.size(-1) == 0) return scale_output(c, beta);
  Tensor a = blas_ready(a_in), b = blas_ready(b_in);
  switch (c.dtype()) {
    case kFloat32:
    case kFloat64:
      return gemm_batched(op, c, a, b, alpha, beta);
    case kBFloat16:
    case kFloat16: {
#if KILN_HAVE_DNNL
      if (dnnl_lowp_matmul(c, a, b, static_cast<float>(alpha), static_cast<float>(beta))) return;
#endif
      // Compute in float32, store rounded.
      Tensor cf = beta != 0 ? c.to(kFloat32) : empty_on(c.sizes(), kFloat32, kCPU);
      gemm_batched(op, cf, a.to(kFloat32), b.to(kFloat32), alpha, beta);
      c.copy_(cf);
      return;
    }
    default:
      unsupported_dtype(op, c.dtype());
  }
}

// self: (M, K), mat2: (K, N) -> out: (M, N)
void mm_cpu(const Tensor& out, const Tensor& self, const Tensor& mat2) {
  matmul_into("mm", out, self, mat2, 1.0, 0.0);
}

// self: (B, M, K), mat2: (B, K, N) -> out: (B, M, N)
void bmm_cpu(const Tensor& out, const Tensor& self, const Tensor& mat2) {
  matmul_into("bmm", out, self, mat2, 1.0, 0.0);
}

// self: broadcastable to (M, N), mat1: (M, K), mat2: (K, N) -> out = beta * self + alpha * mat1 @
// mat2 (self is ignored when beta == 0, as in PyTorch).
void addmm_cpu(const Tensor& out, const Tensor& self, const Tensor& mat1, const Tensor& mat2,
               const Scalar& beta, const Scalar& alpha) {
  double be = beta.to_double();
  if (be != 0) out.copy_(self);
  matmul_into("addmm", out, mat1, mat2, alpha.to_double(), be);
}

KILN_LIBRARY(CPU, m) {
  m.structured<ops::mm>(mm_cpu);
  m.structured<ops::bmm>(bmm_cpu);
  m.structured<ops::addmm>(addmm_cpu);
}

}  // namespace
}  // namespace kiln::kernels
