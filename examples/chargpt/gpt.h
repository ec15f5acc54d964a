// examples/chargpt/gpt.h: the decoder-only transformer of WORKLOADS.md's gpt_train (the GPT of
// /work/shared/bench/torch_reference.py): token + learned position embeddings, pre-LayerNorm
// blocks of causal self-attention and a GELU MLP (x4), a final LayerNorm and a linear head.
// Parameters are named as in the PyTorch reference, so state dicts carry over key for key
// ("tok.weight", "blocks.0.qkv.weight", "head.weight"), and initialised as PyTorch's defaults.
//
//   chargpt::GPT model({.layers = 4, .width = 256});          // fused attention by default
//   kiln::Tensor idx = kiln::randint(0, 256, {16, 128});      // (B, T) int64 bytes
//   kiln::Tensor logits = model.forward(idx);                 // (B, T, 256)
//   chargpt::GPT reference_like({.fused_attention = false});  // written-out attention
//   auto groups = chargpt::decay_groups(model, 0.1);          // for optim::AdamW
//
// A block calls its linear children (qkv, proj, fc, out) through Block::call_linear when it is
// set: chargpt.cpp's --tp routes them through kiln::dist::TensorParallel::forward (C++ modules
// have no forward hooks; See Note [C++ tensor parallel] in kiln/dist/tensor_parallel.h).
#pragma once

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/nn/nn.h"
#include "kiln/optim/optim.h"

namespace chargpt {

struct GPTConfig {
  int64_t vocab = 256;  // bytes
  int64_t block = 128;  // context length
  int64_t layers = 4;
  int64_t heads = 4;
  int64_t width = 256;
  // true: scaled_dot_product_attention(is_causal); false: softmax(q kᵀ / sqrt(d), causal mask) v
  // written out, as the PyTorch reference computes it.
  bool fused_attention = true;
};

class Block : public kiln::nn::Module {
 public:
  Block(int64_t width, int64_t heads, bool fused_attention)
      : Module("Block"), heads_(heads), fused_(fused_attention) {
    using namespace kiln::nn;
    ln1 = register_module("ln1", std::make_shared<LayerNorm>(std::vector<int64_t>{width}));
    ln2 = register_module("ln2", std::make_shared<LayerNorm>(std::vector<int64_t>{width}));
    qkv = register_module("qkv", std::make_shared<Linear>(width, 3 * width));
    proj = register_module("proj", std::make_shared<Linear>(width, width));
    fc = register_module("fc", std::make_shared<Linear>(width, 4 * width));
    out = register_module("out", std::make_shared<Linear>(4 * width, width));
  }

  // x: (B, T, C) -> (B, T, C)
  kiln::Tensor forward(const kiln::Tensor& x) override {
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2), D = C / heads_;
    std::vector<kiln::Tensor> qkv_parts = linear("qkv", *qkv, ln1->forward(x)).split(C, 2);
    // (B, T, C) -> (B, H, T, D)
    for (kiln::Tensor& t : qkv_parts) t = t.reshape({B, T, heads_, D}).transpose(1, 2);
    const kiln::Tensor &q = qkv_parts[0], &k = qkv_parts[1], &v = qkv_parts[2];
    kiln::Tensor y;
    if (fused_) {
      y = kiln::scaled_dot_product_attention(q, k, v, 0.0, /*is_causal=*/true);
    } else {
      kiln::Tensor att = kiln::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(D));
      att = att.masked_fill(future_mask(T), -INFINITY).softmax(-1);
      y = kiln::matmul(att, v);
    }
    kiln::Tensor h = x + linear("proj", *proj, y.transpose(1, 2).reshape({B, T, C}));
    return h + linear("out", *out, kiln::gelu(linear("fc", *fc, ln2->forward(h))));
  }

  std::shared_ptr<kiln::nn::LayerNorm> ln1, ln2;
  std::shared_ptr<kiln::nn::Linear> qkv, proj, fc, out;
  // When set, forward calls call_linear("qkv", x) where it would call qkv->forward(x) (and so for
  // "proj", "fc" and "out").
  std::function<kiln::Tensor(std::string_view child, const kiln::Tensor& x)> call_linear;

 private:
  kiln::Tensor linear(std::string_view name, kiln::nn::Linear& child, const kiln::Tensor& x) {
    return call_linear ? call_linear(name, x) : child.forward(x);
  }
  // (T, T) bool, true above the diagonal (the keys a query may not see); cached per T.
  const kiln::Tensor& future_mask(int64_t T) {
    if (!mask_.defined() || mask_.size(0) != T) mask_ = kiln::ones({T, T}).tril() == 0;
    return mask_;
  }
  int64_t heads_;
  bool fused_;
  kiln::Tensor mask_;
};

class GPT : public kiln::nn::Module {
 public:
  explicit GPT(const GPTConfig& config = {}) : Module("GPT"), config(config) {
    using namespace kiln::nn;
    tok = register_module("tok", std::make_shared<Embedding>(config.vocab, config.width));
    pos = register_module("pos", std::make_shared<Embedding>(config.block, config.width));
    blocks = register_module("blocks", std::make_shared<Sequential>());
    for (int64_t i = 0; i < config.layers; ++i)
      blocks->push_back(
          std::make_shared<Block>(config.width, config.heads, config.fused_attention));
    ln = register_module("ln", std::make_shared<LayerNorm>(std::vector<int64_t>{config.width}));
    head = register_module("head", std::make_shared<Linear>(config.width, config.vocab, false));
  }

  // idx: (B, T) int64, T <= block -> logits (B, T, vocab)
  kiln::Tensor forward(const kiln::Tensor& idx) override {
    const int64_t T = idx.size(1);
    KILN_CHECK(T <= config.block, Value, "GPT: sequence length ", T, " exceeds the context of ",
               config.block);
    kiln::Tensor x =
        tok->forward(idx) + pos->forward(kiln::arange(0, T, 1, kiln::kInt64, idx.device()));
    return head->forward(ln->forward(blocks->forward(x)));
  }

  GPTConfig config;
  std::shared_ptr<kiln::nn::Embedding> tok, pos;
  std::shared_ptr<kiln::nn::Sequential> blocks;
  std::shared_ptr<kiln::nn::LayerNorm> ln;
  std::shared_ptr<kiln::nn::Linear> head;
};

// nanoGPT's grouping for AdamW: matrices (embeddings and linear weights) decay by weight_decay,
// vectors (biases, LayerNorm parameters) not at all.
inline std::vector<kiln::optim::ParamGroup> decay_groups(const kiln::nn::Module& model,
                                                         double weight_decay) {
  kiln::optim::ParamGroup decay{{}, {{"weight_decay", weight_decay}}};
  kiln::optim::ParamGroup no_decay{{}, {{"weight_decay", 0.0}}};
  for (const kiln::Tensor& p : model.parameters())
    (p.dim() >= 2 ? decay : no_decay).params.push_back(p);
  return {decay, no_decay};
}

}  // namespace chargpt
