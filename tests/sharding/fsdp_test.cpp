// FSDP (kiln/dist/fsdp.h) across processes (tests/sharding/harness.h): an MLP whose blocks and
// root are fully_shard-ed trains on 2 and 3 ranks (uneven shards) exactly as single-process
// training on the full batch does; the parameters are Shard(0) DTensors holding about 1/N of
// the model; the gathered parameters are freed after backward; gradient accumulation with
// set_requires_gradient_sync(false); FSDPParamGroup directly; bad input; per-rank memory by the
// allocator's statistics; a rank killed mid-step; prefetch counts; reshard_after_forward=k.
#include "kiln/dist/fsdp.h"

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <variant>

#include "harness.h"
#include "kiln/allocator.h"
#include "kiln/dist/tensor_parallel.h"
#include "kiln/kiln.h"
#include "kiln/nn/nn.h"
#include "kiln/optim/optim.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

using dist::DeviceMesh;
using dist::DTensor;
using dist::FSDPParamGroup;
using dist::Shard;

std::shared_ptr<nn::Sequential> mlp(uint64_t seed) {
  manual_seed(seed);
  return std::make_shared<nn::Sequential>(
      std::vector<nn::ModulePtr>{std::make_shared<nn::Linear>(7, 13), std::make_shared<nn::Tanh>(),
                                 std::make_shared<nn::Linear>(13, 5)});
}

// The model with each Linear and then the whole fully_shard-ed.
std::shared_ptr<dist::FullyShardedModule> sharded_mlp(uint64_t seed, const DeviceMesh& mesh) {
  auto net = mlp(seed);
  for (const char* name : {"0", "2"})
    net->replace_module(name, dist::fully_shard(net->child(name), mesh));
  return dist::fully_shard(net, mesh);
}

Tensor rows(const Tensor& t, int64_t per_rank) {
  return t.narrow(0, rank() * per_rank, per_rank).contiguous();
}

void expect_matches(const std::shared_ptr<dist::FullyShardedModule>& model,
                    const std::shared_ptr<nn::Sequential>& ref, bool grads) {
  auto got = model->parameters();
  auto want = ref->parameters();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(dist::is_dtensor(got[i]));
    EXPECT_EQ(DTensor(got[i]).placements(), dist::Placements{Shard(0)});
    if (grads) {
      ASSERT_TRUE(got[i].grad().defined()) << "parameter " << i;
      EXPECT_EQ(DTensor(got[i].grad()).placements(), dist::Placements{Shard(0)});
      expect_close(DTensor(got[i].grad()).full_tensor(), want[i].grad(), 1e-5, 1e-7);
    } else {
      expect_close(DTensor(got[i]).full_tensor(), want[i].detach(), 1e-5, 1e-7);
    }
  }
}

