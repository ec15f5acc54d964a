// maximum, minimum, pow, fmod and remainder on CUDA (tensor/ops/pointwise.toml). x, y
// broadcastable to out's shape -> out in out's dtype (inputs cast to it on the device, a CPU
// 0-dim operand a kernel argument, float16/bfloat16 computed in float). Same semantics as
// kernels/cpu/binary.cpp; integer fmod/remainder by zero give 0 (Note [CUDA integer division by
// zero] in arith_ops.cu); integer edge values follow kiln/scalar_math.h (See Note [Integer edge
// values]).
#include "kiln/dispatcher.h"
#include "kiln/generated/ops/pointwise.h"
#include "loops.cuh"
#include "math.cuh"

namespace kiln::cuda {
namespace {

// maximum (or minimum): nan propagates (the first nan operand is returned).
struct MinMaxOp {
  bool max;
  template <typename C>
  KILN_HD C operator()(C a, C b) const { return max ? dm::maximum(a, b) : dm::minimum(a, b); }
};

struct PowOp {
  template <typename C>
  KILN_HD C operator()(C a, C b) const {
    if constexpr (std::is_integral_v<C>) return int_pow(a, b);
    else return dm::pow(a, b);
  }
};

// fmod: the remainder has the sign of a (C fmod); remainder (python): the sign of b (Python %).
struct ModOp {
  bool python;
  template <typename C>
  KILN_HD C operator()(C a, C b) const {
    if constexpr (std::is_integral_v<C>) {
      if (b == 0) return 0;  // Note [CUDA integer division by zero]
      return python ? int_mod_floor(a, b) : int_mod_trunc(a, b);
    } else {
      return python ? dm::python_mod(a, b) : dm::fmod(a, b);
    }
  }
};

void maximum_cuda(const Tensor& out, const Tensor& self, const Tensor& other) {
  binary_op<TypeSet::All>("maximum", out, self, other, MinMaxOp{true});
}
void minimum_cuda(const Tensor& out, const Tensor& self, const Tensor& other) {
  binary_op<TypeSet::All>("minimum", out, self, other, MinMaxOp{false});
}
void pow_cuda(const Tensor& out, const Tensor& self, const Tensor& exponent) {
  binary_op<TypeSet::Numeric>("pow", out, self, exponent, PowOp{});
}
void fmod_cuda(const Tensor& out, const Tensor& self, const Tensor& other) {
  binary_op<TypeSet::Numeric>("fmod", out, self, other, ModOp{false});
}
void remainder_cuda(const Tensor& out, const Tensor& self, const Tensor& other) {
  binary_op<TypeSet::Numeric>("remainder", out, self, other, ModOp{true});
}

KILN_LIBRARY(CUDA, m) {
  m.structured<ops::maximum>(maximum_cuda);
  m.structured<ops::minimum>(minimum_cuda);
  m.structured<ops::pow>(pow_cuda);
  m.structured<ops::fmod>(fmod_cuda);
  m.structured<ops::remainder>(remainder_cuda);
}

}  // namespace
}  // namespace kiln::cuda
