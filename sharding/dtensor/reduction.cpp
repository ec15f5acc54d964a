// The reduction sharding rule (Note [Reduction sharding]).
#include <string_view>

#include "kiln/meta.h"
#include "rules.h"

namespace kiln::dist::rules {

// Note [Reduction sharding]: the rows whose sharding is "reduction" (tensor/ops/reduction.toml):
// sum, mean, prod, max and min (all and .dim), amax, amin, argmax, argmin, var, std, norm,
// logsumexp, any, all. Their `dim` argument (an int, an int list, or None) names the reduced
// dims; None, an empty list and the rows without one reduce every dim. The output has the input's
// shape with the reduced dims removed (kept as 1 with keepdim), so a kept input dim d is output
// dim d less the reduced dims before it (d itself with keepdim). Each mesh dim is decided on its
// own, by choose(), among:
//  - Shard(d) on a dim that is not reduced: passes through, renumbered (costs nothing);
//  - Shard(d) on a reduced dim, for the ops the ranks can finish with an all-reduce:
//      sum            Partial(sum): the local sums add up to the sum;
//      mean           Partial(sum) of (local sum / the global count of reduced elements). The
//                     local means would be wrong with uneven shards (3 ranks over 4 rows average
//                     2, 2 and 0 rows), and this is exact for every split, empty pieces included;
//      amax, max()    Partial(max); amin, min() Partial(min): exact, but a rank whose piece of a
//                     reduced dim is empty has no value (the local op refuses), so where some
//                     rank's piece would be empty every mesh dim sharding that dim replicates;
//    the other rows (prod: there is no Partial(product); var, std, norm, logsumexp: not sums of
//    their local results; max.dim, min.dim, argmax, argmin: the indices are global; any, all)
//    gather that dim (Replicate);
//  - a Partial input: sum and mean are linear, so Partial(sum) and Partial(avg) stay (sum with a
//    dtype only where that cast keeps it linear: float to float, or between integer types); amax
//    keeps Partial(max), amin Partial(min). Otherwise the Partial is reduced: to Replicate
//    (all-reduce) or to Shard(d) of a dim that is not reduced (reduce-scatter, half the cost);
//  - Replicate.
// The cheapest wins (See Note [Pointwise sharding] for the costs), the first listed on a tie. The
// values+indices rows give both results the same placements. Scalar arguments (norm's p, var's
// correction) are not in the decision cache's key, and no strategy depends on them.

namespace {

enum class Combine { None, Sum, Mean, Max, Min };

Combine combine_of(std::string_view name) {
  if (name == "sum") return Combine::Sum;
  if (name == "mean") return Combine::Mean;
  if (name == "amax" || name == "max") return Combine::Max;  // "max" is max(): no overload
  if (name == "amin" || name == "min") return Combine::Min;
  return Combine::None;
}

// The reduced dims of `self` (of `ndim` dims) as a mask; every dim where `dim` is absent, None or
// empty.
std::vector<bool> reduced_mask(const char* op, const Stack& args, int dim_arg, int64_t ndim) {
  if (dim_arg < 0 || args[dim_arg].is_none()) return std::vector<bool>(ndim, true);
  const IValue& v = args[dim_arg];
  if (v.is<int64_t>()) {
    std::vector<bool> mask(ndim, false);
    const int64_t d = meta::wrap_dim(op, v.get<int64_t>(), ndim);
    if (ndim > 0) mask[d] = true;
    return mask;
  }
  return meta::dim_mask(op, IntArrayRef(v.get<std::vector<int64_t>>()), ndim);
}

// Whether some rank's piece of tensor dim `d` is empty under `spec`'s Shard(d) placements.
bool some_piece_empty(const DTensorSpec& spec, int64_t d) {
  std::vector<int64_t> pieces{spec.shape[d]};
  for (size_t i = 0; i < spec.placements.size(); ++i) {
    if (!spec.placements[i].is_shard(d)) continue;
    std::vector<int64_t> next;
    const int64_t n = spec.mesh.size(static_cast<int64_t>(i));
    for (int64_t p : pieces)
      for (int64_t j = 0; j < n; ++j) next.push_back(chunk_of(p, n, j).second);
    pieces = std::move(next);
  }
  for (int64_t p : pieces)
    if (p == 0) return true;
  return false;
}

}  // namespace

Decision decide_reduction(const RuleCall& call) {
  const OpInfo& info = call.op.info();
  const Arg& self = call.tensors.at(0);
  if (!self.spec) return replicate();
  const DTensorSpec& spec = *self.spec;
  const int64_t ndim = self.rank;
  std::string_view name = call.op.name();
  const bool has_overload = name.find('.') != std::string_view::npos;
  const Combine combine = has_overload ? Combine::None : combine_of(name);

  const int dim_arg = arg_named(info, "dim"), keepdim_arg = arg_named(info, "keepdim");
  const int dtype_arg = arg_named(info, "dtype");
  const std::vector<bool> mask = reduced_mask(call.op.name(), call.args, dim_arg, ndim);
  const bool keepdim = keepdim_arg >= 0 && call.args[keepdim_arg].get<bool>();
  std::optional<ScalarType> dtype;
  if (dtype_arg >= 0 && !call.args[dtype_arg].is_none())
    dtype = call.args[dtype_arg].get<ScalarType>();

  // Output dim of kept input dim d.
  auto out_dim = [&](int64_t d) {
    if (keepdim) return d;
    int64_t od = d;
    for (int64_t k = 0; k < d; ++k) od -= mask[k] ? 1 : 0;
    return od;
  };
  int64_t count = 1;  // reduced elements per output element (mean)
  for (int64_t k = 0; k < ndim; ++k)
    if (mask[k]) count *= spec.shape[k];

  // Which Partial inputs stay Partial, and what a reduced Shard becomes.
  const ScalarType in = self.tensor->dtype();
  bool linear_cast = in != kBool;
  if (dtype)
    linear_cast = linear_cast && (is_floating(*dtype) ? is_floating(in) : !is_floating(in));
  std::optional<Placement> from_shard;  // the output placement of a Shard of a reduced dim
  auto keeps_partial = [&](const Placement& p) {
    switch (combine) {
      case Combine::Sum:
        return linear_cast && (p.reduce == ReduceOp::Sum || p.reduce == ReduceOp::Avg);
      case Combine::Mean:
        return is_floating(dtype.value_or(in)) &&
               (p.reduce == ReduceOp::Sum || p.reduce == ReduceOp::Avg);
      case Combine::Max:
        return p.reduce == ReduceOp::Max;
      case Combine::Min:
        return p.reduce == ReduceOp::Min;
      case Combine::None:
        return false;
    }
    return false;
  };
  switch (combine) {
    case Combine::Sum:
      from_shard = Partial(ReduceOp::Sum);
      break;
    case Combine::Mean:
      if (is_floating(dtype.value_or(in))) from_shard = Partial(ReduceOp::Sum);
      break;
    case Combine::Max:
      from_shard = Partial(ReduceOp::Max);
      break;
    case Combine::Min:
      from_shard = Partial(ReduceOp::Min);
      break;
    case Combine::None:
      break;
  }
  std::vector<bool> empty_piece(ndim, false);
  if (combine == Combine::Max || combine == Combine::Min)
    for (int64_t k = 0; k < ndim; ++k) empty_piece[k] = mask[k] && some_piece_empty(spec, k);

  Decision dec;
  dec.outs.resize(info.num_returns);
  for (rules::OutSpec& o : dec.outs) o.shape = meta::reduced_shape(spec.shape, mask, keepdim);
  const size_t nouts = dec.outs.size();
  auto all = [&](const Placement& p) { return Placements(nouts, p); };
  auto cands = [&](int64_t i) {
    const Placement& p = spec.placements[i];
    std::vector<Candidate> cs;
    if (p.is_shard() && !mask[p.dim]) cs.push_back({{p}, all(Shard(out_dim(p.dim)))});
    if (p.is_shard() && mask[p.dim] && from_shard && !empty_piece[p.dim])
      cs.push_back({{p}, all(*from_shard)});
    if (p.is_partial() && keeps_partial(p)) cs.push_back({{p}, all(p)});
    cs.push_back({{Replicate()}, all(Replicate())});
    if (p.is_partial())
      for (int64_t d = 0; d < ndim; ++d)
        if (!mask[d]) cs.push_back({{Shard(d)}, all(Shard(out_dim(d)))});
    return cs;
  };
  if (!choose(call, cands, dec)) return replicate();

  // mean with a Partial result: each rank sums its piece and divides by the global count.
  if (combine == Combine::Mean) {
    bool partial = false;
    for (const Placement& p : dec.outs[0].placements) partial = partial || p.is_partial();
    if (partial) {
      std::optional<std::vector<int64_t>> dims;
      if (dim_arg >= 0 && !call.args[dim_arg].is_none())
        dims = call.args[dim_arg].get<std::vector<int64_t>>();
      const ScalarType out = dtype.value_or(in);
      dec.local_call = [dims, keepdim, out, count](const OperatorHandle&, Stack& s) {
        Tensor x = s[0].to_tensor();
        OptionalIntArrayRef d;
        if (dims) d = IntArrayRef(*dims);
        Tensor r = kiln::sum(x, d, keepdim, out) / static_cast<double>(count);
        s.clear();
        s.push_back(std::move(r));
      };
    }
  }
  return dec;
}

}  // namespace kiln::dist::rules
