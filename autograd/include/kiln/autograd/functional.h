// kiln/autograd/functional.h: functorch-style transforms over reverse mode (torch.func's names).
//
//   using namespace kiln;
//   func::UnaryFn f = [](const Tensor& x) { return (sin(x) * x * x).sum(); };
//   Tensor g = func::grad(f)(x);                  // df/dx, same shape as x
//   Tensor h = func::hessian(f)(x);               // jacfwd(jacrev(f)), shape x.shape + x.shape
//   auto [y, t] = func::jvp(f, x, v);             // f(x) and J(x) v
//   Tensor ys = func::vmap(f)(xs);                // f over dim 0 of xs, stacked along dim 0
//
// Every transform takes a function of tensors and returns a function (or values); they compose:
// grad(grad(f)), jacfwd(jacrev(f)), jacrev(jacrev(f)), vjp/jvp inside any of them.
//
// Note [Transform inputs]: a transform never changes the caller's tensors. It runs f on fresh
// handles of the primals: a detached leaf that requires grad (sharing storage, so f must not
// write into its inputs), or, when the primal itself requires grad (an enclosing transform, or
// the caller's own autograd), a clone that stays connected to it. Gradients are taken with
// respect to those handles only, so paths through tensors f captures from outside are not
// counted as paths through the inputs. Inside vmap, each primal is first batched at every
// running vmap level (Note [vmap and autograd] in kiln/autograd/batched.h), and the leaf is
// made from its plain value, so every example gets its own gradient.
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
#include <optional>
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

// Jacobians of shape f(x).shape + primals[argnum].shape. jacrev runs one backward, batched by
// vmap over the rows of the identity (each example a cotangent e_j); jacfwd takes one jvp per
// input element, with dual tensors.
Fn jacrev(const Fn& f, int64_t argnum = 0);
MultiFn jacrev(const Fn& f, const std::vector<int64_t>& argnums);
UnaryFn jacrev(const UnaryFn& f);
Fn jacfwd(const Fn& f, int64_t argnum = 0);
MultiFn jacfwd(const Fn& f, const std::vector<int64_t>& argnums);
UnaryFn jacfwd(const UnaryFn& f);

// jacfwd(jacrev(f)): shape f(x).shape + x.shape + x.shape.
Fn hessian(const Fn& f, int64_t argnum = 0);
UnaryFn hessian(const UnaryFn& f);

// Note [vmap]: vmap(f, in_dims, out_dims)(xs) runs f once on BatchedTensors (Note
// [BatchedTensor] in kiln/autograd/batched.h): input i is batched along in_dims[i] (nullopt:
// the same tensor for every example; negative dims count from the end; empty in_dims: 0 for
// every input), and f sees each example's shape. Output j comes back with the examples along
// out_dims[j]; an output that does not depend on the batch is expanded to every example. Every
// op runs its table row's batching rule (Note [Batching rules]), so the result equals stacking
// f applied to each example, without a loop. chunk_size runs that many examples at a time.
//
//   Tensor per_sample = func::vmap(func::grad(loss, 0), {std::nullopt, 0, 0})({w, x, y});
//   Fn dot = [](const std::vector<Tensor>& v) { return (v[0] * v[1]).sum(); };
//   Tensor dots = func::vmap(dot)({a, b});                            // a, b: (B, n) -> (B,)
//   Fn mul = [](const std::vector<Tensor>& v) { return v[0] * v[1]; };
//   Tensor outer = func::vmap(func::vmap(mul, {std::nullopt, 0}), {0, std::nullopt})({a, b});
//
// Randomness: a random op on a BatchedTensor (bernoulli, normal_, uniform_) draws different
// values for each example; one without tensor inputs (randn(size)) draws once, for all.
// Transforms compose: vmap(grad(f)) gives per-example gradients (grad and vjp batch the primals
// that are not batched yet, Note [vmap and autograd]), grad(vmap(f)) differentiates through
// the batching, vmap(vmap(f)) batches twice. Errors are ValueErrors: no batched input, batch
// sizes that differ, an in_dim or out_dim out of range. Inside f, a BatchedTensor's data
// cannot be read (item(), data_ptr()), and backward() is refused: use grad or vjp. An in-place
// op whose self is not batched while another argument is raises a ValueError (one tensor cannot
// hold every example's result); out= tensors must already have the result's shape.
MultiFn vmap(const MultiFn& f, std::vector<std::optional<int64_t>> in_dims = {},
             std::vector<int64_t> out_dims = {}, std::optional<int64_t> chunk_size = std::nullopt);
Fn vmap(const Fn& f, std::vector<std::optional<int64_t>> in_dims = {}, int64_t out_dim = 0,
        std::optional<int64_t> chunk_size = std::nullopt);
UnaryFn vmap(const UnaryFn& f, int64_t in_dim = 0, int64_t out_dim = 0);

}  // namespace kiln::func
