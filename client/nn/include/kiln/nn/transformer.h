// kiln/nn/transformer.h: MultiheadAttention and the Transformer encoder/decoder layers
// (torch.nn's), with PyTorch's parameter names, defaults and initialisation.
//
//   kiln::nn::MultiheadAttention mha(64, 4, /*dropout=*/0.0, /*bias=*/true, /*batch_first=*/true);
//   auto [out, weights] = mha.forward(x, x, x, {.is_causal = true});    // fused attention
//   kiln::nn::TransformerEncoderLayer enc(64, 4, {.dim_feedforward = 256, .batch_first = true});
//   kiln::Tensor y = enc.forward(x);
//
// Note [Attention paths]: without masks and without need_weights, attention runs the fused
// scaled_dot_product_attention kernel (causal masking included). A key_padding_mask, an
// attn_mask or need_weights take the explicit path: softmax(q kᵀ · scale + mask) v, with the
// masks combined into one additive float mask (a bool mask's true entries are excluded, as in
// PyTorch's MultiheadAttention). Unlike PyTorch, need_weights defaults to false.
#pragma once

#include <string>
#include <utility>

#include "kiln/nn/layers.h"

namespace kiln::nn {

struct AttentionArgs {
  Tensor key_padding_mask;  // (N, S) or (S): bool (true = ignore) or additive float
  Tensor attn_mask;         // (L, S) or (N·num_heads, L, S): bool (true = ignore) or additive float
  bool need_weights = false;
  bool average_attn_weights = true;
  bool is_causal = false;  // mask out keys after each query (when attn_mask is undefined)
};

class MultiheadAttention : public Module {
 public:
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, double dropout = 0.0, bool bias = true,
                     bool batch_first = false);
  using Module::forward;
  // query: (L, N, E) ((N, L, E) if batch_first, (L, E) unbatched), key/value: (S, N, E) ->
  // (output like query, attention weights (N, L, S) or (N, H, L, S) when need_weights).
  std::pair<Tensor, Tensor> forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const AttentionArgs& args = {});
  std::string extra_repr() const override;
  int64_t embed_dim, num_heads, head_dim;
  double dropout;
  bool batch_first;
  Tensor in_proj_weight, in_proj_bias;  // (3E, E), (3E): q, k, v stacked
  std::shared_ptr<Linear> out_proj;
};

struct TransformerArgs {
  int64_t dim_feedforward = 2048;
  double dropout = 0.1;
  std::string activation = "relu";  // "relu" or "gelu"
  double layer_norm_eps = 1e-5;
  bool batch_first = false;
  bool norm_first = false;
  bool bias = true;
};

class TransformerEncoderLayer : public Module {
 public:
  TransformerEncoderLayer(int64_t d_model, int64_t nhead, const TransformerArgs& args = {});
  Tensor forward(const Tensor& src) override { return forward(src, Tensor()); }
  Tensor forward(const Tensor& src, const Tensor& src_mask,
                 const Tensor& src_key_padding_mask = Tensor(), bool is_causal = false);
  TransformerArgs args;
  std::shared_ptr<MultiheadAttention> self_attn;
  std::shared_ptr<Linear> linear1, linear2;
  std::shared_ptr<Dropout> dropout, dropout1, dropout2;
  std::shared_ptr<LayerNorm> norm1, norm2;

 private:
  Tensor ff_block(const Tensor& x);
};

struct DecoderMasks {
  Tensor tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask;
  bool tgt_is_causal = false;
  bool memory_is_causal = false;
};

class TransformerDecoderLayer : public Module {
 public:
  TransformerDecoderLayer(int64_t d_model, int64_t nhead, const TransformerArgs& args = {});
  using Module::forward;
  Tensor forward(const Tensor& tgt, const Tensor& memory, const DecoderMasks& masks = {});
  TransformerArgs args;
  std::shared_ptr<MultiheadAttention> self_attn, multihead_attn;
  std::shared_ptr<Linear> linear1, linear2;
  std::shared_ptr<Dropout> dropout, dropout1, dropout2, dropout3;
  std::shared_ptr<LayerNorm> norm1, norm2, norm3;

 private:
  Tensor ff_block(const Tensor& x);
};

namespace functional {
// The attention core of MultiheadAttention on projected heads (Note [Attention paths]).
// q: (N, H, L, D), k, v: (N, H, S, D); mask: undefined or additive, broadcastable to
// (N, H, L, S) -> (output (N, H, L, D), weights (N, H, L, S) or undefined).
std::pair<Tensor, Tensor> attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& mask, double dropout_p, bool is_causal,
                                    bool need_weights);
}  // namespace functional

}  // namespace kiln::nn
