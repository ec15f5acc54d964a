// Fused attention (tensor/ops/attention.toml) against written-out attention (matmul, softmax,
// matmul in float64, differentiated by autograd): outputs, logsumexp and gradients on shapes that
// cross the kernel's query and key blocks, causal masks, dropout (against the regenerated mask),
// explicit scales, non-contiguous inputs, bfloat16 and float64, zero-size inputs, thread-count
// independence and bad shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "kiln/autograd/autograd.h"
#include "kiln/operators.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

using Sizes = std::vector<int64_t>;

struct ThreadGuard {
  int saved = get_num_threads();
  ~ThreadGuard() { set_num_threads(saved); }
};

struct Case {
  Sizes q, k, v;
  bool causal = false;
  std::optional<double> scale;
  double p = 0;
};

struct Result {
  Tensor out, lse, dq, dk, dv;
};

// Written out in float64: s = scale q k^T (causal: -inf above the diagonal), lse = logsumexp(s),
// out = (softmax(s) * keep) v with keep the dropout multipliers (undefined: none).
std::pair<Tensor, Tensor> written_out(const Tensor& q, const Tensor& k, const Tensor& v,
                                      const Case& c, const Tensor& keep) {
  double sc = c.scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  Tensor s = matmul(q, k.transpose(-2, -1)) * sc;
  if (c.causal)
    s = s.masked_fill(ones({q.size(-2), k.size(-2)}, kBool).triu(1),
                      -std::numeric_limits<double>::infinity());
  Tensor p = softmax(s, -1);
  if (keep.defined()) p = p * keep;
  return {matmul(p, v), logsumexp(s, {-1})};
}

// out, lse and the gradients of sum(out * g_out) + sum(lse * g_lse).
template <typename F>
Result run(const F& attention, const Tensor& q, const Tensor& k, const Tensor& v,
           const Tensor& g_out, const Tensor& g_lse) {
  Tensor qr = q.detach().requires_grad_(), kr = k.detach().requires_grad_(),
         vr = v.detach().requires_grad_();
  auto [out, lse] = attention(qr, kr, vr);
  Tensor loss = (out * g_out.to(out.dtype())).sum() + (lse * g_lse.to(lse.dtype())).sum();
  auto g = autograd::grad({loss}, {qr, kr, vr});
  return {out.detach(), lse.detach(), g[0], g[1], g[2]};
}

Tensor keep_mask(const Tensor& q, const Tensor& k, const Case& c, int64_t seed, int64_t offset) {
  if (c.p == 0) return Tensor();
  Sizes s(q.sizes().begin(), q.sizes().end());
  s.back() = k.size(-2);
  return _fused_attention_dropout_mask(s, c.p, seed, offset, kFloat64);
}

// The fused op in `dt` against the written-out reference in float64 on the same (rounded) values.
void check_case(const Case& c, ScalarType dt, uint32_t seed, double rtol, double atol) {
  Tensor q = random(c.q, dt, -1, 1, seed), k = random(c.k, dt, -1, 1, seed + 1);
  Tensor v = random(c.v, dt, -1, 1, seed + 2);
  Sizes os(c.q.begin(), c.q.end());
  os.back() = c.v.back();
  Tensor g_out = random(os, kFloat64, -1, 1, seed + 3);
  Tensor g_lse = random(Sizes(c.q.begin(), c.q.end() - 1), kFloat64, -1, 1, seed + 4);
  const int64_t rng_seed = 17, rng_offset = 5;
  Result got = run(
      [&](const Tensor& a, const Tensor& b, const Tensor& d) {
        return _fused_attention(a, b, d, c.p, c.causal, c.scale, rng_seed, rng_offset);
      },
      q, k, v, g_out, g_lse);
  Tensor keep = keep_mask(q, k, c, rng_seed, rng_offset);
  Result want = run([&](const Tensor& a, const Tensor& b,
                        const Tensor& d) { return written_out(a, b, d, c, keep); },
                    q.to(kFloat64), k.to(kFloat64), v.to(kFloat64), g_out, g_lse);
  EXPECT_EQ(got.out.dtype(), dt);
  EXPECT_EQ(got.lse.dtype(), dt == kFloat64 ? kFloat64 : kFloat32);
  EXPECT_EQ(got.dq.dtype(), dt);
  {
    SCOPED_TRACE("out");
    expect_close(got.out, want.out, rtol, atol);
  }
  {
    SCOPED_TRACE("logsumexp");
    expect_close(got.lse, want.lse, rtol, atol);
  }
  {
    SCOPED_TRACE("grad query");
    expect_close(got.dq, want.dq, rtol, atol);
  }
  {
    SCOPED_TRACE("grad key");
    expect_close(got.dk, want.dk, rtol, atol);
  }
  {
    SCOPED_TRACE("grad value");
    expect_close(got.dv, want.dv, rtol, atol);
  }
}

