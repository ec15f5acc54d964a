// The loss sharding rule: cross_entropy_indices and its backward row (Note [Loss sharding]).
#include <string_view>

#include "rules.h"

namespace kiln::dist::rules {

// Note [Loss sharding]: cross_entropy_indices(input (N, C), target (N,), weight (C,)?,
// ignore_index, label_smoothing) -> (N,) computes each sample's loss from its own row of logits
// and its own target, so a Shard of a sample dim passes through. Input dim d other than the class
// dim 1 matches target dim d - (d > 1) (the row takes (N, C) today; the composite cross_entropy
// brings (C,) and (N, C, d1, ...) inputs to that shape with views, and the view rules keep or
// gather the shards of those). Each mesh dim is decided on its own, by choose(), among:
//  - everything Replicate (listed first, so that an unsharded call stays unsharded and ties keep
//    the inputs as they are) -> Replicate;
//  - input Shard(d) and target Shard(d - (d > 1)) for a sample dim d, weight Replicate -> the
//    target's Shard. Taking a piece of a Replicate input costs nothing, so a batch-sharded target
//    shards a replicated input and the reverse. Uneven and empty pieces are fine: input and
//    target have the same sample dims, so their pieces line up, and an empty piece gives an empty
//    result.
// The class dim is never sharded for the local call: the log-sum-exp over the classes needs
// every logit. A Shard(1) input is gathered along that mesh dim (to Replicate, or straight to the
// batch Shard where the target is sharded there). That all-gathers the classes; it is correct and
// fine for now. Class-sharded logits stay where they are under loss_parallel only
// (vocab_parallel_cross_entropy, Note [Vocab-parallel cross entropy]). The weight is read for
// every class, so it is always Replicate. The loss is not linear in input or weight, so a Partial
// one is reduced first: the weight all-reduced to Replicate, the input reduce-scattered onto the
// batch Shard (half the cost of an all-reduce to Replicate).
// cross_entropy_indices_backward(grad (N,), input, target, weight?, ...) -> grad_input (N, C):
// the same candidates, grad sharded like the target and grad_input like the input. It is linear
// in grad, so grad may also stay Partial(sum) or Partial(avg) with the other tensors Replicate,
// giving a grad_input Partial of the same kind.
// The reductions of the composite cross_entropy ('mean', 'sum') sum these per-sample losses by
// the reduction rule (Note [Reduction sharding]): a batch-sharded loss sums to Partial(sum).

namespace {

enum class Role { Input, Target, Weight, Grad };

Role role_of(const RuleCall& call, const Arg& a) {
  const std::string_view n = call.op.info().args[a.index].name;
  if (n == "input") return Role::Input;
  if (n == "target") return Role::Target;
  if (n == "grad") return Role::Grad;
  KILN_ASSERT(n == "weight", call.op.name(), ": a loss row with an unexpected tensor '", n, "'");
  return Role::Weight;
}

}  // namespace

Decision decide_loss(const RuleCall& call) {
  const std::vector<Arg>& args = call.tensors;
  const bool backward = call.op.name() != std::string_view("cross_entropy_indices");
  std::vector<Role> roles;
  const Arg* input = nullptr;
  const Arg* target = nullptr;
  for (const Arg& a : args) {
    if (!a.spec) return replicate();  // a 0-d plain tensor: a shape error the local op reports
    roles.push_back(role_of(call, a));
    if (roles.back() == Role::Input) input = &a;
    if (roles.back() == Role::Target) target = &a;
  }
  KILN_ASSERT(input && target, call.op.name(), ": a loss row without input or target");
  const int64_t ndim = input->rank;
  int grad = -1;
  for (size_t j = 0; j < args.size(); ++j)
    if (roles[j] == Role::Grad) grad = static_cast<int>(j);
  // A shape error (the local op reports it, with the global shapes on this path).
  if (ndim < 2) return replicate();
  DimVector samples = input->spec->shape;
  samples.erase(1);
  if (target->spec->shape != samples) return replicate();
  if (grad >= 0 && args[grad].spec->shape != samples) return replicate();
  Decision dec;
  dec.outs.resize(1);
  dec.outs[0].shape = backward ? input->spec->shape : target->spec->shape;
  auto cands = [&](int64_t i) {
    const size_t n = args.size();
    std::vector<Candidate> cs{{Placements(n, Replicate()), {Replicate()}}};
    for (int64_t d = 0; d < ndim; ++d) {
      if (d == 1) continue;  // the class dim
      const int64_t t = d > 1 ? d - 1 : d;
      Candidate c{Placements(n, Replicate()), {Shard(backward ? d : t)}};
      for (size_t j = 0; j < n; ++j) {
        if (roles[j] == Role::Input) c.in[j] = Shard(d);
        if (roles[j] == Role::Target || roles[j] == Role::Grad) c.in[j] = Shard(t);
      }
      cs.push_back(std::move(c));
    }
    if (grad >= 0) {
      const Placement& p = args[grad].spec->placements[i];
      if (p.is_partial() && (p.reduce == ReduceOp::Sum || p.reduce == ReduceOp::Avg)) {
        Candidate c{Placements(n, Replicate()), {p}};
        c.in[grad] = p;
        cs.push_back(std::move(c));
      }
    }
    return cs;
  };
  if (!choose(call, cands, dec)) return replicate();
  return dec;
}

}  // namespace kiln::dist::rules
