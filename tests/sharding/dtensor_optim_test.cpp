// The fused optimizer rows on DTensors (Note [Optimizer sharding]): SGD with momentum and AdamW
// step each shard where it lies, beside plain parameters, with Shard, Replicate and Partial
// gradients, on 1-d meshes of 2 and 3 ranks (uneven shards) and a 2x2 mesh; every step is
// checked against the same optimizer on the unsharded tensors; one call may hold parameters on
// two meshes.
#include <algorithm>

#include "harness.h"
#include "kiln/dist/dtensor.h"
#include "kiln/kiln.h"
#include "kiln/optim/optimizers.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

using dist::DeviceMesh;
using dist::distribute_tensor;
using dist::DTensor;
using dist::Partial;
using dist::Placements;
using dist::Replicate;
using dist::Shard;

void expect_close(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  EXPECT_LT((a - b).abs().max().item<float>(), 1e-5f) << what;
}

// Runs `steps` of an optimizer made by `make` on a DTensor parameter placed by `param` (its
// gradients placed by `grad`) and a plain one, against the unsharded run.
template <typename Make>
void check(const DeviceMesh& mesh, const Placements& param, const Placements& grad, Make make,
           const std::string& what) {
  manual_seed(7);
  const Tensor w0 = randn({5, 3}), b0 = randn({3});
  std::vector<Tensor> grads;
  for (int s = 0; s < 3; ++s) grads.push_back(randn({5, 3}));
  Tensor w_ref = w0.clone().requires_grad_(true), b_ref = b0.clone().requires_grad_(true);
  Tensor w = Tensor(distribute_tensor(w0, mesh, param)).requires_grad_(true);
  Tensor b = b0.clone().requires_grad_(true);
  auto ref = make(std::vector<Tensor>{w_ref, b_ref});
  auto opt = make(std::vector<Tensor>{w, b});
  dist::clear_fallback_ops();
  for (int s = 0; s < 3; ++s) {
    w_ref.set_grad(grads[s]);
    b_ref.set_grad(grads[s].select(0, 0) * 2.0);
    ref.step();
    w.set_grad(distribute_tensor(grads[s], mesh, grad));
    b.set_grad(grads[s].select(0, 0) * 2.0);
    opt.step();
    expect_close(DTensor(w).full_tensor(), w_ref.detach(), what + " step " + std::to_string(s));
    expect_close(b.detach(), b_ref.detach(), what + " (plain) step " + std::to_string(s));
  }
  EXPECT_EQ(DTensor(w).placements(), param) << what;
  for (const std::string& op : dist::fallback_ops())
    EXPECT_EQ(op.rfind("_fused", 0), std::string::npos) << what << ": " << op << " fell back";
}

void check_all(const DeviceMesh& mesh, const std::vector<Placements>& params,
               const std::vector<Placements>& grads) {
  auto sgd = [](std::vector<Tensor> p) {
    return optim::SGD(std::move(p), {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01});
  };
  auto adamw = [](std::vector<Tensor> p) {
    return optim::AdamW(std::move(p), {.lr = 0.05, .amsgrad = true});
  };
  for (const Placements& p : params)
    for (const Placements& g : grads) {
      const std::string what = dist::placements_str(p) + " grad " + dist::placements_str(g);
      check(mesh, p, g, sgd, "SGD " + what);
      check(mesh, p, g, adamw, "AdamW " + what);
    }
}

KILN_RANK_SCENARIO(optim_1d) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {world()});
  check_all(mesh, {{Shard(0)}, {Shard(1)}, {Replicate()}},
            {{Shard(0)}, {Shard(1)}, {Replicate()}, {Partial()}});
}
TEST(DTensorOptim, TwoRanks) { expect_all_pass(run_ranks("optim_1d", 2)); }
TEST(DTensorOptim, ThreeRanksUneven) { expect_all_pass(run_ranks("optim_1d", 3)); }

KILN_RANK_SCENARIO(optim_2x2) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {2, 2});
  check_all(mesh, {{Shard(0), Shard(1)}, {Replicate(), Shard(0)}},
            {{Shard(0), Shard(1)}, {Partial(), Replicate()}});
}
TEST(DTensorOptim, TwoByTwo) { expect_all_pass(run_ranks("optim_2x2", 4)); }

// Parameters on two meshes in one fused call (FSDP over tensor parallel, Note [FSDP over TP]):
// a 2-d parameter beside one on the "tp" sub-mesh and a plain one.
KILN_RANK_SCENARIO(optim_two_meshes) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  DeviceMesh tp = mesh["tp"];
  manual_seed(3);
  const Tensor w0 = randn({4, 3}), v0 = randn({5}), b0 = randn({2});
  Tensor w_ref = w0.clone().requires_grad_(true), v_ref = v0.clone().requires_grad_(true);
  Tensor b_ref = b0.clone().requires_grad_(true);
  Tensor w = Tensor(distribute_tensor(w0, mesh, {Shard(1), Shard(0)})).requires_grad_(true);
  Tensor v = Tensor(distribute_tensor(v0, tp, {Shard(0)})).requires_grad_(true);
  Tensor b = b0.clone().requires_grad_(true);
  optim::AdamW ref({w_ref, v_ref, b_ref}, {.lr = 0.05});
  optim::AdamW opt({w, v, b}, {.lr = 0.05});
  for (int s = 0; s < 3; ++s) {
    const Tensor gw = randn({4, 3}), gv = randn({5}), gb = randn({2});
    w_ref.set_grad(gw);
    v_ref.set_grad(gv);
    b_ref.set_grad(gb);
    ref.step();
    w.set_grad(distribute_tensor(gw, mesh, {Replicate(), Shard(0)}));
    v.set_grad(distribute_tensor(gv, tp, {Shard(0)}));
    b.set_grad(gb);
    opt.step();
    expect_close(DTensor(w).full_tensor(), w_ref.detach(), "2-d step " + std::to_string(s));
    expect_close(DTensor(v).full_tensor(), v_ref.detach(), "tp step " + std::to_string(s));
    expect_close(b.detach(), b_ref.detach(), "plain step " + std::to_string(s));
  }
  EXPECT_EQ(DTensor(w).placements(), (Placements{Shard(1), Shard(0)}));
  // A gradient on another mesh than its parameter's.
  w.set_grad(distribute_tensor(randn({4, 3}), tp, {Shard(0)}));
  expect_error(ErrorKind::Value, "but its 'grads' is on DeviceMesh", [&] { opt.step(); });
}
TEST(DTensorOptim, TwoMeshes) { expect_all_pass(run_ranks("optim_two_meshes", 4)); }

KILN_RANK_SCENARIO(optim_errors) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {world()});
  Tensor w = Tensor(distribute_tensor(randn({4, 2}), mesh, {Shard(0)})).requires_grad_(true);
  optim::SGD opt({w}, {.lr = 0.1});
  w.set_grad(randn({4, 2}));  // a plain gradient for a DTensor parameter
  expect_error(ErrorKind::Runtime, "is a DTensor but its 'grads' is a plain tensor",
               [&] { opt.step(); });
  Tensor p = randn({4, 2}).requires_grad_(true);
  optim::SGD opt2({p}, {.lr = 0.1});
  p.set_grad(distribute_tensor(randn({4, 2}), mesh, {Shard(0)}));
  expect_error(ErrorKind::Runtime, "is a plain tensor but its 'grads' is a DTensor",
               [&] { opt2.step(); });
}
TEST(DTensorOptim, Errors) { expect_all_pass(run_ranks("optim_errors", 2)); }

}  // namespace
}  // namespace kiln::testing
