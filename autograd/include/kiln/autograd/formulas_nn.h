// kiln/autograd/formulas_nn.h: formula helpers of the norm rows (tensor/ops/nn.toml), included by
// kiln/autograd/formulas.h. The fused backward rows themselves are ops of the table.
//
//   // _batch_norm: d[bias] = "channel_sum(grad)"
//   Tensor g_bias = kiln::autograd::channel_sum(grad);   // (N, C, H, W) -> (C,)
#pragma once

#include "kiln/kiln.h"

namespace kiln::autograd {

// Sums an (N, C, *) gradient over every dim but the channel dim 1: a per-channel bias's gradient.
Tensor channel_sum(const Tensor& grad);

}  // namespace kiln::autograd
