// DTensor across processes (tests/sharding/harness.h): redistribute between every pair of
// placements on 1-d meshes of 2 and 3 ranks (3 gives uneven and empty shards) and on a 2x2 mesh;
// pointwise ops with broadcasting and their placements; the decision cache; the replicate path
// (warned once, listed, written back); bad input; autograd through DTensors. Every result is
// checked against the same computation on the unsharded tensors.
#include "kiln/dist/dtensor.h"

#include <cmath>
#include <set>

#include "harness.h"
#include "kiln/kiln.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

using dist::DeviceMesh;
using dist::distribute_tensor;
using dist::DTensor;
using dist::Partial;
using dist::Placements;
using dist::ReduceOp;
using dist::Replicate;
using dist::Shard;

// Every placement of a 2-d tensor on one mesh dim.
const Placements kAll = {Shard(0),
                         Shard(1),
                         Replicate(),
                         Partial(),
                         Partial(ReduceOp::Avg),
                         Partial(ReduceOp::Max),
                         Partial(ReduceOp::Min)};

std::string label(const Placements& from, const Placements& to, IntArrayRef shape) {
  std::ostringstream os;
  os << dist::placements_str(from) << " -> " << dist::placements_str(to) << " shape " << shape;
  return os.str();
}

// A DTensor of global value `g` placed by `p` whose Partial pieces differ between ranks: the
// pieces of distribute_tensor, plus a different random term per rank that cancels out (sum,
// avg) or stays below the maximum (max) / above the minimum (min).
DTensor genuine(const Tensor& g, const DeviceMesh& mesh, const Placements& p) {
  DTensor d = distribute_tensor(g, mesh, p);
  Tensor local = d.to_local().clone();
  const std::vector<int64_t> c = mesh.coordinate();
  for (size_t i = 0; i < p.size(); ++i) {
    if (!p[i].is_partial()) continue;
    Tensor noise = random(local.sizes(), kFloat32, 0, 1, 7 + static_cast<uint32_t>(c[i]));
    const int64_t n = mesh.size(static_cast<int64_t>(i));
    // Index 0 keeps the value, the others fall below (max) or rise above (min) it.
    if (p[i].reduce == ReduceOp::Max) local = local - static_cast<double>(c[i]) * noise;
    if (p[i].reduce == ReduceOp::Min) local = local + static_cast<double>(c[i]) * noise;
    if (p[i].reduce == ReduceOp::Sum || p[i].reduce == ReduceOp::Avg) {
      // Rank j adds noise_j - noise_{j+1 mod n}: the terms cancel in the sum.
      Tensor next =
          random(local.sizes(), kFloat32, 0, 1, 7 + static_cast<uint32_t>((c[i] + 1) % n));
      local = local + (noise - next);
    }
  }
  return DTensor::from_local(local, mesh, p, DimVector(g.sizes()));
}

// from -> to for every pair of `placements` on `mesh`, against the unsharded `g`.
void check_all_pairs(const DeviceMesh& mesh, const std::vector<Placements>& placements,
                     const Tensor& g) {
  for (const Placements& from : placements) {
    DTensor src = genuine(g, mesh, from);
    expect_close(src.full_tensor(), g, 1e-5, 1e-5);
    for (const Placements& to : placements) {
      SCOPED_TRACE(label(from, to, g.sizes()));
      DTensor dst = src.redistribute(mesh, to);
      EXPECT_EQ(dst.placements(), to);
      EXPECT_EQ(dst.sizes(), g.sizes());
      EXPECT_EQ(dst.to_local().sizes(), IntArrayRef(dist::local_shape(g.sizes(), mesh, to)));
      expect_close(dst.full_tensor(), g, 1e-5, 1e-5);
      bool partial = false;
      for (const auto& p : to) partial = partial || p.is_partial();
      // Pieces of Shard and Replicate are determined by the value; Partial pieces are not.
      if (!partial) expect_close(dst.to_local(), distribute_tensor(g, mesh, to).to_local());
    }
  }
}

