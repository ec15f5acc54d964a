// kiln/autograd/formulas_attention.h: the derivative helper of _fused_attention
// (tensor/ops/attention.toml), included by kiln/autograd/formulas.h.
//
//   // _fused_attention: d[query] = "fused_attention_grad(0, grads[0], grads[1], query, ...)"
//   Tensor g_query = fused_attention_grad(0, grads[0], grads[1], query, key, value, output,
//                                         logsumexp, dropout_p, is_causal, scale, seed, offset);
//   Tensor g_key = fused_attention_grad(1, ...);   // the same pass: no second backward kernel
//
// Note [Fused attention gradients]: one backward pass (_fused_attention_backward) yields the
// gradients of query, key and value together, but a node evaluates one formula per input. The
// first formula to run computes all three and keeps, in a thread-local slot, the ones the node
// will ask for next: those of the other inputs that require grad (exactly the inputs the node has
// edges for, unless requires_grad changed after the forward). The slot is matched by the
// identity and version of every tensor argument and by the other arguments, so a request that
// does not match (a formula of another node, an input whose flag changed) recomputes: the cache
// only ever saves work. It holds its tensors until the node has taken the gradients it expects,
// and is emptied by the next request that does not match.
#pragma once

#include <optional>

#include "kiln/kiln.h"

namespace kiln::autograd {

// Gradient of input `which` (0 query, 1 key, 2 value) of _fused_attention, given the gradients
// of its output and logsumexp (undefined: zeros).
Tensor fused_attention_grad(int64_t which, const Tensor& grad_out, const Tensor& grad_logsumexp,
                            const Tensor& query, const Tensor& key, const Tensor& value,
                            const Tensor& output, const Tensor& logsumexp, double dropout_p,
                            bool is_causal, std::optional<double> scale, int64_t seed,
                            int64_t offset);

}  // namespace kiln::autograd
