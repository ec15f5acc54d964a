// Manifest samples for the attention rows (tensor/ops/attention.toml). The backward's saved
// output and logsumexp come from a real forward; dropout samples fix (seed, offset), so the
// fused rows are deterministic functions that gradcheck can check.
#include "samples/op_samples.h"
#include "samples/util.h"

namespace kiln::testing {
namespace {

using namespace sample_args;

using S = std::vector<Stack>;
using Sizes = std::vector<int64_t>;

KILN_OP_SAMPLES("scaled_dot_product_attention", sdpa_s) {
  return S{{random({2, 3, 5, 4}, kFloat32, -1, 1, 1), random({2, 3, 6, 4}, kFloat32, -1, 1, 2),
            random({2, 3, 6, 3}, kFloat32, -1, 1, 3), 0.0, false, kNone, kNone},
           {random({4, 3}, kFloat32, -1, 1, 4), random({5, 3}, kFloat32, -1, 1, 5),
            random({5, 2}, kFloat32, -1, 1, 6), 0.0, true, 0.5, kNone}};
}

KILN_OP_SAMPLES("_fused_attention", fused_attention_s) {
  return S{{random({2, 3, 4}, kFloat32, -1, 1, 7), random({2, 5, 4}, kFloat32, -1, 1, 8),
            random({2, 5, 3}, kFloat32, -1, 1, 9), 0.0, false, kNone, int64_t{0}, int64_t{0}},
           {random({1, 2, 4, 3}, kFloat32, -1, 1, 10), random({1, 2, 4, 3}, kFloat32, -1, 1, 11),
            random({1, 2, 4, 2}, kFloat32, -1, 1, 12), 0.3, true, kNone, int64_t{7}, int64_t{11}},
           {random({3, 3}, kFloat32, -1, 1, 13), random({3, 3}, kFloat32, -1, 1, 14),
            random({3, 3}, kFloat32, -1, 1, 15), 0.0, true, 0.7, int64_t{0}, int64_t{0}}};
}

// (grad_out, grad_logsumexp, q, k, v, out, lse, dropout_p, is_causal, scale, seed, offset).
Stack backward_sample(IntArrayRef qs, IntArrayRef ks, IntArrayRef vs, double p, bool causal,
                      uint32_t seed) {
  Tensor q = random(qs, kFloat32, -1, 1, seed), k = random(ks, kFloat32, -1, 1, seed + 1);
  Tensor v = random(vs, kFloat32, -1, 1, seed + 2);
  auto [out, lse] = _fused_attention(q, k, v, p, causal, std::nullopt, 5, 3);
  return {random(out.sizes(), kFloat32, -1, 1, seed + 3),
          random(lse.sizes(), kFloat32, -1, 1, seed + 4),
          q,
          k,
          v,
          out,
          lse,
          p,
          causal,
          kNone,
          int64_t{5},
          int64_t{3}};
}

KILN_OP_SAMPLES("_fused_attention_backward", fused_attention_backward_s) {
  return S{backward_sample({2, 3, 4}, {2, 5, 4}, {2, 5, 3}, 0.0, false, 20),
           backward_sample({1, 2, 4, 3}, {1, 2, 4, 3}, {1, 2, 4, 2}, 0.25, true, 30)};
}

// Packed batches (Note [Jagged attention]): lengths 2, 0, 3 with two heads; one sequence of 4.
Tensor offsets_of(std::vector<int64_t> o) {
  const int64_t n = static_cast<int64_t>(o.size());
  return from_vector<int64_t>(o, {n});
}

KILN_OP_SAMPLES("_jagged_attention", jagged_attention_s) {
  return S{{random({5, 2, 3}, kFloat32, -1, 1, 40), random({5, 2, 3}, kFloat32, -1, 1, 41),
            random({5, 2, 4}, kFloat32, -1, 1, 42), offsets_of({0, 2, 2, 5}), false, kNone},
           {random({4, 1, 2}, kFloat32, -1, 1, 43), random({4, 1, 2}, kFloat32, -1, 1, 44),
            random({4, 1, 2}, kFloat32, -1, 1, 45), offsets_of({0, 4}), true, 0.7}};
}

// (grad_out, grad_logsumexp, q, k, v, offsets, out, lse, is_causal, scale).
Stack jagged_backward_sample(IntArrayRef qs, IntArrayRef vs, std::vector<int64_t> off, bool causal,
                             uint32_t seed) {
  Tensor q = random(qs, kFloat32, -1, 1, seed), k = random(qs, kFloat32, -1, 1, seed + 1);
  Tensor v = random(vs, kFloat32, -1, 1, seed + 2), o = offsets_of(std::move(off));
  auto [out, lse] = _jagged_attention(q, k, v, o, causal, std::nullopt);
  return {random(out.sizes(), kFloat32, -1, 1, seed + 3),
          random(lse.sizes(), kFloat32, -1, 1, seed + 4),
          q,
          k,
          v,
          o,
          out,
          lse,
          causal,
          kNone};
}

KILN_OP_SAMPLES("_jagged_attention_backward", jagged_attention_backward_s) {
  return S{jagged_backward_sample({5, 2, 3}, {5, 2, 4}, {0, 2, 2, 5}, false, 50),
           jagged_backward_sample({6, 1, 2}, {6, 1, 3}, {0, 3, 6}, true, 60)};
}

KILN_OP_SAMPLES("_fused_attention_dropout_mask", dropout_mask_s) {
  return S{{Sizes{2, 3, 5}, 0.25, int64_t{3}, int64_t{9}, kNone, kNone},
           {Sizes{4, 4}, 0.0, int64_t{0}, int64_t{0}, kFloat64, kNone}};
}

}  // namespace
}  // namespace kiln::testing
