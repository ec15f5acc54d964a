// The DTensor reduction, softmax and norm sharding rules across processes (See Note [Reduction
// sharding] and Note [Softmax sharding]): on 1-d meshes of 2 and 3 ranks (3 gives uneven and
// empty pieces) and on a 2x2 mesh, every reduction row over several dims, with and without
// keepdim, from every input placement; softmax, log_softmax, layer_norm, rms_norm and their
// backward rows; autograd; the decision cache. Every result is checked against the same op on the
// unsharded tensor, its placements against the ones the rules promise, and no op may take the
// replicate path.
#include <functional>
#include <optional>
#include <set>

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

// How a Shard of a reduced dim (and a Partial input) combines across ranks.
enum class Combine { None, Sum, Max, Min };

struct Reduction {
  std::string name;
  std::function<std::vector<Tensor>(const Tensor&)> run;
  std::optional<std::vector<int64_t>> dims;  // nullopt: every dim
  bool keepdim;
  Combine combine;
  bool skip_partial = false;  // any/all of a comparison: the comparison is not linear
};

std::vector<bool> mask_of(const Reduction& r, int64_t ndim) {
  std::vector<bool> m(ndim, !r.dims || r.dims->empty());
  if (r.dims)
    for (int64_t d : *r.dims) m[d < 0 ? d + ndim : d] = true;
  return m;
}

// Whether some rank's piece of dim d is empty under the Shard(d) placements of `p`.
bool some_piece_empty(int64_t size, const DeviceMesh& mesh, const Placements& p, int64_t d) {
  std::vector<int64_t> pieces{size};
  for (size_t i = 0; i < p.size(); ++i) {
    if (!p[i].is_shard(d)) continue;
    std::vector<int64_t> next;
    const int64_t n = mesh.size(static_cast<int64_t>(i));
    for (int64_t s : pieces)
      for (int64_t j = 0; j < n; ++j) next.push_back(dist::chunk_of(s, n, j).second);
    pieces = next;
  }
  for (int64_t s : pieces)
    if (s == 0) return true;
  return false;
}

// The placements Note [Reduction sharding] promises for `r` of a tensor of `shape` placed by `in`.
Placements expected(const Reduction& r, IntArrayRef shape, const DeviceMesh& mesh,
                    const Placements& in) {
  const int64_t ndim = static_cast<int64_t>(shape.size());
  const std::vector<bool> mask = mask_of(r, ndim);
  auto out_dim = [&](int64_t d) {
    int64_t od = d;
    if (!r.keepdim)
      for (int64_t k = 0; k < d; ++k) od -= mask[k];
    return od;
  };
  Placements out;
  for (const Placement& p : in) {
    if (p.is_shard() && !mask[p.dim]) {
      out.push_back(Shard(out_dim(p.dim)));
    } else if (p.is_shard()) {
      const bool empty = (r.combine == Combine::Max || r.combine == Combine::Min) &&
                         some_piece_empty(shape[p.dim], mesh, in, p.dim);
      if (r.combine == Combine::Sum)
        out.push_back(Partial());
      else if (r.combine == Combine::Max && !empty)
        out.push_back(Partial(ReduceOp::Max));
      else if (r.combine == Combine::Min && !empty)
        out.push_back(Partial(ReduceOp::Min));
      else
        out.push_back(Replicate());
    } else if (p.is_partial()) {
      const bool keeps = (r.combine == Combine::Sum && p.reduce == ReduceOp::Sum) ||
                         (r.combine == Combine::Max && p.reduce == ReduceOp::Max);
      if (keeps) {
        out.push_back(p);
        continue;
      }
      // Reduce-scattered onto the first kept dim, else all-reduced.
      int64_t first = -1;
      for (int64_t d = ndim - 1; d >= 0; --d)
        if (!mask[d]) first = d;
      out.push_back(first >= 0 ? Shard(out_dim(first)) : Replicate());
    } else {
      out.push_back(Replicate());
    }
  }
  return out;
}