KILN_RANK_SCENARIO(fsdp_mlp_training) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {world()});
  auto ref = mlp(3);
  auto model = sharded_mlp(3, mesh);
  // About 1/N of the parameters on each rank.
  int64_t local = 0, whole = 0;
  for (const Tensor& p : model->parameters()) local += DTensor(p).to_local().numel();
  for (const Tensor& p : ref->parameters()) whole += p.numel();
  EXPECT_LE(local, whole / world() + 13 + 5 + 7);
  optim::SGD ropt(ref->parameters(), {.lr = 0.1});
  optim::SGD fopt(model->parameters(), {.lr = 0.1});
  const int64_t per = 4;
  dist::fsdp_gather_stats(/*reset=*/true);
  for (int step = 0; step < 6; ++step) {
    Tensor x = random({per * world(), 7}, kFloat32, -1, 1, 10 + step);
    Tensor y = random({per * world(), 5}, kFloat32, -1, 1, 50 + step);
    ropt.zero_grad();
    mse_loss(ref->forward(x), y).backward();
    ropt.step();
    fopt.zero_grad();
    mse_loss(model->forward(rows(x, per)), rows(y, per)).backward();
    expect_matches(model, ref, true);
    // After backward only the shards remain: the blocks' gathered parameters are freed.
    auto block = std::dynamic_pointer_cast<dist::FullyShardedModule>(
        std::static_pointer_cast<nn::Sequential>(model->module())->child("0"));
    ASSERT_TRUE(block);
    EXPECT_FALSE(block->param_group()->is_unsharded());
    for (const Tensor& f : block->param_group()->unsharded_params())
      EXPECT_EQ(f.impl()->storage()->nbytes(), 0u);
    fopt.step();
  }
  // See Note [FSDP prefetch]. Each step gathers blocks 0 and 2 for forward and again for backward
  // (the root holds no parameter of its own). The first forward records the order; from then on
  // forward prefetches blocks 0 and 2, and every backward prefetches block 0 (the parity above
  // shows that no stale prefetch is used).
  const dist::FSDPGatherStats gs = dist::fsdp_gather_stats();
  EXPECT_EQ(gs.count, 6 * 4);
  EXPECT_EQ(gs.prefetched, 1 + 5 * 3);
  EXPECT_GE(gs.hidden_fraction(), 0.0);
  EXPECT_LE(gs.hidden_fraction(), 1.0);
  expect_matches(model, ref, false);
}
TEST(Fsdp, MlpTrainingTwoRanks) { expect_all_pass(run_ranks("fsdp_mlp_training", 2)); }
TEST(Fsdp, MlpTrainingThreeRanksUneven) { expect_all_pass(run_ranks("fsdp_mlp_training", 3)); }

KILN_RANK_SCENARIO(fsdp_accumulation) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {world()});
  auto ref = mlp(4);
  auto model = sharded_mlp(4, mesh);
  const int64_t per = 3;
  Tensor x1 = random({per * world(), 7}, kFloat32, -1, 1, 1);
  Tensor y1 = random({per * world(), 5}, kFloat32, -1, 1, 2);
  Tensor x2 = random({per * world(), 7}, kFloat32, -1, 1, 3);
  Tensor y2 = random({per * world(), 5}, kFloat32, -1, 1, 4);
  model->set_requires_gradient_sync(false);
  mse_loss(model->forward(rows(x1, per)), rows(y1, per)).backward();
  for (const Tensor& p : model->parameters()) EXPECT_FALSE(p.grad().defined());
  model->set_requires_gradient_sync(true);
  mse_loss(model->forward(rows(x2, per)), rows(y2, per)).backward();
  (mse_loss(ref->forward(x1), y1) + mse_loss(ref->forward(x2), y2)).backward();
  expect_matches(model, ref, true);
}
TEST(Fsdp, GradientAccumulation) { expect_all_pass(run_ranks("fsdp_accumulation", 3)); }

