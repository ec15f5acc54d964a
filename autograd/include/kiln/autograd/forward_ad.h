// kiln/autograd/forward_ad.h: forward-mode automatic differentiation with dual tensors
// (PyTorch's torch.autograd.forward_ad).
//
//   namespace fwd = kiln::autograd::forward;
//   fwd::DualLevel level;                              // tangents live until it ends
//   Tensor x = fwd::make_dual(primal, tangent);        // x: primal's values, carrying `tangent`
//   Tensor y = kiln::sin(x) * x;                       // every op propagates the tangent
//   auto [p, jv] = fwd::unpack_dual(y);                // jv == J(primal) @ tangent
//
// Note [Forward AD]: a dual tensor is an ordinary tensor whose AutogradMeta holds a tangent for
// the thread's active DualLevel, and which carries the Autograd dispatch key. While a level is
// active, the generated Autograd kernels (tensor/ops/gen_autograd.py) give every floating output
// of an op a tangent when one of its differentiable inputs has one:
// - a row with a jvp formula evaluates it, with `<input>_t` bound to the inputs' tangents (zeros
//   for inputs without one) and `result` to the output;
// - a row with `jvp = "derived"` uses the double-vjp trick on its own backward node: with
//   u = zeros shaped like the output (requiring grad), g = node.apply(u) = J^T u is linear in u,
//   so the vjp of u -> <g, t> is J t (Note [jvp by double vjp] in functional.h, per op);
// - view ops apply the same view to the input's tangent (the output's tangent aliases it);
// - in-place ops compute the new tangent from the values before the op and copy it into self's
//   tangent (or give self one); for a view, the same view of its base's tangent, the base getting
//   a zero tangent when it has none (as in PyTorch);
// - `jvp = "non_differentiable"` rows, integer outputs and out= variants get no tangent;
//   composite rows get theirs from the ops they decompose into.
// Tangents are computed with forward AD disabled (no tangents of tangents at one level) but
// under the caller's grad mode, so reverse mode records them when the primals or tangents
// require grad: forward-over-reverse (func::hessian = jacfwd(jacrev(f))) differentiates the
// backward pass's ops, whose saved tensors keep their tangents. Forward AD ignores GradMode:
// no_grad does not stop tangents (as in PyTorch).
//
// Note [Forward AD levels]: one level may be active per thread; entering a second raises
// NotImplemented (func::jvp inside an active level falls back to the double-vjp transform).
// Each level has a process-unique id; a tangent is valid only while its level is the thread's
// active one, and leaving the level drops every tangent set during it (and the Autograd key of
// the tensors that no longer need it). With no level active, a kernel pays one flag test, read
// together with grad mode (Note [Autograd thread-local state] in grad_mode.h). Levels belong to
// a thread: another thread does not see this level's tangents (and should not share dual
// tensors while the level is active).
//
// Custom Functions (function.h) have no jvp of their own: their outputs get the tangents the ops
// inside forward() compute (PyTorch asks for a jvp staticmethod instead).
//
// Limitations: as_strided's tangent is computed (derived), not a view of the input's tangent, so
// an in-place op through an as_strided view does not reach the base's tangent.
#pragma once

#include <cstdint>

#include "kiln/tensor.h"

namespace kiln::autograd::forward {

// Enters a forward AD level on this thread for its lifetime (torch.autograd.forward_ad.dual_level).
class DualLevel {
 public:
  DualLevel();
  ~DualLevel();
  DualLevel(const DualLevel&) = delete;
  DualLevel& operator=(const DualLevel&) = delete;
  uint64_t id() const { return id_; }

 private:
  uint64_t id_;
};

// The active level's id on this thread, 0 when none.
uint64_t current_level();

// A new handle on `primal` (an alias: same storage, same reverse-mode history) whose tangent is
// `tangent`. Needs an active level. The tangent must be a floating tensor of the primal's shape,
// dtype and device (ValueError otherwise); it is stored as is (not copied), as in PyTorch.
Tensor make_dual(const Tensor& primal, const Tensor& tangent);

struct UnpackedDual {
  Tensor primal;   // an alias of the tensor without its tangent (t itself when it has none)
  Tensor tangent;  // undefined when t has no tangent at the active level
};
UnpackedDual unpack_dual(const Tensor& t);

}  // namespace kiln::autograd::forward
