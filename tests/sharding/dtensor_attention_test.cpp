// The DTensor attention sharding rule across processes (See Note [Attention sharding]): on 1-d
// meshes of 2 and 3 ranks (uneven and empty pieces) and on a 2x2 mesh, scaled_dot_product_attention
// and _fused_attention on (B, H, L, E) tensors sharded on the batch dim, on the heads (tensor
// parallelism) and, without is_causal, on the query rows; float32 and float64, causal and not;
// their gradients through autograd (_fused_attention_backward). Every result is checked against
// the same call on the unsharded tensors, its placements against the ones the rule promises, and
// no sharded call may take the replicate path. Dropout takes the replicate path (and the decision
// cache keys on dropout_p); mismatched shapes give the local op's error.
#include <optional>

#include "harness.h"
#include "kiln/dist/dtensor.h"
#include "kiln/kiln.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

using dist::DeviceMesh;
using dist::distribute_tensor;
using dist::DTensor;
using dist::Partial;
using dist::Placement;
using dist::Placements;
using dist::Replicate;
using dist::Shard;

int64_t replicated() { return dist::dispatch_stats().replicated; }

void expect_placed(const Tensor& t, const Placements& want, const Tensor& full, double tol) {
  ASSERT_TRUE(dist::is_dtensor(t));
  DTensor d(t);
  EXPECT_EQ(dist::placements_str(d.placements()), dist::placements_str(want));
  expect_close(d.full_tensor(), full, tol, tol);
}

struct Case {
  Placements q, kv;         // the inputs' placements
  Placements out, kv_grad;  // the output's (and grad_query's), grad_key's and grad_value's
  bool causal;
  int64_t heads = 4;
};

// One case in float32 and float64: the forward (both rows) and the gradients of q, k and v.
void check(const DeviceMesh& mesh, const Case& c) {
  for (ScalarType dt : {kFloat32, kFloat64}) {
    SCOPED_TRACE(dist::placements_str(c.q) + " / " + dist::placements_str(c.kv) +
                 (c.causal ? " causal " : " ") + std::to_string(c.heads) + " heads " +
                 std::string(scalar_type_name(dt)));
    const double tol = dt == kFloat32 ? 1e-6 : 1e-12;
    const int64_t B = 3, H = c.heads, L = 5, E = 8;
    Tensor q0 = random({B, H, L, E}, dt, -1, 1, 1), k0 = random({B, H, L, E}, dt, -1, 1, 2);
    Tensor v0 = random({B, H, L, E}, dt, -1, 1, 3);
    auto D = [&](const Tensor& t, const Placements& p) { return distribute_tensor(t, mesh, p); };
    const int64_t before = replicated();
    expect_placed(scaled_dot_product_attention(D(q0, c.q), D(k0, c.kv), D(v0, c.kv), 0.0, c.causal),
                  c.out, scaled_dot_product_attention(q0, k0, v0, 0.0, c.causal), tol);
    auto [out, lse] =
        _fused_attention(D(q0, c.q), D(k0, c.kv), D(v0, c.kv), 0.0, c.causal, 0.5, 0, 0);
    auto [rout, rlse] = _fused_attention(q0, k0, v0, 0.0, c.causal, 0.5, 0, 0);
    expect_placed(out, c.out, rout, tol);
    expect_placed(lse, c.out, rlse, tol);
    // Gradients through autograd: sum().backward() reaches _fused_attention_backward with a
    // DTensor of zeros for the unused logsumexp.
    Tensor q1 = q0.clone().requires_grad_(), k1 = k0.clone().requires_grad_();
    Tensor v1 = v0.clone().requires_grad_();
    scaled_dot_product_attention(q1, k1, v1, 0.0, c.causal).sum().backward();
    DTensor q = D(q0, c.q), k = D(k0, c.kv), v = D(v0, c.kv);
    q.requires_grad_();
    k.requires_grad_();
    v.requires_grad_();
    scaled_dot_product_attention(q, k, v, 0.0, c.causal).sum().backward();
    expect_placed(q.grad(), c.out, q1.grad(), tol);
    expect_placed(k.grad(), c.kv_grad, k1.grad(), tol);
    expect_placed(v.grad(), c.kv_grad, v1.grad(), tol);
    EXPECT_EQ(replicated(), before) << "a sharded attention call took the replicate path";
  }
}

