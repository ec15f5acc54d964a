// kiln/optim/clip_grad.h: gradient clipping (PyTorch's torch.nn.utils.clip_grad_norm_ and
// clip_grad_value_), in place on the parameters' .grad; parameters without one are skipped.
//
//   loss.backward();
//   kiln::Tensor norm = kiln::optim::clip_grad_norm_(params, 1.0);   // the norm before clipping
//   kiln::optim::clip_grad_value_(params, 0.5);                      // each element to [-0.5, 0.5]
//   opt.step();
#pragma once

#include <limits>
#include <vector>

#include "kiln/tensor.h"

namespace kiln::optim {

// Scales the gradients by min(1, max_norm / (total_norm + 1e-6)), where total_norm is the
// norm_type norm (inf: the largest magnitude) of all the gradients together. Returns total_norm
// as a 0-dim tensor (0 with no gradients). error_if_nonfinite: a NaN or infinite total norm is a
// RuntimeError instead of scaling the gradients by it.
Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2,
                       bool error_if_nonfinite = false);

// Clamps every gradient element to [-clip_value, clip_value].
void clip_grad_value_(const std::vector<Tensor>& params, double clip_value);

}  // namespace kiln::optim
