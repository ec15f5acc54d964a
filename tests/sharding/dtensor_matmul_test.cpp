// The matmul family (mm, bmm, addmm, matmul, linear) and embedding on DTensors, across processes
// (tests/sharding/harness.h): every combination of input placements on 1-d meshes of 2 and 3
// ranks (3 gives uneven and empty pieces) and on a 2x2 mesh, against the unsharded result; the
// placements the rules choose (Note [Matmul sharding], Note [Embedding sharding]); autograd.
#include <functional>
#include <sstream>

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
using dist::ReduceOp;
using dist::Replicate;
using dist::Shard;

// A DTensor of global value `g` placed by `p` whose Partial(sum|avg) pieces differ between
// ranks: rank j adds noise_j - noise_{j+1 mod n}, which cancels out.
DTensor place(const Tensor& g, const DeviceMesh& mesh, const Placements& p) {
  DTensor d = distribute_tensor(g, mesh, p);
  Tensor local = d.to_local().clone();
  const std::vector<int64_t> c = mesh.coordinate();
  for (size_t i = 0; i < p.size(); ++i) {
    if (!p[i].is_partial() || !is_floating(g.dtype())) continue;
    const int64_t n = mesh.size(static_cast<int64_t>(i));
    auto noise = [&](int64_t j) {
      return random(local.sizes(), g.dtype(), 0, 1, 31 + static_cast<uint32_t>(j));
    };
    local = local + (noise(c[i]) - noise((c[i] + 1) % n));
  }
  return DTensor::from_local(local, mesh, p, DimVector(g.sizes()));
}

// Every placement of a rank-`r` tensor on one mesh dim: Shard of each dim, Replicate, and
// Partial(sum) where `partial`.
std::vector<Placement> each(int64_t r, bool partial = true) {
  std::vector<Placement> ps;
  for (int64_t d = 0; d < r; ++d) ps.push_back(Shard(d));
  ps.push_back(Replicate());
  if (partial) ps.push_back(Partial());
  return ps;
}

// Every list of placements on `mesh` of a rank-`r` tensor.
std::vector<Placements> all_on(const DeviceMesh& mesh, int64_t r, bool partial = true) {
  std::vector<Placements> out{{}};
  for (int64_t i = 0; i < mesh.ndim(); ++i) {
    std::vector<Placements> next;
    for (const Placements& p : out)
      for (const Placement& q : each(r, partial)) {
        next.push_back(p);
        next.back().push_back(q);
      }
    out = std::move(next);
  }
  return out;
}

std::string label(const std::string& what, const std::vector<Placements>& ps) {
  std::ostringstream os;
  os << what;
  for (const Placements& p : ps) os << " " << dist::placements_str(p);
  return os.str();
}

// The result of a DTensor op: its global value and its local piece's shape.
void expect_result(const Tensor& got, const Tensor& want, const DeviceMesh& mesh) {
  ASSERT_TRUE(dist::is_dtensor(got));
  DTensor d(got);
  EXPECT_EQ(d.sizes(), want.sizes());
  EXPECT_EQ(d.to_local().sizes(),
            IntArrayRef(dist::local_shape(want.sizes(), mesh, d.placements())));
  expect_close(d.full_tensor(), want, 1e-5, 1e-5);
}

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// fn on every combination of `options[j]` for input j, against fn on the unsharded inputs.
void sweep(const std::string& what, const DeviceMesh& mesh, const std::vector<Tensor>& inputs,
           const std::vector<std::vector<Placements>>& options, const Fn& fn) {
  const Tensor want = fn(inputs);
  std::vector<size_t> at(inputs.size(), 0);
  while (true) {
    std::vector<Placements> ps;
    std::vector<Tensor> ds;
    for (size_t j = 0; j < inputs.size(); ++j) {
      ps.push_back(options[j][at[j]]);
      ds.push_back(place(inputs[j], mesh, ps.back()));
    }
    {
      SCOPED_TRACE(label(what, ps));
      expect_result(fn(ds), want, mesh);
    }
    size_t j = 0;
    while (j < at.size() && ++at[j] == options[j].size()) at[j++] = 0;
    if (j == at.size()) break;
  }
}

