// Derivative helpers of the collectives (kiln/autograd/formulas_comm.h).
#include "kiln/autograd/formulas_comm.h"

namespace kiln::autograd {
namespace {

void check_linear(const char* op, std::string_view reduce_op) {
  KILN_CHECK(reduce_op == "sum" || reduce_op == "avg", NotImplemented, op,
             ": the derivative is implemented for reduce_op 'sum' and 'avg' only, got '", reduce_op,
             "'");
}

}  // namespace

Tensor all_reduce_backward(const Tensor& grad, std::string_view reduce_op, std::string_view group) {
  check_linear("all_reduce", reduce_op);
  return all_reduce(grad, reduce_op, group);
}

Tensor all_gather_backward(const Tensor& grad, IntArrayRef sizes, int64_t group_size,
                           std::string_view group) {
  return reduce_scatter_tensor(grad, "sum", group_size, group).reshape(sizes);
}

Tensor reduce_scatter_backward(const Tensor& grad, std::string_view reduce_op, int64_t group_size,
                               std::string_view group) {
  check_linear("reduce_scatter_tensor", reduce_op);
  Tensor g = all_gather_into_tensor(grad, group_size, group);
  return reduce_op == "avg" ? g / static_cast<double>(group_size) : g;
}

}  // namespace kiln::autograd