KILN_RANK_SCENARIO(redistribute_1d) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {world()});
  std::vector<Placements> all;
  for (const auto& p : kAll) all.push_back({p});
  for (auto shape : {std::vector<int64_t>{5, 7}, std::vector<int64_t>{2, 4}})
    check_all_pairs(mesh, all, random(shape, kFloat32, -2, 2, 11));
}

TEST(DTensor, Redistribute1dTwoRanks) { expect_all_pass(run_ranks("redistribute_1d", 2)); }
TEST(DTensor, Redistribute1dThreeRanksUneven) { expect_all_pass(run_ranks("redistribute_1d", 3)); }

KILN_RANK_SCENARIO(redistribute_2x2) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  const Placements one = {Shard(0), Shard(1), Replicate(), Partial(), Partial(ReduceOp::Max)};
  std::vector<Placements> all;
  for (const auto& a : one)
    for (const auto& b : one) all.push_back({a, b});
  check_all_pairs(mesh, all, random({5, 3}, kFloat32, -2, 2, 12));  // uneven on both dims
}

TEST(DTensor, Redistribute2x2) { expect_all_pass(run_ranks("redistribute_2x2", 4)); }

// ---- Pointwise ops ------------------------------------------------------------------------------

void expect_placed(const Tensor& t, const Placements& want, const Tensor& full) {
  DTensor d(t);
  EXPECT_EQ(dist::placements_str(d.placements()), dist::placements_str(want));
  expect_close(d.full_tensor(), full, 1e-5, 1e-5);
}

KILN_RANK_SCENARIO(pointwise_1d) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {world()});
  Tensor a = random({5, 4}, kFloat32, -2, 2, 1), b = random({5, 4}, kFloat32, -2, 2, 2);
  Tensor row = random({4}, kFloat32, 1, 2, 3), col = random({5, 1}, kFloat32, -2, 2, 4);
  auto D = [&](const Tensor& t, Placements p) { return distribute_tensor(t, mesh, std::move(p)); };
  expect_placed(D(a, {Shard(0)}) + D(b, {Shard(0)}), {Shard(0)}, a + b);
  expect_placed(D(a, {Shard(0)}) * D(b, {Replicate()}), {Shard(0)}, a * b);
  expect_placed(D(a, {Shard(1)}) - D(b, {Shard(0)}), {Shard(1)}, a - b);  // one all-gather
  // Broadcasting: the row's dim 0 is the output's dim 1; the column's dim 1 has size 1.
  expect_placed(D(a, {Shard(1)}) / D(row, {Shard(0)}), {Shard(1)}, a / row);
  expect_placed(D(a, {Replicate()}) * D(row, {Shard(0)}), {Shard(1)}, a * row);
  expect_placed(D(a, {Shard(0)}) + D(col, {Shard(0)}), {Shard(0)}, a + col);
  expect_placed(D(a, {Shard(1)}) + D(col, {Shard(1)}), {Shard(1)}, a + col);
  expect_placed(D(a, {Shard(0)}) * 2.5 + 1.0, {Shard(0)}, a * 2.5 + 1.0);
  expect_placed(D(a, {Shard(1)}).exp(), {Shard(1)}, a.exp());
  expect_placed(D(a, {Shard(0)}) + full({}, 3.0), {Shard(0)}, a + 3.0);  // a 0-d plain tensor
  expect_placed(kiln::where(D(a, {Shard(0)}) > 0.0, D(a, {Shard(0)}), D(row, {Replicate()})),
                {Shard(0)}, kiln::where(a > 0.0, a, row));
  // Partial passes through linear ops only.
  DTensor p = genuine(a, mesh, {Partial()}), q = genuine(b, mesh, {Partial()});
  expect_placed(p * 2.0, {Partial()}, a * 2.0);
  expect_placed(-p, {Partial()}, -a);
  expect_placed(p + q, {Partial()}, a + b);
  expect_placed(p - D(b, {Replicate()}), {Partial()}, a - b);
  expect_placed(p * D(b, {Replicate()}), {Partial()}, a * b);
  expect_placed(p / D(row, {Replicate()}), {Partial()}, a / row);
  expect_placed(p + 1.0, {Replicate()}, a + 1.0);  // affine: the scalar must not be added n times
  expect_placed(p * q, {Partial()}, a * b);        // one side is all-reduced
  expect_placed(p.exp(), {Replicate()}, a.exp());
  expect_placed(genuine(a, mesh, {Partial(ReduceOp::Max)}) * 2.0, {Replicate()}, a * 2.0);
  // In place: self keeps its placements; other inputs follow them.
  DTensor x = D(a.clone(), {Shard(0)});
  Tensor y = x.add_(D(b, {Shard(1)}));
  EXPECT_TRUE(y.is_same(x));
  expect_placed(x, {Shard(0)}, a + b);
  DTensor z = genuine(a, mesh, {Partial()});
  z *= 3.0;
  expect_placed(z, {Partial()}, a * 3.0);
  z.fill_(1.5);  // not linear: replicated, filled, written back as Partial
  expect_placed(z, {Partial()}, full({5, 4}, 1.5));
  // The decision is cached per (op, input specs).
  Tensor l = D(a, {Shard(0)}), r = D(b, {Shard(0)});
  const auto before = dist::dispatch_stats();
  for (int i = 0; i < 3; ++i) (void)(l + r);
  const auto after = dist::dispatch_stats();
  EXPECT_EQ(after.misses, before.misses);  // add on these specs was decided above
  EXPECT_EQ(after.hits, before.hits + 3);
  EXPECT_TRUE(dist::fallback_ops().empty()) << dist::fallback_ops()[0];
}