// fn on inputs placed by `ps` gives `want_p`, and the unsharded value.
void expect_placed(const std::string& what, const DeviceMesh& mesh,
                   const std::vector<Tensor>& inputs, const std::vector<Placements>& ps,
                   const Placements& want_p, const Fn& fn) {
  SCOPED_TRACE(label(what, ps));
  std::vector<Tensor> ds;
  for (size_t j = 0; j < inputs.size(); ++j) ds.push_back(place(inputs[j], mesh, ps[j]));
  Tensor got = fn(ds);
  EXPECT_EQ(dist::placements_str(DTensor(got).placements()), dist::placements_str(want_p));
  expect_result(got, fn(inputs), mesh);
}

Tensor mm2(const std::vector<Tensor>& t) { return kiln::mm(t[0], t[1]); }
Tensor bmm2(const std::vector<Tensor>& t) { return kiln::bmm(t[0], t[1]); }
Tensor matmul2(const std::vector<Tensor>& t) { return kiln::matmul(t[0], t[1]); }
Tensor addmm3(const std::vector<Tensor>& t) { return kiln::addmm(t[0], t[1], t[2]); }
Tensor addmm_scaled(const std::vector<Tensor>& t) {
  return kiln::addmm(t[0], t[1], t[2], 0.5, -2.0);
}
Tensor linear2(const std::vector<Tensor>& t) { return kiln::linear(t[0], t[1]); }
Tensor linear3(const std::vector<Tensor>& t) { return kiln::linear(t[0], t[1], t[2]); }

bool is_matmul_or_embedding(const std::string& op) {
  for (const char* n :
       {"mm", "bmm", "addmm", "matmul", "linear", "embedding", "embedding_dense_backward"})
    if (op == n) return true;
  return false;
}

// ---- The matmul family on a 1-d mesh -----------------------------------------------------------

