// The sharding rule of the fused optimizer rows (Note [Optimizer sharding]).
#include "rules.h"

namespace kiln::dist::rules {

// Note [Optimizer sharding]: _fused_sgd_, _fused_adam_ and _fused_adamw_ update, for each index
// k, the parameter self[k] from grads[k] and the k-th state of every other list, element by
// element. So each parameter's shard is updated where it lies: every DTensor at index k takes
// the placements of self[k] (a Partial gradient is reduce-scattered or all-reduced into them; the
// state made by zeros_like already has them), and the local call updates the shards in place;
// state placed otherwise is redistributed and written back (Note [DTensor dispatch]). A DTensor
// step counter is replicated: every element of the parameter reads it.
// Plain tensors may sit beside DTensors (a tensor-parallel model's replicated norms, the
// one-element step counters): at an index whose parameter is plain every tensor must be plain,
// and a plain step counter is allowed beside a DTensor parameter. The parameters may lie on
// different meshes (FSDP over tensor parallel: 2-d parameters beside FSDP-only ones), but every
// DTensor at index k lies on the mesh of self[k]. A Partial parameter cannot be updated shard by
// shard, so the call takes the replicate path, which needs one mesh for the whole call.
Decision decide_optimizer(const RuleCall& call) {
  const std::vector<Arg>& args = call.tensors;
  Decision d;
  d.targets.assign(args.size(), Placements{});
  std::vector<const Arg*> params;  // self[k]
  for (const Arg& a : args)
    if (a.index == 0) params.push_back(&a);
  const std::string& steps_name = "state_steps";
  for (size_t j = 0; j < args.size(); ++j) {
    const Arg& a = args[j];
    KILN_ASSERT(a.elem >= 0, call.op.name(), ": a tensor outside the lists");
    KILN_CHECK(static_cast<size_t>(a.elem) < params.size(), Value, call.op.name(), ": list '",
               call.op.info().args[a.index].name, "' is longer than self (", params.size(),
               " parameters)");
    const Arg& p = *params[a.elem];
    const bool step = call.op.info().args[a.index].name == steps_name;
    if (!p.spec) {
      KILN_CHECK(!a.spec, Runtime, call.op.name(), ": parameter ", a.elem,
                 " is a plain tensor but its '", call.op.info().args[a.index].name,
                 "' is a DTensor; a parameter and its gradient and state must both be DTensors "
                 "or both plain");
      continue;
    }
    if (!a.spec) {
      KILN_CHECK(step || a.tensor->dim() == 0, Runtime, call.op.name(), ": parameter ", a.elem,
                 " is a DTensor but its '", call.op.info().args[a.index].name,
                 "' is a plain tensor of shape ", a.tensor->sizes(),
                 "; convert it with distribute_tensor or DTensor.from_local");
      continue;
    }
    KILN_CHECK(a.spec->mesh == p.spec->mesh, Value, call.op.name(), ": parameter ", a.elem,
               " is on ", p.spec->mesh.str(), " but its '", call.op.info().args[a.index].name,
               "' is on ", a.spec->mesh.str(), "; redistribute it onto the parameter's mesh");
    for (const Placement& pl : p.spec->placements) {
      if (!pl.is_partial()) continue;
      for (const Arg* q : params)
        KILN_CHECK(!q->spec || q->spec->mesh == p.spec->mesh, Value, call.op.name(), ": parameter ",
                   a.elem,
                   " is Partial, which updates on the replicate path of "
                   "one mesh, but the parameters lie on ",
                   p.spec->mesh.str(), " and ", q->spec->mesh.str(),
                   "; redistribute the Partial parameter first");
      return replicate();
    }
    d.targets[j] = step ? Placements(p.spec->placements.size(), Replicate()) : p.spec->placements;
  }
  return d;
}

}  // namespace kiln::dist::rules
