// Manifest samples for the reductions and softmax (tensor/ops/reduction.toml).
#include "samples/op_samples.h"
#include "samples/util.h"

namespace kiln::testing {
namespace {

using namespace sample_args;

using S = std::vector<Stack>;
using Dims = std::vector<int64_t>;

KILN_OP_SAMPLES("sum", sum_s) {
  return S{{random({2, 3, 4}), kNone, false, kNone},
           {non_contiguous(random({3, 4})), Dims{-1}, true, kNone},
           {random({2, 3}, kInt32), Dims{0}, false, kNone},
           {random({4, 5}), Dims{0, 1}, false, kFloat64},
           {random({0, 3}), Dims{0}, false, kNone}};
}
KILN_OP_SAMPLES("mean", mean_s) {
  return S{{random({2, 3, 4}), Dims{0, 2}, true, kNone}, {random({3, 4}, kFloat32, 0, 5), kNone, false, kFloat32}};
}
KILN_OP_SAMPLES("prod", prod_s) {
  return S{{random({2, 3}), Dims{1}, false, kNone}, {random({4}, kInt8), kNone, false, kNone}};
}
KILN_OP_SAMPLES("max", max_s) { return S{{random({3, 4})}, {random({5}, kInt16)}}; }
KILN_OP_SAMPLES("min", min_s) { return S{{non_contiguous(random({3, 4}))}}; }
KILN_OP_SAMPLES("max.dim", max_dim_s) {
  return S{{random({3, 4}), int64_t{1}, false}, {random({2, 3, 4}), int64_t{-3}, true}};
}
KILN_OP_SAMPLES("min.dim", min_dim_s) {
  return S{{random({3, 4}, kInt32), int64_t{0}, true}, {random({2, 5}), int64_t{1}, false}};
}
KILN_OP_SAMPLES("argmax", argmax_s) {
  return S{{random({3, 4}), kNone, false}, {random({3, 4}), int64_t{1}, true}, {random({3, 4}), kNone, true}};
}
KILN_OP_SAMPLES("argmin", argmin_s) { return S{{random({3, 4}), int64_t{-1}, false}}; }
KILN_OP_SAMPLES("var", var_s) {
  return S{{random({3, 4}), Dims{1}, 1.0, false}, {random({2, 3, 4}), kNone, 0.0, true}};
}
KILN_OP_SAMPLES("std", std_s) { return S{{random({3, 4}, kFloat64), Dims{0}, 1.0, true}}; }
KILN_OP_SAMPLES("norm", norm_s) {
  return S{{random({3, 4}), Scalar(2), kNone, false}, {random({3, 4}), Scalar(1), Dims{1}, true}};
}
KILN_OP_SAMPLES("logsumexp", logsumexp_s) {
  return S{{random({3, 4}), Dims{1}, false}, {random({2, 3}, kInt32), Dims{0, 1}, true}};
}
KILN_OP_SAMPLES("any", any_s) { return S{{random({3, 4}, kBool), Dims{1}, false}, {random({3, 4}), kNone, false}}; }
KILN_OP_SAMPLES("all", all_s) {
  return S{{random({3, 4}, kInt32), Dims{0}, true}, {random({2, 3}), Dims{1}, false}};
}
KILN_OP_SAMPLES("softmax", softmax_s) {
  return S{{random({3, 4}), int64_t{-1}, kNone}, {non_contiguous(random({3, 4, 2})), int64_t{1}, kFloat64}};
}
KILN_OP_SAMPLES("log_softmax", log_softmax_s) { return S{{random({3, 4}), int64_t{0}, kNone}}; }

}  // namespace
}  // namespace kiln::testing
