// kiln/autograd/formulas_comm.h: the derivative helpers of the collectives (tensor/ops/comm.toml,
// Note [Functional collectives]). Each returns the adjoint collective on the same group:
//
//   // all_reduce: d[self] = "all_reduce_backward(grad, reduce_op, group)"
//   Tensor g = all_reduce_backward(grad, "sum", "world");  // == all_reduce(grad, "sum", "world")
//
// A reduction other than sum or avg raises NotImplemented (its gradient needs the arg-max rank).
#pragma once

#include <string_view>

#include "kiln/kiln.h"

namespace kiln::autograd {

// all_reduce(sum) -> all_reduce(grad, sum); avg -> all_reduce(grad, avg).
Tensor all_reduce_backward(const Tensor& grad, std::string_view reduce_op, std::string_view group);
// all_gather_into_tensor -> reduce_scatter_tensor(grad, sum), shaped as the input (`sizes`: a 0-d
// input gathers into a 1-d output).
Tensor all_gather_backward(const Tensor& grad, IntArrayRef sizes, int64_t group_size,
                           std::string_view group);
// reduce_scatter_tensor(sum) -> all_gather_into_tensor(grad); avg: the same divided by the size.
Tensor reduce_scatter_backward(const Tensor& grad, std::string_view reduce_op, int64_t group_size,
                               std::string_view group);

}  // namespace kiln::autograd
