// kiln/autograd/engine_helpers.h: the few derivative-formula helpers kiln_autograd implements
// itself (the rest live in formulas.h). Plain tensor functions: recorded when grad mode is on.
//
//   sum_to(grad, {2, 1});   // sums broadcast dims away: (4, 2, 3) -> (2, 1)
#pragma once

#include "kiln/tensor.h"

namespace kiln::autograd {

// Sums `t` down to `sizes` (the inverse of broadcasting `sizes` up to t's shape).
Tensor sum_to(const Tensor& t, IntArrayRef sizes);
// `grad` converted to `like`'s dtype (the backward of an op that changed the dtype).
Tensor cast_back(const Tensor& grad, const Tensor& like);
// The backward of sum / mean over `dim` (all dims when absent) of a tensor of shape `sizes`.
Tensor sum_backward(const Tensor& grad, IntArrayRef sizes, OptionalIntArrayRef dim, bool keepdim);
Tensor mean_backward(const Tensor& grad, IntArrayRef sizes, OptionalIntArrayRef dim, int64_t numel,
                     bool keepdim);

}  // namespace kiln::autograd