std::vector<Reduction> reductions() {
  using V = std::vector<int64_t>;
  std::vector<Reduction> rs;
  auto one = [](auto f) { return [f](const Tensor& t) { return std::vector<Tensor>{f(t)}; }; };
  for (bool k : {false, true}) {
    for (std::optional<V> d : {std::optional<V>{}, std::optional<V>{V{0}}, std::optional<V>{V{1}},
                               std::optional<V>{V{-1}}, std::optional<V>{V{0, 2}}}) {
      auto opt = [d]() { return OptionalIntArrayRef(d); };
      rs.push_back({"sum", one([=](const Tensor& t) { return kiln::sum(t, opt(), k); }), d, k,
                    Combine::Sum});
      rs.push_back({"sum(dtype=float64)",
                    one([=](const Tensor& t) { return kiln::sum(t, opt(), k, kFloat64); }), d, k,
                    Combine::Sum});
      rs.push_back({"mean", one([=](const Tensor& t) { return kiln::mean(t, opt(), k); }), d, k,
                    Combine::Sum});
      rs.push_back({"var", one([=](const Tensor& t) { return kiln::var(t, opt(), 1.0, k); }), d, k,
                    Combine::None});
      rs.push_back({"std(correction=0)",
                    one([=](const Tensor& t) { return kiln::std(t, opt(), 0.0, k); }), d, k,
                    Combine::None});
      rs.push_back({"norm", one([=](const Tensor& t) { return kiln::norm(t, 2, opt(), k); }), d, k,
                    Combine::None});
      rs.push_back({"any", one([=](const Tensor& t) { return kiln::any(t > 0.5, opt(), k); }), d, k,
                    Combine::None, true});
      rs.push_back({"all", one([=](const Tensor& t) { return kiln::all(t > -1.5, opt(), k); }), d,
                    k, Combine::None, true});
      if (d) {
        V dl = *d;
        rs.push_back({"amax", one([=](const Tensor& t) { return kiln::amax(t, dl, k); }), d, k,
                      Combine::Max});
        rs.push_back({"amin", one([=](const Tensor& t) { return kiln::amin(t, dl, k); }), d, k,
                      Combine::Min});
        rs.push_back({"logsumexp", one([=](const Tensor& t) { return kiln::logsumexp(t, dl, k); }),
                      d, k, Combine::None});
      }
      if (d && d->size() == 1) {
        const int64_t x = (*d)[0];
        rs.push_back({"prod", one([=](const Tensor& t) { return kiln::prod(t, opt(), k); }), d, k,
                      Combine::None});
        rs.push_back({"max.dim",
                      [=](const Tensor& t) {
                        auto [v, i] = kiln::max(t, x, k);
                        return std::vector<Tensor>{v, i};
                      },
                      d, k, Combine::None});
        rs.push_back({"min.dim",
                      [=](const Tensor& t) {
                        auto [v, i] = kiln::min(t, x, k);
                        return std::vector<Tensor>{v, i};
                      },
                      d, k, Combine::None});
        rs.push_back({"argmax", one([=](const Tensor& t) { return kiln::argmax(t, x, k); }), d, k,
                      Combine::None});
        rs.push_back({"argmin", one([=](const Tensor& t) { return kiln::argmin(t, x, k); }), d, k,
                      Combine::None});
      }
    }
    rs.push_back({"argmax(dim=None)", one([=](const Tensor& t) { return kiln::argmax(t, {}, k); }),
                  std::nullopt, k, Combine::None});
  }
  rs.push_back({"amax([])", one([](const Tensor& t) { return kiln::amax(t, {}, false); }),
                std::vector<int64_t>{}, false, Combine::Max});
  rs.push_back({"max()", one([](const Tensor& t) { return kiln::max(t); }), std::nullopt, false,
                Combine::Max});
  rs.push_back({"min()", one([](const Tensor& t) { return kiln::min(t); }), std::nullopt, false,
                Combine::Min});
  return rs;
}

std::string describe(const Reduction& r, const Placements& p) {
  std::ostringstream os;
  os << r.name << " dims ";
  if (r.dims)
    os << IntArrayRef(*r.dims);
  else
    os << "None";
  os << " keepdim " << r.keepdim << " from " << dist::placements_str(p);
  return os.str();
}