// Dropout takes the replicate path and matches the plain call for the same (seed, offset); the
// decision cache tells dropout_p = 0 from dropout_p > 0. A shape error is the local op's.
void check_dropout_and_errors(const DeviceMesh& mesh) {
  const Placements R(mesh.ndim(), Replicate());
  Placements heads = R;
  heads.back() = Shard(1);
  Tensor q0 = random({2, 4, 5, 8}, kFloat32, -1, 1, 4),
         k0 = random({2, 4, 5, 8}, kFloat32, -1, 1, 5);
  Tensor v0 = random({2, 4, 5, 8}, kFloat32, -1, 1, 6);
  auto D = [&](const Tensor& t) { return distribute_tensor(t, mesh, heads); };
  for (double p : {0.0, 0.3, 0.0}) {
    SCOPED_TRACE("dropout_p " + std::to_string(p));
    const int64_t before = replicated();
    auto [out, lse] = _fused_attention(D(q0), D(k0), D(v0), p, false, std::nullopt, 7, 11);
    auto [rout, rlse] = _fused_attention(q0, k0, v0, p, false, std::nullopt, 7, 11);
    expect_placed(out, p == 0 ? heads : R, rout, 1e-6);
    expect_placed(lse, p == 0 ? heads : R, rlse, 1e-6);
    EXPECT_EQ(replicated() - before, p == 0 ? 0 : 1);
  }
  // Through autograd (every rank draws the same (seed, offset) from its own generator).
  manual_seed(5);
  DTensor q = D(q0), k = D(k0), v = D(v0);
  q.requires_grad_();
  k.requires_grad_();
  v.requires_grad_();
  Tensor y = scaled_dot_product_attention(q, k, v, 0.3, true);
  ASSERT_TRUE(dist::is_dtensor(y));
  EXPECT_EQ(dist::placements_str(DTensor(y).placements()), dist::placements_str(R));
  y.sum().backward();
  manual_seed(5);
  Tensor q1 = q0.clone().requires_grad_(), k1 = k0.clone().requires_grad_();
  Tensor v1 = v0.clone().requires_grad_();
  Tensor y1 = scaled_dot_product_attention(q1, k1, v1, 0.3, true);
  y1.sum().backward();
  expect_close(DTensor(y).full_tensor(), y1, 1e-6, 1e-6);
  expect_close(DTensor(q.grad()).full_tensor(), q1.grad(), 1e-6, 1e-6);
  expect_close(DTensor(k.grad()).full_tensor(), k1.grad(), 1e-6, 1e-6);
  expect_close(DTensor(v.grad()).full_tensor(), v1.grad(), 1e-6, 1e-6);
  // Different head counts: the local op's error, on every rank alike.
  Tensor k3 = random({2, 3, 5, 8}, kFloat32, -1, 1, 7);
  expect_error(ErrorKind::Value, "same batch dims",
               [&] { scaled_dot_product_attention(D(q0), D(k3), D(v0)); });
  expect_error(ErrorKind::Value, "same batch dims",
               [&] { _fused_attention(D(q0), D(k3), D(v0), 0.0, false, std::nullopt, 0, 0); });
}

KILN_RANK_SCENARIO(attention_1d) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {world()});
  const Placements R{Replicate()}, S0{Shard(0)}, S1{Shard(1)}, S2{Shard(2)};
  for (bool causal : {false, true}) {
    check(mesh, {S0, S0, S0, S0, causal});
    check(mesh, {S1, S1, S1, S1, causal});
    check(mesh, {S1, S1, S1, S1, causal, /*heads=*/3});  // uneven heads
    check(mesh, {R, R, R, R, causal});
    // A Partial query is reduce-scattered onto the heads of key and value.
    check(mesh, {{Partial()}, S1, S1, S1, causal});
  }
  // Query rows: without is_causal each rank takes its rows, and the key and value gradients are
  // Partial(sum); causal rows need their global index, so the call gathers them.
  check(mesh, {S2, R, S2, {Partial()}, false});
  check(mesh, {S2, R, R, R, true});
  check_dropout_and_errors(mesh);
}

TEST(DTensor, AttentionTwoRanks) { expect_all_pass(run_ranks("attention_1d", 2)); }
TEST(DTensor, AttentionThreeRanksUneven) { expect_all_pass(run_ranks("attention_1d", 3)); }

KILN_RANK_SCENARIO(attention_2x2) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  const Placements R{Replicate(), Replicate()};
  for (bool causal : {false, true}) {
    const Placements a{Shard(0), Shard(1)}, b{Shard(1), Shard(0)}, c{Shard(1), Shard(1)};
    const Placements d{Replicate(), Shard(1)};
    check(mesh, {a, a, a, a, causal});
    check(mesh, {b, b, b, b, causal});
    check(mesh, {c, c, c, c, causal});
    check(mesh, {d, d, d, d, causal, /*heads=*/3});
  }
  const Placements rows{Shard(0), Shard(2)}, batch{Shard(0), Replicate()};
  check(mesh, {rows, batch, rows, {Shard(0), Partial()}, false});
  check_dropout_and_errors(mesh);
}

TEST(DTensor, Attention2x2) { expect_all_pass(run_ranks("attention_2x2", 4)); }

}  // namespace
}  // namespace kiln::testing
