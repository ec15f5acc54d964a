// Manifest samples for the PyTorch overloads and names of the op table: scatter.value,
// floor_divide, round.decimals, trunc, clamp.Tensor, softplus (pointwise.toml, unary.toml,
// indexing.toml), max/min.other, amax/amin (reduction.toml), split_with_sizes (shape.toml) and
// binary_cross_entropy's _binary_cross_entropy (loss.toml), with their in-place and out= variants.
#include "samples/op_samples.h"
#include "samples/util.h"

namespace kiln::testing {
namespace {

using namespace sample_args;

using S = std::vector<Stack>;
using Dims = std::vector<int64_t>;

// ---- indexing.toml
KILN_OP_SAMPLES("scatter.value", scatter_value_s) {
  return S{
      {random({3, 4}, kFloat32, -2, 2, 1), i64(1), idx({0, 3, 1, 2}, {2, 2}), Scalar(2.5)},
      {random({3, 4}, kInt32, -9, 9, 2), i64(0), idx({2, 0, 1}, {1, 3}), Scalar(7)},
      {non_contiguous(random({2, 3}, kFloat32, -2, 2, 3)), i64(-1), idx({}, {0, 2}), Scalar(1)}};
}
KILN_OP_SAMPLES("scatter_.value", scatter_value_inplace_s) {
  // 1.5 fits every claimed dtype (uint8 cannot hold a negative value).
  return S{{random({3, 4}, kFloat32, -2, 2, 4), i64(0), idx({2, 0, 1}, {1, 3}), Scalar(1.5)}};
}

// ---- pointwise.toml, unary.toml
KILN_OP_SAMPLES("floor_divide", floor_divide_s) {
  // Divisors in [1, 3) stay non-zero cast to an integer dtype; dividends in [0, 5) fit uint8.
  return S{{random({2, 3}, kFloat32, 0, 5, 5), random({3}, kFloat32, 1, 3, 6)},
           {random({4}, kInt32, -5, 5, 7), scalar_to_tensor(Scalar(2))}};
}
KILN_OP_SAMPLES("floor_divide_", floor_divide_inplace_s) {
  return S{{non_contiguous(random({2, 3}, kFloat32, 0, 5, 8)), random({3}, kFloat32, 1, 3, 9)}};
}
KILN_OP_SAMPLES("round.decimals", round_decimals_s) {
  return S{{random({2, 3}), i64(2)},
           {random({4}, kFloat64, -20, 20), i64(-1)},
           {random({3}, kInt32), i64(0)},
           {random({3}, kBFloat16), i64(1)}};
}
KILN_OP_SAMPLES("round_.decimals", round_decimals_inplace_s) {
  return S{{non_contiguous(random({2, 3})), i64(1)}};
}
KILN_OP_SAMPLES("trunc", trunc_s) {
  return S{{random({2, 3})}, {random({4}, kInt16)}, {non_contiguous(random({3, 2}, kBFloat16))}};
}
KILN_OP_SAMPLES("trunc_", trunc_inplace_s) { return S{{non_contiguous(random({2, 3}))}}; }
KILN_OP_SAMPLES("trunc.out", trunc_out_s) { return S{{random({3, 2}, kFloat64), random({0})}}; }
KILN_OP_SAMPLES("clamp.Tensor", clamp_tensor_s) {
  return S{{random({2, 3}, kFloat32, -2, 2, 10), random({3}, kFloat32, -1, 0, 11),
            random({2, 1}, kFloat32, 0, 1, 12)},
           {random({4}, kInt32, -9, 9, 13), kNone, random({4}, kInt32, -9, 9, 14)},
           {random({2, 3}, kInt64, -9, 9, 15), random({3}, kFloat32, -2, 2, 16), kNone}};
}
KILN_OP_SAMPLES("clamp_.Tensor", clamp_tensor_inplace_s) {
  return S{{non_contiguous(random({2, 3}, kFloat32, -2, 2, 17)), random({3}, kFloat32, -1, 0, 18),
            kNone}};
}
KILN_OP_SAMPLES("softplus", softplus_s) {
  return S{{random({2, 3}), Scalar(1), Scalar(20)},
           {random({2, 4}, kFloat64, -8, 8), Scalar(2), Scalar(3)},
           {random({3}, kBFloat16), Scalar(0.5), Scalar(20)}};
}

// ---- reduction.toml
KILN_OP_SAMPLES("max.other", max_other_s) {
  return S{{random({2, 3}, kFloat32, -2, 2, 19), random({3}, kFloat32, -2, 2, 20)},
           {random({4}, kInt32, -9, 9, 21), random({4}, kInt32, -9, 9, 22)}};
}
KILN_OP_SAMPLES("min.other", min_other_s) {
  return S{{random({2, 3}, kFloat32, -2, 2, 23), random({2, 1}, kFloat64, -2, 2, 24)},
           {random({4}, kInt16, -9, 9, 25), random({}, kInt16, -9, 9, 26)}};
}
KILN_OP_SAMPLES("amax", amax_s) {
  return S{{random({2, 3, 4}), Dims{}, false},
           {random({3, 4}), Dims{1}, true},
           {non_contiguous(random({3, 4})), Dims{0, -1}, false},
           {random({4}, kInt32), Dims{0}, false},
           {random({}), Dims{}, false},
           {random({0, 3}), Dims{1}, false}};
}
KILN_OP_SAMPLES("amin", amin_s) {
  return S{{random({2, 3, 4}), Dims{0, 2}, true}, {random({5}, kBFloat16), Dims{}, false}};
}

// ---- shape.toml
KILN_OP_SAMPLES("split_with_sizes", split_with_sizes_s) {
  return S{{random({5, 4}), Dims{2, 3}, i64(0)}, {random({3, 4}), Dims{1, 0, 3}, i64(-1)}};
}

// ---- loss.toml
KILN_OP_SAMPLES("_binary_cross_entropy", binary_cross_entropy_core_s) {
  return S{{random({3, 4}, kFloat32, 0.1, 0.9, 27), random({3, 4}, kFloat32, 0, 1, 28)},
           {random({2, 3}, kFloat64, 0.1, 0.9, 29), random({3}, kFloat64, 0, 1, 30)}};
}

}  // namespace
}  // namespace kiln::testing
