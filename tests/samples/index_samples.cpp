// Manifest samples for the advanced-indexing rows of indexing.toml, sort.toml, interpolate.toml
// and the flip/roll/repeat/repeat_interleave/pad rows of shape.toml (run on every path by
// the conformance driver, tests/conformance; gradchecked and forward-AD checked too).
#include "samples/op_samples.h"
#include "samples/util.h"

namespace kiln::testing {
namespace {

using namespace sample_args;

using S = std::vector<Stack>;
using Ts = std::vector<Tensor>;
using Ints = std::vector<int64_t>;

// ---- indexing.toml
KILN_OP_SAMPLES("index", index_s) {
  return S{{random({4, 3}), Ts{idx({3, 0, -1}, {3})}},
           {random({4, 3, 2}), Ts{idx({0, 2, 1, 0}, {2, 2}), idx({2, 0}, {2}).to(kInt32)}},
           {random({2, 3}, kInt64), Ts{idx({1}, {1}), idx({0, 2, 2}, {3})}},
           {random({2, 3, 2}), Ts{mask({true, false, true, true, false, false}, {2, 3})}},
           {random({3, 2}), Ts{mask({false, true, true}, {3}), idx({1}, {})}}};
}
KILN_OP_SAMPLES("index_put", index_put_s) {
  return S{{random({4, 3}), Ts{idx({3, 0}, {2})}, random({2, 3}), false},
           {random({4, 3}), Ts{idx({3, 0, 3}, {3}), idx({1, 2, 1}, {3})}, random({3}), true},
           {random({3, 2}, kInt32), Ts{mask({true, false, true}, {3})}, random({2}, kInt32), false},
           {random({2, 3}), Ts{mask({false, true, true, false, false, true}, {2, 3})},
            random({}), true}};
}
KILN_OP_SAMPLES("index_put_", index_put_inplace_s) {
  return S{{random({4, 3}), Ts{idx({1, -1}, {2})}, random({2, 1}), false},
           {random({4}), Ts{idx({0, 0, 2}, {3})}, random({3}), true}};
}
KILN_OP_SAMPLES("masked_select", masked_select_s) {
  return S{{random({2, 3}), mask({true, false, true, false, false, true}, {2, 3})},
           {random({2, 3}), mask({false, true, true}, {3})},
           {random({3}, kInt16), mask({true, false, true}, {3})}};
}
KILN_OP_SAMPLES("nonzero", nonzero_s) {
  return S{{from_vector<float>({0, 1.5f, 0, -2, 0, 0}, {2, 3})},
           {mask({true, false, true, true}, {4})},
           {random({2, 0, 3})}};
}

// ---- sort.toml
KILN_OP_SAMPLES("sort", sort_s) {
  return S{{random({3, 5}), i64(-1), false, false},
           {non_contiguous(random({4, 3})), i64(0), true, true},
           {random({2, 4}, kInt32, -3, 3), i64(1), true, false},
           {random({}), i64(0), false, false}};
}
KILN_OP_SAMPLES("argsort", argsort_s) {
  return S{{random({3, 5}), i64(1), false, true}, {random({4, 2}, kInt64, -2, 2), i64(0), true, false}};
}
KILN_OP_SAMPLES("topk", topk_s) {
  return S{{random({3, 6}), i64(2), i64(-1), true, true},
           {random({5, 3}), i64(3), i64(0), false, true},
           {random({4}, kInt64, -9, 9), i64(0), i64(0), true, false}};
}
KILN_OP_SAMPLES("cumsum", cumsum_s) {
  return S{{random({3, 4}), i64(1), kNone},
           {non_contiguous(random({2, 3, 2})), i64(0), IValue(kFloat64)},
           {random({5}, kInt32, -5, 5), i64(0), kNone},
           {random({}), i64(-1), kNone}};
}
KILN_OP_SAMPLES("cumprod", cumprod_s) {
  return S{{random({3, 4}, kFloat32, 0.5, 1.5), i64(1), kNone},
           {from_vector<float>({1.5f, 0, 2, -1, 0.5f, 0, 3, 2}, {2, 4}), i64(1), kNone},
           {random({4, 2}, kInt16, -3, 3), i64(0), kNone}};
}

// ---- shape.toml
KILN_OP_SAMPLES("flip", flip_s) {
  return S{{random({3, 4}), IValue(Ints{0})},
           {non_contiguous(random({2, 3, 2})), IValue(Ints{-1, 0})},
           {random({2, 2}, kBool), IValue(Ints{})}};
}
KILN_OP_SAMPLES("roll", roll_s) {
  return S{{random({3, 4}), IValue(Ints{1}), IValue(Ints{1})},
           {random({2, 3}), IValue(Ints{-4}), IValue(Ints{})},
           {random({2, 3, 2}, kInt64), IValue(Ints{1, 5}), IValue(Ints{0, 1})}};
}
KILN_OP_SAMPLES("repeat", repeat_s) {
  return S{{random({2, 3}), IValue(Ints{2, 1})},
           {random({3}), IValue(Ints{2, 1, 2})},
           {random({2}, kInt8), IValue(Ints{0, 3})}};
}
KILN_OP_SAMPLES("repeat_interleave.Tensor", repeat_interleave_indices_s) {
  return S{{idx({2, 0, 1}, {3})}, {idx({}, {0})}};
}
KILN_OP_SAMPLES("repeat_interleave.self_Tensor", repeat_interleave_tensor_s) {
  return S{{random({3, 2}), idx({1, 0, 2}, {3}), i64(0)},
           {random({2, 2}), idx({2}, {1}), kNone}};
}
KILN_OP_SAMPLES("repeat_interleave.self_int", repeat_interleave_int_s) {
  return S{{random({2, 3}), i64(2), i64(1)}, {random({2, 2}, kInt32), i64(3), kNone}};
}
KILN_OP_SAMPLES("constant_pad_nd", constant_pad_nd_s) {
  return S{{random({2, 3}), IValue(Ints{1, 2}), Scalar(0.5)},
           {random({2, 3, 4}), IValue(Ints{-1, 1, 2, 0}), Scalar(0)},
           {random({3}, kInt64), IValue(Ints{0, 1}), Scalar(7)}};
}
KILN_OP_SAMPLES("pad", pad_s) {
  return S{{random({1, 2, 3}), IValue(Ints{1, 2}), IValue(std::string("constant")), IValue(1.5)},
           {random({1, 2, 4}), IValue(Ints{2, 3}), IValue(std::string("reflect")), kNone},
           {random({1, 3, 4}), IValue(Ints{1, 2, 2, 0}), IValue(std::string("replicate")), kNone},
           {random({2, 3}), IValue(Ints{2, 1}), IValue(std::string("circular")), kNone}};
}

// ---- interpolate.toml
KILN_OP_SAMPLES("upsample_nearest", upsample_nearest_s) {
  return S{{random({1, 2, 3}), IValue(Ints{7}), kNone},
           {random({2, 1, 2, 3}), IValue(Ints{4, 5}), kNone},
           {random({1, 1, 2, 2, 3}), IValue(Ints{3, 4, 6}), IValue(2.0)},
           {random({1, 2, 5, 4}), IValue(Ints{3, 2}), kNone}};
}
KILN_OP_SAMPLES("upsample_nearest_backward", upsample_nearest_backward_s) {
  return S{{random({2, 1, 4, 5}), IValue(Ints{4, 5}), IValue(Ints{2, 1, 2, 3}), kNone},
           {random({1, 2, 7}), IValue(Ints{7}), IValue(Ints{1, 2, 3}), IValue(2.5)}};
}
KILN_OP_SAMPLES("upsample_bilinear", upsample_bilinear_s) {
  return S{{random({1, 2, 3, 4}), IValue(Ints{5, 7}), false, kNone},
           {random({2, 1, 3, 3}), IValue(Ints{4, 2}), true, kNone},
           {random({1, 1, 2, 3}), IValue(Ints{4, 6}), false, IValue(2.0)}};
}
KILN_OP_SAMPLES("upsample_bilinear_backward", upsample_bilinear_backward_s) {
  return S{{random({1, 2, 5, 7}), IValue(Ints{5, 7}), IValue(Ints{1, 2, 3, 4}), false, kNone},
           {random({2, 1, 4, 2}), IValue(Ints{4, 2}), IValue(Ints{2, 1, 3, 3}), true, kNone}};
}
KILN_OP_SAMPLES("interpolate", interpolate_s) {
  return S{{random({1, 2, 3, 4}), IValue(Ints{6, 8}), kNone, IValue(std::string("nearest")), false},
           {random({1, 1, 3, 3}), kNone, IValue(1.5), IValue(std::string("bilinear")), true},
           {random({2, 1, 4}), kNone, IValue(2.0), IValue(std::string("nearest")), false}};
}

}  // namespace
}  // namespace kiln::testing
