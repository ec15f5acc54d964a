// The indexing sharding rule: index_select, gather and the scatter rows (Note [Index sharding]).
#include <string_view>

#include "kiln/meta.h"
#include "rules.h"

namespace kiln::dist::rules {

// Note [Index sharding]: ops that pick or write along one dim `dim` at positions an index tensor
// holds. The positions are along `dim`, which a candidate never splits on a tensor the positions
// point into, so the local op needs no rewriting. Along each mesh dim, the cheapest of:
//  - Replicate everywhere (first, so that ties keep the inputs as they are);
//  - index_select(self, dim, index (k,)): self Shard(d), d != dim, index Replicate -> Shard(d);
//    index Shard(0), self Replicate -> Shard(dim) (each rank picks its share of the positions);
//  - gather(self, dim, index) -> index's shape: self and index Shard(d), d != dim, where both have
//    the same size along d (so their pieces line up) -> Shard(d); index Shard(dim), self Replicate
//    -> Shard(dim);
//  - scatter, scatter.value, scatter_add and their in-place rows: self, index and src Shard(d),
//    d != dim, all of the same size along d -> Shard(d);
//  - picking is linear, and so is scatter_add in (self, src): self (and src) Partial(r), index
//    Replicate -> Partial(r), for r sum or avg already on self.

namespace {

enum class Kind { Select, Gather, Scatter, ScatterAdd };

Kind kind_of(std::string_view name) {
  if (name.starts_with("index_select")) return Kind::Select;
  if (name.starts_with("gather")) return Kind::Gather;
  if (name.starts_with("scatter_add")) return Kind::ScatterAdd;
  return Kind::Scatter;
}

}  // namespace

Decision decide_index(const RuleCall& call) {
  const std::vector<Arg>& args = call.tensors;  // self, index[, src]
  if (args.size() < 2 || !args[0].spec) return replicate();
  const Kind kind = kind_of(call.op.name());
  const Tensor &self = *args[0].tensor, &index = *args[1].tensor;
  const int64_t ndim = self.dim();
  if (ndim == 0) return replicate();  // nothing to split
  const int64_t dim = meta::wrap_dim(call.op.name(), call.args[1].get<int64_t>(), ndim);
  if (kind != Kind::Select) {
    for (const Arg& a : args)
      if (a.rank != ndim) return replicate();  // a shape error: the local op reports it
  } else if (index.dim() > 1) {
    return replicate();
  }
  Decision dec;
  dec.outs.resize(1);
  DimVector& shape = dec.outs[0].shape;
  shape = kind == Kind::Gather ? DimVector(index.sizes()) : DimVector(self.sizes());
  if (kind == Kind::Select) shape[dim] = index.numel();
  const size_t n = args.size();
  // Whether every tensor has self's size along d.
  auto aligned = [&](int64_t d) {
    for (const Arg& a : args)
      if (a.tensor->size(d) != self.size(d)) return false;
    return true;
  };
  auto cands = [&](int64_t i) {
    std::vector<Candidate> cs{{Placements(n, Replicate()), {Replicate()}}};
    for (int64_t d = 0; d < ndim; ++d) {
      if (d == dim) continue;
      if (kind == Kind::Select) {
        cs.push_back({{Shard(d), Replicate()}, {Shard(d)}});
      } else if (aligned(d)) {
        Placements in(n, Shard(d));
        cs.push_back({in, {Shard(d)}});
      }
    }
    if (args[1].spec && index.dim() > 0) {
      if (kind == Kind::Select) cs.push_back({{Replicate(), Shard(0)}, {Shard(dim)}});
      if (kind == Kind::Gather) cs.push_back({{Replicate(), Shard(dim)}, {Shard(dim)}});
    }
    const Placement& p = args[0].spec->placements[i];
    if (p.is_partial() && (p.reduce == ReduceOp::Sum || p.reduce == ReduceOp::Avg) &&
        kind != Kind::Scatter) {
      Placements in(n, Replicate());
      in[0] = p;
      if (kind == Kind::ScatterAdd && n == 3) in[2] = p;
      cs.push_back({in, {p}});
    }
    return cs;
  };
  if (!choose(call, cands, dec)) return replicate();
  return dec;
}

}  // namespace kiln::dist::rules
