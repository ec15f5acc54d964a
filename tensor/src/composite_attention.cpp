// Decompositions of attention.toml: scaled_dot_product_attention (reserves the dropout counters,
// then runs the fused kernel) and the written-out backward of _fused_attention_backward, which
// autograd differentiates for double backward and forward-mode AD (Note [Differentiating by
// decomposition]).
#include <cmath>

#include "kiln/generated/composite/attention.h"
#include "kiln/generated/composite/copy.h"
#include "kiln/generated/composite/creation.h"
#include "kiln/generated/composite/linalg.h"
#include "kiln/generated/meta/attention.h"
#include "kiln/meta.h"
#include "kiln/operators.h"

namespace kiln::composite {

// The dropout mask's (seed, offset) are reserved here, one 32-bit draw per (N, L, S) probability
// (See Note [Attention dropout] in kernels/cpu/attention.cpp).
Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    double dropout_p, bool is_causal, std::optional<double> scale,
                                    std::optional<Generator> generator) {
  meta::scaled_dot_product_attention(query, key, value, dropout_p, is_causal, scale, generator);
  uint64_t seed = 0, offset = 0;
  if (dropout_p > 0) {
    int64_t n = key.size(-2);  // one draw per (..., L, S) probability
    for (int64_t d = 0; d < query.dim() - 1; ++d) n *= query.size(d);
    Generator& g = generator ? *generator : default_generator();
    std::tie(seed, offset) = g.reserve(random_counters(RandomWidth::k32, n));
  }
  return std::get<0>(kiln::_fused_attention(query, key, value, dropout_p, is_causal, scale,
                                            static_cast<int64_t>(seed),
                                            static_cast<int64_t>(offset)));
}

// The backward of P = softmax(scale q k^T) (causal: keys j <= i), out = (P * M) v with the
// dropout mask M (0 or 1 / (1 - p)), and logsumexp, written out with (..., L, S) matrices.
std::tuple<Tensor, Tensor, Tensor> fused_attention_backward(
    const Tensor& grad_out, const Tensor& grad_logsumexp, const Tensor& query, const Tensor& key,
    const Tensor& value, const Tensor& output, const Tensor& logsumexp, double dropout_p,
    bool is_causal, std::optional<double> scale, int64_t seed, int64_t offset) {
  meta::fused_attention_backward(grad_out, grad_logsumexp, query, key, value, output, logsumexp,
                                 dropout_p, is_causal, scale, seed, offset);
  const double sc = scale.value_or(1.0 / std::sqrt(static_cast<double>(query.size(-1))));
  const ScalarType dt = query.dtype();
  Tensor kt = key.transpose(-2, -1);
  Tensor prob = kiln::exp(kiln::matmul(query, kt) * sc - logsumexp.to(dt).unsqueeze(-1));
  if (is_causal) {
    Tensor above = kiln::ones({query.size(-2), key.size(-2)}, kBool, query.device()).triu(1);
    prob = prob.masked_fill(above, 0.0);
  }
  Tensor keep;
  if (dropout_p > 0)
    keep = kiln::_fused_attention_dropout_mask(prob.sizes(), dropout_p, seed, offset, dt,
                                               query.device());
  Tensor dropped = keep.defined() ? prob * keep : prob;
  Tensor grad_value = kiln::matmul(dropped.transpose(-2, -1), grad_out);
  Tensor grad_prob = kiln::matmul(grad_out, value.transpose(-2, -1));
  if (keep.defined()) grad_prob = grad_prob * keep;
  Tensor row =
      (grad_out * output).sum(std::vector<int64_t>{-1}, true) - grad_logsumexp.to(dt).unsqueeze(-1);
  Tensor grad_scores = prob * (grad_prob - row) * sc;
  return {kiln::matmul(grad_scores, key), kiln::matmul(grad_scores.transpose(-2, -1), query),
          grad_value};
}

// _jagged_attention_backward written out densely: the packed (T, H, .) inputs as (H, T, .)
// matrices, and a (T, T) mask that keeps key j for query i only when both lie in the same
// sequence (and j <= i when causal). See Note [Jagged attention] in kernels/cpu/attention.cpp.
std::tuple<Tensor, Tensor, Tensor> jagged_attention_backward(
    const Tensor& grad_out, const Tensor& grad_logsumexp, const Tensor& query, const Tensor& key,
    const Tensor& value, const Tensor& offsets, const Tensor& output, const Tensor& logsumexp,
    bool is_causal, std::optional<double> scale) {
  meta::jagged_attention_backward(grad_out, grad_logsumexp, query, key, value, offsets, output,
                                  logsumexp, is_causal, scale);
  const double sc = scale.value_or(1.0 / std::sqrt(static_cast<double>(query.size(-1))));
  const ScalarType dt = query.dtype();
  const int64_t T = query.size(0), B = offsets.size(0) - 1;
  // seq[i] = b with offsets[b] <= i < offsets[b + 1]: how many sequences end at or before i.
  Tensor rows = kiln::arange(0, T, 1, kInt64, query.device());
  Tensor ends = offsets.narrow(0, 1, B);
  Tensor seq = kiln::ge(rows.unsqueeze(1), ends.unsqueeze(0)).sum(std::vector<int64_t>{1});
  Tensor blocked = kiln::logical_not(kiln::eq(seq.unsqueeze(1), seq.unsqueeze(0)));
  if (is_causal)
    blocked = kiln::logical_or(blocked, kiln::ones({T, T}, kBool, query.device()).triu(1));
  Tensor q = query.transpose(0, 1), k = key.transpose(0, 1), v = value.transpose(0, 1);
  Tensor go = grad_out.transpose(0, 1), o = output.transpose(0, 1);
  Tensor lse = logsumexp.to(dt).transpose(0, 1).unsqueeze(-1);  // (H, T, 1)
  Tensor glse = grad_logsumexp.to(dt).transpose(0, 1).unsqueeze(-1);
  Tensor prob =
      kiln::exp(kiln::matmul(q, k.transpose(-2, -1)) * sc - lse).masked_fill(blocked, 0.0);
  Tensor grad_value = kiln::matmul(prob.transpose(-2, -1), go);
  Tensor grad_prob = kiln::matmul(go, v.transpose(-2, -1));
  Tensor row = (go * o).sum(std::vector<int64_t>{-1}, true) - glse;
  Tensor grad_scores = prob * (grad_prob - row) * sc;
  return {kiln::matmul(grad_scores, k).transpose(0, 1).contiguous(),
          kiln::matmul(grad_scores.transpose(-2, -1), q).transpose(0, 1).contiguous(),
          grad_value.transpose(0, 1).contiguous()};
}

}  // namespace kiln::composite
