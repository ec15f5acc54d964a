// Fused scaled-dot-product attention on the CPU (tensor/ops/attention.toml).
//
// Note [Fused attention]: FlashAttention's scheme on the CPU. q: (N, L, E), k: (N, S, E),
// v: (N, S, Ev) -> out: (N, L, Ev), lse: (N, L), N the flattened batch and head dims.
//  - Forward: per block of kQueryBlock query rows, the keys are walked in blocks of kKeyBlock
//    keeping, per row, the running max m, the sum l of exp(s - m) and the unnormalised output
//    (online softmax). Only (kQueryBlock, kKeyBlock) tiles of scores exist, never (L, S). It
//    saves out and lse = m + log l.
//  - Backward: per batch-head, key blocks outside and query blocks inside. Each tile of
//    probabilities is recomputed as exp(s - lse); dV and dK of a key block are complete when its
//    inner loop ends, and dQ accumulates over the key blocks. The softmax term uses
//    D_i = dO_i . O_i - dlse_i, so the gradient of lse is exact too.
//  - Tiles multiply through the CPU GEMM (See Note [CPU GEMM]; float16 and bfloat16 compute in
//    float32). One task per (batch-head, query block) in the forward and per
//    batch-head in the backward: every output element is computed by one task in a fixed order,
//    so results do not depend on the thread count.
//  - is_causal masks keys j > i (PyTorch's top-left aligned tril), skipping tiles wholly above
//    the diagonal.
//
// Note [Jagged attention]: _jagged_attention runs the same two passes over a packed batch
// (kiln.nested's jagged layout): q: (T, H, E), k: (T, H, E), v: (T, H, Ev), offsets: (B + 1)
// -> out: (T, H, Ev), lse: (T, H). Sequence b is rows [offsets[b], offsets[b + 1]) and attends
// only to itself, so each (sequence, head) is one Head whose rows are H E apart: no copy into
// (B, H, L, E), no padding, and no work on the (T, T) pairs of different sequences. Tasks are
// (head, sequence, query block) in the forward and (sequence, head) in the backward, each
// written by one task in a fixed order, so results do not depend on the thread count either.
// The offsets are checked here (they start at 0, never decrease, end at T); the meta function
// cannot see their values.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "gemm.h"
#include "kiln/generated/meta/attention.h"
#include "kiln/generated/ops/attention.h"
#include "kiln/generator.h"
#include "loops.h"
#include "vec_math.h"

namespace kiln::kernels {
namespace {

constexpr int64_t kQueryBlock = 64;
constexpr int64_t kKeyBlock = 256;
static_assert(kKeyBlock % kQueryBlock == 0, "a causal key block starts at a query block");

// c (m x n) = alpha op(a) op(b) + beta c, row-major with leading dims; op transposes when t.
template <typename A>
void tile_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, A alpha, const A* a, int64_t lda,
               const A* b, int64_t ldb, A beta, A* c, int64_t ldc) {
  const int st = gemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  KILN_ASSERT(st == 0, "attention: GEMM failed with status ", st);
}

// Note [Attention dropout]: element e = (n L + i) S + j of the (N, L, S) probabilities is kept
// when lane e % 4 of philox4x32(seed, offset + e / 4) is >= p 2^32 (probability 1 - p), and
// then scaled by 1 / (1 - p). The forward, the backward and _fused_attention_dropout_mask all
// regenerate this one mask, so a call's mask is fixed by its (seed, offset):
// scaled_dot_product_attention (tensor/src/composite_attention.cpp) reserves them from its
// generator like a random op drawing 32 bits per (N, L, S) probability.
struct Dropout {
  Dropout(double p, int64_t seed, int64_t offset)
      : active(p > 0),
        seed(static_cast<uint64_t>(seed)),
        offset(static_cast<uint64_t>(offset)),
        threshold(static_cast<uint64_t>(p * 4294967296.0)),
        keep_scale(p < 1 ? 1.0 / (1.0 - p) : 0.0) {}

