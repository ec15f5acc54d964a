// Manifest samples for the norm, dropout, embedding and loss rows (tensor/ops/nn.toml,
// loss.toml) and the softmax backward rows (reduction.toml). Every sample is deterministic (the
// manifest gradcheck differentiates them): dropout only with train=False or p=0.
#include "samples/op_samples.h"
#include "samples/util.h"

namespace kiln::testing {
namespace {

using namespace sample_args;

using S = std::vector<Stack>;
using Dims = std::vector<int64_t>;

Tensor r(IntArrayRef sizes, uint32_t seed, double lo = -2, double hi = 2) {
  return random(sizes, kFloat32, lo, hi, seed);
}
Tensor labels(IntArrayRef sizes, int64_t classes, uint32_t seed) {
  return random(sizes, kInt64, 0, static_cast<double>(classes), seed);
}

// ---- norms ------------------------------------------------------------------------------------

KILN_OP_SAMPLES("layer_norm", layer_norm_s) {
  return S{{r({2, 3, 4}, 1), Dims{4}, r({4}, 2), r({4}, 3), 1e-5},
           {r({3, 2, 3}, 4), Dims{2, 3}, kNone, kNone, 1e-5},
           {non_contiguous(r({3, 4}, 5)), Dims{4}, r({4}, 6), kNone, 1e-3}};
}
KILN_OP_SAMPLES("_layer_norm", layer_norm_core_s) {
  return S{{r({2, 3, 4}, 7), Dims{4}, r({4}, 8), r({4}, 9), 1e-5},
           {r({4}, 10), Dims{4}, r({4}, 11), r({4}, 12), 1e-5},
           {r({0, 5}, 13), Dims{5}, r({5}, 14), r({5}, 15), 1e-5}};
}
KILN_OP_SAMPLES("_layer_norm_backward", layer_norm_backward_s) {
  return S{{r({3, 4}, 16), r({3, 4}, 17), r({4}, 18), Dims{4}, 1e-5},
           {r({2, 2, 3}, 19), r({2, 2, 3}, 20), r({2, 3}, 21), Dims{2, 3}, 1e-5},
           {r({5}, 24), non_contiguous(r({5}, 25)), r({5}, 22), Dims{5}, 1e-5}};
}
KILN_OP_SAMPLES("rms_norm", rms_norm_s) {
  return S{{r({2, 3, 4}, 26), Dims{4}, r({4}, 27), kNone}, {r({3, 4}, 28), Dims{3, 4}, kNone, 1e-6}};
}
KILN_OP_SAMPLES("_rms_norm", rms_norm_core_s) {
  return S{{r({2, 5}, 29), Dims{5}, r({5}, 30), 1e-6}, {r({0, 3}, 31), Dims{3}, r({3}, 32), 1e-6}};
}
KILN_OP_SAMPLES("_rms_norm_backward", rms_norm_backward_s) {
  return S{{r({3, 4}, 33), r({3, 4}, 34), r({4}, 35), Dims{4}, 1e-6},
           {r({2, 2, 3}, 36), r({2, 2, 3}, 37), r({2, 3}, 23), Dims{2, 3}, 1e-6}};
}
KILN_OP_SAMPLES("group_norm", group_norm_s) {
  return S{{r({2, 4, 3}, 38), int64_t{2}, r({4}, 39), r({4}, 40), 1e-5},
           {r({2, 6, 2, 2}, 41), int64_t{3}, kNone, kNone, 1e-5}};
}
KILN_OP_SAMPLES("_group_norm", group_norm_core_s) {
  return S{{r({2, 4, 3}, 42), int64_t{2}, r({4}, 43), r({4}, 44), 1e-5},
           {r({3, 2}, 45), int64_t{1}, r({2}, 46), r({2}, 47), 1e-5}};
}
KILN_OP_SAMPLES("_group_norm_backward", group_norm_backward_s) {
  return S{{r({2, 4, 3}, 48), r({2, 4, 3}, 49), r({4}, 50), int64_t{2}, 1e-5},
           {r({3, 2}, 51), non_contiguous(r({3, 2}, 52)), r({2}, 5), int64_t{1}, 1e-5}};
}
KILN_OP_SAMPLES("batch_norm", batch_norm_s) {
  return S{{r({4, 3, 2}, 53), r({3}, 54), r({3}, 55), r({3}, 56), r({3}, 57, 0.5, 2), true, 0.1, 1e-5},
           {r({4, 3, 2}, 58), r({3}, 59), r({3}, 60), r({3}, 61), r({3}, 62, 0.5, 2), false, 0.1, 1e-5},
           {r({5, 2}, 63), kNone, kNone, kNone, kNone, true, 0.1, 1e-5}};
}
KILN_OP_SAMPLES("_batch_norm", batch_norm_core_s) {
  return S{{r({4, 3, 2}, 64), r({3}, 65), r({3}, 66), 1e-5}, {r({3, 2}, 67), r({2}, 68), r({2}, 69), 1e-5}};
}
KILN_OP_SAMPLES("batch_norm_backward", batch_norm_backward_s) {
  return S{{r({4, 3, 2}, 70), r({4, 3, 2}, 71), r({3}, 72), 1e-5}};
}
KILN_OP_SAMPLES("batch_norm_backward_weight", batch_norm_backward_weight_s) {
  return S{{r({4, 3, 2}, 73), r({4, 3, 2}, 74), 1e-5}};
}

// ---- dropout, embedding, softmax backward -----------------------------------------------------

KILN_OP_SAMPLES("dropout", dropout_s) {
  return S{{r({3, 4}, 75), 0.5, false, kNone}, {r({5}, 76), 0.0, true, kNone}};
}
KILN_OP_SAMPLES("dropout_seeded", dropout_seeded_s) {
  return S{{r({3, 5}, 77), 0.3, int64_t{7}, int64_t{3}}, {r({4}, 78), 1.0, int64_t{1}, int64_t{0}}};
}
KILN_OP_SAMPLES("embedding", embedding_s) {
  return S{{r({5, 3}, 79), labels({2, 4}, 5, 80), int64_t{-1}, false, false},
           // padding_idx 4 is never looked up, and no scale_grad_by_freq: both make the gradient
           // differ from the derivative by design (norm_test.cpp and the golden test check them)
           {r({5, 2}, 81), labels({6}, 4, 82), int64_t{4}, false, false}};
}
KILN_OP_SAMPLES("embedding_dense_backward", embedding_dense_backward_s) {
  return S{{r({2, 4, 3}, 83), labels({2, 4}, 5, 84), int64_t{5}, int64_t{-1}, false},
           {r({6, 2}, 85), labels({6}, 4, 86), int64_t{4}, int64_t{2}, true}};
}
KILN_OP_SAMPLES("softmax_backward_data", softmax_backward_data_s) {
  return S{{r({3, 4}, 87), random({3, 4}, kFloat32, 0.05, 0.5, 88), int64_t{1}},
           {r({2, 3, 4}, 89), random({2, 3, 4}, kFloat32, 0.05, 0.5, 90), int64_t{1}}};
}
KILN_OP_SAMPLES("log_softmax_backward_data", log_softmax_backward_data_s) {
  return S{{r({3, 4}, 91), r({3, 4}, 92, -3, -0.5), int64_t{-1}},
           {r({2, 3, 4}, 93), r({2, 3, 4}, 94, -3, -0.5), int64_t{0}}};
}

// ---- losses -----------------------------------------------------------------------------------

KILN_OP_SAMPLES("cross_entropy", cross_entropy_s) {
  return S{{r({4, 5}, 95), labels({4}, 5, 96), kNone, std::string("mean"), int64_t{-100}, 0.0},
           {r({3, 4, 2}, 97), labels({3, 2}, 4, 98), r({4}, 99, 0.5, 2), std::string("mean"),
            int64_t{1}, 0.2},
           {r({5}, 100), labels({}, 5, 101), kNone, std::string("none"), int64_t{-100}, 0.1},
           {r({3, 4}, 102), random({3, 4}, kFloat32, 0, 1, 103), r({4}, 104, 0.5, 2),
            std::string("sum"), int64_t{-100}, 0.3}};
}
KILN_OP_SAMPLES("cross_entropy_indices", cross_entropy_indices_s) {
  return S{{r({4, 5}, 105), labels({4}, 5, 106), kNone, int64_t{-100}, 0.0},
           {r({4, 3}, 107), labels({4}, 3, 108), kNone, int64_t{2}, 0.25}};  // (weights: loss_test)
}
KILN_OP_SAMPLES("cross_entropy_indices_backward", cross_entropy_indices_backward_s) {
  return S{{r({4}, 110), r({4, 5}, 111), labels({4}, 5, 112), kNone, int64_t{-100}, 0.1},
           {r({4}, 113), r({4, 3}, 114), labels({4}, 3, 115), r({3}, 116, 0.5, 2), int64_t{0}, 0.0}};
}
KILN_OP_SAMPLES("nll_loss", nll_loss_s) {
  return S{{r({4, 5}, 117), labels({4}, 5, 118), kNone, std::string("mean"), int64_t{-100}},
           {r({3, 4, 2}, 119), labels({3, 2}, 4, 120), r({4}, 121, 0.5, 2), std::string("mean"),
            int64_t{0}},
           {r({5}, 122), labels({}, 5, 123), kNone, std::string("none"), int64_t{-100}}};
}
KILN_OP_SAMPLES("mse_loss", mse_loss_s) {
  return S{{r({3, 4}, 124), r({3, 4}, 125), std::string("mean")},
           {r({2, 3}, 126), r({3}, 127), std::string("none")}};
}
KILN_OP_SAMPLES("l1_loss", l1_loss_s) {
  return S{{r({3, 4}, 128), r({3, 4}, 129), std::string("sum")}};
}
KILN_OP_SAMPLES("smooth_l1_loss", smooth_l1_loss_s) {
  return S{{r({3, 4}, 130), r({3, 4}, 131), std::string("mean"), 1.0},
           {r({5}, 132), r({5}, 133), std::string("none"), 0.0}};
}
KILN_OP_SAMPLES("binary_cross_entropy", binary_cross_entropy_s) {
  return S{{r({3, 4}, 134, 0.1, 0.9), r({3, 4}, 135, 0, 1), kNone, std::string("mean")},
           {r({2, 3}, 136, 0.1, 0.9), r({2, 3}, 137, 0, 1), r({3}, 138, 0.5, 2), std::string("none")}};
}
KILN_OP_SAMPLES("binary_cross_entropy_with_logits", bce_logits_s) {
  return S{{r({3, 4}, 139), r({3, 4}, 140, 0, 1), kNone, kNone, std::string("mean")},
           {r({2, 3}, 141), r({2, 3}, 142, 0, 1), r({3}, 143, 0.5, 2), r({3}, 144, 0.5, 3),
            std::string("sum")}};
}
KILN_OP_SAMPLES("kl_div", kl_div_s) {
  return S{{r({3, 4}, 145, -3, -0.5), r({3, 4}, 146, 0.05, 1), std::string("batchmean"), false},
           {r({3, 4}, 147, -3, -0.5), r({3, 4}, 148, -3, -0.5), std::string("sum"), true}};
}

}  // namespace
}  // namespace kiln::testing