// Every reduction from every placement in `placements` of `g` on `mesh`.
void check_reductions(const DeviceMesh& mesh, const Tensor& g,
                      const std::vector<Placements>& placements) {
  dist::clear_fallback_ops();
  size_t checked = 0;
  for (const Placements& p : placements) {
    // Partial pieces made by distribute_tensor (rank 0 holds the value) are exact, so argmax
    // and the products see the same values as the reference.
    DTensor x = distribute_tensor(g, mesh, p);
    for (const Reduction& r : reductions()) {
      bool partial = false;
      for (const Placement& q : p) partial = partial || q.is_partial();
      if (partial && r.skip_partial) continue;
      SCOPED_TRACE(describe(r, p));
      std::vector<Tensor> got = r.run(x), want = r.run(g);
      ASSERT_EQ(got.size(), want.size());
      const Placements placed = expected(r, g.sizes(), mesh, p);
      for (size_t k = 0; k < got.size(); ++k) {
        DTensor d(got[k]);
        EXPECT_EQ(dist::placements_str(d.placements()), dist::placements_str(placed));
        EXPECT_EQ(d.dtype(), want[k].dtype());
        expect_close(d.full_tensor(), want[k], 1e-5, 1e-5);
      }
      ++checked;
    }
  }
  EXPECT_GE(checked, 100 * placements.size());  // 139 reductions, 119 from a Partial input
  const auto fb = dist::fallback_ops();
  EXPECT_TRUE(fb.empty()) << fb[0];
}

KILN_RANK_SCENARIO(reduction_1d) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {world()});
  // 5 rows: 3 + 2 on 2 ranks, 2 + 2 + 1 on 3; 4 columns: 2 + 2 + 0 on 3 ranks (an empty piece).
  Tensor g = random({5, 4, 3}, kFloat32, 0.5, 1.5, 21);
  check_reductions(mesh, g, {{Shard(0)}, {Shard(1)}, {Shard(2)}, {Replicate()}, {Partial()}});
}

TEST(DTensor, ReductionTwoRanks) { expect_all_pass(run_ranks("reduction_1d", 2)); }
TEST(DTensor, ReductionThreeRanksUneven) { expect_all_pass(run_ranks("reduction_1d", 3)); }

KILN_RANK_SCENARIO(reduction_2x2) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  Tensor g = random({5, 3, 4}, kFloat32, 0.5, 1.5, 22);
  check_reductions(mesh, g,
                   {{Shard(0), Shard(1)},
                    {Shard(1), Shard(0)},
                    {Shard(0), Shard(0)},
                    {Replicate(), Shard(2)},
                    {Partial(), Shard(1)},
                    {Shard(2), Partial()}});
}

TEST(DTensor, Reduction2x2) { expect_all_pass(run_ranks("reduction_2x2", 4)); }

void expect_placed(const Tensor& t, const Placements& want, const Tensor& full) {
  DTensor d(t);
  EXPECT_EQ(dist::placements_str(d.placements()), dist::placements_str(want));
  expect_close(d.full_tensor(), full, 1e-5, 1e-5);
}

// Partial pieces that differ between ranks, the per-rank terms cancelling (sum) or staying below
// the value (max).
DTensor genuine(const Tensor& g, const DeviceMesh& mesh, const Placements& p) {
  DTensor d = distribute_tensor(g, mesh, p);
  Tensor local = d.to_local().clone();
  const std::vector<int64_t> c = mesh.coordinate();
  for (size_t i = 0; i < p.size(); ++i) {
    if (!p[i].is_partial()) continue;
    const int64_t n = mesh.size(static_cast<int64_t>(i));
    Tensor noise = random(local.sizes(), kFloat32, 0, 1, 7 + static_cast<uint32_t>(c[i]));
    if (p[i].reduce == ReduceOp::Max) local = local - static_cast<double>(c[i]) * noise;
    if (p[i].reduce == ReduceOp::Sum || p[i].reduce == ReduceOp::Avg)
      local = local + (noise - random(local.sizes(), kFloat32, 0, 1,
                                      7 + static_cast<uint32_t>((c[i] + 1) % n)));
  }
  return DTensor::from_local(local, mesh, p, DimVector(g.sizes()));
}