TEST(DTensor, PointwiseTwoRanks) { expect_all_pass(run_ranks("pointwise_1d", 2)); }
TEST(DTensor, PointwiseThreeRanksUneven) { expect_all_pass(run_ranks("pointwise_1d", 3)); }

KILN_RANK_SCENARIO(pointwise_2x2) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  Tensor a = random({5, 3}, kFloat32, -2, 2, 1), b = random({5, 3}, kFloat32, -2, 2, 2);
  Tensor row = random({3}, kFloat32, 1, 2, 3);
  auto D = [&](const Tensor& t, Placements p) { return distribute_tensor(t, mesh, std::move(p)); };
  expect_placed(D(a, {Shard(0), Shard(1)}) + D(b, {Shard(0), Replicate()}), {Shard(0), Shard(1)},
                a + b);
  expect_placed(D(a, {Shard(0), Shard(0)}) * D(b, {Replicate(), Shard(0)}), {Shard(0), Shard(0)},
                a * b);
  expect_placed(D(a, {Replicate(), Shard(1)}) / D(row, {Replicate(), Shard(0)}),
                {Replicate(), Shard(1)}, a / row);
  DTensor p = genuine(a, mesh, {Partial(), Shard(1)});
  expect_placed(p * D(row, {Replicate(), Shard(0)}), {Partial(), Shard(1)}, a * row);
  expect_placed(p + D(b, {Shard(0), Shard(1)}), {Shard(0), Shard(1)}, a + b);
  expect_placed(p.exp(), {Replicate(), Shard(1)}, a.exp());
}

TEST(DTensor, Pointwise2x2) { expect_all_pass(run_ranks("pointwise_2x2", 4)); }

// ---- The replicate path, errors, autograd ------------------------------------------------------

std::vector<std::string> g_warnings;
void record_warning(const std::string& msg) { g_warnings.push_back(msg); }

KILN_RANK_SCENARIO(replicate_path) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {world()});
  Tensor a = random({5, 4}, kFloat32, -2, 2, 1);
  set_warning_handler(&record_warning);
  dist::clear_fallback_ops();
  // An out= variant (no rule takes them yet): replicated, computed, written back into `out`'s
  // shards, warned about once and listed.
  DTensor x = distribute_tensor(a, mesh, {Shard(0)});
  DTensor out = distribute_tensor(zeros({5, 4}), mesh, {Shard(0)});
  mul_out(out, x, x);
  expect_placed(out, {Shard(0)}, a * a);
  mul_out(out, x, x);
  EXPECT_EQ(dist::fallback_ops(), (std::vector<std::string>{"mul.out"}));
  ASSERT_EQ(g_warnings.size(), 1u);  // once per op
  EXPECT_NE(g_warnings[0].find("mul.out has no sharding rule yet (its rule is 'pointwise')"),
            std::string::npos)
      << g_warnings[0];
  // Rule "replicate" takes the same path without a warning; in place writes the shards back.
  DTensor t = distribute_tensor(a.clone(), mesh, {Shard(1)});
  Tensor u = t.tril_();
  EXPECT_TRUE(u.is_same(t));
  expect_placed(t, {Shard(1)}, a.tril());
  EXPECT_EQ(g_warnings.size(), 1u);
  set_warning_handler(nullptr);
}

