// Private support for the generated autograd_kernels_<table>.cpp (tensor/ops/gen_autograd.py).
#pragma once

#include "kiln/autograd/autograd.h"
#include "kiln/dispatcher.h"
#include "kiln/generated/ops.h"
#include "kiln/operators.h"
#include "forward_support.h"

namespace kiln::autograd {

inline bool needs_grad(const Tensor& t) { return t.defined() && t.key_set().has(DispatchKey::Autograd); }
inline bool needs_grad(const std::optional<Tensor>& t) { return t && needs_grad(*t); }
inline bool needs_grad(TensorList ts) {
  for (const Tensor& t : ts)
    if (needs_grad(t)) return true;
  return false;
}

// The keys below Autograd that a call with this key set runs (thread-local sets applied).
inline DispatchKeySet below_autograd(DispatchKeySet ks) {
  const LocalDispatchKeySet& tls = tls_local_dispatch_key_set();
  return ((ks | tls.included) - tls.excluded) & DispatchKeySet::below(DispatchKey::Autograd);
}

// Tensor[] arguments of a node (gen_autograd.py LIST_GEOMETRY_HELPERS): the geometry is kept,
// and apply() passes zero-stride placeholders of that geometry to the formula.
inline InputMetadata geometry_of(const Tensor& t) {
  return InputMetadata{DimVector(t.sizes()), t.dtype(), t.device()};
}
std::vector<Tensor> geometry_placeholders(const std::vector<InputMetadata>& geom);

// PyTorch's error for an in-place op on a leaf that requires grad (grad mode on).
void check_inplace(const Tensor& self, const char* op);
// A copy of `t` made below autograd (the pre-op value an in-place op's formula needs), with a
// copy of t's tangent when it has one.
Tensor clone_below_autograd(const Tensor& t);

// ---- Forward AD (Note [Forward AD] in kiln/autograd/forward_ad.h) ------------------------------
using forward::detail::ForwardADDisabledGuard;
using forward::detail::has_tangent;
using forward::detail::tangent_of;

// What the forward path of a kernel asks instead of needs_grad(): a dual tensor carries the
// Autograd key without requiring grad.
inline bool requires_grad_of(const Tensor& t) { return t.defined() && t.requires_grad(); }
inline bool requires_grad_of(const std::optional<Tensor>& t) { return t && t->requires_grad(); }
inline bool requires_grad_of(TensorList ts) {
  for (const Tensor& t : ts)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}
inline std::vector<Tensor> tangents_of(TensorList ts) {
  std::vector<Tensor> r;
  r.reserve(ts.size());
  for (const Tensor& t : ts) r.push_back(tangent_of(t));
  return r;
}

// The tangent step of a kernel's reverse-mode path when no tangents flow.
struct NoForward {
  template <typename R>
  void operator()(const R&) const {}
};
// The value of self before an in-place op, for its jvp (recorded when self requires grad).
Tensor clone_for_jvp(const Tensor& self);
// A jvp formula's `<x>_t`: x's tangent, or zeros shaped like x when it has none.
Tensor tangent_or_zeros(const Tensor& tangent, const Tensor& x);
std::vector<Tensor> tangents_or_zeros(const std::vector<Tensor>& tangents, TensorList xs);
// The output `out` of `op` gets tangent `t` (cast to its dtype; a copy when t aliases another
// tensor's tangent). Integer outputs get none. Shapes must match (Runtime error naming op).
void set_output_tangent(const Tensor& out, Tensor t, const char* op);
// An in-place op on `self` ends with tangent `t`: copied into self's tangent when it has one,
// else set.
void set_inplace_tangent(const Tensor& self, Tensor t, const char* op);
// Raised when an out= variant sees a tangent.
[[noreturn]] void fail_out_variant_tangent(const char* op);

// The edge a jvp node gets for an input: valid when the input has a tangent (apply() computes
// gradients for valid edges only; the node is never run by the engine).
Edge forward_edge(const Tensor& tangent);
// Note [Derived jvp]: the double-vjp trick on one op's node (fresh, with the op's saved values
// and forward_edge()s): with u_i zeros shaped like each floating output (requiring grad),
// g = node.apply(u) = J^T u, and the tangents are the vjp of u -> sum_k <g_k, tangents_k>, i.e.
// J tangents. `outputs`: one per node input (undefined or integer: none); `tangents`: one per
// edge. Returns one tangent per output (zeros where nothing depends, undefined for integer
// outputs). The graph of the result is kept when grad mode is on and `record` is set (the
// inputs or tangents require grad).
std::vector<Tensor> derived_jvp(Node& node, const std::vector<Tensor>& outputs,
                                const std::vector<Tensor>& tangents, bool record);

}  // namespace kiln::autograd