KILN_RANK_SCENARIO(reduction_partial) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {world()});
  Tensor g = random({5, 4}, kFloat32, -2, 2, 23);
  dist::clear_fallback_ops();
  DTensor s = genuine(g, mesh, {Partial()}), a = genuine(g, mesh, {Partial(ReduceOp::Avg)});
  DTensor m = genuine(g, mesh, {Partial(ReduceOp::Max)});
  expect_placed(s.sum({1}), {Partial()}, g.sum({1}));
  expect_placed(a.sum(), {Partial(ReduceOp::Avg)}, g.sum());
  expect_placed(a.mean({0}, true), {Partial(ReduceOp::Avg)}, g.mean({0}, true));
  expect_placed(s.mean(), {Partial()}, g.mean());
  expect_placed(m.amax({1}), {Partial(ReduceOp::Max)}, g.amax({1}));
  expect_placed(m.sum({1}), {Shard(0)}, g.sum({1}));             // reduce-scattered onto dim 0
  expect_placed(s.amax({0, 1}), {Replicate()}, g.amax({0, 1}));  // nothing left to scatter
  expect_placed(s.var({1}), {Shard(0)}, g.var({1}));
  expect_placed(s.sum({0}, false, kFloat64), {Partial()}, g.sum({0}, false, kFloat64));
  // An integer cast of a Partial sum is not the sum of the casts.
  expect_placed(s.sum({0}, false, kInt64), {Shard(0)}, g.sum({0}, false, kInt64));
  // mean of uneven shards: 5 rows over 3 ranks are 2 + 2 + 1, not three equal thirds.
  DTensor r = distribute_tensor(g, mesh, {Shard(0)});
  expect_placed(r.mean({0}), {Partial()}, g.mean({0}));
  expect_placed(r.mean(), {Partial()}, g.mean());
  expect_placed(r.mean({1}), {Shard(0)}, g.mean({1}));
  // The decision is cached per (op, input specs): a repeated call is a hit.
  const auto before = dist::dispatch_stats();
  for (int i = 0; i < 3; ++i) (void)r.sum({0});
  const auto after = dist::dispatch_stats();
  EXPECT_EQ(after.misses, before.misses + 1);
  EXPECT_EQ(after.hits, before.hits + 2);
  const auto fb = dist::fallback_ops();
  EXPECT_TRUE(fb.empty()) << fb[0];
}

TEST(DTensor, ReductionPartialTwoRanks) { expect_all_pass(run_ranks("reduction_partial", 2)); }
TEST(DTensor, ReductionPartialThreeRanks) { expect_all_pass(run_ranks("reduction_partial", 3)); }

// ---- softmax and the norms ----------------------------------------------------------------------

// The placement Note [Softmax sharding] promises along one mesh dim for a tensor placed `p`, the
// dims in `sliced` being whole.
Placement rowwise(const Placement& p, const std::vector<bool>& sliced) {
  if (p.is_shard() && !sliced[p.dim]) return p;
  if (p.is_partial())
    for (size_t d = 0; d < sliced.size(); ++d)
      if (!sliced[d]) return Shard(static_cast<int64_t>(d));
  return Replicate();
}

Placements rowwise(const Placements& p, const std::vector<bool>& sliced) {
  Placements out;
  for (const Placement& q : p) out.push_back(rowwise(q, sliced));
  return out;
}

