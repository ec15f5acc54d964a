// sub, mul, div (true, 'trunc', 'floor') on CUDA (tensor/ops/pointwise.toml). x, y broadcastable
// to out's shape -> out, computed in out's dtype (the meta function's promotion); inputs are
// cast to it on the device, a CPU 0-dim operand is a kernel argument, float16/bfloat16 compute
// in float. Same formulas as kernels/cpu/binary.cpp.
//
// Note [CUDA integer division by zero]: the CPU raises ZeroDivisionError. A CUDA kernel cannot
// raise without a device->host sync, and PyTorch's CUDA kernels do not raise either (they
// return whatever the hardware division gives). Here integer div (trunc/floor), fmod and
// remainder by zero return 0, deterministically. Otherwise integers follow kiln/scalar_math.h
// (See Note [Integer edge values]): min / -1 wraps to min, min % -1 is 0.
#include <string_view>

#include "kiln/dispatcher.h"
#include "kiln/generated/ops/pointwise.h"
#include "loops.cuh"
#include "math.cuh"

namespace kiln::cuda {
namespace {

// a - alpha * b (bool is rejected by the meta function).
struct SubOp {
  double alpha_f;
  int64_t alpha_i;
  template <typename C>
  KILN_HD C operator()(C a, C b) const {
    if constexpr (std::is_integral_v<C>) return wrapping_sub(a, wrapping_mul(static_cast<C>(alpha_i), b));
    else return a - static_cast<C>(alpha_f) * b;
  }
};

// a * b (bool: a && b).
struct MulOp {
  template <typename C>
  KILN_HD C operator()(C a, C b) const {
    if constexpr (std::is_same_v<C, bool>) return a && b;
    else return wrapping_mul(a, b);
  }
};

struct TrueDivOp {
  template <typename C>
  KILN_HD C operator()(C a, C b) const { return a / b; }
};

// Rounded division: trunc or floor (one functor for both keeps the instantiations down).
struct DivRoundOp {
  bool floor;
  template <typename C>
  KILN_HD C operator()(C a, C b) const {
    if constexpr (std::is_integral_v<C>) {
      if (b == 0) return 0;  // Note [CUDA integer division by zero]
      return floor ? int_div_floor(a, b) : int_div_trunc(a, b);
    } else {
      return floor ? dm::div_floor(a, b) : dm::trunc(a / b);  // floats: kiln/pointwise_math.h
    }
  }
};

void sub_cuda(const Tensor& out, const Tensor& self, const Tensor& other, const Scalar& alpha) {
  SubOp op{alpha.to_double(), alpha.is_floating() ? 0 : alpha.to_int()};
  binary_op<TypeSet::Numeric>("sub", out, self, other, op);
}

void mul_cuda(const Tensor& out, const Tensor& self, const Tensor& other) {
  binary_op<TypeSet::All>("mul", out, self, other, MulOp{});
}

// out = x / y; rounding_mode None (true division, floating out), 'trunc' or 'floor'.
void div_cuda(const Tensor& out, const Tensor& self, const Tensor& other,
              std::optional<std::string_view> rounding_mode) {
  if (!rounding_mode) {
    binary_op<TypeSet::Float>("div", out, self, other, TrueDivOp{});
    return;
  }
  binary_op<TypeSet::Numeric>("div", out, self, other, DivRoundOp{*rounding_mode == "floor"});
}

KILN_LIBRARY(CUDA, m) {
  m.structured<ops::sub>(sub_cuda);
  m.structured<ops::mul>(mul_cuda);
  m.structured<ops::div>(div_cuda);
}

}  // namespace
}  // namespace kiln::cuda
