// Jagged attention (_jagged_attention and its backward, tensor/ops/attention.toml; Note [Jagged
// attention]) against a per-sequence loop of the dense fused kernel: outputs, logsumexp and
// gradients, causal and not, sequences crossing the query and key blocks, empty sequences,
// float64 and bfloat16, thread-count independence, the backward row against its dense
// decomposition, and bad offsets.
#include <gtest/gtest.h>

#include "kiln/autograd/autograd.h"
#include "kiln/generated/composite/attention.h"
#include "kiln/operators.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

using Sizes = std::vector<int64_t>;

Tensor offsets_tensor(const Sizes& lengths) {
  Sizes off{0};
  for (int64_t n : lengths) off.push_back(off.back() + n);
  Tensor t = empty_on({static_cast<int64_t>(off.size())}, kInt64, kCPU);
  std::copy(off.begin(), off.end(), static_cast<int64_t*>(t.data_ptr()));
  return t;
}

struct Grads {
  Tensor out, lse, dq, dk, dv;
};

// The reference: each sequence (L, H, E) as (1, H, L, E) through _fused_attention and its
// backward, then packed again.
Grads per_sequence(const Tensor& q, const Tensor& k, const Tensor& v, const Sizes& lengths,
                   bool causal, std::optional<double> scale, const Tensor& go, const Tensor& glse) {
  std::vector<Tensor> out, lse, dq, dk, dv;
  int64_t r0 = 0;
  for (int64_t n : lengths) {
    const int64_t r = r0;
    auto seq = [&](const Tensor& t) { return t.narrow(0, r, n).transpose(0, 1).unsqueeze(0); };
    auto back = [&](const Tensor& t) { return t.select(0, 0).transpose(0, 1).contiguous(); };
    r0 += n;
    if (n == 0) continue;
    auto [o, l] = _fused_attention(seq(q), seq(k), seq(v), 0.0, causal, scale, 0, 0);
    Tensor gl = glse.narrow(0, r, n).transpose(0, 1).unsqueeze(0);
    auto [gq, gk, gv] = _fused_attention_backward(seq(go), gl, seq(q), seq(k), seq(v), o, l, 0.0,
                                                  causal, scale, 0, 0);
    out.push_back(back(o));
    lse.push_back(back(l));
    dq.push_back(back(gq));
    dk.push_back(back(gk));
    dv.push_back(back(gv));
  }
  return {cat(out, 0), cat(lse, 0), cat(dq, 0), cat(dk, 0), cat(dv, 0)};
}

void check(const Sizes& lengths, int64_t H, int64_t E, int64_t Ev, bool causal,
           std::optional<double> scale, ScalarType dt, double rtol, double atol) {
  int64_t T = 0;
  for (int64_t n : lengths) T += n;
  Tensor q = random({T, H, E}, dt, -1, 1, 1), k = random({T, H, E}, dt, -1, 1, 2);
  Tensor v = random({T, H, Ev}, dt, -1, 1, 3), off = offsets_tensor(lengths);
  Tensor go = random({T, H, Ev}, dt, -1, 1, 4);
  auto [out, lse] = _jagged_attention(q, k, v, off, causal, scale);
  Tensor glse = random(lse.sizes(), lse.dtype(), -1, 1, 5);
  auto [dq, dk, dv] = _jagged_attention_backward(go, glse, q, k, v, off, out, lse, causal, scale);
  Grads want = per_sequence(q, k, v, lengths, causal, scale, go, glse);
  expect_close(out, want.out, rtol, atol);
  expect_close(lse, want.lse, rtol, atol);
  expect_close(dq, want.dq, rtol, atol);
  expect_close(dk, want.dk, rtol, atol);
  expect_close(dv, want.dv, rtol, atol);
}

TEST(JaggedAttention, MatchesPerSequenceLoop) {
  // Lengths crossing the 64-row query blocks and the 256-key blocks, with an empty sequence.
  check({5, 0, 70, 1, 300}, 2, 8, 6, false, std::nullopt, kFloat64, 1e-10, 1e-12);
  check({5, 0, 70, 1, 300}, 2, 8, 6, true, std::nullopt, kFloat64, 1e-10, 1e-12);
  check({3, 17, 9}, 3, 4, 4, true, 0.3, kFloat32, 1e-5, 1e-6);
  check({3, 17, 9}, 1, 4, 5, false, std::nullopt, kBFloat16, 2e-2, 2e-2);
}

TEST(JaggedAttention, BackwardMatchesItsDecomposition) {
  // The decomposition (dense ops, a block-diagonal mask) is what double backward differentiates.
  Sizes lengths{4, 0, 7, 2};
  Tensor off = offsets_tensor(lengths);
  Tensor q = random({13, 2, 3}, kFloat64, -1, 1, 7), k = random({13, 2, 3}, kFloat64, -1, 1, 8);
  Tensor v = random({13, 2, 5}, kFloat64, -1, 1, 9), go = random({13, 2, 5}, kFloat64, -1, 1, 10);
  for (bool causal : {false, true}) {
    auto [out, lse] = _jagged_attention(q, k, v, off, causal, std::nullopt);
    Tensor glse = random(lse.sizes(), kFloat64, -1, 1, 11);
    auto [dq, dk, dv] =
        _jagged_attention_backward(go, glse, q, k, v, off, out, lse, causal, std::nullopt);
    auto [wq, wk, wv] = composite::jagged_attention_backward(go, glse, q, k, v, off, out, lse,
                                                             causal, std::nullopt);
    expect_close(dq, wq, 1e-10, 1e-12);
    expect_close(dk, wk, 1e-10, 1e-12);
    expect_close(dv, wv, 1e-10, 1e-12);
  }
}