KILN_RANK_SCENARIO(fsdp_param_group) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {world()});
  Tensor w = random({5, 3}, kFloat32, -1, 1, 7), b = random({5}, kFloat32, -1, 1, 8);
  auto group = FSDPParamGroup::create({w.clone().requires_grad_(), b.clone().requires_grad_()},
                                      mesh, {}, {"w", "b"});
  Tensor x = random({2, 3}, kFloat32, -1, 1, 20 + rank());  // each rank's own batch
  auto full = group->unshard();
  expect_close(full[0], w);
  expect_close(full[1], b);
  Tensor loss = linear(x, full[0], full[1]).sum();
  group->reshard();
  EXPECT_EQ(full[0].impl()->storage()->nbytes(), 0u);
  group->pre_backward();
  expect_close(full[0], w);
  loss.backward();
  // The mean over the ranks of each rank's gradient: x summed over its rows, per rank.
  Tensor xs = zeros({3});
  for (int q = 0; q < world(); ++q)
    xs = xs + random({2, 3}, kFloat32, -1, 1, 20 + q).sum(std::vector<int64_t>{0});
  Tensor want_w = (xs / static_cast<double>(world())).unsqueeze(0).expand({5, 3}).contiguous();
  expect_close(DTensor(group->sharded_params()[0].grad()).full_tensor(), want_w);
  expect_close(DTensor(group->sharded_params()[1].grad()).full_tensor(), full_like(b, 2.0));
  // Bad input.
  Tensor d = group->sharded_params()[0];
  expect_error(ErrorKind::Value, "parameter 'd' is already a DTensor on the FSDP mesh",
               [&] { FSDPParamGroup::create({d}, mesh, {}, {"d"}); });
  DeviceMesh other = dist::init_device_mesh("cpu", {world()}, {"other"});
  Tensor o = dist::distribute_tensor(ones({4, 2}), other, {Shard(0)});
  expect_error(ErrorKind::Value,
               "parameter 'o' is already a DTensor on DeviceMesh('cpu', [0, 1], "
               "mesh_dim_names=('other')), which FSDP cannot shard again over",
               [&] { FSDPParamGroup::create({o}, mesh, {}, {"o"}); });
  expect_error(ErrorKind::Value, "parameter 's' is 0-d",
               [&] { FSDPParamGroup::create({ones({})}, mesh, {}, {"s"}); });
  expect_error(ErrorKind::Value, "the device mesh is undefined",
               [&] { FSDPParamGroup::create({w}, DeviceMesh()); });
  expect_error(ErrorKind::Value, "must share a dtype", [&] {
    FSDPParamGroup::create({w, ones({2}, kFloat64)}, mesh);
  });
}
TEST(Fsdp, ParamGroup) { expect_all_pass(run_ranks("fsdp_param_group", 2)); }

// See Note [FSDP over TP]. An MLP tensor-parallel over mesh["tp"] (fc1 Colwise, fc2 Rowwise) and
// then fully_shard-ed over mesh["dp"] of a 2x2 mesh trains as one process does on the whole
// batch. Shapes make both splits uneven: fc1's 10 rows are 5 per tp rank, then 3 + 2 over dp.
// The LayerNorm is not tensor-parallel, so its parameters stay 1-d Shard(0) over dp.
struct TpMlp : nn::Module {
  TpMlp() : Module("TpMlp") {
    manual_seed(5);
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(6, 10));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(10, 7));
    norm = register_module("norm", std::make_shared<nn::LayerNorm>(std::vector<int64_t>{7}));
  }
  Tensor forward(const Tensor& x) override {
    auto call = [&](const char* name, const Tensor& in) {
      return par ? par->forward(name, in) : child(name)->forward(in);
    };
    return norm->forward(call("fc2", tanh(call("fc1", x))));
  }
  std::shared_ptr<nn::Linear> fc1, fc2;
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<dist::TensorParallel> par;
};