  // out[t] = the multiplier (0 or 1 / (1 - p)) of element e0 + t, t < n.
  template <typename A>
  void fill(int64_t e0, int64_t n, A* out) const {
    for (int64_t t = 0; t < n;) {
      const int64_t e = e0 + t;
      std::array<uint32_t, 4> r = philox4x32(seed, offset + static_cast<uint64_t>(e / 4));
      for (int64_t lane = e % 4; lane < 4 && t < n; ++lane, ++t)
        out[t] = r[lane] >= threshold ? static_cast<A>(keep_scale) : A(0);
    }
  }

  bool active;
  uint64_t seed, offset, threshold;
  double keep_scale;
};

template <typename A>
struct Problem {
  int64_t N, L, S, E, Ev;
  A scale;
  bool causal;
  Dropout drop;

  // How many keys of the block starting at j0 (nk wide) row i attends to.
  int64_t valid_keys(int64_t i, int64_t j0, int64_t nk) const {
    return causal ? std::clamp<int64_t>(i - j0 + 1, 0, nk) : nk;
  }
};

// One attention problem: L query rows against S keys. Row i of q starts at q + i * ldq (k, v
// and the outputs likewise); dense batch-head n has ld = E (Ev) and lse stride 1, a jagged
// sequence ld = H E (H Ev) and lse stride H (Note [Jagged attention]). The gradient pointers
// are set only for the backward; dq, dk, dv share q's, k's and v's leading dims, go and o
// out's, glse lse's stride.
template <typename A>
struct Head {
  int64_t L, S;
  const A *q, *k, *v;
  A *out, *lse;
  int64_t ldq, ldk, ldv, ldo, ld_lse;
  int64_t drop_base;  // the dropout element of (row 0, key 0): Note [Attention dropout]
  const A *go = nullptr, *glse = nullptr, *o = nullptr;
  A *dq = nullptr, *dk = nullptr, *dv = nullptr;
};

// Batch-head n of a dense (N, L, E) problem.
template <typename A>
Head<A> dense_head(const Problem<A>& P, int64_t n, const A* q, const A* k, const A* v, A* out,
                   A* lse) {
  const int64_t L = P.L, S = P.S, E = P.E, Ev = P.Ev;
  return Head<A>{L,
                 S,
                 q + n * L * E,
                 k + n * S * E,
                 v + n * S * Ev,
                 out ? out + n * L * Ev : nullptr,
                 lse + n * L,
                 E,
                 E,
                 Ev,
                 Ev,
                 1,
                 n * L * S};
}

// Rows [i0, i1) of head H (Note [Fused attention]). s: kQueryBlock x kKeyBlock scratch,
// acc: kQueryBlock x Ev, m, l: kQueryBlock.
template <typename A>
void forward_rows(const Problem<A>& P, const Head<A>& H, int64_t i0, int64_t i1, A* s, A* acc, A* m,
                  A* l) {
  const int64_t rows = i1 - i0, E = P.E, Ev = P.Ev, S = H.S;
  const A* qn = H.q + i0 * H.ldq;
  std::fill(acc, acc + rows * Ev, A(0));
  std::fill(m, m + rows, -std::numeric_limits<A>::infinity());
  std::fill(l, l + rows, A(0));
  const int64_t s_end = P.causal ? std::min(S, i1) : S;  // causal: keys j <= i < i1
  for (int64_t j0 = 0; j0 < s_end; j0 += kKeyBlock) {
    const int64_t nk = std::min(kKeyBlock, s_end - j0);
    tile_gemm(false, true, rows, nk, E, P.scale, qn, H.ldq, H.k + j0 * H.ldk, H.ldk, A(0), s,
              kKeyBlock);
    for (int64_t r = 0; r < rows; ++r) {
      A* sr = s + r * kKeyBlock;
      const int64_t i = i0 + r, valid = P.valid_keys(i, j0, nk);
      if (valid == 0) {
        std::fill(sr, sr + nk, A(0));
        continue;
      }
      // Three loops: GCC vectorizes exp only in a loop without a reduction.
      A mx = m[r];
#pragma omp simd reduction(max : mx)
      for (int64_t j = 0; j < valid; ++j) mx = sr[j] > mx ? sr[j] : mx;
      const A alpha = l[r] == 0 ? A(0) : vec::exp_nonpositive_acc<A>(m[r] - mx);
#pragma omp simd
      for (int64_t j = 0; j < valid; ++j) sr[j] = vec::exp_nonpositive_acc<A>(sr[j] - mx);
      A sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < valid; ++j) sum += sr[j];
      std::fill(sr + valid, sr + nk, A(0));
      l[r] = l[r] * alpha + sum;
      m[r] = mx;
      if (P.drop.active) {
        A keep[kKeyBlock];
        P.drop.fill(H.drop_base + i * S + j0, valid, keep);
        for (int64_t j = 0; j < valid; ++j) sr[j] *= keep[j];
      }
      if (alpha != A(1)) {
        A* ar = acc + r * Ev;
        for (int64_t c = 0; c < Ev; ++c) ar[c] *= alpha;
      }
    }
    tile_gemm(false, false, rows, Ev, nk, A(1), s, kKeyBlock, H.v + j0 * H.ldv, H.ldv, A(1), acc,
              Ev);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = i0 + r;
    const A inv = l[r] > 0 ? A(1) / l[r] : A(0);
    A* o = H.out + i * H.ldo;
    for (int64_t c = 0; c < Ev; ++c) o[c] = acc[r * Ev + c] * inv;
    H.lse[i * H.ld_lse] = l[r] > 0 ? m[r] + std::log(l[r]) : -std::numeric_limits<A>::infinity();
  }
}