TEST(DTensor, ReplicatePath) { expect_all_pass(run_ranks("replicate_path", 2)); }

// See Note [Random sharding]. bernoulli, normal_, uniform_ and dropout on DTensors give bit for bit
// the unsharded op's values from the same generator state, which advances as the unsharded op's
// does: on the shards where they line up with counter blocks, on the replicate path otherwise.
void check_random(const DeviceMesh& mesh, const Placements& placements, IntArrayRef shape,
                  bool sharded) {
  SCOPED_TRACE(dist::placements_str(placements) + " of " + std::to_string(shape[0]) + " rows");
  for (ScalarType dtype : {kFloat32, kFloat64}) {
    const Tensor p = random(shape, dtype, 0, 1, 3);
    Generator g1(42), g2(42);
    const auto stats = dist::dispatch_stats();
    Tensor got = bernoulli(distribute_tensor(p, mesh, placements), g2);
    Tensor want = bernoulli(p, g1);
    EXPECT_EQ(DTensor(got).placements(),
              sharded ? placements : Placements(placements.size(), Replicate()));
    expect_close(DTensor(got).full_tensor(), want, 0, 0);
    DTensor n = distribute_tensor(zeros(shape, dtype), mesh, placements);
    normal_(n, 1.0, 2.0, g2);
    expect_close(n.full_tensor(), normal_(zeros(shape, dtype), 1.0, 2.0, g1), 0, 0);
    DTensor u = distribute_tensor(zeros(shape, dtype), mesh, placements);
    uniform_(u, -1.0, 3.0, g2);
    expect_close(u.full_tensor(), uniform_(zeros(shape, dtype), -1.0, 3.0, g1), 0, 0);
    EXPECT_EQ(g1.get_state().offset, g2.get_state().offset);
    EXPECT_EQ(dist::dispatch_stats().replicated > stats.replicated, !sharded);
  }
  // The default generator, as the unsharded op uses it.
  manual_seed(7);
  Tensor got = bernoulli(distribute_tensor(full(shape, 0.5), mesh, placements));
  manual_seed(7);
  expect_close(DTensor(got).full_tensor(), bernoulli(full(shape, 0.5)), 0, 0);
}

// dropout (dropout_seeded), forward and backward, against one process from the same generator;
// the decision is cached although every call has a new offset.
void check_dropout(const DeviceMesh& mesh, const Placements& placements, IntArrayRef shape,
                   bool sharded) {
  SCOPED_TRACE("dropout " + dist::placements_str(placements));
  Generator g1(11), g2(11);
  const Tensor x0 = random(shape, kFloat32, -1, 1, 4);
  const auto stats = dist::dispatch_stats();
  for (int step = 0; step < 3; ++step) {
    Tensor xr = x0.clone().requires_grad_(true);
    Tensor yr = dropout(xr, 0.3, true, g1);
    (yr * yr).sum().backward();
    DTensor xd = distribute_tensor(x0, mesh, placements);
    xd.requires_grad_(true);
    Tensor yd = dropout(xd, 0.3, true, g2);
    (yd * yd).sum().backward();
    if (sharded) EXPECT_EQ(DTensor(yd).placements(), placements);
    expect_close(DTensor(yd).full_tensor(), yr, 0, 0);
    expect_close(DTensor(xd.grad()).full_tensor(), xr.grad());
  }
  EXPECT_EQ(dist::dispatch_stats().replicated > stats.replicated, !sharded);
  if (sharded) EXPECT_LE(dist::dispatch_stats().misses - stats.misses, 12);  // not one per call
}

