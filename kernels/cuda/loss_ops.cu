// Pointwise losses on CUDA (tensor/ops/loss.toml): _binary_cross_entropy, the loss per element of
// binary_cross_entropy. input, target broadcast to out -> out, float16/bfloat16 computed in float.
// Same expression as kernels/cpu/loss.cpp (kiln/pointwise_math.h, See Note [One home per
// formula]); an input outside [0, 1] gives nan here (the CPU
// raises: a device kernel cannot).
#include "kiln/dispatcher.h"
#include "kiln/generated/ops/loss.h"
#include "loops.cuh"
#include "math.cuh"

namespace kiln::cuda {
namespace {

struct BinaryCrossEntropyOp {
  template <typename C>
  KILN_HD C operator()(C x, C t) const { return dm::binary_cross_entropy(x, t); }
};

void binary_cross_entropy_cuda(const Tensor& out, const Tensor& input, const Tensor& target) {
  binary_op<TypeSet::Float>("binary_cross_entropy", out, input, target, BinaryCrossEntropyOp{});
}

KILN_LIBRARY(CUDA, m) { m.structured<ops::_binary_cross_entropy>(binary_cross_entropy_cuda); }

}  // namespace
}  // namespace kiln::cuda