KILN_RANK_SCENARIO(fsdp_tp_2d) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  auto ref = std::make_shared<TpMlp>();
  auto net = std::make_shared<TpMlp>();
  net->par = std::make_shared<dist::TensorParallel>(dist::parallelize_module(
      *net, mesh["tp"], {{"fc1", dist::ColwiseParallel()}, {"fc2", dist::RowwiseParallel()}}));
  auto model = dist::fully_shard(net, mesh["dp"]);
  const DeviceMesh tp_dp = dist::concat_meshes(mesh["tp"], mesh["dp"]);
  auto params = model->named_parameters();
  ASSERT_EQ(params.size(), 6u);
  const std::vector<dist::Placements> want = {{Shard(0), Shard(0)}, {Shard(0), Shard(0)},
                                              {Shard(1), Shard(0)}, {dist::Replicate(), Shard(0)},
                                              {Shard(0)},           {Shard(0)}};
  for (size_t i = 0; i < params.size(); ++i) {
    SCOPED_TRACE(params[i].first);
    EXPECT_EQ(DTensor(params[i].second).placements(), want[i]);
    EXPECT_TRUE(DTensor(params[i].second).device_mesh() == (i < 4 ? tp_dp : mesh["dp"]));
  }
  // fc1.weight: 10 rows, 5 per tp rank, then 3 + 2 over dp.
  const int64_t dp = mesh.local_rank(0);
  EXPECT_EQ(DTensor(params[0].second).to_local().sizes(), IntArrayRef({dp == 0 ? 3 : 2, 6}));
  expect_close(DTensor(params[0].second).full_tensor(), ref->fc1->weight.detach());

  optim::AdamW ropt(ref->parameters(), {.lr = 0.01});
  optim::AdamW fopt(model->parameters(), {.lr = 0.01});
  const int64_t per = 3;
  for (int step = 0; step < 4; ++step) {
    Tensor x = random({per * 2, 6}, kFloat32, -1, 1, 10 + step);
    Tensor y = random({per * 2, 7}, kFloat32, -1, 1, 50 + step);
    ropt.zero_grad();
    mse_loss(ref->forward(x), y).backward();
    fopt.zero_grad();
    // Each dp rank takes its rows; the two tp ranks of a dp rank take the same rows.
    Tensor out = model->forward(x.narrow(0, dp * per, per).contiguous());
    EXPECT_FALSE(dist::is_dtensor(out));
    mse_loss(out, y.narrow(0, dp * per, per).contiguous()).backward();
    auto got = model->parameters(), exp = ref->parameters();
    for (size_t i = 0; i < got.size(); ++i) {
      SCOPED_TRACE(params[i].first + " at step " + std::to_string(step));
      ASSERT_TRUE(got[i].grad().defined());
      EXPECT_EQ(DTensor(got[i].grad()).placements(), want[i]);
      expect_close(DTensor(got[i].grad()).full_tensor(), exp[i].grad(), 1e-5, 1e-7);
    }
    Tensor norm = optim::clip_grad_norm_(got, 1e9);
    Tensor ref_norm = optim::clip_grad_norm_(exp, 1e9);
    expect_close(dist::is_dtensor(norm) ? DTensor(norm).full_tensor() : norm, ref_norm, 1e-5, 1e-7);
    ropt.step();
    fopt.step();
  }
  auto got = model->parameters(), exp = ref->parameters();
  for (size_t i = 0; i < got.size(); ++i)
    expect_close(DTensor(got[i]).full_tensor(), exp[i].detach(), 1e-5, 1e-7);
  // A tp DTensor with a Partial placement cannot be sharded again.
  Tensor partial = dist::distribute_tensor(ones({4, 2}), mesh["tp"], {dist::Partial()});
  expect_error(ErrorKind::Value, "FSDP cannot shard a Partial value",
               [&] { FSDPParamGroup::create({partial}, mesh["dp"], {}, {"p"}); });
}
TEST(Fsdp, TensorParallel2x2) { expect_all_pass(run_ranks("fsdp_tp_2d", 4)); }

