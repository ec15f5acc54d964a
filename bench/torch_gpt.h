// bench/torch_gpt.h: the GPT of shared/bench/torch_reference.py (gpt_train) in PyTorch's C++ API
// (libtorch), shared by bench/torch_cpp_ref.cpp (the benchmark's reference) and
// tests/golden/chargpt_parity_gen.cpp (the chargpt parity files): pre-LayerNorm blocks, causal
// attention written out, GELU MLP x4, no dropout.
//
//   #include "torch_gpt.h"
//   torch::manual_seed(0);
//   torch_gpt::GPT m(/*vocab=*/256, /*block=*/128, /*layers=*/4, /*heads=*/4, /*d=*/256);
//   auto logits = m->forward(idx);  // idx: (B, T) int64 -> (B, T, vocab)
//
// Modules are built in the order tok, pos, ln, head, then the blocks: the initial weights of a
// seed depend on it (the committed chargpt parity files were made this way).
#pragma once

#include <torch/torch.h>

#include <cmath>

namespace torch_gpt {

struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t d, int64_t h)
      : h(h),
        ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        qkv(register_module("qkv", torch::nn::Linear(d, 3 * d))),
        proj(register_module("proj", torch::nn::Linear(d, d))),
        fc(register_module("fc", torch::nn::Linear(d, 4 * d))),
        out(register_module("out", torch::nn::Linear(4 * d, d))) {}

  // x: (B, T, C) -> (B, T, C)
  torch::Tensor forward(torch::Tensor x) {
    int64_t B = x.size(0), T = x.size(1), C = x.size(2);
    auto parts = qkv(ln1(x)).split(C, 2);
    for (auto& t : parts) t = t.view({B, T, h, C / h}).transpose(1, 2);
    auto att = torch::matmul(parts[0], parts[1].transpose(-2, -1)) / std::sqrt(double(C / h));
    auto mask = torch::ones({T, T}).tril() == 0;
    att = att.masked_fill(mask, -INFINITY).softmax(-1);
    auto y = torch::matmul(att, parts[2]).transpose(1, 2).reshape({B, T, C});
    x = x + proj(y);
    return x + out(torch::gelu(fc(ln2(x))));
  }
  int64_t h;
  torch::nn::LayerNorm ln1, ln2;
  torch::nn::Linear qkv, proj, fc, out;
};
TORCH_MODULE(Block);

struct GPTImpl : torch::nn::Module {
  GPTImpl(int64_t vocab, int64_t block, int64_t layers, int64_t heads, int64_t d)
      : tok(register_module("tok", torch::nn::Embedding(vocab, d))),
        pos(register_module("pos", torch::nn::Embedding(block, d))),
        blocks(register_module("blocks", torch::nn::ModuleList())),
        ln(register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        head(register_module("head", torch::nn::Linear(torch::nn::LinearOptions(d, vocab).bias(false)))) {
    for (int64_t i = 0; i < layers; ++i) blocks->push_back(Block(d, heads));
  }
  // idx: (B, T) int64 -> logits (B, T, vocab)
  torch::Tensor forward(torch::Tensor idx) {
    auto x = tok(idx) + pos(torch::arange(idx.size(1)));
    for (const auto& b : *blocks) x = b->as<BlockImpl>()->forward(x);
    return head(ln(x));
  }
  torch::nn::Embedding tok, pos;
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm ln;
  torch::nn::Linear head;
};
TORCH_MODULE(GPT);

}  // namespace torch_gpt
