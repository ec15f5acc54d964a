// kernels/cuda/math.cuh: dm, the math functions that CUDA functors generic over the op math type
// C (float for float16/bfloat16/float32, double) call by one name:
//
//   struct ExpOp { template <typename C> KILN_HD C operator()(C a) const { return dm::exp(a); } };
//
// They are kiln/pointwise_math.h's float/double overloads (float calls CUDA's single-precision
// functions, expf, erff, ... : at most 2 ulp, no fast-math intrinsics; double the double ones),
// with its formulas (dm::gelu_erf, dm::sigmoid, ...: See Note [One home per formula]). Inside
// namespace kiln an unqualified exp(x) would find kiln::exp(Tensor), hence the explicit namespace.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "kiln/pointwise_math.h"

namespace kiln::cuda::dm {

using namespace kiln::math;

// a < 0, without nvcc's "pointless comparison of unsigned integer with zero" for unsigned C.
template <typename C>
KILN_HD constexpr bool is_negative(C a) {
  if constexpr (std::is_unsigned_v<C>) return false;
  else return a < C(0);
}

}  // namespace kiln::cuda::dm