// FSDP over TP with reshard_after_forward=2 (Note [FSDP reshard to k ranks]): a 4x2 ("dp", "tp")
// mesh, the whole TpMlp one group that keeps the halves of its TP-local tensors over pairs of dp
// ranks; fc1's 5 TP-local rows are 3 + 2 over a pair, fc2's 7 are 4 + 3.
KILN_RANK_SCENARIO(fsdp_tp_reshard_to_k) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {4, 2}, {"dp", "tp"});
  auto ref = std::make_shared<TpMlp>();
  auto net = std::make_shared<TpMlp>();
  net->par = std::make_shared<dist::TensorParallel>(dist::parallelize_module(
      *net, mesh["tp"], {{"fc1", dist::ColwiseParallel()}, {"fc2", dist::RowwiseParallel()}}));
  auto model = dist::fully_shard(net, mesh["dp"], {.reshard_after_forward = 2});
  const dist::ProcessGroupPtr& pair = model->param_group()->post_forward_group();
  ASSERT_TRUE(pair);
  const int first = rank() / 4 * 4 + rank() % 2;  // dp pairs {0, 1}, {2, 3} within a tp column
  EXPECT_EQ(pair->ranks(), std::vector<int>({first, first + 2}));
  optim::AdamW ropt(ref->parameters(), {.lr = 0.01});
  optim::AdamW fopt(model->parameters(), {.lr = 0.01});
  const int64_t per = 2, dp = mesh.local_rank(0);
  for (int step = 0; step < 3; ++step) {
    Tensor x = random({per * 4, 6}, kFloat32, -1, 1, 10 + step);
    Tensor y = random({per * 4, 7}, kFloat32, -1, 1, 50 + step);
    ropt.zero_grad();
    mse_loss(ref->forward(x), y).backward();
    fopt.zero_grad();
    dist::fsdp_gather_stats(/*reset=*/true);
    Tensor out = model->forward(x.narrow(0, dp * per, per).contiguous());
    for (const Tensor& f : model->param_group()->unsharded_params()) {
      const Tensor& local = dist::is_dtensor(f) ? dist::detail::local_of(f) : f;
      EXPECT_EQ(local.impl()->storage()->nbytes(), 0u);
    }
    mse_loss(out, y.narrow(0, dp * per, per).contiguous()).backward();
    const dist::FSDPGatherStats st = dist::fsdp_gather_stats();
    EXPECT_EQ(st.count, 2);
    EXPECT_EQ(st.post_forward, 1);
    auto got = model->parameters(), exp = ref->parameters();
    for (size_t i = 0; i < got.size(); ++i) {
      SCOPED_TRACE("parameter " + std::to_string(i) + " at step " + std::to_string(step));
      expect_close(DTensor(got[i].grad()).full_tensor(), exp[i].grad(), 1e-5, 1e-7);
    }
    ropt.step();
    fopt.step();
  }
}
TEST(Fsdp, TensorParallel4x2ReshardToTwo) { expect_all_pass(run_ranks("fsdp_tp_reshard_to_k", 8)); }

// Per-rank memory after AdamW steps, by the CPU allocator's statistics: the shards, their
// gradients and both Adam moments must be at most 1/N + 5% of what one process would hold (4
// float32 copies of the model). Every shard has a power-of-two size, so the allocator's size
// classes round nothing; the gathered parameters are freed after each backward. A step's peak
// above the state before it (allocator peak reset before the step) is printed and bounded.
KILN_RANK_SCENARIO(fsdp_memory) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {world()});
  const size_t base = cpu_allocator()->stats().in_use_bytes;
  manual_seed(5);
  auto net = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
      std::make_shared<nn::Linear>(256, 512), std::make_shared<nn::Tanh>(),
      std::make_shared<nn::Linear>(512, 256)});
  int64_t whole = 0;
  for (const Tensor& p : net->parameters()) whole += p.numel();
  for (const char* name : {"0", "2"})
    net->replace_module(name, dist::fully_shard(net->child(name), mesh));
  auto model = dist::fully_shard(net, mesh);
  optim::AdamW opt(model->parameters(), {.lr = 1e-3});
  const size_t params_only = cpu_allocator()->stats().in_use_bytes - base;
  std::printf("rank %d: shards alone %zu bytes (%.4f of the unsharded parameters)\n", rank(),
              params_only, params_only / (4.0 * static_cast<double>(whole)));
  size_t step_peak = 0;
  for (int step = 0; step < 3; ++step) {
    Tensor x = random({4, 256}, kFloat32, -1, 1, 30 + rank());
    opt.zero_grad(false);  // keep the gradients: they are part of the state measured
    mesh.group(0)->barrier()->wait();
    const size_t before = cpu_allocator()->stats().in_use_bytes;
    cpu_allocator()->reset_peak_stats();
    Tensor out = model->forward(x);
    (out * out).mean().backward();
    opt.step();
    step_peak = std::max(step_peak, cpu_allocator()->stats().peak_in_use_bytes - before);
  }
  // The comm thread lets go of a finished collective's buffers (the last reduce-scatter's, about
  // the whole model) when it takes the next one: a barrier flushes them, leaving the state.
  mesh.group(0)->barrier()->wait();
  const AllocatorStats st = cpu_allocator()->stats();
  const double used = static_cast<double>(st.in_use_bytes - base);
  const double unsharded = 4.0 * 4.0 * static_cast<double>(whole);
  std::printf(
      "rank %d: %.0f bytes of parameters, gradients and AdamW state; %.4f of the "
      "unsharded %.0f (bound %.4f); a step's peak above the state before it: %zu bytes (%.4f of "
      "the unsharded state, %.2f whole copies of the parameters)\n",
      rank(), used, used / unsharded, unsharded, 1.0 / world() + 0.05, step_peak,
      step_peak / unsharded, step_peak / (4.0 * static_cast<double>(whole)));
  EXPECT_LE(used, unsharded * (1.0 / world() + 0.05));
  EXPECT_GE(used, unsharded / world() * 0.95);  // the state really is there
  // During a step, on top of the state: the whole parameters of at most two layers (one
  // prefetched), the whole gradients, and the flat all-gather and reduce-scatter buffers (each at
  // most the whole parameters, which the allocator's power-of-two classes may double); the
  // activations of 4 rows are small. So under 6 whole copies of the parameters (1.5 of the
  // unsharded state); measured about 4.3 copies on 4 ranks.
  EXPECT_LT(step_peak, 6.0 * 4.0 * static_cast<double>(whole));
}
TEST(Fsdp, MemoryPerRankTwoRanks) { expect_all_pass(run_ranks("fsdp_memory", 2)); }
TEST(Fsdp, MemoryPerRankFourRanks) { expect_all_pass(run_ranks("fsdp_memory", 4)); }