KILN_RANK_SCENARIO(matmul_1d) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {world()});
  dist::clear_fallback_ops();
  const Placements S0{Shard(0)}, S1{Shard(1)}, S2{Shard(2)}, R{Replicate()}, P{Partial()},
      Pavg{Partial(ReduceOp::Avg)};
  auto opts = [&](int64_t r) { return all_on(mesh, r); };
  // Odd sizes: with 3 ranks, 5 rows split 2 + 2 + 1, 7 as 3 + 3 + 1, 2 as 1 + 1 + 0.
  Tensor a = random({5, 7}, kFloat32, -2, 2, 1), b = random({7, 3}, kFloat32, -2, 2, 2);
  sweep("mm", mesh, {a, b}, {opts(2), opts(2)}, mm2);
  Tensor a2 = random({3, 2}, kFloat32, -2, 2, 3), b2 = random({2, 4}, kFloat32, -2, 2, 4);
  sweep("mm small k", mesh, {a2, b2}, {opts(2), opts(2)}, mm2);
  Tensor ba = random({3, 5, 7}, kFloat32, -2, 2, 5), bb = random({3, 7, 4}, kFloat32, -2, 2, 6);
  sweep("bmm", mesh, {ba, bb}, {opts(3), opts(3)}, bmm2);
  Tensor bias1 = random({3}, kFloat32, -2, 2, 7), bias2 = random({5, 3}, kFloat32, -2, 2, 8);
  Tensor bias_row = random({1, 3}, kFloat32, -2, 2, 9);
  sweep("addmm 1-d bias", mesh, {bias1, a, b}, {opts(1), opts(2), opts(2)}, addmm3);
  sweep("addmm 2-d bias", mesh, {bias2, a, b}, {opts(2), opts(2), opts(2)}, addmm3);
  sweep("addmm (1, n) bias", mesh, {bias_row, a, b}, {opts(2), opts(2), opts(2)}, addmm3);
  sweep("addmm beta alpha", mesh, {bias2, a, b}, {opts(2), opts(2), opts(2)}, addmm_scaled);
  // matmul: vector operands, folding, broadcast batch dims.
  Tensor v = random({7}, kFloat32, -2, 2, 10), v3 = random({3}, kFloat32, -2, 2, 11);
  sweep("matmul 1-d @ 2-d", mesh, {v, b}, {opts(1), opts(2)}, matmul2);
  sweep("matmul 2-d @ 1-d", mesh, {b.t().contiguous(), v}, {opts(2), opts(1)}, matmul2);
  sweep("matmul 1-d @ 1-d", mesh, {v, v}, {opts(1), opts(1)}, matmul2);
  sweep("matmul 3-d @ 2-d", mesh, {ba, b}, {opts(3), opts(2)}, matmul2);
  sweep("matmul 2-d @ 3-d", mesh, {a, bb}, {opts(2), opts(3)}, matmul2);
  Tensor c4 = random({2, 1, 5, 7}, kFloat32, -2, 2, 12);
  sweep("matmul broadcast", mesh, {c4, bb}, {opts(4), opts(3)}, matmul2);
  sweep("matmul 3-d @ 1-d", mesh, {bb.transpose(1, 2).contiguous(), v}, {opts(3), opts(1)},
        matmul2);
  // linear: weight (out, in), a 3-d input, with and without bias.
  Tensor x3 = random({2, 3, 7}, kFloat32, -2, 2, 13), w = random({5, 7}, kFloat32, -2, 2, 14);
  Tensor lb = random({5}, kFloat32, -2, 2, 15);
  sweep("linear", mesh, {x3, w}, {opts(3), opts(2)}, linear2);
  sweep("linear bias", mesh, {x3, w, lb}, {opts(3), opts(2), opts(1)}, linear3);
  sweep("linear 1-d input", mesh, {v, w, lb}, {opts(1), opts(2), opts(1)}, linear3);
  // The placements chosen (Note [Matmul sharding]).
  expect_placed("mm", mesh, {a, b}, {S0, R}, S0, mm2);
  expect_placed("mm", mesh, {a, b}, {R, S1}, S1, mm2);
  expect_placed("mm", mesh, {a, b}, {S1, S0}, P, mm2);
  expect_placed("mm", mesh, {a, b}, {R, R}, R, mm2);
  expect_placed("mm", mesh, {a, b}, {P, R}, P, mm2);
  expect_placed("mm", mesh, {a, b}, {R, P}, P, mm2);
  expect_placed("mm", mesh, {a, b}, {Pavg, R}, Pavg, mm2);
  expect_placed("mm", mesh, {a2, b2}, {S1, S0}, P, mm2);  // a rank with no k
  expect_placed("bmm", mesh, {ba, bb}, {S0, S0}, S0, bmm2);
  expect_placed("bmm", mesh, {ba, bb}, {S2, S1}, P, bmm2);
  expect_placed("bmm", mesh, {ba, bb}, {S1, R}, S1, bmm2);
  expect_placed("bmm", mesh, {ba, bb}, {R, S2}, S2, bmm2);
  expect_placed("addmm", mesh, {bias1, a, b}, {R, S1, S0}, P, addmm3);  // bias added once
  expect_placed("addmm", mesh, {bias1, a, b}, {S0, R, S1}, S1, addmm3);
  expect_placed("addmm", mesh, {bias2, a, b}, {S0, S0, R}, S0, addmm3);
  expect_placed("addmm", mesh, {bias2, a, b}, {P, R, R}, P, addmm3);
  expect_placed("addmm", mesh, {bias2, a, b}, {P, R, R}, P, addmm_scaled);
  expect_placed("matmul", mesh, {c4, bb}, {R, S0}, {Shard(1)}, matmul2);
  expect_placed("matmul", mesh, {ba, b}, {S0, R}, S0, matmul2);
  expect_placed("matmul", mesh, {v, v}, {S0, S0}, P, matmul2);
  // ColwiseParallel and RowwiseParallel.
  expect_placed("linear colwise", mesh, {x3, w, lb}, {R, S0, S0}, S2, linear3);
  expect_placed("linear rowwise", mesh, {x3, w, lb}, {S2, S1, R}, P, linear3);
  expect_placed("linear", mesh, {x3, w}, {S0, R}, S0, linear2);
  // A plain 0-d bias cannot be Partial: the product is gathered instead.
  Tensor r = kiln::addmm(full({}, 1.5), place(a, mesh, S1), place(b, mesh, S0));
  EXPECT_EQ(dist::placements_str(DTensor(r).placements()), "[Replicate()]");
  expect_result(r, kiln::addmm(full({}, 1.5), a, b), mesh);
  // The decision is cached.
  const auto before = dist::dispatch_stats();
  DTensor l = place(a, mesh, S0), m = place(b, mesh, R);
  for (int i = 0; i < 3; ++i) (void)kiln::mm(l, m);
  EXPECT_EQ(dist::dispatch_stats().misses, before.misses);
  EXPECT_TRUE(dist::fallback_ops().empty()) << dist::fallback_ops()[0];
}

