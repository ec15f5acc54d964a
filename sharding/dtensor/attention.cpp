// The attention sharding rule: _fused_attention and _fused_attention_backward (Note [Attention
// sharding]).
#include <string_view>

#include "rules.h"

namespace kiln::dist::rules {

// Note [Attention sharding]: query (..., L, E), key (..., S, E), value (..., S, Ev) share their
// batch dims (all but the last two); every (batch, head) slice is an attention of its own. Each
// mesh dim is decided on its own, by choose(), among Replicate() (first, so an unsharded call
// stays unsharded), Shard(d) of every tensor for each batch dim d (the results Shard(d): the
// tensor-parallel case, heads sharded after a colwise qkv), and, without is_causal, the rows:
// query, output, logsumexp and the gradients of the last two Shard(L) with key and value
// Replicate; the forward's results are Shard(L), and the backward's grad_query Shard(L) with
// grad_key and grad_value Partial(sum) (each rank's rows add their terms; an empty piece adds 0).
// Causal masks depend on the global row index, so they keep whole rows. Attention is not linear,
// so a Partial input is reduced (choose() costs that). With dropout_p != 0 the mask hangs on each
// element's position in the whole (N, L, S) (Note [Attention dropout]), so the call takes the
// replicate path; dispatch.cpp keys this rule's decisions on float arguments for that reason.
// Batch dims that differ between the tensors are a shape error: the replicate path's local op
// reports it.

Decision decide_attention(const RuleCall& call) {
  // _fused_attention(query, key, value, dropout_p, is_causal, scale, seed, offset) -> (output,
  // logsumexp); _fused_attention_backward(grad_out, grad_logsumexp, query, key, value, output,
  // logsumexp, dropout_p, is_causal, scale, seed, offset) -> (grad_query, grad_key, grad_value).
  const std::vector<Arg>& args = call.tensors;
  const OpInfo& info = call.op.info();
  for (const Arg& a : args)
    if (!a.spec) return replicate();
  const int p_arg = arg_named(info, "dropout_p"), causal_arg = arg_named(info, "is_causal");
  KILN_ASSERT(p_arg >= 0 && causal_arg >= 0, call.op.name(), ": an attention row without ",
              "dropout_p or is_causal");
  if (call.args[p_arg].get<double>() != 0) return replicate();
  const bool causal = call.args[causal_arg].get<bool>();
  // Each tensor's role: query, key/value, a row tensor of query's shape up to its last dim
  // (output, grad_out: (..., L, Ev); logsumexp, grad_logsumexp: (..., L)).
  enum Role { kQuery, kKeyValue, kRows, kRowStats };
  std::vector<Role> role(args.size());
  int q = -1, k = -1, v = -1;
  for (size_t j = 0; j < args.size(); ++j) {
    std::string_view n = info.args[args[j].index].name;
    if (n == "query") q = static_cast<int>(j);
    if (n == "key") k = static_cast<int>(j);
    if (n == "value") v = static_cast<int>(j);
    role[j] = n == "query"                       ? kQuery
              : n == "key" || n == "value"       ? kKeyValue
              : n == "output" || n == "grad_out" ? kRows
                                                 : kRowStats;
  }
  KILN_ASSERT(q >= 0 && k >= 0 && v >= 0, call.op.name(), ": an attention row without q, k, v");
  const DimVector& qs = args[q].spec->shape;
  const int64_t n = args[q].rank, batch = n - 2;
  if (n < 2) return replicate();  // a shape error: the local op reports it
  for (size_t j = 0; j < args.size(); ++j) {
    const DimVector& s = args[j].spec->shape;
    if (args[j].rank != (role[j] == kRowStats ? n - 1 : n)) return replicate();
    for (int64_t d = 0; d < batch; ++d)
      if (s[d] != qs[d]) return replicate();
    if (role[j] == kRows || role[j] == kRowStats)
      if (s[batch] != qs[batch]) return replicate();
  }
  Decision dec;
  const bool forward = arg_named(info, "grad_out") < 0;
  KILN_ASSERT(info.num_returns == (forward ? 2 : 3), call.op.name(),
              ": an attention row with an unexpected number of results");
  if (forward) {
    DimVector out = qs;
    out[n - 1] = args[v].spec->shape[n - 1];
    dec.outs = {OutSpec{{}, out, {}}, OutSpec{{}, DimVector(IntArrayRef(qs.data(), n - 1)), {}}};
  } else {
    dec.outs = {OutSpec{{}, qs, {}}, OutSpec{{}, args[k].spec->shape, {}},
                OutSpec{{}, args[v].spec->shape, {}}};
  }
  const size_t m = dec.outs.size();
  auto cands = [&](int64_t) {
    std::vector<Candidate> cs;
    cs.push_back({Placements(args.size(), Replicate()), Placements(m, Replicate())});
    for (int64_t d = 0; d < batch; ++d)
      cs.push_back({Placements(args.size(), Shard(d)), Placements(m, Shard(d))});
    if (!causal) {
      Candidate c{Placements(args.size(), Shard(batch)), Placements(m, Shard(batch))};
      for (size_t j = 0; j < args.size(); ++j)
        if (role[j] == kKeyValue) c.in[j] = Replicate();
      if (!forward) c.out[1] = c.out[2] = Partial();
      cs.push_back(std::move(c));
    }
    return cs;
  };
  if (!choose(call, cands, dec)) return replicate();
  return dec;
}

}  // namespace kiln::dist::rules
