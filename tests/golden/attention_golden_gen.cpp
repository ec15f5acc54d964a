// tests/golden/attention_golden_gen.cpp: PyTorch's (libtorch C++ API) written-out attention,
// softmax(q k^T * scale, masked) v, and its gradients, which Kiln's fused
// scaled_dot_product_attention must match (tests/kernels/attention_golden_test.cpp). libtorch
// 1.13 has no scaled_dot_product_attention, so the reference is the composition it replaces.
// Built and run by make_attention_golden.sh; CI never runs it.
//
// Inputs (float64, golden::fill; the test builds the same ones):
//   causal: q (2,3,70,16) fill .37,.1 * .5; k fill .23,.5 * .5; v fill .71,0; causal (key j <=
//           query i), scale 1/sqrt(16): 70 queries cross the kernel's 64-query tiles
//   cross:  q (2,2,33,8) fill .37,.1; k, v (2,2,300,8) fill .23,.5 and .71,0; not causal, scale
//           0.3: 300 keys cross the 256-key tiles
//   skew:   q (1,2,5,8), k, v (1,2,9,8), causal with more keys than queries (top-left aligned)
// For each case: "<case>.y" and "<case>.{q,k,v}.grad" of sum(y * gy). File format:
// golden_writer.h.
#include "golden_writer.h"

using golden::fill;

namespace {

torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        bool causal, double scale) {
  auto s = torch::matmul(q, k.transpose(-2, -1)) * scale;
  if (causal) {
    auto mask = torch::ones({q.size(-2), k.size(-2)}, torch::kBool).triu(1);
    s = s.masked_fill(mask, -INFINITY);
  }
  return torch::matmul(torch::softmax(s, -1), v);
}

void run(golden::Writer& out, const std::string& name, std::vector<int64_t> qs,
         std::vector<int64_t> ks, double qscale, bool causal, double scale) {
  auto q = fill(qs, .37, .1, qscale), k = fill(ks, .23, .5, qscale), v = fill(ks, .71, 0);
  out.record(name, attention(q, k, v, causal, scale), {{"q", q}, {"k", k}, {"v", v}});
}

}  // namespace

int main(int argc, char** argv) {
  golden::Writer out;
  run(out, "causal", {2, 3, 70, 16}, {2, 3, 70, 16}, .5, true, 0.25);
  run(out, "cross", {2, 2, 33, 8}, {2, 2, 300, 8}, 1.0, false, 0.3);
  run(out, "skew", {1, 2, 5, 8}, {1, 2, 9, 8}, 1.0, true, 1.0 / std::sqrt(8.0));
  return out.save(argc > 1 ? argv[1] : "attention_golden.bin");
}