TEST(DTensorMatmul, TwoRanks) {
  expect_all_pass(run_ranks("matmul_1d", 2, std::chrono::seconds(240)));
}
TEST(DTensorMatmul, ThreeRanksUneven) {
  expect_all_pass(run_ranks("matmul_1d", 3, std::chrono::seconds(240)));
}

// ---- The matmul family on a 2x2 mesh ------------------------------------------------------------

KILN_RANK_SCENARIO(matmul_2x2) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  dist::clear_fallback_ops();
  Tensor a = random({5, 7}, kFloat32, -2, 2, 1), b = random({7, 3}, kFloat32, -2, 2, 2);
  sweep("mm", mesh, {a, b}, {all_on(mesh, 2), all_on(mesh, 2)}, mm2);
  Tensor ba = random({3, 5, 3}, kFloat32, -2, 2, 5), bb = random({3, 3, 4}, kFloat32, -2, 2, 6);
  const std::vector<Placements> some3 = {{Shard(0), Shard(1)},    {Shard(2), Shard(0)},
                                         {Replicate(), Shard(2)}, {Partial(), Shard(1)},
                                         {Shard(1), Shard(1)},    {Replicate(), Replicate()}};
  sweep("bmm", mesh, {ba, bb}, {some3, some3}, bmm2);
  Tensor x = random({4, 7}, kFloat32, -2, 2, 13), w = random({5, 7}, kFloat32, -2, 2, 14);
  Tensor lb = random({5}, kFloat32, -2, 2, 15);
  const std::vector<Placements> xs = {{Replicate(), Replicate()},
                                      {Shard(0), Replicate()},
                                      {Shard(0), Shard(1)},
                                      {Replicate(), Shard(1)},
                                      {Partial(), Replicate()}};
  sweep("linear bias", mesh, {x, w, lb}, {xs, all_on(mesh, 2), all_on(mesh, 1)}, linear3);
  sweep("addmm", mesh, {lb, x, w.t().contiguous()}, {all_on(mesh, 1), xs, all_on(mesh, 2)}, addmm3);
  // Each mesh dim on its own: (dp, tp).
  const Placement S0 = Shard(0), S1 = Shard(1), R = Replicate(), P = Partial();
  expect_placed("mm", mesh, {a, b}, {{S0, R}, {R, S1}}, {S0, S1}, mm2);
  expect_placed("mm", mesh, {a, b}, {{S1, S0}, {S0, R}}, {P, S0}, mm2);
  expect_placed("mm", mesh, {a, b}, {{S0, S0}, {R, R}}, {S0, S0}, mm2);
  expect_placed("mm", mesh, {a, b}, {{S1, S1}, {S0, S0}}, {P, P}, mm2);
  expect_placed("linear", mesh, {x, w, lb}, {{S0, R}, {R, S0}, {R, S0}}, {S0, S1}, linear3);
  expect_placed("linear", mesh, {x, w, lb}, {{S0, S1}, {R, S1}, {R, R}}, {S0, P}, linear3);
  EXPECT_TRUE(dist::fallback_ops().empty()) << dist::fallback_ops()[0];
}