TEST(FusedAttention, MatchesWrittenOutAcrossBlocks) {
  // 67 query rows and 300 keys cross the 64-row and 256-key blocks; E != Ev.
  for (bool causal : {false, true})
    for (std::optional<double> scale : {std::optional<double>(), std::optional<double>(0.3)}) {
      SCOPED_TRACE(std::string(causal ? "causal" : "full") + (scale ? " scale 0.3" : ""));
      check_case({{2, 3, 67, 24}, {2, 3, 300, 24}, {2, 3, 300, 40}, causal, scale}, kFloat32, 1,
                 2e-4, 2e-5);
    }
}

TEST(FusedAttention, CausalWithMoreOrFewerKeysThanQueries) {
  check_case({{3, 70, 8}, {3, 20, 8}, {3, 20, 5}, true}, kFloat32, 2, 2e-4, 2e-5);
  check_case({{3, 20, 8}, {3, 300, 8}, {3, 300, 5}, true}, kFloat32, 3, 2e-4, 2e-5);
  check_case({{1, 8}, {1, 8}, {1, 8}, true}, kFloat32, 4, 2e-4, 2e-5);  // 2-D, one row
}

TEST(FusedAttention, DropoutMatchesTheRegeneratedMask) {
  check_case({{2, 2, 67, 16}, {2, 2, 260, 16}, {2, 2, 260, 8}, false, {}, 0.3}, kFloat32, 5, 2e-4,
             2e-5);
  check_case({{2, 70, 16}, {2, 70, 16}, {2, 70, 8}, true, 0.5, 0.1}, kFloat32, 6, 2e-4, 2e-5);
}

TEST(FusedAttention, Float64) {
  check_case({{2, 67, 5}, {2, 259, 5}, {2, 259, 3}, true, {}, 0.2}, kFloat64, 7, 1e-10, 1e-12);
}

TEST(FusedAttention, BFloat16ComputesInFloat32) {
  check_case({{2, 67, 16}, {2, 130, 16}, {2, 130, 8}, true}, kBFloat16, 8, 2e-2, 2e-2);
  check_case({{2, 33, 16}, {2, 40, 16}, {2, 40, 8}}, kFloat16, 9, 4e-3, 4e-3);
}

TEST(FusedAttention, NonContiguousInputs) {
  // (B, T, H, E) projections viewed as (B, H, T, E), as a transformer does.
  Tensor q = random({2, 70, 3, 16}, kFloat32, -1, 1, 10).transpose(1, 2);
  Tensor k = random({2, 90, 3, 16}, kFloat32, -1, 1, 11).transpose(1, 2);
  Tensor v = non_contiguous(random({2, 3, 90, 8}, kFloat32, -1, 1, 12));
  ASSERT_FALSE(q.is_contiguous());
  Tensor g = random({2, 3, 70, 8}, kFloat64, -1, 1, 13), gl = zeros({2, 3, 70}, kFloat64);
  Result got =
      run([](const Tensor& a, const Tensor& b,
             const Tensor& d) { return _fused_attention(a, b, d, 0.0, true, std::nullopt, 0, 0); },
          q, k, v, g, gl);
  Case c{{}, {}, {}, true};
  Result want = run([&](const Tensor& a, const Tensor& b,
                        const Tensor& d) { return written_out(a, b, d, c, Tensor()); },
                    q.to(kFloat64), k.to(kFloat64), v.to(kFloat64), g, gl);
  expect_close(got.out, want.out, 2e-4, 2e-5);
  expect_close(got.dq, want.dq, 2e-4, 2e-5);
  expect_close(got.dk, want.dk, 2e-4, 2e-5);
  expect_close(got.dv, want.dv, 2e-4, 2e-5);
}

