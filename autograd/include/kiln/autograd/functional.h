// kiln/autograd/functional.h: functorch-style transforms over reverse mode (torch.func's names).
//
//   using namespace kiln;
//   func::UnaryFn f = [](const Tensor& x) { return (sin(x) * x * x).sum(); };
//   Tensor g = func::grad(f)(x);                  // df/dx, same shape as x
//   Tensor h = func::hessian(f)(x);               // jacfwd(jacrev(f)), shape x.shape + x.shape
//   auto [y, t] = func::jvp(f, x, v);             // f(x) and J(x) v
//
// Every transform takes a function of tensors and returns a function (or values); they compose:
// grad(grad(f)), jacfwd(jacrev(f)), jacrev(jacrev(f)), vjp/jvp inside any of them.
//
// Note [Transform inputs]: a transform never changes the caller's tensors. It runs f on fresh
// handles of the primals: a detached leaf that requires grad (sharing storage, so f must not
// write into its inputs), or, when the primal itself requires grad (an enclosing transform, or
// the caller's own autograd), a clone that stays connected to it. Gradients are taken with
// respect to those handles only, so paths through tensors f captures from outside are not
// counted as paths through the inputs.
//
// Note [Transform levels]: a thread-local depth counts the transforms running. The outermost
// transform (depth 0) whose primals do not require grad returns plain tensors: detached, no graph
// kept. Nested transforms, and transforms whose primals require grad under grad mode, record the
// graph of their results (create_graph) so the enclosing level can differentiate them. Limitation:
// at the outermost level, f's dependence on captured tensors that require grad is not kept in the
// results (functorch would keep it); pass such tensors as primals instead.
//
// Note [jvp by double vjp]: jvp and jacfwd run f on dual tensors (kiln/autograd/forward_ad.h):
// one forward pass per tangent, in a forward AD level of its own, with the op table's jvp
// formulas. Only one level can be active per thread, so a jvp/jacfwd called while one is active
// (jacfwd(jacfwd(f)), jvp inside a DualLevel) uses the double-vjp trick instead: with a dummy
// cotangent u (zeros that require grad), g(u) = vjp(u) = J^T u is computed with create_graph,
// and since g is linear in u, the vjp of g with respect to u in the direction v is
// (J^T)^T v = J v. That costs one forward, one backward and one double backward per tangent, and
// needs every op on the path to have a differentiable backward formula. Inside an active level,
// the primals' tangents ride along on the transforms' fresh handles (forward-over-reverse:
// hessian = jacfwd(jacrev(f)) differentiates jacrev's backward pass with tangents).
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "kiln/tensor.h"

namespace kiln::func {

// f(primals) -> one tensor.
using Fn = std::function<Tensor(const std::vector<Tensor>&)>;
// f(primals) -> one tensor per requested argnum (grad/jacrev/jacfwd with several argnums).
using MultiFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
using UnaryFn = std::function<Tensor(const Tensor&)>;
// Takes a cotangent shaped like f's output, returns one cotangent per primal (zeros where the
// output does not depend on it). Callable any number of times.
using VjpFn = std::function<std::vector<Tensor>(const Tensor&)>;

// How many transforms are running on this thread (Note [Transform levels]).
int64_t transform_depth();

// f(primals) and its vjp function.
std::pair<Tensor, VjpFn> vjp(const Fn& f, const std::vector<Tensor>& primals);
std::pair<Tensor, UnaryFn> vjp(const UnaryFn& f, const Tensor& primal);

// f(primals) and J(primals) @ tangents (one tangent per primal, same shape and dtype).
// Dual tensors (Note [jvp by double vjp]).
std::pair<Tensor, Tensor> jvp(const Fn& f, const std::vector<Tensor>& primals,
                              const std::vector<Tensor>& tangents);
std::pair<Tensor, Tensor> jvp(const UnaryFn& f, const Tensor& primal, const Tensor& tangent);

// The gradient of a 0-dim f with respect to primals[argnum] (ValueError for any other output
// shape). Negative argnums count from the end. Several argnums: one gradient per argnum, in order.
Fn grad(const Fn& f, int64_t argnum = 0);
MultiFn grad(const Fn& f, const std::vector<int64_t>& argnums);
UnaryFn grad(const UnaryFn& f);

// Like grad, also returning f's value: (gradient(s), value).
std::function<std::pair<Tensor, Tensor>(const std::vector<Tensor>&)> grad_and_value(
    const Fn& f, int64_t argnum = 0);
std::function<std::pair<std::vector<Tensor>, Tensor>(const std::vector<Tensor>&)> grad_and_value(
    const Fn& f, const std::vector<int64_t>& argnums);
std::function<std::pair<Tensor, Tensor>(const Tensor&)> grad_and_value(const UnaryFn& f);

// Jacobians of shape f(x).shape + primals[argnum].shape. jacrev takes one vjp per output element;
// jacfwd one jvp per input element, with dual tensors (Note [jvp by double vjp]).
Fn jacrev(const Fn& f, int64_t argnum = 0);
MultiFn jacrev(const Fn& f, const std::vector<int64_t>& argnums);
UnaryFn jacrev(const UnaryFn& f);
Fn jacfwd(const Fn& f, int64_t argnum = 0);
MultiFn jacfwd(const Fn& f, const std::vector<int64_t>& argnums);
UnaryFn jacfwd(const UnaryFn& f);

// jacfwd(jacrev(f)): shape f(x).shape + x.shape + x.shape.
Fn hessian(const Fn& f, int64_t argnum = 0);
UnaryFn hessian(const UnaryFn& f);

}  // namespace kiln::func
