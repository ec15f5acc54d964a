// Manifest samples for conv.toml and pool.toml (run on every path by the
// conformance driver, gradchecked in float64, and run under forward AD).
#include "samples/op_samples.h"
#include "samples/util.h"

namespace kiln::testing {
namespace {

using namespace sample_args;

using S = std::vector<Stack>;
using Dims = std::vector<int64_t>;

// ---- conv.toml
KILN_OP_SAMPLES("convolution", convolution_s) {
  return S{
      {random({2, 4, 5, 5}), random({6, 2, 3, 3}), Dims{1, 1}, Dims{1, 1}, Dims{1, 1}, false,
       Dims{0, 0}, i64(2)},
      {random({2, 3, 7}), random({4, 3, 2}), Dims{2}, Dims{1}, Dims{2}, false, Dims{0}, i64(1)},
      {random({1, 4, 3, 4}), random({4, 3, 3, 2}), Dims{2, 1}, Dims{1, 0}, Dims{1, 1}, true,
       Dims{1, 0}, i64(2)},
      {non_contiguous(random({2, 3, 4, 4})), random({2, 3, 2, 2}), Dims{1, 1}, Dims{0, 0},
       Dims{1, 1}, false, Dims{0, 0}, i64(1)}};
}
KILN_OP_SAMPLES("convolution_backward_weight", convolution_backward_weight_s) {
  return S{
      {random({2, 6, 5, 5}), random({2, 4, 5, 5}), Dims{6, 2, 3, 3}, Dims{1, 1}, Dims{1, 1},
       Dims{1, 1}, i64(2)},
      {random({2, 4, 4}), random({2, 3, 7}), Dims{4, 3, 2}, Dims{2}, Dims{1}, Dims{2}, i64(1)}};
}
KILN_OP_SAMPLES("conv1d", conv1d_s) {
  return S{{random({2, 3, 7}), random({4, 3, 3}), random({4}), Dims{1}, Dims{1}, Dims{1}, i64(1)},
           {random({3, 6}), random({2, 3, 2}), kNone, Dims{2}, Dims{0}, Dims{1}, i64(1)}};
}
KILN_OP_SAMPLES("conv1d.padding", conv1d_padding_s) {
  return S{
      {random({2, 3, 7}), random({4, 3, 4}), random({4}), Dims{1}, str("same"), Dims{1}, i64(1)},
      {random({2, 4, 6}), random({2, 2, 3}), kNone, Dims{2}, str("valid"), Dims{1}, i64(2)}};
}
KILN_OP_SAMPLES("conv2d", conv2d_s) {
  return S{{random({2, 3, 5, 5}), random({4, 3, 3, 3}), random({4}), Dims{1, 1}, Dims{1, 1},
            Dims{1, 1}, i64(1)},
           {random({4, 5, 4}), random({4, 2, 2, 3}), kNone, Dims{2}, Dims{1}, Dims{1}, i64(2)}};
}
KILN_OP_SAMPLES("conv2d.padding", conv2d_padding_s) {
  return S{{random({1, 2, 5, 6}), random({3, 2, 2, 3}), random({3}), Dims{1, 1}, str("same"),
            Dims{2, 1}, i64(1)}};
}
KILN_OP_SAMPLES("conv_transpose2d", conv_transpose2d_s) {
  return S{
      {random({2, 4, 3, 3}), random({4, 3, 3, 3}), random({6}), Dims{2, 2}, Dims{1, 1}, Dims{1, 0},
       i64(2), Dims{1, 1}},
      {random({2, 3, 4}), random({2, 2, 2, 2}), kNone, Dims{1}, Dims{0}, Dims{0}, i64(1), Dims{2}}};
}

// ---- pool.toml
KILN_OP_SAMPLES("max_pool2d_with_indices", max_pool2d_with_indices_s) {
  return S{{random({2, 3, 6, 5}), Dims{2, 2}, Dims{}, Dims{0, 0}, Dims{1, 1}, false},
           {random({3, 7, 7}), Dims{3}, Dims{2}, Dims{1}, Dims{2}, true}};
}
KILN_OP_SAMPLES("max_pool2d_backward", max_pool2d_backward_s) {
  Tensor x = random({2, 3, 6, 5});
  Tensor idx = std::get<1>(max_pool2d_with_indices(x, {3, 2}, {2, 1}, {1, 0}));
  return S{{random(idx.sizes(), kFloat32, -2, 2, 7), idx, Dims{2, 3, 6, 5}}};
}
KILN_OP_SAMPLES("max_pool2d", max_pool2d_s) {
  return S{{random({2, 3, 6, 5}), Dims{2}, Dims{}, Dims{0}, Dims{1}, false}};
}
KILN_OP_SAMPLES("avg_pool2d", avg_pool2d_s) {
  return S{{random({2, 3, 6, 5}), Dims{3, 2}, Dims{2, 1}, Dims{1, 1}, true, false, kNone},
           {random({3, 5, 5}), Dims{2}, Dims{}, Dims{0}, false, true, i64(3)}};
}
KILN_OP_SAMPLES("avg_pool2d_backward", avg_pool2d_backward_s) {
  Tensor y = avg_pool2d(random({2, 3, 6, 5}), {3, 2}, {2, 1}, {1, 1}, true, false);
  return S{{random(y.sizes(), kFloat32, -2, 2, 7), Dims{2, 3, 6, 5}, Dims{3, 2}, Dims{2, 1},
            Dims{1, 1}, true, false, kNone}};
}
KILN_OP_SAMPLES("adaptive_avg_pool2d", adaptive_avg_pool2d_s) {
  return S{{random({2, 3, 7, 5}), Dims{3, 2}}, {random({3, 4, 4}), Dims{1}}};
}
KILN_OP_SAMPLES("adaptive_avg_pool2d_backward", adaptive_avg_pool2d_backward_s) {
  return S{{random({2, 3, 3, 2}), Dims{2, 3, 7, 5}}};
}

}  // namespace
}  // namespace kiln::testing