// See Note [FSDP reshard to k ranks]. Three fully_shard-ed Linears of uneven shapes (13, 9 and 5
// rows over 4 ranks and over 2), the root keeping its (no) parameters: reshard_after_forward=2
// trains exactly as True does, and as one process on the whole batch; between forward and
// backward each block holds only its 1/2 pieces; backward gathers over this rank's pair of ranks.
std::shared_ptr<nn::Sequential> mlp3(uint64_t seed) {
  manual_seed(seed);
  return std::make_shared<nn::Sequential>(
      std::vector<nn::ModulePtr>{std::make_shared<nn::Linear>(7, 13), std::make_shared<nn::Tanh>(),
                                 std::make_shared<nn::Linear>(13, 9), std::make_shared<nn::Tanh>(),
                                 std::make_shared<nn::Linear>(9, 5)});
}

std::shared_ptr<dist::FullyShardedModule> sharded_mlp3(std::shared_ptr<nn::Sequential> net,
                                                       const DeviceMesh& mesh,
                                                       dist::FSDPOptions options) {
  for (const char* name : {"0", "2", "4"})
    net->replace_module(name, dist::fully_shard(net->child(name), mesh, options));
  return dist::fully_shard(net, mesh, {.reshard_after_forward = false});
}

std::vector<FSDPParamGroup*> block_groups(const std::shared_ptr<dist::FullyShardedModule>& m) {
  std::vector<FSDPParamGroup*> out;
  auto seq = std::static_pointer_cast<nn::Sequential>(m->module());
  for (const char* name : {"0", "2", "4"})
    out.push_back(
        std::dynamic_pointer_cast<dist::FullyShardedModule>(seq->child(name))->param_group().get());
  return out;
}