// Gradients of head H (Note [Fused attention]): H.dq, H.dk, H.dv written whole.
template <typename A>
void backward_head(const Problem<A>& P, const Head<A>& H) {
  const int64_t L = H.L, S = H.S, E = P.E, Ev = P.Ev;
  std::vector<A> row_term(L), tile(kQueryBlock * kKeyBlock), dtile(kQueryBlock * kKeyBlock);
  std::vector<A> keep, dropped;
  if (P.drop.active) {
    keep.resize(kQueryBlock * kKeyBlock);
    dropped.resize(kQueryBlock * kKeyBlock);
  }
  for (int64_t i = 0; i < L; ++i) {
    A d = 0;
    const A *gi = H.go + i * H.ldo, *oi = H.o + i * H.ldo;
    for (int64_t c = 0; c < Ev; ++c) d += gi[c] * oi[c];
    row_term[i] = d - H.glse[i * H.ld_lse];
  }
  for (int64_t i = 0; i < L; ++i) std::fill(H.dq + i * H.ldq, H.dq + i * H.ldq + E, A(0));
  for (int64_t j = 0; j < S; ++j) {
    std::fill(H.dk + j * H.ldk, H.dk + j * H.ldk + E, A(0));
    std::fill(H.dv + j * H.ldv, H.dv + j * H.ldv + Ev, A(0));
  }
  for (int64_t j0 = 0; j0 < S; j0 += kKeyBlock) {
    const int64_t nk_block = std::min(kKeyBlock, S - j0);
    const A *kj = H.k + j0 * H.ldk, *vj = H.v + j0 * H.ldv;
    A *dkj = H.dk + j0 * H.ldk, *dvj = H.dv + j0 * H.ldv;
    const int64_t i_start = P.causal ? j0 / kQueryBlock * kQueryBlock : 0;
    for (int64_t i0 = i_start; i0 < L; i0 += kQueryBlock) {
      const int64_t rows = std::min(kQueryBlock, L - i0);
      // Causal: keys past the block's last row get nothing; only the first nk of the key block.
      const int64_t nk = P.causal ? std::min(nk_block, i0 + rows - j0) : nk_block;
      const A *qi = H.q + i0 * H.ldq, *goi = H.go + i0 * H.ldo;
      A* p = tile.data();
      A* dp = dtile.data();
      tile_gemm(false, true, rows, nk, E, P.scale, qi, H.ldq, kj, H.ldk, A(0), p, kKeyBlock);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = i0 + r, valid = P.valid_keys(i, j0, nk);
        A* pr = p + r * kKeyBlock;
        const A ls = H.lse[i * H.ld_lse];
#pragma omp simd
        for (int64_t j = 0; j < valid; ++j) pr[j] = vec::exp_nonpositive_acc<A>(pr[j] - ls);
        std::fill(pr + valid, pr + nk, A(0));
        if (P.drop.active) {
          A* kr = keep.data() + r * kKeyBlock;
          P.drop.fill(H.drop_base + i * S + j0, nk, kr);
          for (int64_t j = 0; j < nk; ++j) dropped[r * kKeyBlock + j] = pr[j] * kr[j];
        }
      }
      const A* pd = P.drop.active ? dropped.data() : p;
      // dV += Pd^T dO; dPd = dO V^T
      tile_gemm(true, false, nk, Ev, rows, A(1), pd, kKeyBlock, goi, H.ldo, A(1), dvj, H.ldv);
      tile_gemm(false, true, rows, nk, Ev, A(1), goi, H.ldo, vj, H.ldv, A(0), dp, kKeyBlock);
      for (int64_t r = 0; r < rows; ++r) {  // dS = P (dP - D) scale, dP = dPd * keep
        A *pr = p + r * kKeyBlock, *dr = dp + r * kKeyBlock;
        const A d = row_term[i0 + r];
        if (P.drop.active) {
          const A* kr = keep.data() + r * kKeyBlock;
          for (int64_t j = 0; j < nk; ++j) dr[j] = pr[j] * (dr[j] * kr[j] - d) * P.scale;
        } else {
#pragma omp simd
          for (int64_t j = 0; j < nk; ++j) dr[j] = pr[j] * (dr[j] - d) * P.scale;
        }
      }
      // dQ += dS K; dK += dS^T Q
      tile_gemm(false, false, rows, E, nk, A(1), dp, kKeyBlock, kj, H.ldk, A(1), H.dq + i0 * H.ldq,
                H.ldq);
      tile_gemm(true, false, nk, E, rows, A(1), dp, kKeyBlock, qi, H.ldq, A(1), dkj, H.ldk);
    }
  }
}

