// Dtype-keeping unary ops on CUDA (tensor/ops/unary.toml): neg, abs, relu, floor, ceil, round,
// trunc, sign, logical_not, clamp. x: (*) -> (*). Same semantics as kernels/cpu/unary.cpp:
// integers wrap (neg/abs of the minimum value give the minimum value: See Note [Integer edge
// values]), relu and clamp keep nan, sign of
// nan is 0, round is half to even, abs(-0.0) is -0.0 (a < 0 ? -a : a, as on the CPU).
// floor/ceil/round/trunc of integers and sign of bool are the identity: a copy, no kernel.
#include <limits>

#include "kiln/dispatcher.h"
#include "kiln/generated/ops.h"
#include "kiln/generated/ops/unary.h"
#include "loops.cuh"
#include "math.cuh"

namespace kiln::cuda {
namespace {

struct NegOp {
  template <typename C>
  KILN_HD C operator()(C a) const { return wrapping_neg(a); }
};
struct AbsOp {
  template <typename C>
  KILN_HD C operator()(C a) const { return wrapping_abs(a); }
};
struct ReluOp {
  template <typename C>
  KILN_HD C operator()(C a) const { return dm::is_negative(a) ? C(0) : a; }
};
struct SignOp {
  template <typename C>
  KILN_HD C operator()(C a) const { return static_cast<C>((C(0) < a) - dm::is_negative(a)); }
};
struct FloorOp {
  template <typename C>
  KILN_HD C operator()(C a) const { return dm::floor(a); }
};
struct CeilOp {
  template <typename C>
  KILN_HD C operator()(C a) const { return dm::ceil(a); }
};
struct RoundOp {
  template <typename C>
  KILN_HD C operator()(C a) const { return dm::rint(a); }
};
struct TruncOp {
  template <typename C>
  KILN_HD C operator()(C a) const { return dm::trunc(a); }
};
struct NotOp {
  KILN_HD bool operator()(bool a) const { return !a; }
};

// min(max(a, lo), hi), nan kept; lo > hi gives hi (as PyTorch).
template <typename C>
struct ClampOp {
  C lo, hi;
  KILN_HD C operator()(C a) const { return dm::clamp(a, lo, hi); }
};

void neg_cuda(const Tensor& out, const Tensor& self) { unary_op<TypeSet::Numeric>("neg", out, self, NegOp{}); }
void abs_cuda(const Tensor& out, const Tensor& self) { unary_op<TypeSet::Numeric>("abs", out, self, AbsOp{}); }
void relu_cuda(const Tensor& out, const Tensor& self) { unary_op<TypeSet::Numeric>("relu", out, self, ReluOp{}); }

// Floating dtypes run op; integers (out's dtype is self's) are copied unchanged.
template <typename Op>
void integral_identity_op(const char* name, const Tensor& out, const Tensor& self, Op op) {
  if (is_floating(out.dtype())) {
    unary_op<TypeSet::Float>(name, out, self, op);
  } else if (out.numel() > 0) {
    out.copy_(self);
  }
}
void floor_cuda(const Tensor& out, const Tensor& self) { integral_identity_op("floor", out, self, FloorOp{}); }
void ceil_cuda(const Tensor& out, const Tensor& self) { integral_identity_op("ceil", out, self, CeilOp{}); }
void round_cuda(const Tensor& out, const Tensor& self) { integral_identity_op("round", out, self, RoundOp{}); }
void trunc_cuda(const Tensor& out, const Tensor& self) { integral_identity_op("trunc", out, self, TruncOp{}); }

void sign_cuda(const Tensor& out, const Tensor& self) {
  if (out.dtype() == kBool) {
    if (out.numel() > 0) out.copy_(self);
    return;
  }
  unary_op<TypeSet::Numeric>("sign", out, self, SignOp{});
}

// x: (*) any dtype -> (*) bool; x is read as bool (nonzero, nan included, is true).
void logical_not_cuda(const Tensor& out, const Tensor& self) {
  unary_op_in<TypeSet::Bool, bool>("logical_not", kBool, out, self, NotOp{});
}

// Bounds converted as on the CPU: Scalar::to<C> (C = float for float16/bfloat16); a missing
// bound is -inf/+inf for floats, the type's limits for integers.
void clamp_cuda(const Tensor& out, const Tensor& self, const std::optional<Scalar>& min,
                const std::optional<Scalar>& max) {
  if (out.numel() == 0) return;
  dispatch<TypeSet::Numeric>(out.dtype(), "clamp", [&]<typename T>() {
    using C = opmath_t<T>;
    C lo = min ? min->to<C>() : std::numeric_limits<C>::lowest();
    C hi = max ? max->to<C>() : std::numeric_limits<C>::max();
    if constexpr (std::is_floating_point_v<C>) {
      if (!min) lo = -std::numeric_limits<C>::infinity();
      if (!max) hi = std::numeric_limits<C>::infinity();
    }
    Tensor a = self.to(out.dtype(), out.device());
    launch_elementwise<T, T, 1>(out, {&a}, ClampOp<C>{lo, hi});
  });
}

KILN_LIBRARY(CUDA, m) {
  m.structured<ops::neg>(neg_cuda);
  m.structured<ops::abs>(abs_cuda);
  m.structured<ops::relu>(relu_cuda);
  m.structured<ops::floor>(floor_cuda);
  m.structured<ops::ceil>(ceil_cuda);
  m.structured<ops::round>(round_cuda);
  m.structured<ops::trunc>(trunc_cuda);
  m.structured<ops::sign>(sign_cuda);
  m.structured<ops::logical_not>(logical_not_cuda);
  m.structured<ops::clamp>(clamp_cuda);
}

}  // namespace
}  // namespace kiln::cuda