TEST(JaggedAttention, AutogradMatchesPerSequenceSdpa) {
  Sizes lengths{6, 2, 9};
  Tensor off = offsets_tensor(lengths);
  Tensor q = random({17, 2, 4}, kFloat64, -1, 1, 12).requires_grad_(true);
  Tensor k = random({17, 2, 4}, kFloat64, -1, 1, 13).requires_grad_(true);
  Tensor v = random({17, 2, 4}, kFloat64, -1, 1, 14).requires_grad_(true);
  Tensor w = random({17, 2, 4}, kFloat64, -1, 1, 15);
  (std::get<0>(_jagged_attention(q, k, v, off, true, std::nullopt)) * w).sum().backward();
  Tensor gq = q.grad(), gk = k.grad(), gv = v.grad();
  Tensor q2 = q.detach().requires_grad_(true), k2 = k.detach().requires_grad_(true);
  Tensor v2 = v.detach().requires_grad_(true);
  int64_t r0 = 0;
  Tensor loss;
  for (int64_t n : lengths) {
    auto seq = [&](const Tensor& t) { return t.narrow(0, r0, n).transpose(0, 1); };
    Tensor l = (scaled_dot_product_attention(seq(q2), seq(k2), seq(v2), 0.0, true) * seq(w)).sum();
    loss = loss.defined() ? loss + l : l;
    r0 += n;
  }
  loss.backward();
  expect_close(gq, q2.grad(), 1e-10, 1e-12);
  expect_close(gk, k2.grad(), 1e-10, 1e-12);
  expect_close(gv, v2.grad(), 1e-10, 1e-12);
}

TEST(JaggedAttention, ThreadCountIndependent) {
  Tensor q = random({400, 2, 8}), k = random({400, 2, 8}), v = random({400, 2, 8});
  Tensor off = offsets_tensor({130, 7, 263});
  const int saved = get_num_threads();
  set_num_threads(1);
  Tensor one = std::get<0>(_jagged_attention(q, k, v, off, true, std::nullopt));
  set_num_threads(std::max(2, saved));
  Tensor many = std::get<0>(_jagged_attention(q, k, v, off, true, std::nullopt));
  set_num_threads(saved);
  EXPECT_EQ(to_doubles(one), to_doubles(many));
}

TEST(JaggedAttention, BadInput) {
  Tensor q = random({5, 2, 3}), k = random({5, 2, 3}), v = random({5, 2, 4});
  auto run = [&](const Tensor& off) { _jagged_attention(q, k, v, off, false, std::nullopt); };
  expect_error(ErrorKind::Value, "offsets must start at 0, got offsets[0] = 1", [&] {
    run(from_vector<int64_t>({1, 3, 5}, {3}));
  });
  expect_error(ErrorKind::Value, "offsets must not decrease, got offsets[1] = 4 > offsets[2] = 2",
               [&] {
                 run(from_vector<int64_t>({0, 4, 2, 5}, {4}));
               });
  expect_error(ErrorKind::Value, "offsets must end at the total length 5", [&] {
    run(from_vector<int64_t>({0, 2, 4}, {3}));
  });
  expect_error(ErrorKind::Type, "expected int64 offsets, got int32", [&] {
    run(from_vector<int32_t>({0, 2, 5}, {3}));
  });
  expect_error(ErrorKind::Value, "expected offsets of shape (B + 1)", [&] {
    run(from_vector<int64_t>({0, 2, 3, 5}, {2, 2}));
  });
  expect_error(ErrorKind::Value, "same total length", [&] {
    _jagged_attention(q, random({4, 2, 3}), v, offsets_tensor({5}), false, std::nullopt);
  });
  expect_error(ErrorKind::Value, "same number of heads", [&] {
    _jagged_attention(q, random({5, 1, 3}), v, offsets_tensor({5}), false, std::nullopt);
  });
  expect_error(ErrorKind::Value, "of 3 dims", [&] {
    _jagged_attention(random({5, 3}), random({5, 3}), random({5, 3}), offsets_tensor({5}), false,
                      std::nullopt);
  });
  Tensor o = empty_on({5, 2, 4}, kFloat32, kCPU), l = empty_on({5, 2}, kFloat32, kCPU);
  expect_error(ErrorKind::Value, "_jagged_attention_backward: offsets must start at 0", [&] {
    _jagged_attention_backward(o, l, q, k, v, from_vector<int64_t>({2, 5}, {2}), o, l, false,
                               std::nullopt);
  });
}

}  // namespace
}  // namespace kiln::testing