ScalarType acc_dtype(ScalarType t) { return t == kFloat64 ? kFloat64 : kFloat32; }

// Calls run(A{}) with A the C++ type of `acc` (acc_dtype's: double or float).
template <typename F>
void with_acc(ScalarType acc, F&& run) {
  if (acc == kFloat64)
    run(double{});
  else
    run(float{});
}

// t in dtype `acc`, contiguous (t itself when it already is).
Tensor as_acc(const Tensor& t, ScalarType acc) { return t.to(acc).contiguous(); }

template <typename A>
const A* ptr(const Tensor& t) {
  return static_cast<const A*>(t.impl()->raw_data());
}
template <typename A>
A* mut_ptr(const Tensor& t) {
  return static_cast<A*>(t.impl()->raw_data());
}

template <typename A>
Problem<A> problem(const Tensor& q, const Tensor& k, const Tensor& v, double dropout_p,
                   bool is_causal, std::optional<double> scale, int64_t seed, int64_t offset) {
  int64_t N = 1;
  for (int64_t d = 0; d < q.dim() - 2; ++d) N *= q.size(d);
  const int64_t E = q.size(-1);
  const double sc = scale.value_or(1.0 / std::sqrt(static_cast<double>(E)));
  const Dropout drop(dropout_p, seed, offset);
  return Problem<A>{N, q.size(-2), k.size(-2), E, v.size(-1), static_cast<A>(sc), is_causal, drop};
}

