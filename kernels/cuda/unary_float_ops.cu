// Float-valued unary ops on CUDA (tensor/ops/unary.toml): exp, log, log1p, expm1, sqrt, rsqrt,
// reciprocal, sin, cos. x: (*) -> (*). The meta function picked a floating out dtype (integer
// and bool inputs give float32), the input is cast to it on the device, and float16/bfloat16
// compute in float (Note [CUDA loops] in loops.cuh). Same formulas as kernels/cpu/unary.cpp;
// CUDA's libm differs from the CPU's by a few ulp at most.
#include "kiln/dispatcher.h"
#include "kiln/generated/ops/unary.h"
#include "loops.cuh"
#include "math.cuh"

namespace kiln::cuda {
namespace {

#define KILN_CUDA_FLOAT_UNARY(NAME, EXPR)                                              \
  struct NAME##Op {                                                                    \
    template <typename C>                                                              \
    KILN_HD C operator()(C a) const { return EXPR; }                                   \
  };                                                                                   \
  void NAME##_cuda(const Tensor& out, const Tensor& self) {                            \
    unary_op<TypeSet::Float>(#NAME, out, self, NAME##Op{});                            \
  }

KILN_CUDA_FLOAT_UNARY(exp, dm::exp(a))
KILN_CUDA_FLOAT_UNARY(log, dm::log(a))
KILN_CUDA_FLOAT_UNARY(log1p, dm::log1p(a))
KILN_CUDA_FLOAT_UNARY(expm1, dm::expm1(a))
KILN_CUDA_FLOAT_UNARY(sqrt, dm::sqrt(a))
KILN_CUDA_FLOAT_UNARY(rsqrt, C(1) / dm::sqrt(a))
KILN_CUDA_FLOAT_UNARY(reciprocal, C(1) / a)
KILN_CUDA_FLOAT_UNARY(sin, dm::sin(a))
KILN_CUDA_FLOAT_UNARY(cos, dm::cos(a))
#undef KILN_CUDA_FLOAT_UNARY

KILN_LIBRARY(CUDA, m) {
  m.structured<ops::exp>(exp_cuda);
  m.structured<ops::log>(log_cuda);
  m.structured<ops::log1p>(log1p_cuda);
  m.structured<ops::expm1>(expm1_cuda);
  m.structured<ops::sqrt>(sqrt_cuda);
  m.structured<ops::rsqrt>(rsqrt_cuda);
  m.structured<ops::reciprocal>(reciprocal_cuda);
  m.structured<ops::sin>(sin_cuda);
  m.structured<ops::cos>(cos_cuda);
}

}  // namespace
}  // namespace kiln::cuda
