// Tensor parallelism across processes (tests/sharding/harness.h; kiln/dist/tensor_parallel.h):
// parallelize_module on an MLP (Colwise then Rowwise), an embedding pair and a SequenceParallel
// LayerNorm against the unsharded modules (outputs, gradients, parameter placements);
// vocab_parallel_cross_entropy against cross_entropy; and the errors.
#include "kiln/dist/tensor_parallel.h"

#include "harness.h"
#include "kiln/kiln.h"
#include "kiln/nn/functional.h"
#include "kiln/nn/layers.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

using dist::ColwiseParallel;
using dist::DeviceMesh;
using dist::distribute_tensor;
using dist::DTensor;
using dist::Placements;
using dist::Replicate;
using dist::RowwiseParallel;
using dist::SequenceParallel;
using dist::Shard;

Tensor full(const Tensor& t) { return dist::is_dtensor(t) ? DTensor(t).full_tensor() : t; }

struct Mlp : nn::Module {
  Mlp() : Module("Mlp") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(8, 16));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(16, 8));
    norm = register_module("norm", std::make_shared<nn::LayerNorm>(std::vector<int64_t>{8}));
  }
  std::shared_ptr<nn::Linear> fc1, fc2;
  std::shared_ptr<nn::LayerNorm> norm;
};

std::shared_ptr<Mlp> make_mlp() {
  manual_seed(1);
  return std::make_shared<Mlp>();
}

void expect_grads_equal(nn::Module& tp, nn::Module& ref) {
  auto a = tp.named_parameters(), b = ref.named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE(a[i].first);
    if (!b[i].second.grad().defined()) continue;
    ASSERT_TRUE(a[i].second.grad().defined());
    expect_close(full(a[i].second.grad()), b[i].second.grad(), 1e-5, 1e-6);
  }
}

KILN_RANK_SCENARIO(tp_mlp) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {2});
  auto tp = make_mlp(), ref = make_mlp();
  dist::TensorParallel par =
      dist::parallelize_module(*tp, mesh, {{"fc1", ColwiseParallel()}, {"fc2", RowwiseParallel()}});
  EXPECT_EQ(DTensor(tp->fc1->weight).placements(), Placements{Shard(0)});
  EXPECT_EQ(DTensor(tp->fc1->bias).placements(), Placements{Shard(0)});
  EXPECT_EQ(DTensor(tp->fc2->weight).placements(), Placements{Shard(1)});
  EXPECT_EQ(DTensor(tp->fc2->bias).placements(), Placements{Replicate()});
  EXPECT_TRUE(tp->fc1->weight.requires_grad());
  EXPECT_EQ(DTensor(tp->fc1->weight).to_local().sizes(), IntArrayRef({8, 8}));
  EXPECT_EQ(tp->named_parameters()[0].first, "fc1.weight");  // names unchanged
  Tensor x = random({4, 8}, kFloat32, -2, 2, 3);
  Tensor c = random({4, 8}, kFloat32, -2, 2, 4);
  Tensor y = par.forward("fc2", relu(par.forward("fc1", x)));
  Tensor y_ref = ref->fc2->forward(relu(ref->fc1->forward(x)));
  EXPECT_FALSE(dist::is_dtensor(y));  // use_local_output: the Replicate() local
  expect_close(y, y_ref, 1e-5, 1e-6);
  (y * c).sum().backward();
  (y_ref * c).sum().backward();
  expect_grads_equal(*tp, *ref);

  // SequenceParallel LayerNorm -> Colwise (from Shard(1)) -> Rowwise (to Shard(1)).
  auto sp = make_mlp(), sref = make_mlp();
  dist::TensorParallel spar =
      dist::parallelize_module(*sp, mesh,
                               {{"norm", SequenceParallel()},
                                {"fc1", ColwiseParallel(Shard(1))},
                                {"fc2", RowwiseParallel(std::nullopt, Shard(1))}});
  EXPECT_EQ(DTensor(sp->norm->weight).placements(), Placements{Replicate()});
  Tensor s = random({2, 6, 8}, kFloat32, -2, 2, 5);
  Tensor local = s.narrow(1, 3 * rank(), 3).contiguous();
  Tensor out = spar.forward("fc2", relu(spar.forward("fc1", spar.forward("norm", local))));
  Tensor out_ref = sref->fc2->forward(relu(sref->fc1->forward(sref->norm->forward(s))));
  expect_close(out, out_ref.narrow(1, 3 * rank(), 3).contiguous(), 1e-5, 1e-6);
  Tensor cs = random({2, 6, 8}, kFloat32, -2, 2, 6);
  (out * cs.narrow(1, 3 * rank(), 3)).sum().backward();
  (out_ref * cs).sum().backward();
  expect_grads_equal(*sp, *sref);
}