std::tuple<Tensor, Tensor> fused_attention_cpu(const Tensor& query, const Tensor& key,
                                               const Tensor& value, double dropout_p,
                                               bool is_causal, std::optional<double> scale,
                                               int64_t seed, int64_t offset) {
  std::vector<TensorSpec> specs =
      meta::fused_attention(query, key, value, dropout_p, is_causal, scale, seed, offset);
  const ScalarType acc = acc_dtype(query.dtype());
  Tensor out = empty_on(specs[0].sizes, acc, specs[0].device);
  Tensor lse = empty_strided_on(specs[1].sizes, specs[1].strides, specs[1].dtype, specs[1].device);
  Tensor q = as_acc(query, acc), k = as_acc(key, acc), v = as_acc(value, acc);
  auto run = [&]<typename A>(A) {
    const Problem<A> P = problem<A>(q, k, v, dropout_p, is_causal, scale, seed, offset);
    const int64_t blocks = (P.L + kQueryBlock - 1) / kQueryBlock;
    const int64_t work = std::min(P.L, kQueryBlock) * P.S * (P.E + P.Ev);
    parallel_for(P.N * blocks, std::max<int64_t>(1, kGrainSize / std::max<int64_t>(work, 1)),
                 [&](int64_t b, int64_t e) {
                   std::vector<A> s(kQueryBlock * kKeyBlock), a(kQueryBlock * P.Ev), m(kQueryBlock),
                       l(kQueryBlock);
                   for (int64_t t = b; t < e; ++t) {
                     const int64_t n = t / blocks, i0 = t % blocks * kQueryBlock;
                     const Head<A> H = dense_head<A>(P, n, ptr<A>(q), ptr<A>(k), ptr<A>(v),
                                                     mut_ptr<A>(out), mut_ptr<A>(lse));
                     forward_rows<A>(P, H, i0, std::min(P.L, i0 + kQueryBlock), s.data(), a.data(),
                                     m.data(), l.data());
                   }
                 });
  };
  with_acc(acc, run);
  return {out.to(specs[0].dtype), lse};
}

std::tuple<Tensor, Tensor, Tensor> fused_attention_backward_cpu(
    const Tensor& grad_out, const Tensor& grad_logsumexp, const Tensor& query, const Tensor& key,
    const Tensor& value, const Tensor& output, const Tensor& logsumexp, double dropout_p,
    bool is_causal, std::optional<double> scale, int64_t seed, int64_t offset) {
  std::vector<TensorSpec> specs =
      meta::fused_attention_backward(grad_out, grad_logsumexp, query, key, value, output, logsumexp,
                                     dropout_p, is_causal, scale, seed, offset);
  const ScalarType acc = acc_dtype(query.dtype());
  Tensor go = as_acc(grad_out, acc), glse = as_acc(grad_logsumexp, acc);
  Tensor q = as_acc(query, acc), k = as_acc(key, acc), v = as_acc(value, acc);
  Tensor o = as_acc(output, acc), lse = as_acc(logsumexp, acc);
  Tensor dq = empty_on(specs[0].sizes, acc, specs[0].device);
  Tensor dk = empty_on(specs[1].sizes, acc, specs[1].device);
  Tensor dv = empty_on(specs[2].sizes, acc, specs[2].device);
  auto run = [&]<typename A>(A) {
    const Problem<A> P = problem<A>(q, k, v, dropout_p, is_causal, scale, seed, offset);
    const int64_t work = P.L * P.S * (P.E + P.Ev);
    parallel_for(P.N, std::max<int64_t>(1, kGrainSize / std::max<int64_t>(work, 1)),
                 [&](int64_t b, int64_t e) {
                   for (int64_t n = b; n < e; ++n) {
                     Head<A> H = dense_head<A>(P, n, ptr<A>(q), ptr<A>(k), ptr<A>(v), nullptr,
                                               mut_ptr<A>(lse));
                     const int64_t L = P.L, S = P.S;
                     H.go = ptr<A>(go) + n * L * P.Ev;
                     H.o = ptr<A>(o) + n * L * P.Ev;
                     H.glse = ptr<A>(glse) + n * L;
                     H.dq = mut_ptr<A>(dq) + n * L * P.E;
                     H.dk = mut_ptr<A>(dk) + n * S * P.E;
                     H.dv = mut_ptr<A>(dv) + n * S * P.Ev;
                     backward_head<A>(P, H);
                   }
                 });
  };
  with_acc(acc, run);
  return {dq.to(specs[0].dtype), dk.to(specs[1].dtype), dv.to(specs[2].dtype)};
}