TEST(DTensorMatmul, TwoByTwo) {
  expect_all_pass(run_ranks("matmul_2x2", 4, std::chrono::seconds(300)));
}

// ---- Embedding ----------------------------------------------------------------------------------

Tensor indices_2x5() { return from_vector<int64_t>({3, 0, 6, 3, 1, 5, 3, 2, 6, 4}, {2, 5}); }

KILN_RANK_SCENARIO(embedding_1d) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {world()});
  dist::clear_fallback_ops();
  const Placements S0{Shard(0)}, S1{Shard(1)}, S2{Shard(2)}, R{Replicate()}, P{Partial()};
  Tensor weight = random({7, 5}, kFloat32, -2, 2, 1), idx = indices_2x5();
  Tensor idx1 = from_vector<int64_t>({1, 0, 1, 1}, {4});
  auto emb = [](int64_t pad) {
    return [pad](const std::vector<Tensor>& t) { return kiln::embedding(t[0], t[1], pad); };
  };
  const std::vector<Placements> ws = all_on(mesh, 2), is = all_on(mesh, 2, false);
  sweep("embedding", mesh, {weight, idx}, {ws, is}, emb(-1));
  sweep("embedding padding_idx", mesh, {weight, idx}, {ws, is}, emb(3));
  // Two rows over 3 ranks: the last rank holds none.
  Tensor w2 = random({2, 5}, kFloat32, -2, 2, 2);
  sweep("embedding 2 rows", mesh, {w2, idx1}, {ws, all_on(mesh, 1, false)}, emb(-1));
  expect_placed("embedding rows", mesh, {weight, idx}, {S0, R}, P, emb(3));
  expect_placed("embedding columns", mesh, {weight, idx}, {S1, R}, S2, emb(-1));
  expect_placed("embedding positions", mesh, {weight, idx}, {R, S1}, S1, emb(-1));
  expect_placed("embedding partial", mesh, {weight, idx}, {P, R}, P, emb(-1));
  expect_placed("embedding 2 rows", mesh, {w2, idx1}, {S0, R}, P, emb(-1));
  // The dense backward by itself, with padding_idx and scale_grad_by_freq.
  Tensor grad = random({2, 5, 4}, kFloat32, -2, 2, 3);
  for (int64_t pad : {-1, 3})
    for (bool scale : {false, true}) {
      Fn back = [pad, scale](const std::vector<Tensor>& t) {
        return kiln::embedding_dense_backward(t[0], t[1], 7, pad, scale);
      };
      const std::string what =
          "embedding_dense_backward pad " + std::to_string(pad) + (scale ? " scaled" : "");
      sweep(what, mesh, {grad, idx}, {all_on(mesh, 3), is}, back);
      expect_placed(what, mesh, {grad, idx}, {R, R}, S0, back);  // each rank its rows
      expect_placed(what, mesh, {grad, idx}, {S2, R}, S1, back);
      expect_placed(what, mesh, {grad, idx}, {S0, S0}, scale ? S0 : P, back);
    }
  EXPECT_TRUE(dist::fallback_ops().empty()) << dist::fallback_ops()[0];
}

TEST(DTensorEmbedding, TwoRanks) {
  expect_all_pass(run_ranks("embedding_1d", 2, std::chrono::seconds(240)));
}
TEST(DTensorEmbedding, ThreeRanksUneven) {
  expect_all_pass(run_ranks("embedding_1d", 3, std::chrono::seconds(240)));
}

