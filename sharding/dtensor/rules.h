// sharding/dtensor/rules.h (internal to sharding/dtensor): what a sharding rule gets and what it
// decides. dispatch.cpp calls the rule of an op's row (OpInfo::sharding), caches its Decision per
// op and argument specs, redistributes the inputs, runs the op on the shards and wraps the results
// (Note [DTensor dispatch]). One file per rule:
//   pointwise.cpp   Note [Pointwise sharding]
//   optim.cpp       Note [Optimizer sharding]
//   reduction.cpp   Note [Reduction sharding]
//   softmax.cpp     Note [Softmax sharding] (rules "softmax" and "norm")
//   view.cpp        Note [View sharding] (the view and cat rules)
//   matmul.cpp      Note [Matmul sharding]
//   embedding.cpp   Note [Embedding sharding]
//   index.cpp       Note [Index sharding]
//   attention.cpp   Note [Attention sharding]
//   loss.cpp        Note [Loss sharding]
//   random.cpp      Note [Random sharding]
#pragma once

#include <functional>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/dist/dtensor.h"
#include "kiln/kiln.h"

namespace kiln::dist::rules {

// A tensor argument of the op (or an element of a tensor-list argument).
struct Arg {
  int index;                // in the op's arguments
  int elem;                 // in the list, or -1
  const Tensor* tensor;     // the DTensor (or plain 0-d tensor) itself, global sizes
  const DTensorSpec* spec;  // null for a plain 0-d tensor
  int64_t rank;             // tensor->dim()
};

// One tensor result: its placements, global shape and global strides (empty: contiguous).
struct OutSpec {
  Placements placements;
  DimVector shape;
  DimVector stride;
};

// What a rule decides. It depends only on what the cache key holds (Note [DTensor dispatch]):
// the op, the tensors' shapes and placements, the integer, bool, int-list, dtype and string
// arguments (not float or Scalar values, except for rule "attention"), the mesh's shape and this
// rank's coordinate.
struct Decision {
  std::vector<Placements> targets;  // per Arg: its placements for the local call (empty: plain)
  std::vector<OutSpec> outs;        // per tensor result, tensor-list results flattened, in order
  // Non-tensor arguments replaced for the local call (a view's global sizes become local ones).
  std::vector<std::pair<int, IValue>> local_args;
  // The rule's own local computation, run instead of the op on the redistributed arguments (which
  // it replaces with the results, as call_boxed does); null for the op itself. Embedding with
  // row-sharded weights, for one, masks the indices outside this rank's rows.
  std::function<void(const OperatorHandle&, Stack&)> local_call;
  bool replicate_path = false;  // the rule cannot shard this call: replicate, compute, reshard
};

struct RuleCall {
  const OperatorHandle& op;
  const Stack& args;
  const std::vector<Arg>& tensors;
  const DeviceMesh& mesh;
};

// A rule: the Decision for one call. Errors in the call itself (a bad dim) are left to the local
// op where it reports them as well; a rule that cannot shard a call returns replicate().
using Rule = Decision (*)(const RuleCall&);

Decision decide_pointwise(const RuleCall& call);
Decision decide_optimizer(const RuleCall& call);
Decision decide_reduction(const RuleCall& call);
Decision decide_softmax(const RuleCall& call);
Decision decide_norm(const RuleCall& call);
Decision decide_view(const RuleCall& call);
Decision decide_cat(const RuleCall& call);
Decision decide_matmul(const RuleCall& call);
Decision decide_embedding(const RuleCall& call);
Decision decide_index(const RuleCall& call);
Decision decide_attention(const RuleCall& call);
Decision decide_loss(const RuleCall& call);
Decision decide_random(const RuleCall& call);

// The index of the op's argument called `name`, or -1.
int arg_named(const OpInfo& info, std::string_view name);

inline Decision replicate() {
  Decision d;
  d.replicate_path = true;
  return d;
}

// Elements moved to go from `from` to `to` along one mesh dim for a tensor of `numel` elements:
// all-gather n, reduce-scatter n, all-reduce 2n, taking a piece or Replicate -> Partial 0.
int64_t move_cost(const Placement& from, const Placement& to, int64_t numel);

// One way to run the op along one mesh dim: the placement each Arg takes (entries for plain
// tensors are ignored) and each result's.
struct Candidate {
  Placements in;
  Placements out;
};

// Fills d.targets and the placements of d.outs (which must already hold one OutSpec per result)
// with, for every mesh dim i, the cheapest of cands(i) by move_cost (the first on a tie). An
// in-place op only takes candidates whose out[0] is self's placement. Returns false when some mesh
// dim has no candidate left (the caller then returns replicate()).
bool choose(const RuleCall& call, const std::function<std::vector<Candidate>(int64_t)>& cands,
            Decision& d);

}  // namespace kiln::dist::rules