// The offsets of a packed batch of total length T, checked (Note [Jagged attention]).
std::vector<int64_t> jagged_offsets(const char* op, const Tensor& offsets, int64_t T) {
  Tensor c = offsets.contiguous();
  const int64_t* p = static_cast<const int64_t*>(c.impl()->raw_data());
  std::vector<int64_t> off(p, p + c.numel());
  KILN_CHECK(off.front() == 0, Value, op,
             ": offsets must start at 0, got offsets[0] = ", off.front());
  for (size_t b = 1; b < off.size(); ++b)
    KILN_CHECK(off[b] >= off[b - 1], Value, op, ": offsets must not decrease, got offsets[", b - 1,
               "] = ", off[b - 1], " > offsets[", b, "] = ", off[b]);
  KILN_CHECK(off.back() == T, Value, op, ": offsets must end at the total length ", T,
             " (dim 0 of query), got offsets[", off.size() - 1, "] = ", off.back());
  return off;
}

template <typename A>
Problem<A> jagged_problem(const Tensor& q, const Tensor& v, bool is_causal,
                          std::optional<double> scale) {
  const int64_t E = q.size(2);
  const double sc = scale.value_or(1.0 / std::sqrt(static_cast<double>(E)));
  return Problem<A>{q.size(1),         0, 0, E, v.size(2), static_cast<A>(sc), is_causal,
                    Dropout(0.0, 0, 0)};
}

// Sequence b, head h of a packed batch (P.N = H heads).
template <typename A>
Head<A> jagged_head(const Problem<A>& P, const std::vector<int64_t>& off, int64_t b, int64_t h,
                    const A* q, const A* k, const A* v, A* out, A* lse) {
  const int64_t H = P.N, E = P.E, Ev = P.Ev, r0 = off[b], L = off[b + 1] - off[b];
  return Head<A>{L,
                 L,
                 q + (r0 * H + h) * E,
                 k + (r0 * H + h) * E,
                 v + (r0 * H + h) * Ev,
                 out ? out + (r0 * H + h) * Ev : nullptr,
                 lse + r0 * H + h,
                 H * E,
                 H * E,
                 H * Ev,
                 H * Ev,
                 H,
                 0};
}

std::tuple<Tensor, Tensor> jagged_attention_cpu(const Tensor& query, const Tensor& key,
                                                const Tensor& value, const Tensor& offsets,
                                                bool is_causal, std::optional<double> scale) {
  std::vector<TensorSpec> specs =
      meta::jagged_attention(query, key, value, offsets, is_causal, scale);
  const std::vector<int64_t> off = jagged_offsets("_jagged_attention", offsets, query.size(0));
  const ScalarType acc = acc_dtype(query.dtype());
  Tensor out = empty_on(specs[0].sizes, acc, specs[0].device);
  Tensor lse = empty_strided_on(specs[1].sizes, specs[1].strides, specs[1].dtype, specs[1].device);
  Tensor q = as_acc(query, acc), k = as_acc(key, acc), v = as_acc(value, acc);
  // One task per (sequence, query block), for each head.
  std::vector<std::pair<int64_t, int64_t>> blocks;
  for (size_t b = 0; b + 1 < off.size(); ++b)
    for (int64_t i0 = 0; i0 < off[b + 1] - off[b]; i0 += kQueryBlock)
      blocks.emplace_back(static_cast<int64_t>(b), i0);
  auto run = [&]<typename A>(A) {
    const Problem<A> P = jagged_problem<A>(q, v, is_causal, scale);
    const int64_t nb = static_cast<int64_t>(blocks.size());
    const int64_t work = kQueryBlock * kKeyBlock * (P.E + P.Ev);
    parallel_for(P.N * nb, std::max<int64_t>(1, kGrainSize / work), [&](int64_t b, int64_t e) {
      std::vector<A> s(kQueryBlock * kKeyBlock), a(kQueryBlock * P.Ev), m(kQueryBlock),
          l(kQueryBlock);
      for (int64_t t = b; t < e; ++t) {
        const auto [seq, i0] = blocks[t % nb];
        const Head<A> H = jagged_head<A>(P, off, seq, t / nb, ptr<A>(q), ptr<A>(k), ptr<A>(v),
                                         mut_ptr<A>(out), mut_ptr<A>(lse));
        forward_rows<A>(P, H, i0, std::min(H.L, i0 + kQueryBlock), s.data(), a.data(), m.data(),
                        l.data());
      }
    });
  };
  with_acc(acc, run);
  return {out.to(specs[0].dtype), lse};
}

