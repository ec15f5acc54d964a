// Views and cat of DTensors across processes (tests/sharding/harness.h; Note [View sharding]):
// every view op and cat on 1-d meshes of 2 and 3 ranks (3 gives uneven shards) and on a 2x2
// mesh, each against the unsharded op: the gathered values, the result's placements (no gather
// where none is needed), its global strides, writes through views reaching the DTensor (and the
// refused ones: Note [DTensor views]), no op on the replicate path, and autograd through views
// with the gradients' placements.
#include <gtest/gtest.h>

#include "harness.h"
#include "kiln/autograd/grad_mode.h"
#include "kiln/dist/dtensor.h"
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

// `t` is placed by `want`, has the global geometry of `ref` (the unsharded op's result) and
// gathers to it.
void expect_view(const Tensor& t, const Placements& want, const Tensor& ref) {
  DTensor d(t);
  EXPECT_EQ(dist::placements_str(d.placements()), dist::placements_str(want));
  EXPECT_EQ(d.sizes(), ref.sizes());
  EXPECT_EQ(d.strides(), ref.strides());
  EXPECT_EQ(d.to_local().sizes(),
            IntArrayRef(dist::local_shape(ref.sizes(), d.device_mesh(), want)));
  expect_close(d.full_tensor(), ref, 1e-5, 1e-5);
}

void expect_views(const std::vector<Tensor>& ts, const Placements& want,
                  const std::vector<Tensor>& ref) {
  ASSERT_EQ(ts.size(), ref.size());
  for (size_t k = 0; k < ts.size(); ++k) {
    SCOPED_TRACE("piece " + std::to_string(k));
    expect_view(ts[k], want, ref[k]);
  }
}

// A Partial(sum) DTensor of global value `g` whose pieces differ between ranks.
DTensor partial_of(const Tensor& g, const DeviceMesh& mesh, Placements p) {
  DTensor d = distribute_tensor(g, mesh, p);
  Tensor local = d.to_local().clone();
  const std::vector<int64_t> c = mesh.coordinate();
  for (size_t i = 0; i < p.size(); ++i) {
    if (!p[i].is_partial()) continue;
    const int64_t n = mesh.size(static_cast<int64_t>(i));
    Tensor mine = random(local.sizes(), kFloat32, 0, 1, 7 + static_cast<uint32_t>(c[i]));
    Tensor next = random(local.sizes(), kFloat32, 0, 1, 7 + static_cast<uint32_t>((c[i] + 1) % n));
    local = local + (mine - next);  // cancels in the sum
  }
  return DTensor::from_local(local, mesh, p, DimVector(g.sizes()));
}