void check_rowwise(const DeviceMesh& mesh, const std::vector<Placements>& placements) {
  dist::clear_fallback_ops();
  Tensor g = random({5, 4, 6}, kFloat32, -2, 2, 31);
  Tensor w = random({6}, kFloat32, 0.5, 1.5, 32), b = random({6}, kFloat32, -1, 1, 33);
  Tensor w2 = random({4, 6}, kFloat32, 0.5, 1.5, 34);
  DTensor dw = distribute_tensor(w, mesh, {}), db = distribute_tensor(b, mesh, {});
  Tensor b2 = random({4, 6}, kFloat32, -1, 1, 36);
  DTensor dw2 = distribute_tensor(w2, mesh, {}), db2 = distribute_tensor(b2, mesh, {});
  for (const Placements& p : placements) {
    DTensor x = distribute_tensor(g, mesh, p);
    for (int64_t dim : {0, 1, -1}) {
      SCOPED_TRACE("softmax dim " + std::to_string(dim) + " from " + dist::placements_str(p));
      std::vector<bool> sliced(3, false);
      sliced[dim < 0 ? dim + 3 : dim] = true;
      expect_placed(kiln::softmax(x, dim), rowwise(p, sliced), kiln::softmax(g, dim));
      expect_placed(kiln::log_softmax(x, dim), rowwise(p, sliced), kiln::log_softmax(g, dim));
      expect_placed(kiln::softmax(x, dim, kFloat64), rowwise(p, sliced),
                    kiln::softmax(g, dim, kFloat64));
    }
    SCOPED_TRACE("norms from " + dist::placements_str(p));
    expect_placed(kiln::layer_norm(x, {6}, dw, db), rowwise(p, {false, false, true}),
                  kiln::layer_norm(g, {6}, w, b));
    expect_placed(kiln::layer_norm(x, {4, 6}, dw2, db2), rowwise(p, {false, true, true}),
                  kiln::layer_norm(g, {4, 6}, w2, b2));
    // Without weight or bias: the composite's plain ones and zeros count as replicated.
    expect_placed(kiln::layer_norm(x, {6}), rowwise(p, {false, false, true}),
                  kiln::layer_norm(g, {6}));
    expect_placed(kiln::layer_norm(x, {6}, dw), rowwise(p, {false, false, true}),
                  kiln::layer_norm(g, {6}, w));
    expect_placed(kiln::rms_norm(x, {4, 6}), rowwise(p, {false, true, true}),
                  kiln::rms_norm(g, {4, 6}));
    expect_placed(kiln::rms_norm(x, {6}, dw), rowwise(p, {false, false, true}),
                  kiln::rms_norm(g, {6}, w));
  }
  // A plain weight that needs a gradient is still refused: its gradient would be a DTensor.
  Tensor wg = w.clone().requires_grad_(true);
  expect_error(ErrorKind::Runtime, "got a mix of DTensors and a plain tensor (argument 'weight'",
               [&] { kiln::layer_norm(distribute_tensor(g, mesh, placements[0]), {6}, wg); });
  // The backward rows: grad and the forward's output or input sharded alike.
  Tensor grad = random({5, 4, 6}, kFloat32, -1, 1, 35), y = kiln::softmax(g, 1);
  auto D = [&](const Tensor& t, Placements p) { return distribute_tensor(t, mesh, std::move(p)); };
  const Placements R(mesh.ndim(), Replicate());
  Placements S0 = R, S1 = R, P = R;
  S0[0] = Shard(0);
  S1[0] = Shard(1);
  P[0] = Partial();
  expect_placed(kiln::softmax_backward_data(D(grad, S0), D(y, S0), 1), S0,
                kiln::softmax_backward_data(grad, y, 1));
  expect_placed(kiln::softmax_backward_data(D(grad, R), D(y, S0), 1), S0,
                kiln::softmax_backward_data(grad, y, 1));
  expect_placed(kiln::softmax_backward_data(D(grad, S1), D(y, S1), 1), R,
                kiln::softmax_backward_data(grad, y, 1));
  expect_placed(kiln::log_softmax_backward_data(genuine(grad, mesh, P), D(y, R), 1), P,
                kiln::log_softmax_backward_data(grad, y, 1));
  auto [gi, gw, gb] = kiln::_layer_norm_backward(D(grad, S0), D(g, S0), dw, {6}, 1e-5);
  auto [ri, rw, rb] = kiln::_layer_norm_backward(grad, g, w, {6}, 1e-5);
  expect_placed(gi, S0, ri);
  expect_placed(gw, P, rw);  // sums over the sharded rows
  expect_placed(gb, P, rb);
  // Linear in grad: a Partial grad with the rest Replicate gives Partial results.
  auto [hi, hw] = kiln::_rms_norm_backward(genuine(grad, mesh, P), D(g, R), dw2, {4, 6}, 1e-5);
  auto [si, sw] = kiln::_rms_norm_backward(grad, g, w2, {4, 6}, 1e-5);
  expect_placed(hi, P, si);
  expect_placed(hw, P, sw);
  const auto fb = dist::fallback_ops();
  EXPECT_TRUE(fb.empty()) << fb[0];
}

KILN_RANK_SCENARIO(rowwise_1d) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {world()});
  check_rowwise(mesh, {{Shard(0)}, {Shard(1)}, {Shard(2)}, {Replicate()}, {Partial()}});
}

TEST(DTensor, SoftmaxNormTwoRanks) { expect_all_pass(run_ranks("rowwise_1d", 2)); }
TEST(DTensor, SoftmaxNormThreeRanksUneven) { expect_all_pass(run_ranks("rowwise_1d", 3)); }

