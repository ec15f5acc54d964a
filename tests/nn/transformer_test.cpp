// MultiheadAttention and the Transformer layers against a per-head reference built from tested
// ops (float64), across layouts, masks and the fused/explicit paths; nn::init statistics.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kiln/nn/nn.h"
#include "test_util.h"

namespace kiln::nn {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::to_doubles;

double max_abs_of(const Tensor& t) { return t.abs().max().item<double>(); }

// PyTorch's multi_head_attention_forward, one head and one batch element at a time.
// q: (N, L, E), k, v: (N, S, E); mask: additive (N, L, S) or undefined -> (N, L, E)
Tensor reference_mha(const MultiheadAttention& m, const Tensor& q, const Tensor& k,
                     const Tensor& v, const Tensor& mask) {
  const int64_t E = m.embed_dim, H = m.num_heads, D = E / H, N = q.size(0);
  std::vector<Tensor> w = m.in_proj_weight.chunk(3, 0), b = m.in_proj_bias.chunk(3, 0);
  std::vector<Tensor> rows;
  for (int64_t n = 0; n < N; ++n) {
    Tensor qp = q.select(0, n).matmul(w[0].t()) + b[0];
    Tensor kp = k.select(0, n).matmul(w[1].t()) + b[1];
    Tensor vp = v.select(0, n).matmul(w[2].t()) + b[2];
    std::vector<Tensor> heads;
    for (int64_t h = 0; h < H; ++h) {
      Tensor qh = qp.narrow(1, h * D, D), kh = kp.narrow(1, h * D, D), vh = vp.narrow(1, h * D, D);
      Tensor s = qh.matmul(kh.t()) / std::sqrt(static_cast<double>(D));
      if (mask.defined()) s = s + mask.select(0, n);
      heads.push_back(kiln::softmax(s, 1).matmul(vh));
    }
    rows.push_back(kiln::cat(heads, 1).matmul(m.out_proj->weight.t()) + m.out_proj->bias);
  }
  return kiln::stack(rows, 0);
}

TEST(NnAttention, FusedAndExplicitPathsMatchReference) {
  manual_seed(3);
  MultiheadAttention mha(8, 2, 0.0, true, /*batch_first=*/true);
  mha.to(kFloat64);
  EXPECT_EQ(mha.state_dict().keys(), (std::vector<std::string>{"in_proj_weight", "in_proj_bias",
                                                               "out_proj.weight", "out_proj.bias"}));
  EXPECT_EQ(max_abs_of(mha.in_proj_bias), 0);
  Tensor x = testing::random({3, 5, 8}, kFloat64, -1, 1, 1);
  Tensor kv = testing::random({3, 4, 8}, kFloat64, -1, 1, 2);
  Tensor want_self = reference_mha(mha, x, x, x, Tensor());
  expect_close(mha.forward(x, x, x).first, want_self, 1e-10, 1e-10);  // fused, one projection
  auto [out, weights] = mha.forward(x, x, x, {.need_weights = true});  // explicit
  expect_close(out, want_self, 1e-10, 1e-10);
  EXPECT_EQ(weights.sizes(), (std::vector<int64_t>{3, 5, 5}));
  expect_close(weights.sum({2}), kiln::ones({3, 5}, kFloat64), 1e-12, 1e-12);
  auto per_head = mha.forward(x, x, x, {.need_weights = true, .average_attn_weights = false}).second;
  EXPECT_EQ(per_head.sizes(), (std::vector<int64_t>{3, 2, 5, 5}));
  expect_close(mha.forward(x, kv, kv).first, reference_mha(mha, x, kv, kv, Tensor()), 1e-10, 1e-10);
}

TEST(NnAttention, MasksLayoutsAndCausal) {
  manual_seed(4);
  MultiheadAttention mha(6, 3);  // batch_first = false: (L, N, E)
  mha.to(kFloat64);
  Tensor x = testing::random({4, 2, 6}, kFloat64, -1, 1, 5);  // (L, N, E)
  Tensor xb = x.transpose(0, 1);
  const double inf = std::numeric_limits<double>::infinity();

  // key_padding_mask (N, S): bool, true = ignore
  Tensor kpm = testing::from_vector<bool>({false, false, true, true, false, false, false, true}, {2, 4});
  Tensor add = kiln::zeros({2, 4}, kFloat64).masked_fill(kpm, -inf).unsqueeze(1).expand({2, 4, 4});
  Tensor got = mha.forward(x, x, x, {.key_padding_mask = kpm}).first;
  EXPECT_EQ(got.sizes(), (std::vector<int64_t>{4, 2, 6}));
  expect_close(got.transpose(0, 1), reference_mha(mha, xb, xb, xb, add), 1e-10, 1e-10);
  // a float key_padding_mask is added as it is
  expect_close(mha.forward(x, x, x, {.key_padding_mask = add.select(1, 0).contiguous()}).first, got,
               1e-12, 1e-12);

  // causal: the fused kernel's mask equals an explicit upper-triangular bool attn_mask
  Tensor causal = kiln::ones({4, 4}, kBool).triu(1);
  Tensor c_add = kiln::zeros({4, 4}, kFloat64).masked_fill(causal, -inf).unsqueeze(0).expand({2, 4, 4});
  Tensor want = reference_mha(mha, xb, xb, xb, c_add).transpose(0, 1);
  expect_close(mha.forward(x, x, x, {.is_causal = true}).first, want, 1e-10, 1e-10);
  expect_close(mha.forward(x, x, x, {.attn_mask = causal}).first, want, 1e-10, 1e-10);
  expect_close(mha.forward(x, x, x, {.need_weights = true, .is_causal = true}).first, want, 1e-10,
               1e-10);

  // unbatched (L, E)
  Tensor x0 = x.select(1, 0).contiguous();
  expect_close(mha.forward(x0, x0, x0).first, mha.forward(x, x, x).first.select(1, 0), 1e-12,
               1e-12);
  EXPECT_EQ(mha.forward(x0, x0, x0, {.need_weights = true}).second.sizes(),
            (std::vector<int64_t>{4, 4}));

  expect_error(ErrorKind::Value, "attn_mask must be (4, 4) or (6, 4, 4), got shape [3, 4]",
               [&] { mha.forward(x, x, x, {.attn_mask = kiln::zeros({3, 4})}); });
  expect_error(ErrorKind::Value, "expected embedding size 6",
               [&] { mha.forward(x, x.narrow(2, 0, 5), x); });
  expect_error(ErrorKind::Value, "divisible by num_heads", [] { MultiheadAttention(6, 4); });
}

TEST(NnTransformer, EncoderLayerMatchesComposition) {
  for (bool norm_first : {false, true}) {
    manual_seed(5);
    TransformerEncoderLayer enc(8, 2, {.dim_feedforward = 16, .dropout = 0.0, .activation = "gelu",
                                       .batch_first = true, .norm_first = norm_first});
    enc.to(kFloat64);
    Tensor x = testing::random({2, 5, 8}, kFloat64, -1, 1, 6);
    auto sa = [&](const Tensor& t) { return reference_mha(*enc.self_attn, t, t, t, Tensor()); };
    auto ff = [&](const Tensor& t) {
      return enc.linear2->forward(kiln::gelu(enc.linear1->forward(t)));
    };
    auto n1 = [&](const Tensor& t) { return enc.norm1->forward(t); };
    auto n2 = [&](const Tensor& t) { return enc.norm2->forward(t); };
    Tensor want;
    if (norm_first) {
      Tensor h = x + sa(n1(x));
      want = h + ff(n2(h));
    } else {
      Tensor h = n1(x + sa(x));
      want = n2(h + ff(h));
    }
    expect_close(enc.forward(x), want, 1e-10, 1e-10);
  }
  TransformerEncoderLayer enc(8, 2);
  EXPECT_EQ(enc.state_dict().keys(),
            (std::vector<std::string>{
                "self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight",
                "self_attn.out_proj.bias", "linear1.weight", "linear1.bias", "linear2.weight",
                "linear2.bias", "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias"}));
  EXPECT_EQ(enc.linear1->weight.sizes(), (std::vector<int64_t>{2048, 8}));
  expect_error(ErrorKind::Value, "activation should be relu/gelu, not swish",
               [] { TransformerEncoderLayer(8, 2, {.activation = "swish"}); });
}

TEST(NnTransformer, DecoderLayerMatchesCompositionAndTrains) {
  manual_seed(6);
  TransformerDecoderLayer dec(8, 4, {.dim_feedforward = 12, .dropout = 0.0});  // (T, N, E)
  dec.to(kFloat64);
  Tensor tgt = testing::random({3, 2, 8}, kFloat64, -1, 1, 7);
  Tensor mem = testing::random({5, 2, 8}, kFloat64, -1, 1, 8);
  Tensor t = tgt.transpose(0, 1), m = mem.transpose(0, 1);
  const double inf = std::numeric_limits<double>::infinity();
  Tensor causal = kiln::ones({3, 3}, kBool).triu(1);
  Tensor c_add = kiln::zeros({3, 3}, kFloat64).masked_fill(causal, -inf).unsqueeze(0).expand({2, 3, 3});
  auto ff = [&](const Tensor& h) { return dec.linear2->forward(kiln::relu(dec.linear1->forward(h))); };
  Tensor h = dec.norm1->forward(t + reference_mha(*dec.self_attn, t, t, t, c_add));
  h = dec.norm2->forward(h + reference_mha(*dec.multihead_attn, h, m, m, Tensor()));
  Tensor want = dec.norm3->forward(h + ff(h)).transpose(0, 1);
  expect_close(dec.forward(tgt, mem, {.tgt_is_causal = true}), want, 1e-10, 1e-10);
  expect_close(dec.forward(tgt, mem, {.tgt_mask = causal}), want, 1e-10, 1e-10);

  dec.forward(tgt, mem, {.tgt_is_causal = true}).pow(scalar_to_tensor(2)).sum().backward();
  for (const auto& [name, p] : dec.named_parameters()) EXPECT_TRUE(p.grad().defined()) << name;
  EXPECT_EQ(dec.named_modules().size(), 14u);
}

// ---- init ---------------------------------------------------------------------------------------

std::pair<double, double> mean_std(const Tensor& t) {
  std::vector<double> v = to_doubles(t);
  double m = 0, s = 0;
  for (double e : v) m += e;
  m /= v.size();
  for (double e : v) s += (e - m) * (e - m);
  return {m, std::sqrt(s / v.size())};
}

TEST(NnInit, GainsAndFans) {
  EXPECT_DOUBLE_EQ(init::calculate_gain("relu"), std::sqrt(2.0));
  EXPECT_DOUBLE_EQ(init::calculate_gain("tanh"), 5.0 / 3);
  EXPECT_DOUBLE_EQ(init::calculate_gain("conv2d"), 1);
  EXPECT_DOUBLE_EQ(init::calculate_gain("leaky_relu"), std::sqrt(2.0 / (1 + 1e-4)));
  EXPECT_DOUBLE_EQ(init::calculate_gain("leaky_relu", std::sqrt(5.0)), std::sqrt(1.0 / 3));
  EXPECT_EQ(init::calculate_fan_in_and_fan_out(kiln::empty({8, 4, 3, 3})),
            (std::pair<int64_t, int64_t>{36, 72}));
  expect_error(ErrorKind::Value, "unsupported nonlinearity \"swish\"",
               [] { init::calculate_gain("swish"); });
  expect_error(ErrorKind::Value, "fewer than 2 dimensions, got shape [5]",
               [] { init::xavier_uniform_(kiln::empty({5})); });
}

TEST(NnInit, DistributionsHaveTheirMoments) {
  manual_seed(11);
  Tensor w = kiln::empty({400, 300});
  auto [fan_in, fan_out] = std::pair<double, double>{300, 400};
  init::xavier_uniform_(w, 2.0);
  double bound = 2.0 * std::sqrt(6.0 / (fan_in + fan_out));
  EXPECT_LE(w.abs().max().item<double>(), bound);
  EXPECT_NEAR(mean_std(w).second, bound / std::sqrt(3.0), 0.01 * bound);
  init::xavier_normal_(w);
  EXPECT_NEAR(mean_std(w).second, std::sqrt(2.0 / (fan_in + fan_out)), 1e-3);
  init::kaiming_normal_(w, 0, init::FanMode::kFanOut, "relu");
  EXPECT_NEAR(mean_std(w).second, std::sqrt(2.0 / fan_out), 1e-3);
  init::kaiming_uniform_(w, 0, init::FanMode::kFanIn, "relu");
  EXPECT_LE(w.abs().max().item<double>(), std::sqrt(6.0 / fan_in));
  EXPECT_NEAR(mean_std(w).second, std::sqrt(2.0 / fan_in), 1e-3);

  init::trunc_normal_(w, 0.5, 1.0, -0.5, 1.0);
  EXPECT_GE(w.min().item<double>(), -0.5);
  EXPECT_LE(w.max().item<double>(), 1.0);
  // N(0.5, 1) truncated to [0.5 - 1, 0.5 + 0.5]: mean 0.5 + (φ(-1) - φ(0.5)) / (Φ(0.5) - Φ(-1))
  auto pdf = [](double z) { return std::exp(-z * z / 2) / std::sqrt(2 * M_PI); };
  auto cdf = [](double z) { return 0.5 * (1 + std::erf(z / std::sqrt(2.0))); };
  EXPECT_NEAR(mean_std(w).first, 0.5 + (pdf(-1) - pdf(0.5)) / (cdf(0.5) - cdf(-1)), 5e-3);
  init::trunc_normal_(w, 0, 0.02, -0.04, 0.04);  // GPT-style: the far tails stay in bounds
  EXPECT_LE(w.abs().max().item<double>(), 0.04);
  EXPECT_NEAR(mean_std(w).second, 0.02 * 0.8796, 5e-4);  // std of N(0,1) cut at ±2

  init::constant_(w, 0.25);
  EXPECT_EQ(w.min().item<float>(), 0.25f);
  Tensor p = kiln::zeros({3}).requires_grad_();
  init::ones_(p);  // in place on a leaf that requires grad: no autograd recording
  EXPECT_TRUE(p.is_leaf());
}

TEST(NnInit, OrthogonalIsOrthonormal) {
  for (auto shape : {std::vector<int64_t>{6, 4}, std::vector<int64_t>{3, 8},
                     std::vector<int64_t>{4, 2, 3}}) {
    Tensor w = kiln::empty(shape, kFloat64);
    init::orthogonal_(w, 1.5);
    Tensor m = w.reshape({shape[0], -1});
    Tensor gram = m.size(0) >= m.size(1) ? m.t().matmul(m) : m.matmul(m.t());
    const int64_t k = gram.size(0);
    expect_close(gram, kiln::eye(k, std::nullopt, kFloat64) * 2.25, 1e-12, 1e-12);
  }
}

}  // namespace
}  // namespace kiln::nn
