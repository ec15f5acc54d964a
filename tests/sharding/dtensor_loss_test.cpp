// The DTensor loss sharding rule across processes (See Note [Loss sharding]): cross_entropy with
// class indices on 1-d meshes of 2 and 3 ranks (7 rows: uneven pieces; 2 rows on 3 ranks: an
// empty piece) and on a 2x2 mesh. The losses (reduction none, mean and sum, with and without
// class weights, with ignore_index hits and label_smoothing) and the logits' gradients through
// autograd are checked in float64 against one process, and the placements against the ones the
// rule promises: a batch shard of the logits or the targets stays a batch shard of the losses
// and of the gradient, with no op of the loss taking the replicate path.
#include <optional>
#include <string>
#include <vector>

#include "harness.h"
#include "kiln/dist/dtensor.h"
#include "kiln/kiln.h"
#include "kiln/nn/functional.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

namespace F = kiln::nn::functional;
using dist::DeviceMesh;
using dist::distribute_tensor;
using dist::DTensor;
using dist::Partial;
using dist::Placements;
using dist::Replicate;
using dist::Shard;

constexpr int64_t kClasses = 5;
constexpr double kTol = 1e-10;

// The placements of the logits and the targets, and those the rule gives the losses (and the
// logits' gradient: the targets' dims are the logits' sample dims).
struct Case {
  Placements input, target, out;
};

// Targets of `n` rows in [0, kClasses), with `ignore` in every third row.
Tensor targets(int64_t n, int64_t ignore, uint32_t seed) {
  Tensor t = random({n}, kInt64, 0, kClasses, seed);
  for (int64_t i = 1; i < n; i += 3) static_cast<int64_t*>(t.data_ptr())[i] = ignore;
  return t;
}

void expect_placed(const Tensor& t, const Placements& want, const Tensor& full) {
  DTensor d(t);
  EXPECT_EQ(dist::placements_str(d.placements()), dist::placements_str(want));
  expect_close(d.full_tensor(), full, kTol, kTol);
}

bool batch_sharded(const Placements& p) {
  for (const auto& q : p)
    if (q.is_shard()) return true;
  return false;
}

