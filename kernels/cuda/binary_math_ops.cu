// maximum, minimum, pow, fmod and remainder on CUDA (tensor/ops/pointwise.toml). x, y
// broadcastable to out's shape -> out in out's dtype (inputs cast to it on the device, a CPU
// 0-dim operand a kernel argument, float16/bfloat16 computed in float). Same semantics as
// kernels/cpu/binary.cpp; integer fmod/remainder by zero give 0 (Note [CUDA integer division by
// zero] in arith_ops.cu).
#include "kiln/dispatcher.h"
#include "kiln/generated/op_handles.h"
#include "loops.cuh"
#include "math.cuh"

namespace kiln::cuda {
namespace {

// maximum (or minimum): nan propagates (the first nan operand is returned).
struct MinMaxOp {
  bool max;
  template <typename C>
  KILN_HD C operator()(C a, C b) const {
    if (a != a) return a;
    if (b != b) return b;
    if (max) return a < b ? b : a;
    return b < a ? b : a;
  }
};

// Integer power by squaring (wrapping); negative exponents give 0 except for bases 1 and -1.
template <typename C>
KILN_HD inline C powi(C a, C b) {
  if constexpr (std::is_signed_v<C>) {
    if (b < 0) {
      if (a == 1) return 1;
      if (a == -1) return (b & 1) ? C(-1) : C(1);
      return 0;
    }
  }
  C r = 1;
  while (b) {
    if (b & 1) r = static_cast<C>(r * a);
    b = static_cast<C>(b / 2);
    a = static_cast<C>(a * a);
  }
  return r;
}

struct PowOp {
  template <typename C>
  KILN_HD C operator()(C a, C b) const {
    if constexpr (std::is_integral_v<C>) return powi(a, b);
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
      C r = static_cast<C>(a % b);
      if (python && r != 0 && (dm::is_negative(r) != dm::is_negative(b))) r = static_cast<C>(r + b);
      return r;
    } else {
      C r = dm::fmod(a, b);
      if (python && r != 0 && ((b < 0) != (r < 0))) r += b;
      return r;
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
