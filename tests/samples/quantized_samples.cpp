// Manifest samples for quantized.toml (run on every path by the conformance driver; the
// fake-quantize rows are differentiable but skipped by the float64 gradcheck: Note
// [Straight-through gradients] in tests/autograd/manifest_gradcheck_test.cpp).
#include "samples/op_samples.h"
#include "samples/util.h"

namespace kiln::testing {
namespace {

using namespace sample_args;

using S = std::vector<Stack>;
using Dims = std::vector<int64_t>;

Tensor codes_u8(IntArrayRef sizes, uint32_t seed = 7) {
  return random(sizes, kUInt8, 0, 256, seed);
}
Tensor codes_s8(IntArrayRef sizes, uint32_t seed = 8) {
  return random(sizes, kInt8, -127, 128, seed);
}
Tensor scales(int64_t n) { return random({n}, kFloat32, 0.005, 0.02, 9); }

KILN_OP_SAMPLES("quantize_per_tensor", quantize_per_tensor_s) {
  return S{{random({3, 4}), 0.02, i64(128)},
           {random({2, 3, 5}, kFloat32, -10, 10), 0.05, i64(0)},
           {random({0, 3}), 0.1, i64(3)}};
}
KILN_OP_SAMPLES("dequantize_per_tensor", dequantize_per_tensor_s) {
  return S{{codes_u8({3, 4}), 0.02, i64(128)}, {codes_u8({2, 0}), 0.5, i64(255)}};
}
KILN_OP_SAMPLES("quantize_weight_per_channel", quantize_weight_per_channel_s) {
  return S{{random({4, 3}), i64(0)}, {random({2, 3, 2, 2}), i64(1)}, {random({3, 5}), i64(-1)}};
}
KILN_OP_SAMPLES("linear_int8", linear_int8_s) {
  return S{
      {codes_u8({5, 8}), 0.02, i64(128), codes_s8({6, 8}), scales(6), random({6}), 0.05, i64(100),
       false},
      {codes_u8({2, 3, 8}), 0.03, i64(7), codes_s8({4, 8}), scales(4), kNone, 0.04, i64(0), true}};
}
KILN_OP_SAMPLES("conv2d_int8", conv2d_int8_s) {
  return S{{codes_u8({2, 4, 5, 5}), 0.02, i64(120), codes_s8({6, 2, 3, 3}), scales(6), random({6}),
            Dims{1, 1}, Dims{1, 1}, Dims{1, 1}, i64(2), 0.05, i64(128), false},
           {codes_u8({1, 3, 6, 5}), 0.03, i64(0), codes_s8({4, 3, 2, 2}), scales(4), kNone,
            Dims{2, 1}, Dims{0, 1}, Dims{1, 2}, i64(1), 0.1, i64(10), true}};
}
KILN_OP_SAMPLES("linear_int8_dynamic", linear_int8_dynamic_s) {
  return S{{random({5, 8}), codes_s8({6, 8}), scales(6), random({6}), false},
           {random({2, 3, 8}), codes_s8({4, 8}), scales(4), kNone, true}};
}
KILN_OP_SAMPLES("fake_quantize_per_tensor_affine", fake_quantize_per_tensor_affine_s) {
  return S{{random({3, 4}), 0.1, i64(128), i64(0), i64(255)},
           {random({2, 5}), 0.05, i64(0), i64(-128), i64(127)}};
}
KILN_OP_SAMPLES("fake_quantize_per_channel_affine", fake_quantize_per_channel_affine_s) {
  return S{{random({3, 4}), random({3}, kFloat32, 0.02, 0.1), idx({0, 3, -2}, {3}), i64(0),
            i64(-127), i64(127)},
           {random({2, 3, 4}), random({4}, kFloat32, 0.05, 0.2), idx({10, 0, 128, 255}, {4}),
            i64(-1), i64(0), i64(255)}};
}

}  // namespace
}  // namespace kiln::testing