std::tuple<Tensor, Tensor, Tensor> jagged_attention_backward_cpu(
    const Tensor& grad_out, const Tensor& grad_logsumexp, const Tensor& query, const Tensor& key,
    const Tensor& value, const Tensor& offsets, const Tensor& output, const Tensor& logsumexp,
    bool is_causal, std::optional<double> scale) {
  std::vector<TensorSpec> specs = meta::jagged_attention_backward(
      grad_out, grad_logsumexp, query, key, value, offsets, output, logsumexp, is_causal, scale);
  const std::vector<int64_t> off =
      jagged_offsets("_jagged_attention_backward", offsets, query.size(0));
  const ScalarType acc = acc_dtype(query.dtype());
  Tensor go = as_acc(grad_out, acc), glse = as_acc(grad_logsumexp, acc);
  Tensor q = as_acc(query, acc), k = as_acc(key, acc), v = as_acc(value, acc);
  Tensor o = as_acc(output, acc), lse = as_acc(logsumexp, acc);
  Tensor dq = empty_on(specs[0].sizes, acc, specs[0].device);
  Tensor dk = empty_on(specs[1].sizes, acc, specs[1].device);
  Tensor dv = empty_on(specs[2].sizes, acc, specs[2].device);
  auto run = [&]<typename A>(A) {
    const Problem<A> P = jagged_problem<A>(q, v, is_causal, scale);
    const int64_t B = static_cast<int64_t>(off.size()) - 1, Hn = P.N;
    parallel_for(B * Hn, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const int64_t seq = t / Hn, h = t % Hn, d = (off[seq] * Hn + h);
        Head<A> H = jagged_head<A>(P, off, seq, h, ptr<A>(q), ptr<A>(k), ptr<A>(v), nullptr,
                                   mut_ptr<A>(lse));
        if (H.L == 0) continue;
        H.go = ptr<A>(go) + d * P.Ev;
        H.o = ptr<A>(o) + d * P.Ev;
        H.glse = ptr<A>(glse) + off[seq] * Hn + h;
        H.dq = mut_ptr<A>(dq) + d * P.E;
        H.dk = mut_ptr<A>(dk) + d * P.E;
        H.dv = mut_ptr<A>(dv) + d * P.Ev;
        backward_head<A>(P, H);
      }
    });
  };
  with_acc(acc, run);
  return {dq.to(specs[0].dtype), dk.to(specs[1].dtype), dv.to(specs[2].dtype)};
}

// The mask of Note [Attention dropout] as a (..., L, S) tensor of multipliers (0 or 1 / (1 - p)).
Tensor dropout_mask_cpu(IntArrayRef size, double dropout_p, int64_t seed, int64_t offset,
                        std::optional<ScalarType> dtype, std::optional<Device> device) {
  TensorSpec spec =
      meta::fused_attention_dropout_mask(size, dropout_p, seed, offset, dtype, device);
  const ScalarType acc = acc_dtype(spec.dtype);
  Tensor out = empty_on(spec.sizes, acc, spec.device);
  const Dropout drop(dropout_p, seed, offset);
  auto run = [&]<typename A>(A) {
    A* o = mut_ptr<A>(out);
    parallel_for(out.numel(), kGrainSize, [&](int64_t b, int64_t e) {
      if (drop.active)
        drop.fill(b, e - b, o + b);
      else
        std::fill(o + b, o + e, A(1));
    });
  };
  with_acc(acc, run);
  return out.to(spec.dtype);
}

KILN_LIBRARY(CPU, m) {
  m.impl<ops::_fused_attention>(fused_attention_cpu);
  m.impl<ops::_fused_attention_backward>(fused_attention_backward_cpu);
  m.impl<ops::_fused_attention_dropout_mask>(dropout_mask_cpu);
  m.impl<ops::_jagged_attention>(jagged_attention_cpu);
  m.impl<ops::_jagged_attention_backward>(jagged_attention_backward_cpu);
}

}  // namespace
}  // namespace kiln::kernels
