// Private support for the generated autograd_kernels.cpp (tensor/ops/gen_autograd.py).
#pragma once

#include "kiln/autograd/autograd.h"
#include "kiln/dispatcher.h"
#include "kiln/generated/composite_decls.h"
#include "kiln/generated/op_handles.h"
#include "kiln/generated/ops.h"
#include "kiln/operators.h"

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
// A copy of `t` made below autograd (the pre-op value an in-place op's formula needs).
Tensor clone_below_autograd(const Tensor& t);

}  // namespace kiln::autograd