KILN_RANK_SCENARIO(rowwise_2x2) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  check_rowwise(mesh, {{Shard(0), Shard(1)},
                       {Shard(2), Shard(0)},
                       {Shard(0), Shard(0)},
                       {Partial(), Shard(1)},
                       {Replicate(), Shard(2)}});
}

TEST(DTensor, SoftmaxNorm2x2) { expect_all_pass(run_ranks("rowwise_2x2", 4)); }

// ---- autograd -----------------------------------------------------------------------------------

bool took_fallback(const std::set<std::string>& ops) {
  for (const std::string& o : dist::fallback_ops())
    if (ops.count(o)) return true;
  return false;
}

KILN_RANK_SCENARIO(reduction_autograd) {
  DeviceMesh mesh = dist::init_device_mesh("cpu", {world()});
  dist::clear_fallback_ops();
  Tensor a = random({5, 4}, kFloat32, -2, 2, 41), c = random({5, 4}, kFloat32, -2, 2, 42);
  Tensor w = random({4}, kFloat32, 0.5, 1.5, 43), b = random({4}, kFloat32, -1, 1, 44);
  for (const Placement& p : {Shard(0), Shard(1), Replicate()}) {
    SCOPED_TRACE(p.str());
    using F = std::function<Tensor(const Tensor&, const Tensor&, const Tensor&, const Tensor&)>;
    const std::vector<std::pair<std::string, F>> fs = {
        {"sum", [](const Tensor& x, const Tensor& c, const Tensor&,
                   const Tensor&) { return (x.sum({1}) * c.sum({1})).sum(); }},
        {"mean", [](const Tensor& x, const Tensor& c, const Tensor&,
                    const Tensor&) { return (x.mean({0}) * c.mean({0})).sum() + x.mean(); }},
        {"softmax",
         [](const Tensor& x, const Tensor& c, const Tensor&, const Tensor&) {
           return (kiln::softmax(x, 1) * c).sum() + (kiln::log_softmax(x, 0) * c).sum();
         }},
        {"layer_norm",
         [](const Tensor& x, const Tensor& c, const Tensor& w, const Tensor& b) {
           return (kiln::layer_norm(x, {4}, w, b) * c).sum() +
                  (kiln::rms_norm(x, {4}, w) * c).sum();
         }},
        {"norms without weight",
         [](const Tensor& x, const Tensor& c, const Tensor&, const Tensor&) {
           return (kiln::layer_norm(x, {4}) * c).sum() + (kiln::rms_norm(x, {4}) * c).sum();
         }},
    };
    for (const auto& [name, f] : fs) {
      SCOPED_TRACE(name);
      Tensor x0 = a.clone().requires_grad_(), w0 = w.clone().requires_grad_();
      Tensor b0 = b.clone().requires_grad_();
      f(x0, c, w0, b0).backward();
      DTensor x = distribute_tensor(a, mesh, {p});
      DTensor dc = distribute_tensor(c, mesh, {p});
      DTensor dw = distribute_tensor(w, mesh, {Replicate()}), db = distribute_tensor(b, mesh, {});
      x.requires_grad_();
      dw.requires_grad_();
      db.requires_grad_();
      f(x, dc, dw, db).backward();
      expect_close(DTensor(x.grad()).full_tensor(), x0.grad(), 1e-5, 1e-5);
      if (name == "layer_norm") {
        expect_close(DTensor(dw.grad()).full_tensor(), w0.grad(), 1e-5, 1e-5);
        expect_close(DTensor(db.grad()).full_tensor(), b0.grad(), 1e-5, 1e-5);
      }
    }
  }
  EXPECT_FALSE(took_fallback({"sum", "mean", "softmax", "log_softmax", "softmax_backward_data",
                              "log_softmax_backward_data", "_layer_norm", "_layer_norm_backward",
                              "_rms_norm", "_rms_norm_backward"}));
}

TEST(DTensor, ReductionAutograd) { expect_all_pass(run_ranks("reduction_autograd", 2)); }
TEST(DTensor, ReductionAutogradThreeRanks) { expect_all_pass(run_ranks("reduction_autograd", 3)); }

}  // namespace
}  // namespace kiln::testing
