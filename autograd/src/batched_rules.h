// Private: what the Batched key's rule files share (batched_rules.cpp: the generic rules, the
// loop and the kernels; batched_rules_nn.cpp: conv, pool and the row-wise rules of nn.toml,
// loss.toml and attention.toml). Note [Batching rules] in kiln/autograd/batched.h.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "batched_internal.h"
#include "kiln/dispatcher.h"
#include "kiln/generated/op_handles.h"
#include "kiln/generated/ops.h"

namespace kiln::autograd::batching {

// ---- helpers over one call's arguments --------------------------------------------------------

// A rule's outputs (what goes back on the stack), or nullopt: "use the per-example loop".
using Result = std::optional<Stack>;

struct Call {
  const OperatorHandle& op;
  Stack args;
  int64_t level = 0;
  int64_t batch = -1;
  const OpInfo& info() const { return op.info(); }
  const char* name() const { return op.name(); }
  // The first argument with `role` (Note [Argument roles] in tensor/ops/optable.py), or -1.
  int index(ArgRole role) const {
    for (int i = 0; i < info().num_args; ++i)
      if (info().args[i].role == role) return i;
    return -1;
  }
  // Per-op code reads an argument without a role (groups, eps, ...) at its generated position,
  // ops::X::kArg_<name> (Note [Argument positions] in tensor/ops/gen.py), after checking is<X>().
  // Whether this call is of the op `Op` (a handle of kiln::ops): per-op code without names.
  template <typename Op>
  bool is() const {
    return &op == &Op::handle();
  }
  bool batched(const Tensor& t) const { return t.defined() && batched_level(t) == level; }
};

// `t` batched at the call's level, as its value with the batch dim first.
inline Tensor front(const Tensor& t) {
  const Tensor& v = batched_value(t);
  const int64_t d = batched_bdim(t);
  if (d == 0) return v;
  std::vector<int64_t> perm{d};
  for (int64_t i = 0; i < v.dim(); ++i)
    if (i != d) perm.push_back(i);
  return v.permute(perm);
}

// The call's argument as a physical tensor with the batch dim first (expanded if unbatched).
inline Tensor front_or_expand(const Call& c, const Tensor& t) {
  if (c.batched(t)) return front(t);
  DimVector sizes(t.sizes());
  sizes.insert(0, c.batch);
  return t.unsqueeze(0).expand(IntArrayRef(sizes));
}

// PyTorch's dim wrapping over the logical rank (0-dim tensors accept 0 and -1).
inline int64_t wrap_dim(const Call& c, int64_t d, int64_t rank) {
  const int64_t r = std::max<int64_t>(rank, 1);
  KILN_CHECK(d >= -r && d < r, Index, c.name(),
             ": dimension out of range (expected to be in range "
             "of [",
             -r, ", ", r - 1, "], but got ", d, ") for an example of rank ", rank, " inside vmap");
  return d < 0 ? d + r : d;
}

inline Tensor pad_after_batch(Tensor phys, int64_t rank) {
  while (phys.dim() - 1 < rank) phys = phys.unsqueeze(1);
  return phys;
}

inline Stack run(const OperatorHandle& op, Stack args) {
  op.call_boxed(args);
  return args;
}

inline Stack wrap_outputs(const Call& c, Stack outs) {
  for (IValue& v : outs) {
    if (v.is_tensor()) {
      v = make_batched(v.to_tensor(), 0, c.level);
    } else if (v.is_tensor_list()) {
      std::vector<Tensor> ts;
      for (const Tensor& t : v.to_tensor_list()) ts.push_back(make_batched(t, 0, c.level));
      v = ts;
    }
  }
  return outs;
}

inline void check_inplace_self(const Call& c) {
  KILN_CHECK(c.batched(c.args[0].to_tensor()), Value, "vmap: ", c.name(),
             "(self, *extra_args) is not possible because self is not batched by this vmap while "
             "another argument is: an in-place op cannot give each example its own result in a "
             "tensor that holds only one (batch self too, or use the out-of-place op)");
}

// Rules of batched_rules_nn.cpp.
Result conv_rule(Call& c);
Result pool_rule(Call& c);
Result rowwise_rule(Call& c);

}  // namespace kiln::autograd::batching
