// Manifest samples for the fused optimizer steps (tensor/ops/optim.toml).
#include "samples/op_samples.h"
#include "samples/util.h"

namespace kiln::testing {
namespace {

using S = std::vector<Stack>;
using List = std::vector<Tensor>;

List tensors(ScalarType dt, uint32_t seed, double lo = -1, double hi = 1) {
  return {random({2, 3}, dt, lo, hi, seed), random({4}, dt, lo, hi, seed + 1)};
}
List steps() { return {full({}, 2.0), full({1}, 5.0)}; }

KILN_OP_SAMPLES("_fused_sgd_", fused_sgd_s) {
  return S{
      {tensors(kFloat32, 1), tensors(kFloat32, 3), tensors(kFloat32, 5), 0.01, 0.9, 0.1, 0.0, true,
       false, false},
      {tensors(kFloat64, 7), tensors(kFloat64, 9), List{}, 0.0, 0.0, 0.5, 0.0, false, true, false}};
}
KILN_OP_SAMPLES("_fused_adam_", fused_adam_s) {
  return S{{tensors(kFloat32, 11), tensors(kFloat32, 13), tensors(kFloat32, 15),
            tensors(kFloat32, 17, 0, 1), tensors(kFloat32, 19, 0, 1), steps(), 1e-3, 0.9, 0.999,
            0.01, 1e-8, true, false}};
}
KILN_OP_SAMPLES("_fused_adamw_", fused_adamw_s) {
  return S{{tensors(kFloat64, 21), tensors(kFloat64, 23), tensors(kFloat64, 25),
            tensors(kFloat64, 27, 0, 1), List{}, steps(), 1e-3, 0.9, 0.999, 0.01, 1e-8, false,
            true}};
}

}  // namespace
}  // namespace kiln::testing
