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

KILN_OP_SAMPLES("_fused_attention_dropout_mask", dropout_mask_s) {
  return S{{Sizes{2, 3, 5}, 0.25, int64_t{3}, int64_t{9}, kNone, kNone},
           {Sizes{4, 4}, 0.0, int64_t{0}, int64_t{0}, kFloat64, kNone}};
}

}  // namespace
}  // namespace kiln::testing
