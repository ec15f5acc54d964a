// Manifest samples for the core ops: creation, copy, views (creation.toml, copy.toml, views.toml).
#include "samples/op_samples.h"
#include "samples/util.h"

namespace kiln::testing {
namespace {

using namespace sample_args;

using S = std::vector<Stack>;

KILN_OP_SAMPLES("empty", empty_s) { return S{{std::vector<int64_t>{2, 3}, kNone, kNone}, {std::vector<int64_t>{0}, kInt64, kNone}}; }
KILN_OP_SAMPLES("empty_strided", empty_strided_s) {
  return S{{std::vector<int64_t>{2, 3}, std::vector<int64_t>{1, 2}, kFloat64, kNone}};
}
KILN_OP_SAMPLES("fill_", fill_s) { return S{{random({2, 3}), Scalar(1.5)}, {non_contiguous(random({3, 2})), Scalar(2)}}; }
KILN_OP_SAMPLES("zero_", zero_s) { return S{{random({4})}}; }
KILN_OP_SAMPLES("zeros", zeros_s) { return S{{std::vector<int64_t>{2, 0}, kNone, kNone}}; }
KILN_OP_SAMPLES("ones", ones_s) { return S{{std::vector<int64_t>{3}, kInt32, kNone}}; }
KILN_OP_SAMPLES("full", full_s) { return S{{std::vector<int64_t>{2}, Scalar(int64_t{7}), kNone, kNone}}; }
KILN_OP_SAMPLES("empty_like", empty_like_s) { return S{{random({2, 3}), kNone, kNone}}; }
KILN_OP_SAMPLES("zeros_like", zeros_like_s) { return S{{random({2, 3}), kFloat64, kNone}}; }
KILN_OP_SAMPLES("ones_like", ones_like_s) { return S{{random({2, 3}), kNone, kNone}}; }
KILN_OP_SAMPLES("full_like", full_like_s) { return S{{random({2, 3}), Scalar(3.0), kNone, kNone}}; }
KILN_OP_SAMPLES("arange", arange_s) {
  return S{{Scalar(0), Scalar(10), Scalar(3), kNone, kNone}, {Scalar(0.5), Scalar(2.0), Scalar(0.25), kNone, kNone}};
}
KILN_OP_SAMPLES("linspace", linspace_s) { return S{{Scalar(0), Scalar(1), int64_t{5}, kNone, kNone}}; }
KILN_OP_SAMPLES("eye", eye_s) { return S{{int64_t{3}, int64_t{4}, kNone, kNone}}; }
KILN_OP_SAMPLES("copy_", copy_s) {
  return S{{random({2, 3}), random({3}, kInt32), false}, {non_contiguous(random({2, 3})), random({2, 3}, kFloat64), false}};
}
KILN_OP_SAMPLES("_to_copy", to_copy_s) { return S{{random({2, 3}), kFloat64, kNone}}; }
KILN_OP_SAMPLES("to", to_s) { return S{{random({2, 3}), kInt64, kNone, false}, {random({2}), kNone, kNone, false}}; }
KILN_OP_SAMPLES("clone", clone_s) { return S{{non_contiguous(random({2, 3}))}}; }
KILN_OP_SAMPLES("contiguous", contiguous_s) { return S{{non_contiguous(random({2, 3}))}, {random({4})}}; }
KILN_OP_SAMPLES("view", view_s) { return S{{random({2, 6}), std::vector<int64_t>{3, -1}}}; }
KILN_OP_SAMPLES("reshape", reshape_s) {
  return S{{random({2, 6}), std::vector<int64_t>{4, 3}}, {random({3, 4}).t(), std::vector<int64_t>{12}}};
}
KILN_OP_SAMPLES("permute", permute_s) { return S{{random({2, 3, 4}), std::vector<int64_t>{2, 0, 1}}}; }
KILN_OP_SAMPLES("transpose", transpose_s) { return S{{random({2, 3, 4}), int64_t{0}, int64_t{-1}}}; }
KILN_OP_SAMPLES("t", t_s) { return S{{random({2, 3})}, {random({3})}}; }
KILN_OP_SAMPLES("expand", expand_s) { return S{{random({3, 1}), std::vector<int64_t>{2, 3, 4}}}; }
KILN_OP_SAMPLES("squeeze", squeeze_s) { return S{{random({1, 3, 1}), kNone}, {random({1, 3, 1}), std::vector<int64_t>{0}}}; }
KILN_OP_SAMPLES("unsqueeze", unsqueeze_s) { return S{{random({2, 3}), int64_t{1}}, {random({2, 3}), int64_t{-1}}}; }
KILN_OP_SAMPLES("flatten", flatten_s) { return S{{random({2, 3, 4}), int64_t{1}, int64_t{-1}}}; }
KILN_OP_SAMPLES("unflatten", unflatten_s) { return S{{random({2, 12}), int64_t{1}, std::vector<int64_t>{3, 4}}}; }
KILN_OP_SAMPLES("select", select_s) { return S{{random({3, 4}), int64_t{1}, int64_t{-1}}}; }
KILN_OP_SAMPLES("slice", slice_s) { return S{{random({5, 4}), int64_t{0}, int64_t{1}, int64_t{5}, int64_t{2}}}; }
KILN_OP_SAMPLES("narrow", narrow_s) { return S{{random({5, 4}), int64_t{1}, int64_t{1}, int64_t{2}}}; }
KILN_OP_SAMPLES("as_strided", as_strided_s) {
  return S{{random({4, 4}), std::vector<int64_t>{2, 2}, std::vector<int64_t>{1, 4}, int64_t{1}}};
}
KILN_OP_SAMPLES("diagonal", diagonal_s) { return S{{random({3, 4}), int64_t{1}, int64_t{0}, int64_t{1}}}; }
KILN_OP_SAMPLES("alias", alias_s) { return S{{random({3})}}; }
KILN_OP_SAMPLES("add", add_s) {
  return S{{random({2, 3}), random({3}), Scalar(2)}, {random({2, 1}, kInt32), random({3}, kFloat64), Scalar(1)}};
}
KILN_OP_SAMPLES("add_", add_inplace_s) { return S{{random({2, 3}), random({3}), Scalar(1)}}; }
KILN_OP_SAMPLES("add.out", add_out_s) { return S{{random({2, 3}), random({3}), Scalar(1), random({0})}}; }

}  // namespace
}  // namespace kiln::testing