KILN_RANK_SCENARIO(embedding_2x2) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  dist::clear_fallback_ops();
  Tensor weight = random({7, 5}, kFloat32, -2, 2, 1), idx = indices_2x5();
  Fn emb = [](const std::vector<Tensor>& t) { return kiln::embedding(t[0], t[1], 3); };
  sweep("embedding", mesh, {weight, idx}, {all_on(mesh, 2), all_on(mesh, 2, false)}, emb);
  const Placement S0 = Shard(0), S1 = Shard(1), S2 = Shard(2), R = Replicate(), P = Partial();
  expect_placed("embedding", mesh, {weight, idx}, {{S0, S1}, {R, R}}, {P, S2}, emb);
  expect_placed("embedding", mesh, {weight, idx}, {{S0, S0}, {R, R}}, {P, P}, emb);
  expect_placed("embedding", mesh, {weight, idx}, {{R, S0}, {S0, R}}, {S0, P}, emb);
  Tensor grad = random({2, 5, 4}, kFloat32, -2, 2, 3);
  Fn back = [](const std::vector<Tensor>& t) {
    return kiln::embedding_dense_backward(t[0], t[1], 7, 3, false);
  };
  sweep("embedding_dense_backward", mesh, {grad, idx}, {all_on(mesh, 3), all_on(mesh, 2, false)},
        back);
  expect_placed("embedding_dense_backward", mesh, {grad, idx}, {{R, R}, {R, R}}, {S0, S0}, back);
  EXPECT_TRUE(dist::fallback_ops().empty()) << dist::fallback_ops()[0];
}

TEST(DTensorEmbedding, TwoByTwo) {
  expect_all_pass(run_ranks("embedding_2x2", 4, std::chrono::seconds(300)));
}

// ---- Autograd
// ------------------------------------------------------------------------------------

// The gradients of sum(fn(inputs) * g) with respect to every input, unsharded.
std::vector<Tensor> reference_grads(const std::vector<Tensor>& inputs, const Tensor& g,
                                    const Fn& fn) {
  std::vector<Tensor> leaves;
  for (const Tensor& t : inputs) leaves.push_back(t.clone().requires_grad_());
  (fn(leaves) * g).sum().backward();
  std::vector<Tensor> grads;
  for (const Tensor& t : leaves) grads.push_back(t.grad());
  return grads;
}

// Runs sum(fn(inputs placed by ps).full_tensor() * g) backward, checks every gradient's value,
// and returns the gradients.
std::vector<DTensor> check_grads(const std::string& what, const DeviceMesh& mesh,
                                 const std::vector<Tensor>& inputs,
                                 const std::vector<Placements>& ps, const Tensor& g, const Fn& fn) {
  SCOPED_TRACE(label(what, ps));
  std::vector<Tensor> ds;
  for (size_t j = 0; j < inputs.size(); ++j) {
    ds.push_back(place(inputs[j], mesh, ps[j]));
    ds.back().requires_grad_();
  }
  (DTensor(fn(ds)).full_tensor() * g).sum().backward();
  const std::vector<Tensor> want = reference_grads(inputs, g, fn);
  std::vector<DTensor> grads;
  for (size_t j = 0; j < inputs.size(); ++j) {
    EXPECT_TRUE(ds[j].grad().defined());
    if (!ds[j].grad().defined()) continue;
    grads.emplace_back(ds[j].grad());
    expect_close(grads.back().full_tensor(), want[j], 1e-5, 1e-5);
  }
  return grads;
}

// Gradient placements are checked where every op on the way has a rule: matmul and linear
// decompose into views (and sum_to for a bias) under autograd, whose rules are not this file's
// (Note [Matmul sharding]). The matmul family and embedding themselves never fall back.
bool all_ruled() {
  for (const std::string& op : dist::fallback_ops()) {
    EXPECT_FALSE(is_matmul_or_embedding(op)) << op << " took the replicate path";
  }
  return dist::fallback_ops().empty();
}

void expect_placements(const DTensor& t, const Placements& want) {
  EXPECT_EQ(dist::placements_str(t.placements()), dist::placements_str(want));
}

