// nn::functional compositions (kiln/nn/functional.h).
#include "kiln/nn/functional.h"

#include <vector>

namespace kiln::nn::functional {

Tensor bilinear(const Tensor& input1, const Tensor& input2, const Tensor& weight,
                const std::optional<Tensor>& bias) {
  KILN_CHECK(weight.dim() == 3, Value, "bilinear: weight must be (out, in1, in2), got shape ",
             weight.sizes());
  KILN_CHECK(input1.dim() >= 1 && input2.dim() == input1.dim(), Value,
             "bilinear: inputs must have the same number of dims, got ", input1.sizes(), " and ",
             input2.sizes());
  const int64_t O = weight.size(0), I = weight.size(1), J = weight.size(2);
  KILN_CHECK(input1.size(-1) == I && input2.size(-1) == J, Value, "bilinear: input sizes ",
             input1.sizes(), " and ", input2.sizes(), " do not match weight ", weight.sizes());
  std::vector<int64_t> lead(input1.sizes().begin(), input1.sizes().end() - 1);
  KILN_CHECK(std::vector<int64_t>(input2.sizes().begin(), input2.sizes().end() - 1) == lead, Value,
             "bilinear: batch sizes of ", input1.sizes(), " and ", input2.sizes(), " differ");
  // x1: (N, I) @ W viewed (I, O·J) -> (N, O, J); contracted with x2: (N, 1, J) -> (N, O).
  Tensor x1 = input1.reshape({-1, I}), x2 = input2.reshape({-1, J});
  Tensor t = x1.matmul(weight.permute({1, 0, 2}).reshape({I, O * J})).reshape({-1, O, J});
  Tensor y = (t * x2.unsqueeze(1)).sum({2});
  if (bias) y = y + *bias;
  lead.push_back(O);
  return y.reshape(lead);
}

}  // namespace kiln::nn::functional
