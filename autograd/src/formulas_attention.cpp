// The derivative helpers of _fused_attention and _jagged_attention
// (kiln/autograd/formulas_attention.h).
#include "kiln/autograd/formulas.h"

namespace kiln::autograd {

std::tuple<Tensor, Tensor, Tensor> fused_attention_grads(
    const Tensor& grad_out, const Tensor& grad_logsumexp, const Tensor& query, const Tensor& key,
    const Tensor& value, const Tensor& output, const Tensor& logsumexp, double dropout_p,
    bool is_causal, std::optional<double> scale, int64_t seed, int64_t offset) {
  return kiln::_fused_attention_backward(
      grad_out.defined() ? grad_out : zeros_like(output),
      grad_logsumexp.defined() ? grad_logsumexp : zeros_like(logsumexp), query, key, value, output,
      logsumexp, dropout_p, is_causal, scale, seed, offset);
}

std::tuple<Tensor, Tensor, Tensor> jagged_attention_grads(
    const Tensor& grad_out, const Tensor& grad_logsumexp, const Tensor& query, const Tensor& key,
    const Tensor& value, const Tensor& offsets, const Tensor& output, const Tensor& logsumexp,
    bool is_causal, std::optional<double> scale) {
  return kiln::_jagged_attention_backward(
      grad_out.defined() ? grad_out : zeros_like(output),
      grad_logsumexp.defined() ? grad_logsumexp : zeros_like(logsumexp), query, key, value, offsets,
      output, logsumexp, is_causal, scale);
}

}  // namespace kiln::autograd