KILN_RANK_SCENARIO(matmul_autograd) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {world()});
  const Placements S0{Shard(0)}, S1{Shard(1)}, R{Replicate()};
  Tensor x = random({4, 7}, kFloat32, -2, 2, 1), w = random({5, 7}, kFloat32, -2, 2, 2);
  Tensor b = random({5}, kFloat32, -2, 2, 3), g = random({4, 5}, kFloat32, -2, 2, 4);
  Tensor m = random({7, 5}, kFloat32, -2, 2, 5);
  dist::clear_fallback_ops();
  auto col = check_grads("linear colwise", mesh, {x, w, b}, {R, S0, S0}, g, linear3);
  if (all_ruled()) {
    expect_placements(col[1], S0);  // the weight's gradient is sharded as the weight
    expect_placements(col[2], S0);
  }
  dist::clear_fallback_ops();
  auto row = check_grads("linear rowwise", mesh, {x, w, b}, {S1, S1, R}, g, linear3);
  if (all_ruled()) expect_placements(row[1], S1);
  dist::clear_fallback_ops();
  auto mmg = check_grads("mm", mesh, {x, m}, {S0, R}, g, mm2);
  if (all_ruled()) {
    expect_placements(mmg[0], S0);
    expect_placements(mmg[1], Placements{Partial()});  // summed over the rows of each rank
  }
  dist::clear_fallback_ops();
  check_grads("mm k", mesh, {x, m}, {S1, S0}, g, mm2);
  check_grads("matmul", mesh, {x, m}, {R, S1}, g, matmul2);
  Tensor ba = random({3, 4, 7}, kFloat32, -2, 2, 6), bb = random({3, 7, 5}, kFloat32, -2, 2, 7);
  check_grads("bmm", mesh, {ba, bb}, {S0, S0}, random({3, 4, 5}, kFloat32, -2, 2, 8), bmm2);
  check_grads("addmm", mesh, {b, x, m}, {S0, R, S1}, g, addmm3);
  all_ruled();
}

TEST(DTensorMatmul, Autograd) {
  expect_all_pass(run_ranks("matmul_autograd", 2, std::chrono::seconds(120)));
}
TEST(DTensorMatmul, AutogradThreeRanks) {
  expect_all_pass(run_ranks("matmul_autograd", 3, std::chrono::seconds(120)));
}

KILN_RANK_SCENARIO(embedding_autograd) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {world()});
  const Placements S0{Shard(0)}, S1{Shard(1)}, R{Replicate()};
  Tensor weight = random({7, 4}, kFloat32, -2, 2, 1), idx = indices_2x5();
  Tensor g = random({2, 5, 4}, kFloat32, -2, 2, 2);
  dist::clear_fallback_ops();
  for (int64_t pad : {-1, 3}) {
    // The indices are not differentiable: only the weight requires grad.
    auto grad_of = [&](const Placements& wp, const Placements& ip) {
      DTensor w = place(weight, mesh, wp);
      w.requires_grad_();
      DTensor i = place(idx, mesh, ip);
      (DTensor(kiln::embedding(w, i, pad)).full_tensor() * g).sum().backward();
      Tensor ref = weight.clone().requires_grad_();
      (kiln::embedding(ref, idx, pad) * g).sum().backward();
      SCOPED_TRACE(label("embedding backward pad " + std::to_string(pad), {wp, ip}));
      expect_close(DTensor(w.grad()).full_tensor(), ref.grad(), 1e-5, 1e-5);
      return DTensor(w.grad());
    };
    expect_placements(grad_of(S0, R), S0);                     // rows: each rank its rows
    expect_placements(grad_of(S1, R), S1);                     // columns
    expect_placements(grad_of(R, S0), Placements{Partial()});  // positions: summed
    grad_of(S0, S1);
    grad_of(R, R);
  }
  EXPECT_TRUE(dist::fallback_ops().empty()) << dist::fallback_ops()[0];
}

TEST(DTensorEmbedding, Autograd) {
  expect_all_pass(run_ranks("embedding_autograd", 2, std::chrono::seconds(120)));
}
TEST(DTensorEmbedding, AutogradThreeRanks) {
  expect_all_pass(run_ranks("embedding_autograd", 3, std::chrono::seconds(120)));
}

}  // namespace
}  // namespace kiln::testing
