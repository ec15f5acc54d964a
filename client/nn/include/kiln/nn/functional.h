// kiln/nn/functional.h: the functional forms of the layers and losses (torch.nn.functional).
// Most are the op table's functions themselves, re-exported here; the rest are compositions.
//
//   namespace F = kiln::nn::functional;
//   kiln::Tensor h = F::relu(F::linear(x, w, b));
//   kiln::Tensor y = F::bilinear(x1, x2, w3, b);
//   kiln::Tensor loss = F::cross_entropy(logits, target);
//   kiln::Tensor o = F::dropout(h, 0.1, /*training=*/true);
#pragma once

#include <optional>

#include "kiln/kiln.h"

namespace kiln::nn::functional {

// Layers (op table rows).
using kiln::adaptive_avg_pool2d;
using kiln::avg_pool2d;
using kiln::batch_norm;
using kiln::conv1d;
using kiln::conv2d;
using kiln::conv_transpose2d;
using kiln::dropout;
using kiln::embedding;
using kiln::group_norm;
using kiln::layer_norm;
using kiln::linear;
using kiln::max_pool2d;
using kiln::rms_norm;
using kiln::scaled_dot_product_attention;
// Activations.
using kiln::gelu;
using kiln::log_softmax;
using kiln::relu;
using kiln::sigmoid;
using kiln::silu;
using kiln::softmax;
using kiln::tanh;
// Losses.
using kiln::binary_cross_entropy;
using kiln::binary_cross_entropy_with_logits;
using kiln::cross_entropy;
using kiln::kl_div;
using kiln::l1_loss;
using kiln::mse_loss;
using kiln::nll_loss;
using kiln::smooth_l1_loss;

// x1: (*, I), x2: (*, J), weight: (O, I, J), bias: (O) -> (*, O);
// y_o = x1ᵀ W_o x2 + b_o.
Tensor bilinear(const Tensor& input1, const Tensor& input2, const Tensor& weight,
                const std::optional<Tensor>& bias = std::nullopt);

// input: (N, C, *) -> (N, C·∏*) by default, PyTorch's nn.Flatten bounds.
inline Tensor flatten(const Tensor& input, int64_t start_dim = 1, int64_t end_dim = -1) {
  return input.flatten(start_dim, end_dim);
}

}  // namespace kiln::nn::functional
