// The torch.func-style transforms. Notes [Transform inputs], [Transform levels] and
// [jvp by double vjp] in functional.h.
#include "kiln/autograd/functional.h"

#include <algorithm>
#include <optional>

#include "kiln/autograd/batched.h"
#include "kiln/autograd/engine.h"
#include "kiln/autograd/forward_ad.h"
#include "kiln/autograd/grad_mode.h"
#include "kiln/generated/ops.h"
#include "kiln/operators.h"
#include "forward_support.h"

namespace kiln::func {
namespace {

using autograd::AutoGradMode;
using autograd::EnableGradGuard;
using autograd::GradMode;

thread_local int64_t g_depth = 0;

class DepthGuard {
 public:
  DepthGuard() { ++g_depth; }
  ~DepthGuard() { --g_depth; }
  DepthGuard(const DepthGuard&) = delete;
  DepthGuard& operator=(const DepthGuard&) = delete;
};

// f run on fresh handles of the primals (Note [Transform inputs]).
struct Traced {
  std::vector<Tensor> inputs;  // what f saw; gradients are taken with respect to these
  Tensor out;                  // f(inputs), with its graph
  bool keep_graph = false;     // record the results' graph (Note [Transform levels])
};

// Whether any primal requires grad; ValueError for undefined or non-floating primals.
bool check_primals(const char* name, const std::vector<Tensor>& primals) {
  bool any_requires_grad = false;
  for (size_t i = 0; i < primals.size(); ++i) {
    const Tensor& p = primals[i];
    KILN_CHECK(p.defined(), Value, name, ": primal ", i, " is an undefined tensor");
    KILN_CHECK(is_floating(p.dtype()), Value, name, ": primal ", i, " has dtype ", p.dtype(),
               " (shape ", p.sizes(), "); transforms differentiate floating point tensors only");
    any_requires_grad = any_requires_grad || p.requires_grad();
  }
  return any_requires_grad;
}

Traced trace(const char* name, const Fn& f, const std::vector<Tensor>& primals) {
  Traced t;
  const bool any_requires_grad = check_primals(name, primals);
  // The leaves are made from the plain values, batched first at every active vmap level so that
  // each example gets its own gradient (See Note [vmap and autograd] in kiln/autograd/batched.h).
  std::vector<autograd::PhysicalView> views;
  for (const Tensor& p : primals)
    views.push_back(autograd::to_physical(autograd::promote_to_active_levels(p)));
  // A primal carrying a tangent (inside jvp/jacfwd) keeps it on its fresh handle, and the
  // results keep theirs (finish() must not detach them).
  using autograd::forward::detail::tangent_of;
  bool any_tangent = false;
  for (const autograd::PhysicalView& v : views) any_tangent = any_tangent || tangent_of(v.base).defined();
  t.keep_graph = g_depth > 0 || (GradMode::is_enabled() && any_requires_grad) || any_tangent;
  DepthGuard depth;
  EnableGradGuard enable;
  for (const autograd::PhysicalView& v : views) {
    Tensor leaf;
    if (t.keep_graph && v.base.requires_grad()) {
      leaf = v.base.clone();
    } else {
      leaf = v.base.detach();
      leaf.requires_grad_();
      if (Tensor tangent = tangent_of(v.base); tangent.defined())
        autograd::forward::detail::set_tangent(leaf, tangent);
    }
    t.inputs.push_back(v.levels.empty() ? leaf : autograd::from_physical(leaf, v.levels));
  }
  t.out = f(t.inputs);
  KILN_CHECK(t.out.defined(), Value, name, ": f returned an undefined tensor");
  return t;
}

Tensor finish(const Tensor& t, bool keep_graph) { return keep_graph ? t : t.detach(); }

// argnums as indices into n primals: negative ones count from the end; no repeats.
std::vector<size_t> resolve_argnums(const char* name, const std::vector<int64_t>& argnums,
                                    size_t n) {
  KILN_CHECK(!argnums.empty(), Value, name, ": argnums must name at least one primal");
  std::vector<size_t> out;
  for (int64_t a : argnums) {
    const int64_t n_args = static_cast<int64_t>(n);
    KILN_CHECK(a >= -n_args && a < n_args, Index, name, ": got argnums=", a, ", but only ", n,
               " primals were given");
    size_t i = static_cast<size_t>(a < 0 ? a + n_args : a);
    for (size_t seen : out)
      KILN_CHECK(seen != i, Value, name, ": argnums must be unique, got ", i, " twice");
    out.push_back(i);
  }
  return out;
}

std::vector<Tensor> pick(const std::vector<Tensor>& xs, const std::vector<size_t>& idx) {
  std::vector<Tensor> out;
  for (size_t i : idx) out.push_back(xs[i]);
  return out;
}

std::vector<int64_t> concat_shape(IntArrayRef a, IntArrayRef b) {
  std::vector<int64_t> out(a.begin(), a.end());
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

// The basis tensors e_0 .. e_{n-1} shaped like `like` come from the rows of eye(n).
Tensor basis(const Tensor& eye_n, int64_t k, IntArrayRef shape) {
  return eye_n.select(0, k).reshape(shape);
}

std::pair<std::vector<Tensor>, Tensor> grad_and_value_impl(const char* name, const Fn& f,
                                                           const std::vector<Tensor>& primals,
                                                           const std::vector<int64_t>& argnums) {
  std::vector<size_t> idx = resolve_argnums(name, argnums, primals.size());
  Traced t = trace(name, f, primals);
  KILN_CHECK(t.out.dim() == 0, Value, name,
             ": expected f to return a 0-dim (scalar) tensor, got a tensor of shape ",
             t.out.sizes(), "; use jacrev or vjp for non-scalar outputs");
  KILN_CHECK(is_floating(t.out.dtype()), Value, name, ": f returned a tensor of dtype ",
             t.out.dtype(), "; expected a floating point tensor");
  std::vector<Tensor> xs = pick(t.inputs, idx);
  std::vector<Tensor> grads(xs.size());
  if (t.out.requires_grad())
    grads = autograd::grad({t.out}, xs, {}, std::nullopt, t.keep_graph, /*allow_unused=*/true);
  AutoGradMode mode(t.keep_graph);
  for (size_t i = 0; i < xs.size(); ++i)
    grads[i] = finish(grads[i].defined() ? grads[i] : kiln::zeros_like(xs[i]), t.keep_graph);
  return {std::move(grads), finish(t.out, t.keep_graph)};
}

// Row j of the Jacobian is J^T e_j: one backward, batched by vmap over the rows of eye(n)
// (Note [Batched gradients] in batched.cpp: the cotangent stays batched through the backward).
std::vector<Tensor> jacrev_impl(const Fn& f, const std::vector<Tensor>& primals,
                                const std::vector<int64_t>& argnums) {
  std::vector<size_t> idx = resolve_argnums("jacrev", argnums, primals.size());
  Traced t = trace("jacrev", f, primals);
  std::vector<Tensor> xs = pick(t.inputs, idx);
  const int64_t n = t.out.numel();
  std::vector<Tensor> rows(xs.size());  // (n, *x.shape) per input; undefined: no dependence
  std::vector<bool> used(xs.size(), false);
  if (t.out.requires_grad() && n > 0) {
    const Tensor out = t.out;
    const bool keep = t.keep_graph;
    MultiFn row_vjp = [&](const std::vector<Tensor>& e) {
      std::vector<Tensor> gs = autograd::grad({out}, xs, {e[0].reshape(out.sizes())},
                                              /*retain_graph=*/true, keep, /*allow_unused=*/true);
      for (size_t i = 0; i < gs.size(); ++i) {
        used[i] = used[i] || gs[i].defined();
        if (!gs[i].defined()) gs[i] = kiln::zeros_like(xs[i]);
      }
      return gs;
    };
    rows = vmap(row_vjp)({kiln::eye(n, std::nullopt, out.dtype(), out.device())});
  }
  AutoGradMode mode(t.keep_graph);
  std::vector<Tensor> jacs;
  for (size_t i = 0; i < xs.size(); ++i) {
    std::vector<int64_t> shape = concat_shape(t.out.sizes(), xs[i].sizes());
    if (!used[i]) {
      jacs.push_back(kiln::zeros(shape, xs[i].dtype(), xs[i].device()));
      continue;
    }
    jacs.push_back(finish(rows[i].reshape(shape), t.keep_graph));
  }
  return jacs;
}

// The dummy-cotangent half of Note [jvp by double vjp]: u, and g_i = J_i^T u for each x_i
// (undefined where f does not depend on x_i).
struct LinearizedVjp {
  Tensor u;
  std::vector<Tensor> g;
};

LinearizedVjp linearize(const Traced& t, const std::vector<Tensor>& xs) {
  LinearizedVjp l;
  l.g.resize(xs.size());
  if (!t.out.requires_grad()) return l;
  EnableGradGuard enable;
  l.u = kiln::zeros_like(t.out).detach();
  l.u.requires_grad_();
  l.g = autograd::grad({t.out}, xs, {l.u}, /*retain_graph=*/true, /*create_graph=*/true,
                       /*allow_unused=*/true);
  for (Tensor& g : l.g)
    if (g.defined() && !g.requires_grad()) g = Tensor();  // J^T u not recorded: J is zero
  return l;
}

// sum_i J_i v_i (the vjp of u -> sum_i g_i(u) in the directions v_i), zeros when nothing depends.
Tensor jvp_from(const LinearizedVjp& l, const Tensor& out, const std::vector<Tensor>& vs,
                bool create_graph) {
  std::vector<Tensor> gs, ts;
  for (size_t i = 0; i < l.g.size(); ++i) {
    if (!l.g[i].defined()) continue;
    gs.push_back(l.g[i]);
    ts.push_back(vs[i]);
  }
  Tensor jv;
  if (!gs.empty())
    jv = autograd::grad(gs, {l.u}, ts, /*retain_graph=*/true, create_graph,
                        /*allow_unused=*/true)[0];
  return jv.defined() ? jv : kiln::zeros_like(out);
}

// One jvp per input element: column k of the Jacobian is J e_k (Note [jvp by double vjp]: for
// jacfwd inside an active forward AD level).
std::vector<Tensor> jacfwd_by_double_vjp(const Fn& f, const std::vector<Tensor>& primals,
                                         const std::vector<size_t>& idx) {
  Traced t = trace("jacfwd", f, primals);
  std::vector<Tensor> xs = pick(t.inputs, idx);
  LinearizedVjp l = linearize(t, xs);
  std::vector<Tensor> jacs;
  for (size_t i = 0; i < xs.size(); ++i) {
    std::vector<int64_t> shape = concat_shape(t.out.sizes(), xs[i].sizes());
    const int64_t m = xs[i].numel();
    if (!l.g[i].defined() || m == 0 || t.out.numel() == 0) {
      AutoGradMode mode(t.keep_graph);
      jacs.push_back(kiln::zeros(shape, t.out.dtype(), t.out.device()));
      continue;
    }
    LinearizedVjp one{l.u, {l.g[i]}};
    Tensor eye_m = kiln::eye(m, std::nullopt, xs[i].dtype(), xs[i].device());
    std::vector<Tensor> cols;
    for (int64_t k = 0; k < m; ++k)
      cols.push_back(jvp_from(one, t.out, {basis(eye_m, k, xs[i].sizes())}, t.keep_graph));
    AutoGradMode mode(t.keep_graph);
    jacs.push_back(finish(kiln::stack(cols, t.out.dim()).reshape(shape), t.keep_graph));
  }
  return jacs;
}

// Fresh handles of the primals for f under dual tensors (Note [Transform inputs]): the primal
// itself (make_dual aliases it, keeping its history) when the graph is kept and it requires
// grad, else a detached one.
std::vector<Tensor> dual_inputs(const std::vector<Tensor>& primals, bool keep_graph) {
  std::vector<Tensor> xs;
  for (const Tensor& p : primals) xs.push_back(keep_graph && p.requires_grad() ? p : p.detach());
  return xs;
}

// f(xs) with xs[i] carrying `tangent`, in a level of its own: f's value and J_i tangent (zeros
// when f's output does not depend on xs[i]).
std::pair<Tensor, Tensor> jvp_with_duals(const char* name, const Fn& f, std::vector<Tensor> xs,
                                         const std::vector<Tensor>& tangents) {
  autograd::forward::DualLevel level;
  for (size_t i = 0; i < xs.size(); ++i)
    if (tangents[i].defined()) xs[i] = autograd::forward::make_dual(xs[i], tangents[i]);
  Tensor out = f(xs);
  KILN_CHECK(out.defined(), Value, name, ": f returned an undefined tensor");
  Tensor jv = autograd::forward::unpack_dual(out).tangent;
  return {out, jv.defined() ? jv : kiln::zeros_like(out)};
}

// jacfwd with dual tensors: one jvp per element of each primals[i], i in idx.
std::vector<Tensor> jacfwd_impl(const Fn& f, const std::vector<Tensor>& primals,
                                const std::vector<int64_t>& argnums) {
  std::vector<size_t> idx = resolve_argnums("jacfwd", argnums, primals.size());
  if (autograd::forward::current_level() != 0) return jacfwd_by_double_vjp(f, primals, idx);
  const bool any_requires_grad = check_primals("jacfwd", primals);
  const bool keep = g_depth > 0 || (GradMode::is_enabled() && any_requires_grad);
  DepthGuard depth;
  const std::vector<Tensor> xs = dual_inputs(primals, keep);
  std::vector<Tensor> jacs;
  for (size_t i : idx) {
    const int64_t m = xs[i].numel();
    std::vector<Tensor> tangents(xs.size()), cols;
    Tensor out;
    Tensor eye_m = kiln::eye(std::max<int64_t>(m, 1), std::nullopt, xs[i].dtype(), xs[i].device());
    for (int64_t k = 0; k < m; ++k) {
      tangents[i] = basis(eye_m, k, xs[i].sizes());
      auto [o, jv] = jvp_with_duals("jacfwd", f, xs, tangents);
      out = o;
      cols.push_back(jv);
    }
    if (m == 0) {
      out = f(xs);
      KILN_CHECK(out.defined(), Value, "jacfwd: f returned an undefined tensor");
    }
    AutoGradMode mode(keep);
    std::vector<int64_t> shape = concat_shape(out.sizes(), xs[i].sizes());
    if (m == 0 || out.numel() == 0) {
      jacs.push_back(kiln::zeros(shape, out.dtype(), out.device()));
      continue;
    }
    jacs.push_back(finish(kiln::stack(cols, out.dim()).reshape(shape), keep));
  }
  return jacs;
}

Fn from_unary(const UnaryFn& f) {
  return [f](const std::vector<Tensor>& xs) { return f(xs[0]); };
}

}  // namespace

int64_t transform_depth() { return g_depth; }

std::pair<Tensor, VjpFn> vjp(const Fn& f, const std::vector<Tensor>& primals) {
  Traced t = trace("vjp", f, primals);
  Tensor out = t.out;
  std::vector<Tensor> inputs = t.inputs;
  const bool keep = t.keep_graph;
  VjpFn vjp_fn = [out, inputs, keep](const Tensor& cotangent) {
    KILN_CHECK(cotangent.defined(), Value, "vjp: the cotangent is an undefined tensor");
    KILN_CHECK(cotangent.sizes() == out.sizes(), Value, "vjp: expected a cotangent of shape ",
               out.sizes(), " (the output's), got ", cotangent.sizes());
    const bool create =
        keep || g_depth > 0 || (GradMode::is_enabled() && cotangent.requires_grad());
    std::vector<Tensor> grads(inputs.size());
    if (out.requires_grad() && !inputs.empty())
      grads = autograd::grad({out}, inputs, {cotangent}, /*retain_graph=*/true, create,
                             /*allow_unused=*/true);
    AutoGradMode mode(create);
    for (size_t i = 0; i < inputs.size(); ++i)
      grads[i] = finish(grads[i].defined() ? grads[i] : kiln::zeros_like(inputs[i]), create);
    return grads;
  };
  return {finish(out, keep), std::move(vjp_fn)};
}

std::pair<Tensor, UnaryFn> vjp(const UnaryFn& f, const Tensor& primal) {
  auto [out, fn] = vjp(from_unary(f), std::vector<Tensor>{primal});
  VjpFn inner = std::move(fn);
  return {out, [inner](const Tensor& ct) { return inner(ct)[0]; }};
}

std::pair<Tensor, Tensor> jvp(const Fn& f, const std::vector<Tensor>& primals,
                              const std::vector<Tensor>& tangents) {
  KILN_CHECK(tangents.size() == primals.size(), Value, "jvp: expected one tangent per primal, got ",
             tangents.size(), " tangents for ", primals.size(), " primals");
  bool tangents_require_grad = false;
  for (size_t i = 0; i < tangents.size(); ++i) {
    KILN_CHECK(tangents[i].defined() && primals[i].defined(), Value, "jvp: primal or tangent ", i,
               " is an undefined tensor");
    KILN_CHECK(tangents[i].sizes() == primals[i].sizes(), Value, "jvp: tangent ", i, " has shape ",
               tangents[i].sizes(), " but its primal has shape ", primals[i].sizes());
    KILN_CHECK(tangents[i].dtype() == primals[i].dtype(), Value, "jvp: tangent ", i, " has dtype ",
               tangents[i].dtype(), " but its primal has dtype ", primals[i].dtype());
    tangents_require_grad = tangents_require_grad || tangents[i].requires_grad();
  }
  if (autograd::forward::current_level() != 0) {  // Note [jvp by double vjp]
    Traced t = trace("jvp", f, primals);
    const bool keep = t.keep_graph || (GradMode::is_enabled() && tangents_require_grad);
    LinearizedVjp l = linearize(t, t.inputs);
    Tensor jv = jvp_from(l, t.out, tangents, keep);
    return {finish(t.out, t.keep_graph), finish(jv, keep)};
  }
  const bool any_requires_grad = check_primals("jvp", primals);
  const bool keep_out = g_depth > 0 || (GradMode::is_enabled() && any_requires_grad);
  const bool keep = keep_out || (GradMode::is_enabled() && tangents_require_grad);
  DepthGuard depth;
  auto [out, jv] = jvp_with_duals("jvp", f, dual_inputs(primals, keep_out), tangents);
  AutoGradMode mode(keep);
  return {finish(out, keep_out), finish(jv, keep)};
}

std::pair<Tensor, Tensor> jvp(const UnaryFn& f, const Tensor& primal, const Tensor& tangent) {
  return jvp(from_unary(f), std::vector<Tensor>{primal}, std::vector<Tensor>{tangent});
}

Fn grad(const Fn& f, int64_t argnum) {
  return [f, argnum](const std::vector<Tensor>& xs) {
    return grad_and_value_impl("grad", f, xs, {argnum}).first[0];
  };
}

MultiFn grad(const Fn& f, const std::vector<int64_t>& argnums) {
  return [f, argnums](const std::vector<Tensor>& xs) {
    return grad_and_value_impl("grad", f, xs, argnums).first;
  };
}

UnaryFn grad(const UnaryFn& f) {
  Fn g = grad(from_unary(f), 0);
  return [g](const Tensor& x) { return g({x}); };
}

std::function<std::pair<Tensor, Tensor>(const std::vector<Tensor>&)> grad_and_value(
    const Fn& f, int64_t argnum) {
  return [f, argnum](const std::vector<Tensor>& xs) {
    auto [grads, value] = grad_and_value_impl("grad_and_value", f, xs, {argnum});
    return std::make_pair(grads[0], value);
  };
}

std::function<std::pair<std::vector<Tensor>, Tensor>(const std::vector<Tensor>&)> grad_and_value(
    const Fn& f, const std::vector<int64_t>& argnums) {
  return [f, argnums](const std::vector<Tensor>& xs) {
    return grad_and_value_impl("grad_and_value", f, xs, argnums);
  };
}

std::function<std::pair<Tensor, Tensor>(const Tensor&)> grad_and_value(const UnaryFn& f) {
  auto g = grad_and_value(from_unary(f), 0);
  return [g](const Tensor& x) { return g({x}); };
}

Fn jacrev(const Fn& f, int64_t argnum) {
  return [f, argnum](const std::vector<Tensor>& xs) { return jacrev_impl(f, xs, {argnum})[0]; };
}

MultiFn jacrev(const Fn& f, const std::vector<int64_t>& argnums) {
  return [f, argnums](const std::vector<Tensor>& xs) { return jacrev_impl(f, xs, argnums); };
}

UnaryFn jacrev(const UnaryFn& f) {
  Fn j = jacrev(from_unary(f), 0);
  return [j](const Tensor& x) { return j({x}); };
}

Fn jacfwd(const Fn& f, int64_t argnum) {
  return [f, argnum](const std::vector<Tensor>& xs) { return jacfwd_impl(f, xs, {argnum})[0]; };
}

MultiFn jacfwd(const Fn& f, const std::vector<int64_t>& argnums) {
  return [f, argnums](const std::vector<Tensor>& xs) { return jacfwd_impl(f, xs, argnums); };
}

UnaryFn jacfwd(const UnaryFn& f) {
  Fn j = jacfwd(from_unary(f), 0);
  return [j](const Tensor& x) { return j({x}); };
}

Fn hessian(const Fn& f, int64_t argnum) { return jacfwd(jacrev(f, argnum), argnum); }

UnaryFn hessian(const UnaryFn& f) { return jacfwd(jacrev(f)); }

}  // namespace kiln::func