KILN_RANK_SCENARIO(random_1d) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {world()});
  dist::clear_fallback_ops();
  check_random(mesh, {Shard(0)}, {12, 4}, true);    // pieces start at multiples of 4 elements
  check_random(mesh, {Replicate()}, {5, 3}, true);  // every rank draws the whole tensor
  check_random(mesh, {Shard(0)}, {5, 3}, false);    // rank 1 starts at element 9 (or 6)
  check_random(mesh, {Shard(1)}, {4, 6}, false);    // not row-major pieces
  check_random(mesh, {Shard(0)}, {2, 4}, true);     // 3 ranks: rows 1, 1 and an empty piece
  check_dropout(mesh, {Shard(0)}, {12, 4}, true);
  check_dropout(mesh, {Partial()}, {5, 3}, true);  // linear in its input, one mask
  check_dropout(mesh, {Shard(0)}, {5, 3}, false);
  // A transposed DTensor: dropout keeps a strided layout, so it takes the replicate path.
  Generator g1(3), g2(3);
  const Tensor a = random({4, 6}, kFloat32, -1, 1, 8);
  const Tensor want = dropout(a.t(), 0.5, true, g1);
  Tensor got = dropout(Tensor(distribute_tensor(a, mesh, {Replicate()})).t(), 0.5, true, g2);
  expect_close(DTensor(got).full_tensor(), want, 0, 0);
  // Ranks whose generators differ would draw replicas that differ: every rank raises.
  DTensor r = distribute_tensor(zeros({8, 4}), mesh, {Replicate()});
  Generator own(100 + rank());
  expect_error(ErrorKind::Runtime, "the ranks' random generators are in different states",
               [&] { normal_(r, 0.0, 1.0, own); });
  manual_seed(100 + rank());
  expect_error(ErrorKind::Runtime, "the ranks' random generators are in different states", [&] {
    dropout(distribute_tensor(ones({8, 4}), mesh, {Shard(0)}), 0.5, true);
  });
  EXPECT_TRUE(dist::fallback_ops().empty()) << dist::fallback_ops()[0];
}
TEST(DTensor, RandomTwoRanks) { expect_all_pass(run_ranks("random_1d", 2)); }
TEST(DTensor, RandomThreeRanksUneven) { expect_all_pass(run_ranks("random_1d", 3)); }

KILN_RANK_SCENARIO(random_2x2) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {2, 2});
  check_random(mesh, {Shard(0), Shard(0)}, {8, 2}, true);  // nested pieces of 2 rows
  check_random(mesh, {Replicate(), Shard(0)}, {8, 2}, true);
  check_random(mesh, {Shard(0), Replicate()}, {3, 4}, true);  // rows 2 + 1
  check_random(mesh, {Partial(), Replicate()}, {4, 4}, false);
  check_dropout(mesh, {Shard(0), Shard(0)}, {8, 2}, true);
  check_dropout(mesh, {Partial(), Shard(0)}, {8, 2}, true);
}
TEST(DTensor, Random2x2) { expect_all_pass(run_ranks("random_2x2", 4)); }

