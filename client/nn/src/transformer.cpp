// MultiheadAttention, TransformerEncoderLayer, TransformerDecoderLayer (kiln/nn/transformer.h).
#include "kiln/nn/transformer.h"

#include <cmath>
#include <limits>

#include "kiln/nn/init.h"

namespace kiln::nn {

namespace functional {

std::pair<Tensor, Tensor> attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& mask, double dropout_p, bool is_causal,
                                    bool need_weights) {
  if (!mask.defined() && !need_weights)
    return {kiln::scaled_dot_product_attention(q, k, v, dropout_p, is_causal), Tensor()};
  const int64_t L = q.size(-2), S = k.size(-2);
  // scores: (N, H, L, D) @ (N, H, D, S) -> (N, H, L, S)
  Tensor scores = q.matmul(k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  if (mask.defined()) scores = scores + mask;
  if (is_causal) {
    Tensor future = kiln::ones({L, S}, kBool, q.device()).triu(1);
    scores = scores.masked_fill(future, -std::numeric_limits<double>::infinity());
  }
  Tensor weights = kiln::softmax(scores, -1);
  if (dropout_p > 0) weights = kiln::dropout(weights, dropout_p, true);
  return {weights.matmul(v), need_weights ? weights : Tensor()};
}

}  // namespace functional

namespace {

// A bool mask (true = excluded) as an additive mask of `dtype`; a float mask as given.
Tensor additive(const Tensor& mask, ScalarType dtype) {
  if (mask.dtype() != kBool) return mask.to(dtype);
  return kiln::zeros(mask.sizes(), dtype, mask.device())
      .masked_fill(mask, -std::numeric_limits<double>::infinity());
}

std::optional<Tensor> opt(const Tensor& t) {
  return t.defined() ? std::optional<Tensor>(t) : std::nullopt;
}

}  // namespace

// ---- MultiheadAttention -------------------------------------------------------------------------

MultiheadAttention::MultiheadAttention(int64_t E, int64_t H, double p, bool bias, bool bf)
    : Module("MultiheadAttention"), embed_dim(E), num_heads(H), head_dim(H > 0 ? E / H : 0),
      dropout(p), batch_first(bf) {
  KILN_CHECK(H > 0 && E % H == 0, Value, "MultiheadAttention: embed_dim (", E,
             ") must be divisible by num_heads (", H, ")");
  register_parameter("in_proj_weight", kiln::empty({3 * E, E}), &in_proj_weight);
  register_parameter("in_proj_bias", bias ? kiln::zeros({3 * E}) : Tensor(), &in_proj_bias);
  out_proj = register_module("out_proj", std::make_shared<Linear>(E, E, bias));
  init::xavier_uniform_(in_proj_weight);
  if (bias) init::zeros_(out_proj->bias);
}

std::string MultiheadAttention::extra_repr() const {
  return "embed_dim=" + std::to_string(embed_dim) + ", num_heads=" + std::to_string(num_heads) +
         ", dropout=" + py_float(dropout) + ", batch_first=" + (batch_first ? "True" : "False");
}

std::pair<Tensor, Tensor> MultiheadAttention::forward(const Tensor& query, const Tensor& key,
                                                      const Tensor& value,
                                                      const AttentionArgs& args) {
  const int64_t E = embed_dim, H = num_heads, D = head_dim;
  KILN_CHECK(query.dim() == 2 || query.dim() == 3, Value,
             "MultiheadAttention: query must be 2-D (unbatched) or 3-D, got shape ", query.sizes());
  KILN_CHECK(key.dim() == query.dim() && value.dim() == query.dim(), Value,
             "MultiheadAttention: query, key and value must have the same number of dims, got ",
             query.sizes(), ", ", key.sizes(), " and ", value.sizes());
  KILN_CHECK(query.size(-1) == E && key.size(-1) == E && value.size(-1) == E, Value,
             "MultiheadAttention: expected embedding size ", E, ", got query ", query.sizes(),
             ", key ", key.sizes(), ", value ", value.sizes());
  const bool unbatched = query.dim() == 2;
  // Every input as (N, len, E).
  auto batched = [&](const Tensor& t) {
    if (unbatched) return t.unsqueeze(0);
    return batch_first ? t : t.transpose(0, 1);
  };
  Tensor q = batched(query), k = batched(key), v = batched(value);
  const int64_t N = q.size(0), L = q.size(1), S = k.size(1);
  KILN_CHECK(k.size(0) == N && v.size(0) == N && v.size(1) == S, Value,
             "MultiheadAttention: key ", key.sizes(), " and value ", value.sizes(),
             " do not match query ", query.sizes());

  // Projections: (N, len, E) -> (N, H, len, D).
  std::vector<Tensor> w = in_proj_weight.chunk(3, 0);
  std::vector<Tensor> b = in_proj_bias.defined() ? in_proj_bias.chunk(3, 0) : std::vector<Tensor>(3);
  auto heads = [&](const Tensor& t, int64_t len) {
    return t.reshape({N, len, H, D}).transpose(1, 2);
  };
  Tensor qh, kh, vh;
  if (query.is_same(key) && key.is_same(value)) {  // self-attention: one (E -> 3E) projection
    std::vector<Tensor> qkv = kiln::linear(q, in_proj_weight, opt(in_proj_bias)).chunk(3, -1);
    qh = heads(qkv[0], L), kh = heads(qkv[1], S), vh = heads(qkv[2], S);
  } else {
    qh = heads(kiln::linear(q, w[0], opt(b[0])), L);
    kh = heads(kiln::linear(k, w[1], opt(b[1])), S);
    vh = heads(kiln::linear(v, w[2], opt(b[2])), S);
  }

  // One additive mask broadcastable to (N, H, L, S).
  Tensor mask;
  if (args.attn_mask.defined()) {
    const Tensor& m = args.attn_mask;
    bool ok = (m.dim() == 2 && m.size(0) == L && m.size(1) == S) ||
              (m.dim() == 3 && m.size(0) == N * H && m.size(1) == L && m.size(2) == S);
    KILN_CHECK(ok, Value, "MultiheadAttention: attn_mask must be (", L, ", ", S, ") or (", N * H,
               ", ", L, ", ", S, "), got shape ", m.sizes());
    mask = additive(m, q.dtype());
    if (m.dim() == 3) mask = mask.reshape({N, H, L, S});
  }
  if (args.key_padding_mask.defined()) {
    const Tensor& m = args.key_padding_mask;
    bool ok = unbatched ? (m.dim() == 1 && m.size(0) == S)
                        : (m.dim() == 2 && m.size(0) == N && m.size(1) == S);
    KILN_CHECK(ok, Value, "MultiheadAttention: key_padding_mask must be ",
               unbatched ? "(" : "(" + std::to_string(N) + ", ", S, "), got shape ", m.sizes());
    Tensor kpm = additive(m, q.dtype()).reshape({N, 1, 1, S});
    mask = mask.defined() ? mask + kpm : kpm;
  }
  const bool causal = args.is_causal && !args.attn_mask.defined();
  auto [o, weights] = functional::attention(qh, kh, vh, mask, is_training() ? dropout : 0.0,
                                            causal, args.need_weights);

  // (N, H, L, D) -> (N, L, E) -> out_proj -> the query's layout.
  Tensor out = out_proj->forward(o.transpose(1, 2).reshape({N, L, E}));
  out = unbatched ? out.squeeze({0}) : (batch_first ? out : out.transpose(0, 1));
  if (weights.defined()) {
    if (args.average_attn_weights) weights = weights.mean({1});
    if (unbatched) weights = weights.squeeze({0});
  }
  return {out, weights};
}

// ---- Transformer layers -------------------------------------------------------------------------

static Tensor activate(const std::string& activation, const Tensor& x) {
  return activation == "gelu" ? kiln::gelu(x) : kiln::relu(x);
}

static void check_activation(const std::string& activation) {
  KILN_CHECK(activation == "relu" || activation == "gelu", Value,
             "Transformer layer: activation should be relu/gelu, not ", activation);
}

TransformerEncoderLayer::TransformerEncoderLayer(int64_t d, int64_t nhead,
                                                 const TransformerArgs& a)
    : Module("TransformerEncoderLayer"), args(a) {
  check_activation(a.activation);
  self_attn = register_module("self_attn", std::make_shared<MultiheadAttention>(
                                               d, nhead, a.dropout, a.bias, a.batch_first));
  linear1 = register_module("linear1", std::make_shared<Linear>(d, a.dim_feedforward, a.bias));
  dropout = register_module("dropout", std::make_shared<Dropout>(a.dropout));
  linear2 = register_module("linear2", std::make_shared<Linear>(a.dim_feedforward, d, a.bias));
  norm1 = register_module("norm1", std::make_shared<LayerNorm>(std::vector<int64_t>{d},
                                                               a.layer_norm_eps, true, a.bias));
  norm2 = register_module("norm2", std::make_shared<LayerNorm>(std::vector<int64_t>{d},
                                                               a.layer_norm_eps, true, a.bias));
  dropout1 = register_module("dropout1", std::make_shared<Dropout>(a.dropout));
  dropout2 = register_module("dropout2", std::make_shared<Dropout>(a.dropout));
}

Tensor TransformerEncoderLayer::ff_block(const Tensor& x) {
  return dropout2->forward(
      linear2->forward(dropout->forward(activate(args.activation, linear1->forward(x)))));
}

Tensor TransformerEncoderLayer::forward(const Tensor& src, const Tensor& src_mask,
                                        const Tensor& src_key_padding_mask, bool is_causal) {
  AttentionArgs attn{.key_padding_mask = src_key_padding_mask, .attn_mask = src_mask,
                     .is_causal = is_causal};
  auto sa = [&](const Tensor& x) {
    return dropout1->forward(self_attn->forward(x, x, x, attn).first);
  };
  Tensor x = src;
  if (args.norm_first) {
    x = x + sa(norm1->forward(x));
    return x + ff_block(norm2->forward(x));
  }
  x = norm1->forward(x + sa(x));
  return norm2->forward(x + ff_block(x));
}

TransformerDecoderLayer::TransformerDecoderLayer(int64_t d, int64_t nhead,
                                                 const TransformerArgs& a)
    : Module("TransformerDecoderLayer"), args(a) {
  check_activation(a.activation);
  auto mha = [&] {
    return std::make_shared<MultiheadAttention>(d, nhead, a.dropout, a.bias, a.batch_first);
  };
  auto norm = [&] {
    return std::make_shared<LayerNorm>(std::vector<int64_t>{d}, a.layer_norm_eps, true, a.bias);
  };
  self_attn = register_module("self_attn", mha());
  multihead_attn = register_module("multihead_attn", mha());
  linear1 = register_module("linear1", std::make_shared<Linear>(d, a.dim_feedforward, a.bias));
  dropout = register_module("dropout", std::make_shared<Dropout>(a.dropout));
  linear2 = register_module("linear2", std::make_shared<Linear>(a.dim_feedforward, d, a.bias));
  norm1 = register_module("norm1", norm());
  norm2 = register_module("norm2", norm());
  norm3 = register_module("norm3", norm());
  dropout1 = register_module("dropout1", std::make_shared<Dropout>(a.dropout));
  dropout2 = register_module("dropout2", std::make_shared<Dropout>(a.dropout));
  dropout3 = register_module("dropout3", std::make_shared<Dropout>(a.dropout));
}

Tensor TransformerDecoderLayer::ff_block(const Tensor& x) {
  return dropout3->forward(
      linear2->forward(dropout->forward(activate(args.activation, linear1->forward(x)))));
}

Tensor TransformerDecoderLayer::forward(const Tensor& tgt, const Tensor& memory,
                                        const DecoderMasks& m) {
  AttentionArgs self_args{.key_padding_mask = m.tgt_key_padding_mask, .attn_mask = m.tgt_mask,
                          .is_causal = m.tgt_is_causal};
  AttentionArgs cross_args{.key_padding_mask = m.memory_key_padding_mask,
                           .attn_mask = m.memory_mask, .is_causal = m.memory_is_causal};
  auto sa = [&](const Tensor& x) {
    return dropout1->forward(self_attn->forward(x, x, x, self_args).first);
  };
  auto ca = [&](const Tensor& x) {
    return dropout2->forward(multihead_attn->forward(x, memory, memory, cross_args).first);
  };
  Tensor x = tgt;
  if (args.norm_first) {
    x = x + sa(norm1->forward(x));
    x = x + ca(norm2->forward(x));
    return x + ff_block(norm3->forward(x));
  }
  x = norm1->forward(x + sa(x));
  x = norm2->forward(x + ca(x));
  return norm3->forward(x + ff_block(x));
}

}  // namespace kiln::nn
