// kernels/cpu/dnnl_util.h: what the oneDNN-backed CPU kernels (conv.cpp, matmul.cpp's bfloat16
// and float16, gemm.cpp's float32) share. Include it only under #if KILN_HAVE_DNNL: a build
// without oneDNN has neither it nor those paths.
//
//   sync_omp_threads();                        // before running a primitive
//   dnnl::stream s(dnnl_engine());
//   if (is_reference_impl(pd)) ...             // oneDNN has nothing optimized for this CPU
#pragma once

#if !KILN_HAVE_DNNL
#error "dnnl_util.h needs oneDNN: include it under #if KILN_HAVE_DNNL"
#endif

#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <vector>

#include "kiln/parallel.h"
#include "kiln/tensor.h"

namespace kiln::kernels {

inline dnnl::engine& dnnl_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// oneDNN parallelizes with the calling thread's OpenMP pool: size it like Kiln's own loops.
inline void sync_omp_threads() {
  int nt = get_num_threads();
  if (omp_get_max_threads() != nt) omp_set_num_threads(nt);
}

// Temporaries for a primitive's run (blocked layouts, reordered operands, the scratchpad) from
// Kiln's caching allocator, so that steady-state training maps no new memory; freed with this.
class DnnlTemps {
 public:
  explicit DnnlTemps(dnnl::stream& s) : s_(s) {}
  dnnl::memory make(const dnnl::memory::desc& md) {
    temps_.push_back(empty_on({static_cast<int64_t>(md.get_size())}, kUInt8, kCPU));
    return dnnl::memory(md, dnnl_engine(), temps_.back().impl()->raw_data());
  }
  // `t` (laid out as `user`) as the primitive wants it: itself, or reordered into a temporary.
  dnnl::memory bring_in(const Tensor& t, const dnnl::memory::desc& user,
                        const dnnl::memory::desc& want) {
    dnnl::memory m(user, dnnl_engine(), t.impl()->raw_data());
    if (want == user) return m;
    dnnl::memory r = make(want);
    dnnl::reorder(m, r).execute(s_, m, r);
    return r;
  }

 private:
  dnnl::stream& s_;
  std::vector<Tensor> temps_;
};

// True when oneDNN picked its reference (unoptimized) implementation: bfloat16/float16 on a CPU
// without AVX-512 (BF16) support. Callers then compute in float32 instead.
template <typename PrimitiveDesc>
bool is_reference_impl(const PrimitiveDesc& pd) {
  return std::string(pd.impl_info_str()).rfind("ref", 0) == 0;
}

}  // namespace kiln::kernels