// The public op: the default scale, dropout counters reserved from the generator, and gradients
// of only some inputs.
TEST(ScaledDotProductAttention, MatchesWrittenOutAndReservesDropoutCounters) {
  Tensor q = random({2, 2, 9, 8}, kFloat32, -1, 1, 20),
         k = random({2, 2, 11, 8}, kFloat32, -1, 1, 21);
  Tensor v = random({2, 2, 11, 4}, kFloat32, -1, 1, 22);
  Case c{{}, {}, {}, true};
  expect_close(scaled_dot_product_attention(q, k, v, 0.0, true),
               written_out(q.to(kFloat64), k.to(kFloat64), v.to(kFloat64), c, Tensor()).first, 1e-5,
               1e-6);
  Generator g(5);
  Tensor a = scaled_dot_product_attention(q, k, v, 0.5, false, std::nullopt, g);
  EXPECT_EQ(g.get_state().offset, static_cast<uint64_t>(2 * 2 * 9 * 11 + 3) / 4);
  Tensor b = scaled_dot_product_attention(q, k, v, 0.5, false, std::nullopt, g);
  Generator g2(5);
  Tensor a2 = scaled_dot_product_attention(q, k, v, 0.5, false, std::nullopt, g2);
  EXPECT_EQ(to_doubles(a), to_doubles(a2));
  EXPECT_NE(to_doubles(a), to_doubles(b));
  Tensor keep = _fused_attention_dropout_mask({2, 2, 9, 11}, 0.5,
                                              static_cast<int64_t>(g2.initial_seed()), 0, kFloat64);
  c.causal = false;
  expect_close(a, written_out(q.to(kFloat64), k.to(kFloat64), v.to(kFloat64), c, keep).first, 1e-5,
               1e-6);
}

TEST(ScaledDotProductAttention, GradientsOfSomeInputs) {
  Tensor q1 = random({2, 5, 4}, kFloat64, -1, 1, 30).requires_grad_();
  Tensor q2 = random({2, 5, 4}, kFloat64, -1, 1, 31).requires_grad_();
  Tensor k = random({2, 6, 4}, kFloat64, -1, 1, 32), v = random({2, 6, 3}, kFloat64, -1, 1, 33);
  Tensor vr = v.detach().requires_grad_();
  // Two nodes fed the same gradient: one wants (query), the other (query, value).
  Tensor y = scaled_dot_product_attention(q1, k, v, 0.0, true) +
             scaled_dot_product_attention(q2, k, vr, 0.0, false);
  auto got = autograd::grad({y.sum()}, {q1, q2, vr});
  Case causal{{}, {}, {}, true}, full;
  Tensor z =
      written_out(q1, k, v, causal, Tensor()).first + written_out(q2, k, vr, full, Tensor()).first;
  auto want = autograd::grad({z.sum()}, {q1, q2, vr});
  for (size_t i = 0; i < 3; ++i) expect_close(got[i], want[i], 1e-10, 1e-12);
}

TEST(FusedAttention, DropoutMaskKeepsOneMinusP) {
  Tensor m = _fused_attention_dropout_mask({64, 1024}, 0.3, 123, 456);
  auto v = to_doubles(m);
  double kept = 0;
  for (double x : v) {
    EXPECT_TRUE(x == 0 || std::fabs(x - 1 / 0.7) < 1e-6) << x;
    kept += x != 0;
  }
  EXPECT_NEAR(kept / v.size(), 0.7, 0.01);
  // Element e reads lane e % 4 of counter offset + e / 4: a mask starting 4 counters later is
  // this one shifted by 16 elements.
  Tensor later = _fused_attention_dropout_mask({64, 1024}, 0.3, 123, 460);
  EXPECT_EQ(to_doubles(m.reshape({-1}).slice(0, 16)),
            to_doubles(later.reshape({-1}).slice(0, 0, -16)));
  EXPECT_EQ(to_doubles(_fused_attention_dropout_mask({3, 3}, 0.0, 1, 2)),
            std::vector<double>(9, 1.0));
  EXPECT_EQ(to_doubles(_fused_attention_dropout_mask({3, 3}, 1.0, 1, 2)),
            std::vector<double>(9, 0.0));
}

