// tests/golden/nn_golden_gen.cpp: PyTorch's (libtorch C++ API) outputs and parameter gradients of
// the nn modules that tests/nn/nn_golden_test.cpp rebuilds in Kiln, written to nn_golden.bin (the
// format of mlp_golden_gen.cpp). Built and run by make_nn_golden.sh; CI never runs it.
//
// No RNG: every parameter named `key` is set to 0.5 * wave(sizes, a, b) with
// s = sum of key's bytes, a = 0.05 + (s % 97) * 0.003, b = (s % 13) * 0.1 (float64); inputs are
// waves too. Each output y is reduced as sum(y * wave(y.sizes, 0.37, 0.5)) and differentiated;
// "<case>.y" is the output, "<case>.grad.<key>" a parameter's gradient.

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "golden_writer.h"

namespace {

golden::Writer g_writer;

torch::Tensor wave(std::vector<int64_t> sizes, double a, double b) {
  auto t = torch::empty(sizes, torch::kFloat64);
  auto* p = t.data_ptr<double>();
  for (int64_t k = 0; k < t.numel(); ++k) p[k] = std::sin(k * a + b);
  return t;
}

void put(const std::string& name, const torch::Tensor& t) { g_writer.add(name, t); }

void set_params(torch::nn::Module& m) {
  m.to(torch::kFloat64);
  torch::NoGradGuard g;
  for (auto& item : m.named_parameters()) {
    const std::string& key = item.key();
    torch::Tensor& p = item.value();
    int s = 0;
    for (unsigned char c : key) s += c;
    std::vector<int64_t> sizes(p.sizes().begin(), p.sizes().end());
    p.copy_(0.5 * wave(sizes, 0.05 + (s % 97) * 0.003, (s % 13) * 0.1));
  }
}

void finish(const std::string& name, torch::nn::Module& m, const torch::Tensor& y) {
  put(name + ".y", y);
  std::vector<int64_t> sizes(y.sizes().begin(), y.sizes().end());
  (y * wave(sizes, 0.37, 0.5)).sum().backward();
  for (auto& item : m.named_parameters()) put(name + ".grad." + item.key(), item.value().grad());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;

  {  // Bilinear(3, 4, 2) over (5, 3) x (5, 4)
    torch::nn::Bilinear m(3, 4, 2);
    set_params(*m);
    finish("bilinear", *m, m(wave({5, 3}, 0.3, 0.1), wave({5, 4}, 0.2, 0.7)));
  }
  {  // MultiheadAttention(8, 2): (L=4, N=2, E=8) self-attention with a key padding mask
    torch::nn::MultiheadAttention m(8, 2);
    set_params(*m);
    auto x = wave({4, 2, 8}, 0.21, 0.3);
    auto kpm = torch::tensor({0, 0, 1, 0, 0, 0, 0, 1}, torch::kBool).reshape({2, 4});
    auto [out, w] = m(x, x, x, kpm, /*need_weights=*/true);
    put("mha.weights", w);
    finish("mha", *m, out);
  }
  {  // TransformerEncoderLayer(8, 2, ff 16, dropout 0, gelu): (S=5, N=2, E=8)
    torch::nn::TransformerEncoderLayer m(torch::nn::TransformerEncoderLayerOptions(8, 2)
                                             .dim_feedforward(16)
                                             .dropout(0.0)
                                             .activation(torch::kGELU));
    set_params(*m);
    finish("encoder", *m, m(wave({5, 2, 8}, 0.17, 0.2)));
  }
  {  // TransformerDecoderLayer(8, 2, ff 12, dropout 0): tgt (3, 2, 8), memory (5, 2, 8), causal
    torch::nn::TransformerDecoderLayer m(
        torch::nn::TransformerDecoderLayerOptions(8, 2).dim_feedforward(12).dropout(0.0));
    set_params(*m);
    auto mask = torch::zeros({3, 3}, torch::kFloat64)
                    .masked_fill(torch::ones({3, 3}, torch::kBool).triu(1), -INFINITY);
    finish("decoder", *m, m(wave({3, 2, 8}, 0.23, 0.4), wave({5, 2, 8}, 0.11, 0.9), mask));
  }
  {  // BatchNorm2d(3) in training: output and the running statistics after one step
    torch::nn::BatchNorm2d m(3);
    set_params(*m);
    auto y = m(wave({4, 3, 2, 2}, 0.29, 0.6) * 2 + 0.5);
    put("batchnorm.running_mean", m->running_mean);
    put("batchnorm.running_var", m->running_var);
    finish("batchnorm", *m, y);
  }

  return g_writer.save(argv[1]);
}