void check_cross_entropy(const DeviceMesh& mesh, int64_t n, const std::vector<Case>& cases) {
  dist::clear_fallback_ops();
  const Tensor logits = random({n, kClasses}, kFloat64, -3, 3, 51);
  const Tensor w = random({kClasses}, kFloat64, 0.5, 2, 52);
  const Tensor c = random({n}, kFloat64, -1, 1, 53);  // weighs the per-sample losses
  const Placements R(mesh.ndim(), Replicate());
  const DTensor dw = distribute_tensor(w, mesh, R), dc = distribute_tensor(c, mesh, R);
  struct Options {
    int64_t ignore_index;
    double label_smoothing;
  };
  for (const Case& k : cases) {
    for (const Options o : {Options{-100, 0.0}, Options{1, 0.2}, Options{-100, 0.1}}) {
      const Tensor t = targets(n, o.ignore_index, 54);
      const DTensor dt = distribute_tensor(t, mesh, k.target);
      for (const char* red : {"none", "mean", "sum"}) {
        for (bool weighted : {false, true}) {
          SCOPED_TRACE(std::string(red) + (weighted ? " weighted" : "") + " ignore_index " +
                       std::to_string(o.ignore_index) + " label_smoothing " +
                       std::to_string(o.label_smoothing) + " input " +
                       dist::placements_str(k.input) + " target " + dist::placements_str(k.target));
          const std::optional<Tensor> ww = weighted ? std::optional<Tensor>(w) : std::nullopt;
          const std::optional<Tensor> dww = weighted ? std::optional<Tensor>(dw) : std::nullopt;
          Tensor x0 = logits.clone().requires_grad_();
          Tensor want = F::cross_entropy(x0, t, ww, red, o.ignore_index, o.label_smoothing);
          const bool none = std::string(red) == "none";
          (none ? (want * c).sum() : want).backward();
          DTensor x = distribute_tensor(logits, mesh, k.input);
          x.requires_grad_();
          const int64_t replicated = dist::dispatch_stats().replicated;
          Tensor got = F::cross_entropy(x, dt, dww, red, o.ignore_index, o.label_smoothing);
          if (none) {
            expect_placed(got, k.out, want);
          } else {
            expect_close(DTensor(got).full_tensor(), want, kTol, kTol);
          }
          (none ? (got * dc).sum() : got).backward();
          if (batch_sharded(k.input) && batch_sharded(k.target))
            EXPECT_EQ(dist::dispatch_stats().replicated, replicated)
                << "an op of the loss took the replicate path";
          const Tensor g = x.grad();
          ASSERT_TRUE(g.defined());
          if (batch_sharded(k.out) && k.input == k.out) {
            expect_placed(g, k.out, x0.grad());
          } else {
            expect_close(DTensor(g).full_tensor(), x0.grad(), kTol, kTol);
          }
        }
      }
    }
  }
  // The fused rows themselves, and the backward row with a Partial grad (linear in grad).
  const Tensor t = targets(n, -100, 55), gr = random({n}, kFloat64, -1, 1, 56);
  for (const Case& k : cases) {
    SCOPED_TRACE("rows: input " + dist::placements_str(k.input) + " target " +
                 dist::placements_str(k.target));
    const DTensor x = distribute_tensor(logits, mesh, k.input);
    const DTensor dt = distribute_tensor(t, mesh, k.target);
    expect_placed(cross_entropy_indices(x, dt, std::optional<Tensor>(dw), -100, 0.1), k.out,
                  cross_entropy_indices(logits, t, w, -100, 0.1));
    expect_placed(cross_entropy_indices_backward(distribute_tensor(gr, mesh, k.target), x, dt,
                                                 std::optional<Tensor>(dw), -100, 0.1),
                  k.out, cross_entropy_indices_backward(gr, logits, t, w, -100, 0.1));
  }
  Placements P = R;
  P[0] = Partial();
  expect_placed(cross_entropy_indices_backward(
                    distribute_tensor(gr, mesh, P), distribute_tensor(logits, mesh, R),
                    distribute_tensor(t, mesh, R), std::nullopt, -100, 0.0),
                P, cross_entropy_indices_backward(gr, logits, t, std::nullopt, -100, 0.0));
  // A Partial input is reduce-scattered onto the batch dim (the loss is not linear in it).
  Placements S0 = R;
  S0[0] = Shard(0);
  expect_placed(cross_entropy_indices(distribute_tensor(logits, mesh, P),
                                      distribute_tensor(t, mesh, R), std::nullopt, -100, 0.0),
                S0, cross_entropy_indices(logits, t, std::nullopt, -100, 0.0));
  // Class-sharded weights are gathered.
  Placements W = R;
  W[0] = Shard(0);
  expect_placed(
      cross_entropy_indices(distribute_tensor(logits, mesh, S0), distribute_tensor(t, mesh, S0),
                            std::optional<Tensor>(distribute_tensor(w, mesh, W)), -100, 0.0),
      S0, cross_entropy_indices(logits, t, w, -100, 0.0));
  // (N, C, d): the composite views the logits to (N d, C) first.
  const Tensor x3 = random({n, kClasses, 3}, kFloat64, -3, 3, 57);
  const Tensor t3 = random({n, 3}, kInt64, 0, kClasses, 58);
  for (const char* red : {"none", "mean"}) {
    SCOPED_TRACE(std::string("(N, C, d) ") + red);
    Tensor got = F::cross_entropy(distribute_tensor(x3, mesh, S0), distribute_tensor(t3, mesh, S0),
                                  std::nullopt, red, -100, 0.1);
    expect_close(DTensor(got).full_tensor(), F::cross_entropy(x3, t3, std::nullopt, red, -100, 0.1),
                 kTol, kTol);
  }
  for (const std::string& op : dist::fallback_ops())
    EXPECT_EQ(op.find("cross_entropy"), std::string::npos) << op << " fell back";
}

std::vector<Case> cases_1d() {
  return {
      {{Shard(0)}, {Shard(0)}, {Shard(0)}},       {{Shard(0)}, {Replicate()}, {Shard(0)}},
      {{Replicate()}, {Shard(0)}, {Shard(0)}},    {{Shard(1)}, {Shard(0)}, {Shard(0)}},
      {{Shard(1)}, {Replicate()}, {Replicate()}}, {{Replicate()}, {Replicate()}, {Replicate()}}};
}

KILN_RANK_SCENARIO(loss_1d) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {world()});
  // 7 rows: 4 + 3 on 2 ranks, 3 + 3 + 1 on 3; 2 rows on 3 ranks: 1 + 1 + 0 (an empty piece).
  check_cross_entropy(mesh, 7, cases_1d());
  check_cross_entropy(mesh, 2, cases_1d());
}

TEST(DTensorLoss, CrossEntropyTwoRanks) { expect_all_pass(run_ranks("loss_1d", 2)); }
TEST(DTensorLoss, ThreeRanksUneven) { expect_all_pass(run_ranks("loss_1d", 3)); }

KILN_RANK_SCENARIO(loss_2x2) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  const Placements R{Replicate(), Replicate()};
  const std::vector<Case> cases = {
      {{Shard(0), Shard(0)}, {Shard(0), Shard(0)}, {Shard(0), Shard(0)}},
      {{Shard(0), Replicate()}, {Replicate(), Shard(0)}, {Shard(0), Shard(0)}},
      {{Shard(1), Shard(0)}, {Shard(0), Shard(0)}, {Shard(0), Shard(0)}},
      {{Replicate(), Shard(1)}, {Shard(0), Replicate()}, {Shard(0), Replicate()}},
      {{Shard(0), Shard(1)}, {Shard(0), Replicate()}, {Shard(0), Replicate()}},
      {R, R, R}};
  check_cross_entropy(mesh, 7, cases);
}

TEST(DTensorLoss, TwoByTwo) { expect_all_pass(run_ranks("loss_2x2", 4)); }

}  // namespace
}  // namespace kiln::testing
