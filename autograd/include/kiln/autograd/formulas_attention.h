// kiln/autograd/formulas_attention.h: the derivative helpers of _fused_attention and
// _jagged_attention (tensor/ops/attention.toml), included by kiln/autograd/formulas.h.
//
//   // derivative = { "query, key, value" = "fused_attention_grads(grads[0], grads[1], ...)" }
//   auto [gq, gk, gv] = fused_attention_grads(grads[0], grads[1], query, key, value, output,
//                                             logsumexp, dropout_p, is_causal, scale, seed,
//                                             offset);
//
// One backward pass (_fused_attention_backward) yields the gradients of query, key and value
// together; the row's derivative names the three inputs in one key, so its node runs the pass
// once (a shared formula, tensor/ops/README.md).
#pragma once

#include <optional>
#include <tuple>

#include "kiln/kiln.h"

namespace kiln::autograd {

// The gradients of _fused_attention's query, key and value, given the gradients of its output
// and logsumexp (undefined: zeros).
std::tuple<Tensor, Tensor, Tensor> fused_attention_grads(
    const Tensor& grad_out, const Tensor& grad_logsumexp, const Tensor& query, const Tensor& key,
    const Tensor& value, const Tensor& output, const Tensor& logsumexp, double dropout_p,
    bool is_causal, std::optional<double> scale, int64_t seed, int64_t offset);

// The same for _jagged_attention (packed sequences; one kernel pass, _jagged_attention_backward).
std::tuple<Tensor, Tensor, Tensor> jagged_attention_grads(
    const Tensor& grad_out, const Tensor& grad_logsumexp, const Tensor& query, const Tensor& key,
    const Tensor& value, const Tensor& offsets, const Tensor& output, const Tensor& logsumexp,
    bool is_causal, std::optional<double> scale);

}  // namespace kiln::autograd
