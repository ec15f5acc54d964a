// Binary pointwise ops on CUDA (tensor/ops/pointwise.toml). A new op is a functor and one
// binary_op call (Note [CUDA loops] in loops.cuh).
#include "kiln/dispatcher.h"
#include "kiln/generated/ops/pointwise.h"
#include "loops.cuh"

namespace kiln::cuda {
namespace {

// a + alpha * b in op math (bool: a || b, as alpha must then be true).
struct AddOp {
  double alpha_f;
  int64_t alpha_i;
  template <typename C>
  KILN_HD C operator()(C a, C b) const {
    if constexpr (std::is_same_v<C, bool>) {
      return a || b;
    } else if constexpr (std::is_integral_v<C>) {
      return wrapping_add(a, wrapping_mul(static_cast<C>(alpha_i), b));  // See Note [Integer edge values]
    } else {
      return a + static_cast<C>(alpha_f) * b;
    }
  }
};

// self: broadcastable to out, other: broadcastable to out -> out = self + alpha * other
void add_cuda(const Tensor& out, const Tensor& self, const Tensor& other, const Scalar& alpha) {
  AddOp op{alpha.to_double(), alpha.is_floating() ? 0 : alpha.to_int()};
  binary_op<TypeSet::All>("add", out, self, other, op);
}

KILN_LIBRARY(CUDA, m) { m.structured<ops::add>(add_cuda); }

}  // namespace
}  // namespace kiln::cuda