TEST(TensorParallel, MlpTwoRanks) { expect_all_pass(run_ranks("tp_mlp", 2)); }

// A hidden size of 5 on 2 ranks: 3 + 2 features.
KILN_RANK_SCENARIO(tp_uneven) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {2});
  auto make = [] {
    manual_seed(3);
    auto m = std::make_shared<nn::Module>("Pair");
    m->register_module("fc1", std::make_shared<nn::Linear>(4, 5));
    m->register_module("fc2", std::make_shared<nn::Linear>(5, 3));
    return m;
  };
  auto tp = make(), ref = make();
  dist::TensorParallel par =
      dist::parallelize_module(*tp, mesh, {{"fc1", ColwiseParallel()}, {"fc2", RowwiseParallel()}});
  EXPECT_EQ(DTensor(tp->child("fc1")->param("weight")).to_local().size(0), rank() == 0 ? 3 : 2);
  Tensor x = random({2, 4}, kFloat32, -2, 2, 11);
  Tensor y = par.forward("fc2", relu(par.forward("fc1", x)));
  Tensor y_ref = ref->child("fc2")->forward(relu(ref->child("fc1")->forward(x)));
  expect_close(y, y_ref, 1e-5, 1e-6);
  y.sum().backward();
  y_ref.sum().backward();
  expect_grads_equal(*tp, *ref);
}

TEST(TensorParallel, UnevenTwoRanks) { expect_all_pass(run_ranks("tp_uneven", 2)); }

KILN_RANK_SCENARIO(tp_embedding) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {2});
  auto make = [] {
    manual_seed(2);
    auto m = std::make_shared<nn::Module>("Pair");
    m->register_module("tok", std::make_shared<nn::Embedding>(11, 8));
    m->register_module("dim", std::make_shared<nn::Embedding>(11, 8));
    return m;
  };
  auto tp = make(), ref = make();
  dist::TensorParallel par = dist::parallelize_module(
      *tp, mesh, {{"tok", RowwiseParallel()}, {"dim", ColwiseParallel(std::nullopt, Replicate())}});
  EXPECT_EQ(DTensor(tp->child("tok")->param("weight")).placements(), Placements{Shard(0)});
  EXPECT_EQ(DTensor(tp->child("dim")->param("weight")).placements(), Placements{Shard(1)});
  Tensor idx = from_vector<int64_t>({0, 5, 10, 6, 3, 7}, {2, 3});
  Tensor y = par.forward("tok", idx) + par.forward("dim", idx);
  Tensor y_ref = ref->child("tok")->forward(idx) + ref->child("dim")->forward(idx);
  expect_close(y, y_ref, 1e-5, 1e-6);
  y.sum().backward();
  y_ref.sum().backward();
  expect_grads_equal(*tp, *ref);
}

TEST(TensorParallel, EmbeddingTwoRanks) { expect_all_pass(run_ranks("tp_embedding", 2)); }