// See Note [Index sharding]. index_select, gather and the scatter rows run on the shards (uneven on
// 3 ranks: 5 rows); positions along the indexed dim are never rewritten.
KILN_RANK_SCENARIO(index_rule) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {world()});
  dist::clear_fallback_ops();
  auto D = [&](const Tensor& t, Placements p) { return distribute_tensor(t, mesh, std::move(p)); };
  Tensor a = random({5, 4}, kFloat32, -2, 2, 1), src = random({5, 4}, kFloat32, -2, 2, 2);
  Tensor idx = from_vector<int64_t>({3, 0, 3, 1, 2}, {5});
  Tensor gi =
      from_vector<int64_t>({1, 0, 3, 3, 2, 1, 0, 0, 2, 2, 1, 3, 0, 1, 2, 3, 3, 2, 1, 0}, {5, 4});
  // index_select: rows stay split; split positions give a split result; Partial passes.
  expect_placed(D(a, {Shard(0)}).index_select(1, D(idx, {Replicate()})), {Shard(0)},
                a.index_select(1, idx));
  expect_placed(D(a, {Replicate()}).index_select(0, D(idx, {Shard(0)})), {Shard(0)},
                a.index_select(0, idx));
  DTensor part(D(a, {Shard(0)}).sum({0}, true));  // Partial(sum), (1, 4)
  ASSERT_TRUE(part.placements()[0].is_partial());
  expect_placed(part.index_select(1, D(idx, {Replicate()})), {dist::Partial()},
                a.sum({0}, true).index_select(1, idx));
  // gather: self and index split alike along another dim; index split along dim.
  expect_placed(D(a, {Shard(0)}).gather(1, D(gi, {Shard(0)})), {Shard(0)}, a.gather(1, gi));
  expect_placed(D(a, {Replicate()}).gather(0, D(gi, {Shard(0)})), {Shard(0)}, a.gather(0, gi));
  // A smaller index along the split dim cannot line up: the rule replicates (no warning).
  Tensor small = gi.narrow(0, 0, 3).contiguous();
  expect_placed(D(a, {Shard(0)}).gather(1, D(small, {Shard(0)})), {Replicate()},
                a.gather(1, small));
  // scatter rows: everything split alike along another dim.
  expect_placed(D(a, {Shard(0)}).scatter(1, D(gi, {Shard(0)}), D(src, {Shard(0)})), {Shard(0)},
                a.scatter(1, gi, src));
  expect_placed(D(a, {Shard(0)}).scatter_add(1, D(gi, {Shard(0)}), D(src, {Shard(0)})), {Shard(0)},
                a.scatter_add(1, gi, src));
  expect_placed(D(a, {Shard(0)}).scatter(1, D(gi, {Shard(0)}), 7.0), {Shard(0)},
                a.scatter(1, gi, 7.0));
  DTensor w = D(a.clone(), {Shard(0)});
  Tensor r = w.scatter_(1, D(gi, {Shard(0)}), -1.0);
  EXPECT_TRUE(r.is_same(w));
  expect_placed(w, {Shard(0)}, a.scatter(1, gi, -1.0));
  for (const std::string& op : dist::fallback_ops())
    ADD_FAILURE() << op << " took the replicate path with a warning";
  // A bad dim is the local op's error.
  expect_error(ErrorKind::Index, "out of range",
               [&] { (void)D(a, {Shard(0)}).index_select(5, D(idx, {Replicate()})); });
}
TEST(DTensor, IndexRule) { expect_all_pass(run_ranks("index_rule", 2)); }
TEST(DTensor, IndexRuleThreeRanks) { expect_all_pass(run_ranks("index_rule", 3)); }

KILN_RANK_SCENARIO(dtensor_errors) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {2});
  DeviceMesh other = dist::init_device_mesh("cpu", {2}, {"x"});
  Tensor a = random({4, 3});
  expect_error(ErrorKind::Index, "placement Shard(2) is out of range for a tensor of 2 dims",
               [&] { distribute_tensor(a, mesh, {Shard(2)}); });
  expect_error(ErrorKind::Value, "2 placements [Shard(0), Shard(1)] for a mesh of 1 dims", [&] {
    distribute_tensor(a, mesh, {Shard(0), Shard(1)});
  });
  DTensor x = distribute_tensor(a, mesh, {Shard(0)}), y = distribute_tensor(a, other, {Shard(0)});
  expect_error(ErrorKind::Value,
               "add: DTensor arguments are on different device meshes: "
               "DeviceMesh('cpu', [0, 1]) and DeviceMesh('cpu', [0, 1], mesh_dim_names=('x'))",
               [&] { x + y; });
  expect_error(ErrorKind::Runtime,
               "mul: got a mix of DTensors and a plain tensor (argument 'other' of shape [4, 3])",
               [&] { x* a; });
  expect_error(ErrorKind::Value, "redistribute: the DTensor is on",
               [&] { x.redistribute(other, {Replicate()}); });
  // A rank whose local shape disagrees with the global shape it was given.
  expect_error(ErrorKind::Value, "holds a local shape [3, 3] but placements [Shard(0)]", [&] {
    DTensor::from_local(random({3, 3}), mesh, {Shard(0)}, DimVector{4, 3});
  });
  expect_error(ErrorKind::Value, "expected a DTensor, got a plain tensor", [&] { DTensor d(a); });
  expect_error(ErrorKind::Value, "Partial: the reduce op must be sum, avg, max or min",
               [] { Partial(ReduceOp::Product); });
}

