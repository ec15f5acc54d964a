// The pointwise sharding rule (Note [Pointwise sharding]).
#include "kiln/meta.h"
#include "rules.h"

namespace kiln::dist::rules {

// Note [Pointwise sharding]: the output has the broadcast shape; input dim k of a rank-r input
// is output dim k + R - r. Each mesh dim is decided on its own, among:
//  - Shard(od), for an output dim od that some input shards: an input whose dim od is not
//    broadcast gets Shard of that dim, a broadcast one (size 1 or absent) gets Replicate;
//  - Partial(op) with op sum or avg, for an op that is linear in its inputs: add and sub (every
//    tensor input Partial, a Replicate one becomes Partial without communication), mul (exactly
//    one input Partial, the others Replicate), div without rounding_mode (the numerator Partial),
//    neg. A plain 0-d input cannot become Partial, so add(Partial, 2.0) replicates;
//  - Replicate().
// The cheapest wins (element counts moved: all-gather n, reduce-scatter n, all-reduce 2n,
// taking a piece or going Replicate -> Partial 0), Shard first on a tie, then Partial. An
// in-place op keeps self's placements (its output is self); where self's placement cannot be the
// output's (self Partial in a nonlinear op) the op takes the replicate path, which writes back.

namespace {

enum class Linear { None, Add, Mul, Div, Unary };

Linear linearity(const OperatorHandle& op, const Stack& args) {
  std::string_view n = op.name();
  if (!n.empty() && n.back() == '_') n.remove_suffix(1);
  if (n == "add" || n == "sub") return Linear::Add;
  if (n == "mul") return Linear::Mul;
  if (n == "neg") return Linear::Unary;
  if (n == "div") return args.size() > 2 && args[2].is_none() ? Linear::Div : Linear::None;
  return Linear::None;
}

// The placement of `a` along one mesh dim when the output is `out` there (nullopt: impossible).
// `partial_input`: for Mul/Div, the Arg that stays Partial.
std::optional<Placement> input_for(const Arg& a, const Placement& out, const DimVector& out_shape,
                                   int64_t R, Linear lin, int partial_input, int self) {
  if (out.is_replicate()) return Replicate();
  if (out.is_shard()) {
    const int64_t d = out.dim - (R - a.rank);
    if (d < 0 || (a.tensor->size(d) == 1 && out_shape[out.dim] != 1)) return Replicate();
    if (!a.spec) return std::nullopt;
    return Shard(d);
  }
  // Partial
  if (!a.spec) return lin == Linear::Add ? std::nullopt : std::optional<Placement>(Replicate());
  if (lin == Linear::Add || lin == Linear::Unary) return out;
  return self == partial_input ? out : Replicate();
}

}  // namespace

Decision decide_pointwise(const RuleCall& call) {
  const OperatorHandle& op = call.op;
  const std::vector<Arg>& args = call.tensors;
  const DeviceMesh& mesh = call.mesh;
  const Linear lin = linearity(op, call.args);
  Decision dec;
  dec.outs.resize(1);
  DimVector& out_shape = dec.outs[0].shape;
  Placements& out = dec.outs[0].placements;
  const bool inplace = op.info().is_inplace;
  int64_t R = 0;
  for (const Arg& a : args) R = std::max(R, a.rank);
  out_shape = DimVector(args[0].tensor->sizes());
  for (const Arg& a : args)
    out_shape = meta::broadcast_shapes(op.name(), IntArrayRef(out_shape), a.tensor->sizes());
  if (inplace)
    KILN_CHECK(IntArrayRef(out_shape) == args[0].tensor->sizes(), Value, op.name(),
               ": the result of shape ", IntArrayRef(out_shape),
               " does not fit in-place into self of shape ", args[0].tensor->sizes());
  dec.targets.assign(args.size(), Placements{});
  for (size_t j = 0; j < args.size(); ++j)
    if (args[j].spec) dec.targets[j].resize(mesh.ndim());
  out.resize(mesh.ndim());
  for (int64_t i = 0; i < mesh.ndim(); ++i) {
    // Candidate (output placement, which input stays Partial for Mul/Div).
    std::vector<std::pair<Placement, int>> cands;
    for (const Arg& a : args) {
      if (!a.spec || !a.spec->placements[i].is_shard()) continue;
      Placement s = Shard(a.spec->placements[i].dim + R - a.rank);
      bool seen = false;
      for (auto& c : cands) seen = seen || c.first == s;
      if (!seen) cands.push_back({s, -1});
    }
    if (lin != Linear::None) {
      for (size_t j = 0; j < args.size(); ++j) {
        if (!args[j].spec || !args[j].spec->placements[i].is_partial()) continue;
        const Placement& p = args[j].spec->placements[i];
        if (p.reduce != ReduceOp::Sum && p.reduce != ReduceOp::Avg) continue;
        if (lin == Linear::Div && j != 0) continue;
        cands.push_back({p, static_cast<int>(j)});
      }
    }
    cands.push_back({Replicate(), -1});
    int64_t best = -1;
    size_t best_c = 0;
    for (size_t c = 0; c < cands.size(); ++c) {
      const Placement& out = cands[c].first;
      if (inplace && args[0].spec && !(out == args[0].spec->placements[i])) continue;
      int64_t cost = 0;
      for (size_t j = 0; j < args.size() && cost >= 0; ++j) {
        auto want =
            input_for(args[j], out, out_shape, R, lin, cands[c].second, static_cast<int>(j));
        if (!want) {
          cost = -1;
        } else if (args[j].spec) {
          cost += move_cost(args[j].spec->placements[i], *want, args[j].tensor->numel());
        }
      }
      if (cost < 0 || (best >= 0 && cost >= best)) continue;
      best = cost;
      best_c = c;
    }
    if (best < 0) return replicate();  // in-place, and self's placement cannot be the output's
    out[i] = cands[best_c].first;
    for (size_t j = 0; j < args.size(); ++j)
      if (args[j].spec)
        dec.targets[j][i] = *input_for(args[j], out[i], out_shape, R, lin, cands[best_c].second,
                                       static_cast<int>(j));
  }
  return dec;
}

}  // namespace kiln::dist::rules