KILN_RANK_SCENARIO(view_1d) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {world()});
  const int n = world();
  dist::clear_fallback_ops();
  Tensor a = random({12, 4}, kFloat32, -2, 2, 1);  // even over 2 and 3 ranks
  Tensor b = random({5, 4}, kFloat32, -2, 2, 2);   // uneven over 2 and 3 ranks
  Tensor c = random({4, 3, 5}, kFloat32, -2, 2, 3);
  auto D = [&](const Tensor& t, Placements p) { return distribute_tensor(t, mesh, std::move(p)); };
  const Placements S0 = {Shard(0)}, S1 = {Shard(1)}, S2 = {Shard(2)}, R = {Replicate()},
                   P = {Partial()};

  // transpose, t, permute renumber the shard; Replicate and Partial pass.
  for (const Tensor& g : {a, b}) {
    SCOPED_TRACE(::testing::Message() << "shape " << g.sizes());
    expect_view(D(g, S0).transpose(0, 1), S1, g.transpose(0, 1));
    expect_view(D(g, S1).transpose(1, 0), S0, g.transpose(1, 0));
    expect_view(D(g, R).transpose(0, 1), R, g.transpose(0, 1));
    expect_view(partial_of(g, mesh, P).transpose(0, 1), P, g.transpose(0, 1));
    expect_view(D(g, S0).t(), S1, g.t());
    expect_view(D(g, S1).t(), S0, g.t());
  }
  expect_view(D(c, S0).permute({2, 0, 1}), S1, c.permute({2, 0, 1}));
  expect_view(D(c, S2).permute({2, 0, 1}), S0, c.permute({2, 0, 1}));
  expect_view(D(c, S1).permute({-1, -2, -3}), S1, c.permute({2, 1, 0}));
  expect_view(D(c, S0).transpose(1, 2).transpose(0, 2), S2, c.transpose(1, 2).transpose(0, 2));

  // unsqueeze and squeeze renumber; a shard of a squeezed size-1 dim is gathered.
  Tensor e = random({5, 1, 4}, kFloat32, -2, 2, 4);
  expect_view(D(b, S0).unsqueeze(0), S1, b.unsqueeze(0));
  expect_view(D(b, S1).unsqueeze(-1), S1, b.unsqueeze(-1));
  expect_view(D(e, S0).squeeze(), S0, e.squeeze());
  expect_view(D(e, S2).squeeze(std::vector<int64_t>{1}), S1, e.squeeze(std::vector<int64_t>{1}));
  expect_view(D(e, S1).squeeze(), R, e.squeeze());
  expect_view(partial_of(e, mesh, P).squeeze(), P, e.squeeze());

  // view / reshape / flatten / unflatten.
  expect_view(D(a, S0).view({48}), S0, a.view({48}));            // even merge
  expect_view(D(b, S0).view({20}), R, b.view({20}));             // uneven merge: gathered
  expect_view(D(a, S1).view({48}), R, a.view({48}));             // not the outermost dim
  expect_view(D(a, S0).view({6, 2, 4}), S0, a.view({6, 2, 4}));  // piece 6 or 4, inner 2
  expect_view(D(a, S0).view({2, 6, 4}), n == 2 ? S0 : R, a.view({2, 6, 4}));  // inner 6
  expect_view(D(a, S0).view({-1, 8}), S0, a.view({6, 8}));  // 12x4 -> 6x8: pieces line up
  expect_view(D(a, S1).view({12, 2, 2}), S1, a.view({12, 2, 2}));
  expect_view(D(b, S0).view({5, 2, 2}), S0, b.view({5, 2, 2}));  // an untouched uneven dim
  expect_view(D(b, S1).view({5, 2, 2}), S1, b.view({5, 2, 2}));  // piece 2, inner 2
  expect_view(D(b, S1).view({1, 5, 4, 1}), S2, b.view({1, 5, 4, 1}));
  expect_view(partial_of(a, mesh, P).view({3, 16}), P, a.view({3, 16}));
  expect_view(D(a, S0).reshape({4, 3, 4}), n == 2 ? S0 : R, a.reshape({4, 3, 4}));  // inner 3
  expect_view(D(c, S0).flatten(), n == 2 ? S0 : R, c.flatten());  // 4 = 2 + 2 + 0 rows
  expect_view(D(c, S0).flatten(1), S0, c.flatten(1));
  expect_view(D(c, S2).flatten(0, 1), S1, c.flatten(0, 1));
  expect_view(D(c, S1).flatten(1), n == 2 ? R : S1, c.flatten(1));  // 3 over 2 ranks: uneven
  expect_view(D(a, S1).unflatten(1, {2, 2}), S1, a.unflatten(1, {2, 2}));
  expect_view(D(a, S0).unflatten(0, {6, 2}), S0, a.unflatten(0, {6, 2}));

  // expand: a shard passes unless its dim is expanded.
  Tensor row = random({1, 4}, kFloat32, -2, 2, 5), col = random({5, 1}, kFloat32, -2, 2, 6);
  Tensor vec = random({4}, kFloat32, -2, 2, 7);
  expect_view(D(row, S1).expand({5, 4}), S1, row.expand({5, 4}));
  expect_view(D(col, S0).expand({5, 3}), S0, col.expand({5, 3}));
  expect_view(D(col, S0).expand({2, -1, 3}), S1, col.expand({2, 5, 3}));
  expect_view(D(col, S1).expand({5, 3}), R, col.expand({5, 3}));
  expect_view(D(vec, S0).expand({3, 4}), S1, vec.expand({3, 4}));
  expect_view(partial_of(col, mesh, P).expand({5, 3}), P, col.expand({5, 3}));

  // select, slice, narrow: pass on other dims, gather the indexed one.
  expect_view(D(b, S0).select(1, 2), S0, b.select(1, 2));
  expect_view(D(b, S1).select(0, -1), S0, b.select(0, -1));
  expect_view(D(b, S0).select(0, 3), R, b.select(0, 3));
  expect_view(D(b, S0).narrow(1, 1, 2), S0, b.narrow(1, 1, 2));
  expect_view(D(b, S1).narrow(1, 1, 2), R, b.narrow(1, 1, 2));
  expect_view(D(b, S0).slice(1, 0, 4, 2), S0, b.slice(1, 0, 4, 2));
  expect_view(D(b, S0).slice(0, std::nullopt, std::nullopt), S0, b.slice(0));  // the whole dim
  expect_view(partial_of(b, mesh, P).select(0, 1), P, b.select(0, 1));
  expect_view(D(c, S0).diagonal(0, 1, 2), S0, c.diagonal(0, 1, 2));
  expect_view(D(c, S2).diagonal(1, 0, 1), S0, c.diagonal(1, 0, 1));
  expect_view(D(c, S1).diagonal(0, 1, 2), R, c.diagonal(0, 1, 2));

  // split, split_with_sizes, chunk: one result per piece.
  expect_views(D(b, S0).split(3, 1), S0, b.split(3, 1));
  expect_views(D(b, S1).split(2, 0), S1, b.split(2, 0));
  expect_views(D(b, S0).split(2, 0), R, b.split(2, 0));
  expect_views(kiln::split_with_sizes(D(b, S1), {1, 4}, 0), S1,
               kiln::split_with_sizes(b, {1, 4}, 0));
  expect_views(D(c, S2).chunk(3, 0), S2, c.chunk(3, 0));
  expect_views(D(c, S2).chunk(2, 2), R, c.chunk(2, 2));
  expect_views(partial_of(c, mesh, P).chunk(2, 1), P, c.chunk(2, 1));

  // cat and stack: a shard of another dim passes, the cat dim is gathered.
  Tensor b2 = random({5, 4}, kFloat32, -2, 2, 8), b3 = random({5, 2}, kFloat32, -2, 2, 9);
  expect_view(kiln::cat({D(b, S0), D(b3, S0)}, 1), S0, kiln::cat({b, b3}, 1));
  expect_view(kiln::cat({D(b, S0), D(b2, S0)}, 0), R, kiln::cat({b, b2}, 0));
  expect_view(kiln::cat({D(b, S1), D(b2, R)}, 0), S1, kiln::cat({b, b2}, 0));  // a free piece
  expect_view(kiln::cat({D(b, S1), D(b2, S1)}, -2), S1, kiln::cat({b, b2}, 0));
  expect_view(kiln::cat({partial_of(b, mesh, P), partial_of(b2, mesh, P)}, 0), P,
              kiln::cat({b, b2}, 0));
  expect_view(kiln::cat({partial_of(b, mesh, P), D(b2, R)}, 0), R, kiln::cat({b, b2}, 0));
  expect_view(kiln::stack({D(b, S0), D(b2, S0)}, 0), S1, kiln::stack({b, b2}, 0));
  expect_view(kiln::stack({D(b, S1), D(b2, S1)}, 2), S1, kiln::stack({b, b2}, 2));

  // Writes through a view reach the DTensor.
  {
    DTensor x = D(b.clone(), S0);
    Tensor v = x.transpose(0, 1);
    v.mul_(full({}, 2.0));
    expect_close(x.full_tensor(), b * 2.0);
    expect_view(v, S1, (b * 2.0).t());
  }
  {
    DTensor x = D(a.clone(), S0);
    x.view({48}).add_(full({}, 1.0));
    x.view({-1, 8}).select(1, 0).zero_();
    Tensor want = a + 1.0;
    want.view({-1, 8}).select(1, 0).zero_();
    expect_close(x.full_tensor(), want);
  }
  {
    DTensor x = D(b.clone(), S1);
    std::vector<Tensor> pieces = x.split(2, 0);
    pieces[1].fill_(3.0);
    x.unsqueeze(0).squeeze(std::vector<int64_t>{0}).narrow(0, 4, 1).mul_(full({}, -1.0));
    Tensor want = b.clone();
    want.narrow(0, 2, 2).fill_(3.0);
    want.narrow(0, 4, 1).mul_(full({}, -1.0));
    expect_close(x.full_tensor(), want);
  }
  {
    DTensor x = D(c.clone(), S1);
    x.permute({2, 0, 1}).select(0, 1).mul_(full({}, 0.5));
    Tensor want = c.clone();
    want.select(2, 1).mul_(full({}, 0.5));
    expect_close(x.full_tensor(), want);
  }
  EXPECT_TRUE(dist::fallback_ops().empty()) << dist::fallback_ops()[0];
  // Cached: the same view again decides nothing new.
  DTensor x = D(a, S0);
  (void)x.view({48});
  const auto before = dist::dispatch_stats();
  (void)x.view({48});
  (void)x.transpose(0, 1);
  EXPECT_EQ(dist::dispatch_stats().misses, before.misses);
}