KILN_RANK_SCENARIO(fsdp_reshard_to_k) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {world()});
  const dist::FSDPOptions by_two{.reshard_after_forward = 2};
  ASSERT_TRUE(std::holds_alternative<int64_t>(by_two.reshard_after_forward));
  auto ref = mlp3(8);
  auto model_k = sharded_mlp3(mlp3(8), mesh, by_two);
  auto model_t = sharded_mlp3(mlp3(8), mesh, {});
  for (FSDPParamGroup* g : block_groups(model_k)) {
    EXPECT_EQ(g->reshard_after_forward_size(), 2);
    ASSERT_TRUE(g->post_forward_group());
    const int first = rank() / 2 * 2;  // ranks [0, 2) and [2, 4)
    EXPECT_EQ(g->post_forward_group()->ranks(), std::vector<int>({first, first + 1}));
  }
  optim::AdamW ropt(ref->parameters(), {.lr = 0.01, .weight_decay = 0.1});
  optim::AdamW kopt(model_k->parameters(), {.lr = 0.01, .weight_decay = 0.1});
  optim::AdamW topt(model_t->parameters(), {.lr = 0.01, .weight_decay = 0.1});
  const int64_t per = 3;
  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    Tensor x = random({per * world(), 7}, kFloat32, -1, 1, 60 + step);
    Tensor y = random({per * world(), 5}, kFloat32, -1, 1, 70 + step);
    ropt.zero_grad();
    mse_loss(ref->forward(x), y).backward();
    ropt.step();
    topt.zero_grad();
    dist::fsdp_gather_stats(/*reset=*/true);
    mse_loss(model_t->forward(rows(x, per)), rows(y, per)).backward();
    const dist::FSDPGatherStats st = dist::fsdp_gather_stats(/*reset=*/true);
    kopt.zero_grad();
    Tensor loss = mse_loss(model_k->forward(rows(x, per)), rows(y, per));
    // Between forward and backward: no whole parameter, and 1/2 of each (this rank's rows of its
    // pair: chunk_of over 2) kept.
    const std::vector<FSDPParamGroup*> groups = block_groups(model_k);
    for (FSDPParamGroup* g : groups) {
      EXPECT_FALSE(g->is_unsharded());
      const std::vector<Tensor>& full = g->unsharded_params();
      ASSERT_EQ(full.size(), 2u);
      for (const Tensor& f : full) EXPECT_EQ(f.impl()->storage()->nbytes(), 0u);
    }
    loss.backward();
    const dist::FSDPGatherStats sk = dist::fsdp_gather_stats(/*reset=*/true);
    // Forward gathers 3 groups over the mesh, backward 3 over the pairs; prefetch works alike.
    EXPECT_EQ(sk.count, 6);
    EXPECT_EQ(sk.post_forward, 3);
    EXPECT_EQ(st.post_forward, 0);
    EXPECT_EQ(sk.count, st.count);
    EXPECT_EQ(sk.prefetched, st.prefetched);
    // Forward prefetches blocks 0, 2 and 4 once the first step has recorded the order; backward
    // prefetches 2 and 0.
    EXPECT_EQ(sk.prefetched, (step > 0 ? 3 : 0) + 2);
    auto gk = model_k->parameters(), gt = model_t->parameters(), want = ref->parameters();
    ASSERT_EQ(gk.size(), want.size());
    for (size_t i = 0; i < gk.size(); ++i) {
      SCOPED_TRACE("parameter " + std::to_string(i));
      EXPECT_EQ(DTensor(gk[i].grad()).placements(), dist::Placements{Shard(0)});
      expect_close(DTensor(gk[i].grad()).to_local(), DTensor(gt[i].grad()).to_local(), 1e-6, 0);
      expect_close(DTensor(gk[i].grad()).full_tensor(), want[i].grad(), 1e-5, 1e-7);
    }
    for (FSDPParamGroup* g : groups)
      for (const Tensor& f : g->unsharded_params()) EXPECT_EQ(f.impl()->storage()->nbytes(), 0u);
    kopt.step();
    topt.step();
  }
  auto gk = model_k->parameters(), want = ref->parameters();
  for (size_t i = 0; i < gk.size(); ++i)
    expect_close(DTensor(gk[i]).full_tensor(), want[i].detach(), 1e-5, 1e-7);
  // k == N is True, k == 1 is False (as in PyTorch); other ints must divide N.
  auto group = FSDPParamGroup::create({ones({6, 2})}, mesh, {}, {"w"});
  group->set_reshard_after_forward(int64_t{4});
  EXPECT_EQ(group->reshard_after_forward_size(), 4);
  EXPECT_FALSE(group->post_forward_group());
  group->set_reshard_after_forward(int64_t{1});
  EXPECT_EQ(group->reshard_after_forward_size(), 1);
  group->set_reshard_after_forward(true);
  EXPECT_EQ(group->reshard_after_forward_size(), 4);
  for (int64_t k : {3, 0, -2, 8})
    expect_error(
        ErrorKind::Value,
        "reshard_after_forward=" + std::to_string(k) + " must be a divisor of the FSDP mesh size 4",
        [&] { group->set_reshard_after_forward(k); });
  expect_error(ErrorKind::Value, "reshard_after_forward=3 must be a divisor", [&] {
    dist::fully_shard(std::make_shared<nn::Linear>(2, 2), mesh, {.reshard_after_forward = 3});
  });
}
TEST(Fsdp, ReshardAfterForwardToTwoOfFourRanks) {
  expect_all_pass(run_ranks("fsdp_reshard_to_k", 4));
}