KILN_RANK_SCENARIO(tp_loss) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {2});
  for (int64_t vocab : {10, 7}) {
    Tensor logits = random({6, vocab}, kFloat32, -4, 4, 7);
    Tensor target = from_vector<int64_t>({0, -1, vocab - 1, 3, -1, 4}, {6});
    Tensor weight = random({vocab}, kFloat32, 0.5, 1.5, 8);
    for (const char* red : {"mean", "sum", "none"}) {
      for (int variant = 0; variant < 3; ++variant) {
        SCOPED_TRACE(std::string(red) + " vocab " + std::to_string(vocab) + " variant " +
                     std::to_string(variant));
        Tensor w = variant == 1 ? weight : Tensor();
        double eps = variant == 2 ? 0.2 : 0.0;
        DTensor d = distribute_tensor(logits, mesh, {Shard(1)});
        d.requires_grad_();
        Tensor r = logits.clone().requires_grad_();
        Tensor loss = dist::vocab_parallel_cross_entropy(d, target, w, red, -1, eps);
        Tensor loss_ref = cross_entropy(
            r, target, w.defined() ? std::optional<Tensor>(w) : std::nullopt, red, -1, eps);
        EXPECT_EQ(DTensor(loss).placements(), Placements{Replicate()});
        expect_close(DTensor(loss).full_tensor(), loss_ref, 1e-5, 1e-6);
        Tensor c = random(loss_ref.sizes(), kFloat32, -2, 2, 9);
        (DTensor(loss).full_tensor() * c).sum().backward();
        (loss_ref * c).sum().backward();
        EXPECT_EQ(DTensor(d.grad()).placements(), Placements{Shard(1)});
        expect_close(DTensor(d.grad()).full_tensor(), r.grad(), 1e-5, 1e-6);
      }
    }
  }
  DTensor d = distribute_tensor(random({4, 6}), mesh, {Shard(0)});
  Tensor t = from_vector<int64_t>({0, 1, 2, 3}, {4});
  expect_error(ErrorKind::Value, "expected the logits sharded on the class dim",
               [&] { dist::vocab_parallel_cross_entropy(d, t); });
  DTensor e = distribute_tensor(random({4, 6}), mesh, {Shard(1)});
  expect_error(ErrorKind::Index, "out of bounds for 6 classes", [&] {
    dist::vocab_parallel_cross_entropy(e, from_vector<int64_t>({0, 1, 2, 9}, {4}));
  });
  expect_error(ErrorKind::NotImplemented, "label_smoothing with class weights",
               [&] { dist::vocab_parallel_cross_entropy(e, t, ones({6}), "mean", -100, 0.1); });
}

TEST(TensorParallel, LossTwoRanks) { expect_all_pass(run_ranks("tp_loss", 2)); }

KILN_RANK_SCENARIO(tp_errors) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {2});
  auto m = make_mlp();
  expect_error(ErrorKind::Value, "Mlp at '<root>' has no child matching 'fc9'", [&] {
    dist::parallelize_module(*m, mesh, {{"fc1", ColwiseParallel()}, {"fc9", RowwiseParallel()}});
  });
  EXPECT_FALSE(dist::is_dtensor(m->fc1->weight));  // a bad plan changes nothing
  expect_error(ErrorKind::NotImplemented,
               "RowwiseParallel on 'norm': RowwiseParallel supports nn::Linear and nn::Embedding "
               "only, got LayerNorm",
               [&] {
                 dist::parallelize_module(
                     *m, mesh, {{"fc1", ColwiseParallel()}, {"norm", RowwiseParallel()}});
               });
  EXPECT_FALSE(dist::is_dtensor(m->fc1->weight));
  expect_error(ErrorKind::NotImplemented, "SequenceParallel supports nn::LayerNorm", [&] {
    dist::parallelize_module(*m, mesh, {{"fc1", SequenceParallel()}});
  });
  dist::TensorParallel par = dist::parallelize_module(*m, mesh, {{"fc*", ColwiseParallel()}});
  EXPECT_TRUE(dist::is_dtensor(m->fc2->weight));  // fnmatch patterns
  expect_error(ErrorKind::Value, "is already a DTensor", [&] {
    dist::parallelize_module(*m, mesh, {{"fc1", ColwiseParallel()}});
  });
  expect_error(ErrorKind::Index, "'norm' was not parallelized", [&] { par["norm"]; });
}

TEST(TensorParallel, Errors) { expect_all_pass(run_ranks("tp_errors", 2)); }

}  // namespace
}  // namespace kiln::testing