TEST(DTensorView, TwoRanks) { expect_all_pass(run_ranks("view_1d", 2)); }
TEST(DTensorView, ThreeRanksUneven) { expect_all_pass(run_ranks("view_1d", 3)); }

KILN_RANK_SCENARIO(view_2x2) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  dist::clear_fallback_ops();
  Tensor a = random({4, 6}, kFloat32, -2, 2, 1), b = random({5, 3}, kFloat32, -2, 2, 2);
  Tensor g = random({6, 4}, kFloat32, -2, 2, 3);
  auto D = [&](const Tensor& t, Placements p) { return distribute_tensor(t, mesh, std::move(p)); };
  const Placements RR = {Replicate(), Replicate()};
  expect_view(D(a, {Shard(0), Shard(1)}).t(), {Shard(1), Shard(0)}, a.t());
  expect_view(D(b, {Shard(0), Shard(1)}).transpose(0, 1), {Shard(1), Shard(0)}, b.t());
  expect_view(D(b, {Shard(0), Shard(0)}).t(), {Shard(1), Shard(1)}, b.t());
  // Nested shards of one dim: 4 -> 2 -> 1 lines up, 6 -> 3 -> (2, 1) does not.
  expect_view(D(a, {Shard(0), Shard(0)}).view({24}), {Shard(0), Shard(0)}, a.view({24}));
  expect_view(D(g, {Shard(0), Shard(0)}).view({24}), RR, g.view({24}));
  expect_view(D(a, {Shard(0), Shard(1)}).view({2, 2, 6}), {Shard(0), Shard(2)}, a.view({2, 2, 6}));
  expect_view(D(a, {Shard(1), Shard(0)}).view({24}), {Replicate(), Shard(0)}, a.view({24}));
  DTensor p = partial_of(a, mesh, {Partial(), Shard(1)});
  expect_view(p.transpose(0, 1), {Partial(), Shard(0)}, a.t());
  expect_view(p.view({4, 2, 3}), {Partial(), Shard(1)}, a.view({4, 2, 3}));
  expect_view(D(a, {Shard(0), Shard(1)}).unsqueeze(1).expand({4, 3, 6}), {Shard(0), Shard(2)},
              a.unsqueeze(1).expand({4, 3, 6}));
  expect_views(D(b, {Shard(1), Shard(0)}).split(2, 1), {Replicate(), Shard(0)}, b.split(2, 1));
  expect_view(kiln::cat({D(b, {Shard(0), Shard(1)}), D(b, {Shard(0), Replicate()})}, 1),
              {Shard(0), Replicate()}, kiln::cat({b, b}, 1));
  expect_view(kiln::stack({D(b, {Shard(1), Shard(0)}), D(b, {Shard(1), Shard(0)})}, 1),
              {Shard(2), Shard(0)}, kiln::stack({b, b}, 1));
  DTensor x = D(a.clone(), {Shard(0), Shard(1)});
  x.t().view({2, 3, 4}).select(1, 0).mul_(full({}, 10.0));  // t() has strides (1, 6)
  Tensor want = a.clone();
  want.t().view({2, 3, 4}).select(1, 0).mul_(full({}, 10.0));
  expect_close(x.full_tensor(), want);
  EXPECT_TRUE(dist::fallback_ops().empty()) << dist::fallback_ops()[0];
}