TEST(FusedAttention, ResultsDoNotDependOnTheThreadCount) {
  ThreadGuard guard;
  Tensor q = random({4, 2, 130, 32}, kFloat32, -1, 1, 40),
         k = random({4, 2, 300, 32}, kFloat32, -1, 1, 41);
  Tensor v = random({4, 2, 300, 16}, kFloat32, -1, 1, 42);
  Tensor g = random({4, 2, 130, 16}, kFloat64, -1, 1, 43), gl = zeros({4, 2, 130}, kFloat64);
  auto f = [](const Tensor& a, const Tensor& b, const Tensor& d) {
    return _fused_attention(a, b, d, 0.1, true, std::nullopt, 9, 0);
  };
  set_num_threads(1);
  Result one = run(f, q, k, v, g, gl);
  set_num_threads(2);
  Result two = run(f, q, k, v, g, gl);
  EXPECT_EQ(to_doubles(one.out), to_doubles(two.out));
  EXPECT_EQ(to_doubles(one.dq), to_doubles(two.dq));
  EXPECT_EQ(to_doubles(one.dk), to_doubles(two.dk));
  EXPECT_EQ(to_doubles(one.dv), to_doubles(two.dv));
}

TEST(FusedAttention, ZeroSize) {
  for (const Case& c :
       {Case{{0, 3, 4}, {0, 5, 4}, {0, 5, 2}}, Case{{2, 0, 4}, {2, 5, 4}, {2, 5, 2}},
        Case{{2, 3, 4}, {2, 0, 4}, {2, 0, 2}, true}}) {
    Tensor q = random(c.q), k = random(c.k), v = random(c.v);
    Sizes os(c.q.begin(), c.q.end());
    os.back() = c.v.back();
    Result r = run(
        [&](const Tensor& a, const Tensor& b, const Tensor& d) {
          return _fused_attention(a, b, d, 0.0, c.causal, std::nullopt, 0, 0);
        },
        q, k, v, ones(os, kFloat64), ones(Sizes(c.q.begin(), c.q.end() - 1), kFloat64));
    EXPECT_EQ(r.out.sizes(), IntArrayRef(os));
    EXPECT_EQ(r.dq.sizes(), q.sizes());
    EXPECT_EQ(r.dk.sizes(), k.sizes());
    EXPECT_EQ(r.dv.sizes(), v.sizes());
    // No keys: the output is zero and the logsumexp -inf (the empty sum).
    for (double x : to_doubles(r.out)) EXPECT_EQ(x, 0.0);
    for (double x : to_doubles(r.lse)) EXPECT_EQ(x, -std::numeric_limits<double>::infinity());
    for (double x : to_doubles(r.dq)) EXPECT_EQ(x, 0.0);
  }
}

TEST(FusedAttention, BadInputNamesTheShapes) {
  Tensor q = random({2, 3, 5, 8}), k = random({2, 3, 6, 8}), v = random({2, 3, 6, 4});
  expect_error(ErrorKind::Value, "query and key must have the same embedding size", [&] {
    scaled_dot_product_attention(q, random({2, 3, 6, 7}), v);
  });
  expect_error(ErrorKind::Value, "[2, 3, 6, 8] and [2, 3, 7, 4]", [&] {
    scaled_dot_product_attention(q, k, random({2, 3, 7, 4}));
  });
  expect_error(ErrorKind::Value, "same batch dims", [&] {
    scaled_dot_product_attention(q, random({2, 4, 6, 8}), random({2, 4, 6, 4}));
  });
  expect_error(ErrorKind::Value, "same number of dims", [&] {
    scaled_dot_product_attention(q, random({6, 8}), v);
  });
  expect_error(ErrorKind::Value, "at least 2 dims",
               [&] { scaled_dot_product_attention(random({8}), random({8}), random({8})); });
  expect_error(ErrorKind::Type, "same dtype",
               [&] { scaled_dot_product_attention(q, k, v.to(kFloat64)); });
  expect_error(ErrorKind::Type, "floating-point",
               [&] { scaled_dot_product_attention(q.to(kInt32), k.to(kInt32), v.to(kInt32)); });
  expect_error(ErrorKind::Value, "dropout probability has to be between 0 and 1, but got 1.5",
               [&] { scaled_dot_product_attention(q, k, v, 1.5); });
  auto [out, lse] = _fused_attention(q, k, v, 0.0, false, std::nullopt, 0, 0);
  expect_error(ErrorKind::Value, "expected grad_out and output of shape", [&] {
    _fused_attention_backward(out.narrow(2, 0, 2), lse, q, k, v, out, lse, 0.0, false, std::nullopt,
                              0, 0);
  });
}

}  // namespace
}  // namespace kiln::testing