TEST(DTensor, Errors) { expect_all_pass(run_ranks("dtensor_errors", 2)); }

KILN_RANK_SCENARIO(dtensor_autograd) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {world()});
  Tensor a = random({5, 4}, kFloat32, -2, 2, 1), b = random({5, 4}, kFloat32, -2, 2, 2);
  DTensor x = distribute_tensor(a, mesh, {Shard(0)});
  x.requires_grad_();
  (x * x).sum().backward();  // grad (Replicate) * x (Shard(0)), twice
  expect_placed(x.grad(), {Shard(0)}, a * 2.0);
  DTensor v = distribute_tensor(a, mesh, {Shard(0)});
  DTensor w = distribute_tensor(b, mesh, {Replicate()});
  v.requires_grad_();
  w.requires_grad_();
  (v * w).sum().backward();
  expect_placed(v.grad(), {Replicate()}, b);  // grad * w: both Replicate
  expect_placed(w.grad(), {Shard(0)}, a);     // grad * v
  // Through an op on the replicate path (transpose has no rule yet): a non-contiguous
  // Replicate() gradient that AccumulateGrad detaches.
  DTensor t = distribute_tensor(a, mesh, {Shard(0)});
  t.requires_grad_();
  (t.transpose(0, 1) * distribute_tensor(b.t().contiguous(), mesh, {Shard(1)})).sum().backward();
  expect_close(DTensor(t.grad()).full_tensor(), b);
  // from_local, to_local and full_tensor are differentiable.
  Tensor local = random({2, 3}, kFloat32, -2, 2, 5 + rank()).requires_grad_();
  DTensor d = DTensor::from_local(local, mesh, {Shard(0)});
  DTensor(d * d).to_local().sum().backward();
  expect_close(local.grad(), local.detach() * 2.0);
  DTensor s = distribute_tensor(a, mesh, {Shard(1)});
  s.requires_grad_();
  (s.full_tensor() * b).sum().backward();
  expect_placed(s.grad(), {Shard(1)}, b);
  // *_like, clone and reshape of a DTensor that requires grad stay DTensors (the *_like rows
  // skip the Autograd key, Note [DTensor dispatch]); reshape of a transposed one copies.
  DTensor r = distribute_tensor(a, mesh, {Shard(0)});
  r.requires_grad_();
  Tensor z = zeros_like(r);
  ASSERT_TRUE(dist::is_dtensor(z));
  EXPECT_FALSE(z.requires_grad());
  expect_placed(z, {Shard(0)}, zeros_like(a));
  Tensor c = r.clone();
  ASSERT_TRUE(dist::is_dtensor(c));
  EXPECT_TRUE(c.requires_grad());
  Tensor flat = r.transpose(0, 1).reshape({20});
  ASSERT_TRUE(dist::is_dtensor(flat));
  expect_close(DTensor(flat).full_tensor(), a.t().reshape({20}));
  (flat * distribute_tensor(arange(0, 20, 1, kFloat32), mesh, {Replicate()})).sum().backward();
  expect_close(DTensor(r.grad()).full_tensor(), arange(0, 20, 1, kFloat32).view({4, 5}).t());
  // A multi-output node's unused DTensor output (attention's logsumexp) gets a DTensor of zeros
  // as its gradient (BackendHandle::zeros_maker), not a plain tensor.
  Tensor q0 = random({2, 2, 3, 4}, kFloat32, -1, 1, 9);
  DTensor q = distribute_tensor(q0, mesh, {Shard(1)});
  q.requires_grad_();
  scaled_dot_product_attention(q, q, q, 0.0, true).sum().backward();
  Tensor q1 = q0.clone().requires_grad_(true);
  scaled_dot_product_attention(q1, q1, q1, 0.0, true).sum().backward();
  expect_close(DTensor(q.grad()).full_tensor(), q1.grad(), 1e-5, 1e-6);
}

TEST(DTensor, Autograd) { expect_all_pass(run_ranks("dtensor_autograd", 2)); }

}  // namespace
}  // namespace kiln::testing