TEST(DTensorView, Mesh2x2) { expect_all_pass(run_ranks("view_2x2", 4)); }

KILN_RANK_SCENARIO(view_autograd) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {world()});
  dist::clear_fallback_ops();
  Tensor a = random({6, 4}, kFloat32, -2, 2, 1), w = random({6, 4}, kFloat32, -2, 2, 2);
  auto D = [&](const Tensor& t, Placements p) { return distribute_tensor(t, mesh, std::move(p)); };
  // view: the gradient comes back through view and reshape as Shard(0).
  DTensor x = D(a, {Shard(0)});
  x.requires_grad_();
  (x.view({24}) * D(w, {Shard(0)}).view({24})).sum().backward();
  expect_view(x.grad(), {Shard(0)}, w);
  // transpose: Shard(0) -> Shard(1) forward, back to Shard(0).
  DTensor y = D(a, {Shard(0)});
  y.requires_grad_();
  (y.t() * D(w.t().contiguous(), {Shard(1)})).sum().backward();
  expect_close(DTensor(y.grad()).full_tensor(), w);
  EXPECT_EQ(dist::placements_str(DTensor(y.grad()).placements()), "[Shard(0)]");
  // reshape and unflatten of a sharded dim, and expand in the backward of a broadcast.
  DTensor z = D(a, {Shard(1)});
  z.requires_grad_();
  Tensor col = random({6, 1}, kFloat32, -2, 2, 3);
  DTensor k = D(col, {Shard(0)});
  k.requires_grad_();
  (z.reshape({6, 2, 2}).flatten(1) * k).sum().backward();
  expect_close(DTensor(z.grad()).full_tensor(), col.expand({6, 4}));
  expect_close(DTensor(k.grad()).full_tensor(), a.sum({1}, true));
  // mean: its backward expands the gradient.
  DTensor m = D(a, {Shard(0)});
  m.requires_grad_();
  m.mean().backward();
  expect_close(DTensor(m.grad()).full_tensor(), full({6, 4}, 1.0 / 24));
  std::vector<std::string> f = dist::fallback_ops();
  for (const std::string& op : f) EXPECT_TRUE(op != "view" && op != "expand" && op != "t") << op;
}