// Per-rank memory between forward and backward, by the allocator's statistics (as fsdp_memory):
// with reshard_after_forward=2 on 4 ranks, the two blocks hold 1/2 of their whole parameters
// (power-of-two pieces, so the allocator rounds nothing); True holds none, False all. The 4-row
// activations are small.
KILN_RANK_SCENARIO(fsdp_reshard_memory) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {world()});
  for (std::variant<bool, int64_t> how :
       std::vector<std::variant<bool, int64_t>>{true, int64_t{2}, false}) {
    manual_seed(5);
    auto net = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
        std::make_shared<nn::Linear>(256, 512), std::make_shared<nn::Tanh>(),
        std::make_shared<nn::Linear>(512, 256)});
    double whole = 0;
    for (const Tensor& p : net->parameters()) whole += 4.0 * p.numel();
    for (const char* name : {"0", "2"})
      net->replace_module(
          name, dist::fully_shard(net->child(name), mesh, {.reshard_after_forward = how}));
    auto model = dist::fully_shard(net, mesh, {.reshard_after_forward = false});
    Tensor x = random({4, 256}, kFloat32, -1, 1, 30 + rank());
    mesh.group(0)->barrier()->wait();  // flushes the comm thread's buffers (See fsdp_memory)
    const double before = static_cast<double>(cpu_allocator()->stats().in_use_bytes);
    Tensor out = model->forward(x);
    mesh.group(0)->barrier()->wait();
    const double held = static_cast<double>(cpu_allocator()->stats().in_use_bytes) - before;
    const double kept = how.index() == 1 ? whole / 2 : std::get<bool>(how) ? 0.0 : whole;
    std::printf("rank %d: reshard_after_forward=%s: %.0f bytes held after forward (whole %.0f)\n",
                rank(),
                how.index() == 1      ? "2"
                : std::get<bool>(how) ? "true"
                                      : "false",
                held, whole);
    EXPECT_GE(held, kept);
    EXPECT_LE(held, kept + 0.03 * whole);
    (out * out).mean().backward();
  }
}
TEST(Fsdp, ReshardAfterForwardMemory) { expect_all_pass(run_ranks("fsdp_reshard_memory", 4)); }

// Rank 1 of 3 dies after the first step; the others' next forward (its all-gather) raises within
// the communication timeout instead of hanging.
KILN_RANK_SCENARIO(fsdp_killed_rank) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {world()});
  auto model = sharded_mlp(6, mesh);
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  Tensor x = random({2, 7}, kFloat32, -1, 1, 40 + rank());
  model->forward(x).sum().backward();
  opt.step();
  if (rank() == 1) raise(SIGKILL);
  const auto start = std::chrono::steady_clock::now();
  expect_error(ErrorKind::Runtime, "never reached", [&] { model->forward(x).sum().backward(); });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(s, 3.0 + 1.5) << "the timeout is 3 s";
}
TEST(Fsdp, KilledRankRaisesOnOthers) {
  auto res =
      run_ranks("fsdp_killed_rank", 3, std::chrono::seconds(30), {{"KILN_COMM_TIMEOUT_S", "3"}});
  EXPECT_EQ(res[1].signal, SIGKILL) << res[1].output;
  for (int r : {0, 2}) EXPECT_EQ(res[r].exit_code, 0) << "rank " << r << ":\n" << res[r].output;
}

}  // namespace
}  // namespace kiln::testing
