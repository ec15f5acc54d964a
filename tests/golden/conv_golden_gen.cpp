// tests/golden/conv_golden_gen.cpp: PyTorch's (libtorch C++ API) outputs and gradients of the
// convolutions and pools that tests/kernels/conv_test.cpp (ConvGolden) checks, written to
// conv_golden.bin. Built and run by make_conv_golden.sh; CI never runs it.
//
// Inputs (float64, no RNG; the test builds the same ones): a tensor of shape s holds, at flat
// row-major index i, fill(i, a, b) = sin(i * a + b); the gradient fed back is named "<case>.gy".
//   conv2d:     x (2,4,7,6) fill .37,.1; w (6,2,3,2) fill .23,.5 * .3; b (6) fill .71,0 * .1
//               stride (2,1), padding (1,1), dilation (1,2), groups 2
//   conv1d:     x (2,3,9), w (4,3,4), b (4), padding "same"
//   convt2d:    x (2,4,3,4), w (4,3,3,3), b (6), stride 2, padding (1,0), output_padding 1,
//               groups 2
//   maxpool:    x (2,3,7,6), kernel (3,2), stride 2, padding 1, ceil_mode
//   avgpool:    x (2,3,7,6), kernel 3, stride 2, padding 1, ceil_mode, count_include_pad false
//   adaptive:   x (2,3,7,5) -> (3, 2)
// For each case: "<case>.y" and the gradients "<case>.x.grad" (and .w.grad, .b.grad) of
// sum(y * gy), gy = fill(i, .53, .2) shaped like y.
//
// File format: golden_writer.h.
#include "golden_writer.h"

using golden::fill;

int main(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : "conv_golden.bin";
  golden::Writer out;
  {
    auto x = fill({2, 4, 7, 6}, .37, .1), w = fill({6, 2, 3, 2}, .23, .5, .3),
         b = fill({6}, .71, 0, .1);
    out.record("conv2d", torch::conv2d(x, w, b, {2, 1}, {1, 1}, {1, 2}, 2),
               {{"x", x}, {"w", w}, {"b", b}});
  }
  {
    auto x = fill({2, 3, 9}, .37, .1), w = fill({4, 3, 4}, .23, .5, .3), b = fill({4}, .71, 0, .1);
    out.record("conv1d", torch::conv1d(x, w, b, 1, "same"), {{"x", x}, {"w", w}, {"b", b}});
  }
  {
    auto x = fill({2, 4, 3, 4}, .37, .1), w = fill({4, 3, 3, 3}, .23, .5, .3),
         b = fill({6}, .71, 0, .1);
    out.record("convt2d", torch::conv_transpose2d(x, w, b, 2, {1, 0}, 1, 2),
               {{"x", x}, {"w", w}, {"b", b}});
  }
  {
    auto x = fill({2, 3, 7, 6}, .37, .1);
    out.record("maxpool", torch::max_pool2d(x, {3, 2}, 2, 1, 1, true), {{"x", x}});
  }
  {
    auto x = fill({2, 3, 7, 6}, .37, .1);
    out.record("avgpool", torch::avg_pool2d(x, 3, 2, 1, true, false), {{"x", x}});
  }
  {
    auto x = fill({2, 3, 7, 5}, .37, .1);
    out.record("adaptive", torch::adaptive_avg_pool2d(x, {3, 2}), {{"x", x}});
  }
  return out.save(path);
}