TEST(DTensorView, Autograd) { expect_all_pass(run_ranks("view_autograd", 2)); }

// See Note [DTensor views]. Writes through views that would be lost are refused, those that reach
// the DTensor are allowed.
KILN_RANK_SCENARIO(view_writes) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {world()});
  Tensor a = random({4, 6}, kFloat32, -2, 2, 5);
  // A view of the local shard (slicing the unsharded dim of a Shard(0) DTensor) under autograd:
  // the base would not see the write in its gradient.
  DTensor x = distribute_tensor(a, mesh, {Shard(0)});
  x.requires_grad_();
  Tensor y = x * 1.0;
  expect_error(ErrorKind::NotImplemented, "mul_: an in-place write into a view of a DTensor",
               [&] { y.narrow(1, 1, 2).mul_(full({}, 3.0)); });
  // The same write without autograd reaches the DTensor (and not `a`: a shard is a copy).
  DTensor z = distribute_tensor(a, mesh, {Shard(0)});
  {
    autograd::NoGradGuard no_grad;
    z.narrow(1, 1, 2).mul_(full({}, 3.0));
  }
  Tensor want = a.clone();
  want.narrow(1, 1, 2).mul_(full({}, 3.0));
  expect_close(z.full_tensor(), want);
  expect_close(a, random({4, 6}, kFloat32, -2, 2, 5));
  // A view that cuts the sharded dim views a gathered copy: the write would be lost.
  DTensor s = distribute_tensor(a, mesh, {Shard(1)});
  autograd::NoGradGuard no_grad;
  expect_error(ErrorKind::NotImplemented, "views a gathered copy of its shards",
               [&] { s.narrow(1, 1, 2).fill_(0.0); });
  expect_close(s.full_tensor(), a);
}
TEST(DTensorView, WritesThroughViews) { expect_all_pass(run_ranks("view_writes", 2)); }
TEST(DTensorView, AutogradThreeRanks) { expect_all_pass(run_ranks("view_autograd", 3)); }

}  // namespace
}  // namespace kiln::testing
