// Formula helpers of the norm rows (kiln/autograd/formulas_nn.h).
#include "kiln/autograd/formulas_nn.h"

namespace kiln::autograd {

Tensor channel_sum(const Tensor& grad) {
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < grad.dim(); ++d)
    if (d != 1) dims.push_back(d);
  return grad.sum(dims);
}

}  // namespace kiln::autograd
