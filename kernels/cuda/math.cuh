// kernels/cuda/math.cuh: float/double overloads of CUDA's math functions, so that functors
// generic over the op math type C (float for float16/bfloat16/float32, double) call one name:
//
//   struct ExpOp { template <typename C> KILN_HD C operator()(C a) const { return dm::exp(a); } };
//
// float calls CUDA's single-precision functions (expf, erff, ... : at most 2 ulp, no fast-math
// intrinsics), double the double ones. Inside namespace kiln an unqualified exp(x) would find
// kiln::exp(Tensor), hence the explicit namespace.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "kiln/half.h"

namespace kiln::cuda::dm {

#define KILN_DM_UNARY(NAME, F32, F64)                             \
  KILN_HD inline float NAME(float x) { return ::F32(x); }         \
  KILN_HD inline double NAME(double x) { return ::F64(x); }
KILN_DM_UNARY(exp, expf, exp)
KILN_DM_UNARY(log, logf, log)
KILN_DM_UNARY(log1p, log1pf, log1p)
KILN_DM_UNARY(expm1, expm1f, expm1)
KILN_DM_UNARY(sqrt, sqrtf, sqrt)
KILN_DM_UNARY(sin, sinf, sin)
KILN_DM_UNARY(cos, cosf, cos)
KILN_DM_UNARY(tanh, tanhf, tanh)
KILN_DM_UNARY(erf, erff, erf)
KILN_DM_UNARY(floor, floorf, floor)
KILN_DM_UNARY(ceil, ceilf, ceil)
KILN_DM_UNARY(trunc, truncf, trunc)
KILN_DM_UNARY(rint, rintf, rint)  // half to even (the default rounding mode), like nearbyint
#undef KILN_DM_UNARY

#define KILN_DM_BINARY(NAME, F32, F64)                                       \
  KILN_HD inline float NAME(float x, float y) { return ::F32(x, y); }        \
  KILN_HD inline double NAME(double x, double y) { return ::F64(x, y); }
KILN_DM_BINARY(pow, powf, pow)
KILN_DM_BINARY(fmod, fmodf, fmod)
KILN_DM_BINARY(copysign, copysignf, copysign)
#undef KILN_DM_BINARY

// a < 0, without nvcc's "pointless comparison of unsigned integer with zero" for unsigned C.
template <typename C>
KILN_HD constexpr bool is_negative(C a) {
  if constexpr (std::is_unsigned_v<C>) return false;
  else return a < C(0);
}

}  // namespace kiln::cuda::dm
