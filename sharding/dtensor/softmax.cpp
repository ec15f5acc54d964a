// The softmax and norm sharding rules (Note [Softmax sharding]).
#include <string_view>

#include "kiln/meta.h"
#include "rules.h"

namespace kiln::dist::rules {

// Note [Softmax sharding]: row-wise ops, which compute each output element from one slice of the
// input: the slice along `dim` for softmax and log_softmax (rule "softmax"), the trailing dims
// normalized_shape for _layer_norm and _rms_norm (rule "norm"; the composite layer_norm and
// rms_norm rows reach them). A Shard of any other dim keeps whole slices on every rank, so it
// passes through, uneven or empty pieces included; the sliced dims must be whole (Replicate).
// Each mesh dim is decided on its own, by choose(), among Replicate() (listed first, so an
// unsharded call stays unsharded) and Shard(d) for every dim d outside the slice (taking a piece
// of a Replicate input costs nothing; a Partial input is reduce-scattered there, half the cost
// of an all-reduce). The parameters (weight, bias) are always Replicate; a plain weight or bias
// that needs no gradient (the ones and zeros of layer_norm and rms_norm without weight or bias)
// is taken as replicated, as it is: every rank holds the whole of it.
// The backward rows (softmax_backward_data, log_softmax_backward_data, _layer_norm_backward,
// _rms_norm_backward) shard grad and the forward's input or output alike. They are linear in
// grad, so grad may also stay Partial(sum) or Partial(avg) with the other tensors Replicate,
// giving Partial results of the same kind. The weight and bias gradients sum over the leading
// dims: with those sharded they are Partial(sum) (exact for any split: an empty piece adds 0).

namespace {

// Candidates over the data tensors (`is_data`, sharded alike; the others Replicate) for a mesh
// dim, with `free(d)` true for the dims outside the slice. `param_out`: which results have the
// parameters' shape (Partial(sum) under a Shard of the data).
std::vector<Candidate> rowwise_cands(const RuleCall& call, int64_t i, const std::vector<bool>& free,
                                     const std::vector<bool>& is_data,
                                     const std::vector<bool>& param_out, int grad) {
  const size_t n = call.tensors.size(), m = param_out.size();
  std::vector<Candidate> cs;
  cs.push_back({Placements(n, Replicate()), Placements(m, Replicate())});
  for (int64_t d = 0; d < static_cast<int64_t>(free.size()); ++d) {
    if (!free[d]) continue;
    Candidate c{Placements(n, Replicate()), Placements(m, Shard(d))};
    for (size_t j = 0; j < n; ++j)
      if (is_data[j]) c.in[j] = Shard(d);
    for (size_t k = 0; k < m; ++k)
      if (param_out[k]) c.out[k] = Partial();
    cs.push_back(std::move(c));
  }
  if (grad >= 0 && call.tensors[grad].spec) {
    const Placement& p = call.tensors[grad].spec->placements[i];
    if (p.is_partial() && (p.reduce == ReduceOp::Sum || p.reduce == ReduceOp::Avg)) {
      Candidate c{Placements(n, Replicate()), Placements(m, p)};
      c.in[grad] = p;
      cs.push_back(std::move(c));
    }
  }
  return cs;
}

int tensor_named(const RuleCall& call, std::string_view name) {
  for (size_t j = 0; j < call.tensors.size(); ++j)
    if (name == call.op.info().args[call.tensors[j].index].name) return static_cast<int>(j);
  return -1;
}

}  // namespace

Decision decide_softmax(const RuleCall& call) {
  // softmax(self, dim, dtype), log_softmax(...); *_backward_data(grad, output, dim).
  const std::vector<Arg>& args = call.tensors;
  for (const Arg& a : args)
    if (!a.spec) return replicate();
  const int64_t ndim = args[0].rank;
  const int dim_arg = arg_named(call.op.info(), "dim");
  KILN_ASSERT(dim_arg >= 0, call.op.name(), ": a softmax row without a dim argument");
  std::vector<bool> free(ndim, true);
  if (ndim > 0)
    free[meta::wrap_dim(call.op.name(), call.args[dim_arg].get<int64_t>(), ndim)] = false;
  for (const Arg& a : args)
    if (a.rank != ndim) return replicate();  // a shape error: the local op reports it
  Decision dec;
  dec.outs.resize(1);
  dec.outs[0].shape = args[0].spec->shape;
  const std::vector<bool> is_data(args.size(), true);
  const int grad = args.size() > 1 ? tensor_named(call, "grad") : -1;
  auto cands = [&](int64_t i) { return rowwise_cands(call, i, free, is_data, {false}, grad); };
  if (!choose(call, cands, dec)) return replicate();
  return dec;
}

Decision decide_norm(const RuleCall& call) {
  // _layer_norm(input, normalized_shape, weight, bias, eps), _rms_norm(input, ..., weight, eps)
  // -> y; _layer_norm_backward(grad, input, weight, normalized_shape, eps) -> (grad_input,
  // grad_weight, grad_bias), _rms_norm_backward -> (grad_input, grad_weight).
  const std::vector<Arg>& args = call.tensors;
  const OpInfo& info = call.op.info();
  const int shape_arg = arg_named(info, "normalized_shape");
  KILN_ASSERT(shape_arg >= 0, call.op.name(), ": a norm row without normalized_shape");
  const int input = tensor_named(call, "input"), grad = tensor_named(call, "grad");
  KILN_ASSERT(input >= 0, call.op.name(), ": a norm row without input");
  const DTensorSpec& in = *args[input].spec;
  const int64_t ndim = args[input].rank;
  const auto& normalized = call.args[shape_arg].get<std::vector<int64_t>>();
  const int64_t lead = ndim - static_cast<int64_t>(normalized.size());
  if (lead < 0) return replicate();  // a shape error: the local op reports it
  std::vector<bool> free(ndim, false), is_data(args.size(), false);
  for (int64_t d = 0; d < lead; ++d) free[d] = true;
  for (size_t j = 0; j < args.size(); ++j) {
    std::string_view n = info.args[args[j].index].name;
    is_data[j] = n == "input" || n == "grad";
    if (is_data[j] && (!args[j].spec || args[j].rank != ndim)) return replicate();
  }
  Decision dec;
  dec.outs.resize(info.num_returns);
  std::vector<bool> param_out(dec.outs.size(), false);
  dec.outs[0].shape = in.shape;
  for (size_t k = 1; k < dec.outs.size(); ++k) {
    dec.outs[k].shape = DimVector(IntArrayRef(normalized));
    param_out[k] = true;
  }
  auto cands = [&](int64_t i) { return rowwise_cands(call, i, free, is_data, param_out, grad); };
  if (!choose(call, cands, dec)) return replicate();
  return dec;
}

}  // namespace kiln::dist::rules
