"""kiln.func: composable function transforms (torch.func's names) over Python callables.

    import kiln
    from kiln.func import grad, vmap, jacrev, hessian
    loss = lambda w, x, y: ((x @ w - y) ** 2).mean()
    g = grad(loss)(w, x, y)                                     # d loss / d w
    per_sample = vmap(grad(loss), in_dims=(None, 0, 0))(w, xs, ys)
    H = hessian(lambda x: (x.sin() * x).sum())(x)               # x.shape + x.shape

Each transform binds its C++ counterpart (kiln/autograd/functional.h), so they nest freely
(grad(grad(f)), vmap(grad(f)), jacfwd(jacrev(f))). Arguments and results may be pytrees: tensors
inside nested tuples, lists and dicts. Functions with several tensor outputs are handled by
concatenating the flattened outputs into one tensor for the C++ transform and splitting the
results back (so their dtypes must promote to one dtype).
"""
import builtins
import functools
import math

from kiln import _C
from kiln._C import Tensor

__all__ = ["grad", "grad_and_value", "vjp", "jvp", "vmap", "jacrev", "jacfwd", "hessian"]


# ---- pytrees -----------------------------------------------------------------------------------
def _flatten(tree):
    """(leaves, spec): the leaves of nested tuples, lists and dicts, and how to rebuild them."""
    if isinstance(tree, (tuple, list)):
        leaves, specs = [], []
        for x in tree:
            l, s = _flatten(x)
            leaves += l
            specs.append(s)
        return leaves, (type(tree), None, specs)
    if isinstance(tree, dict):
        leaves, specs = [], []
        for k in tree:
            l, s = _flatten(tree[k])
            leaves += l
            specs.append(s)
        return leaves, (dict, list(tree), specs)
    return [tree], None


def _unflatten(leaves, spec):
    return _build(iter(leaves), spec)


# Module-level, not a closure over the iterator: a nested function that calls itself is a
# reference cycle, which would keep `leaves` (the tensors of a whole training step) alive until
# the garbage collector happens to run.
def _build(it, s):
    if s is None:
        return next(it)
    kind, keys, subs = s
    items = [_build(it, c) for c in subs]
    if kind is dict:
        return dict(zip(keys, items))
    return kind(items) if kind in (tuple, list) else kind(*items)  # namedtuple


def _check_tensors(leaves, what):
    for x in leaves:
        if not isinstance(x, Tensor):
            raise TypeError(f"{what}: expected tensors (or tuples, lists and dicts of tensors), "
                            f"got {type(x).__name__}")


def _argnums_tuple(argnums, nargs, what):
    nums = (argnums,) if isinstance(argnums, builtins.int) else tuple(argnums)
    if not nums:
        raise ValueError(f"{what}: argnums must be non-empty")
    out = []
    for a in nums:
        if not isinstance(a, builtins.int) or not -nargs <= a < nargs:
            raise ValueError(f"{what}: argnum {a} is out of range for a function called with "
                             f"{nargs} positional arguments")
        out.append(a % nargs)
    return out


class _Packer:
    """Rebuilds f's output pytree from the one tensor the C++ transforms see."""

    def __init__(self):
        self.spec = None
        self.shapes = None
        self.aux = None

    def pack(self, out, what):
        leaves, spec = _flatten(out)
        _check_tensors(leaves, what)
        if not leaves:
            raise ValueError(f"{what}: the function returned no tensors")
        self.spec, self.shapes = spec, [t.shape for t in leaves]
        if spec is None:
            return leaves[0]
        return _C.cat([t.reshape(-1) for t in leaves])

    def sizes(self):
        return [math.prod(s) for s in self.shapes]

    def split(self, flat, trailing=()):
        """The pieces of a packed tensor (leading dim = packed outputs), as f's output pytree."""
        if self.spec is None:
            return flat
        parts, start = [], 0
        for shape, n in zip(self.shapes, self.sizes()):
            parts.append(flat.slice(0, start, start + n).reshape(tuple(shape) + tuple(trailing)))
            start += n
        return _unflatten(parts, self.spec)

    def pack_like(self, tree, what):
        """A cotangent or tangent pytree shaped like f's output, packed the same way."""
        leaves, spec = _flatten(tree)
        _check_tensors(leaves, what)
        if len(leaves) != len(self.shapes):
            raise ValueError(f"{what}: expected {len(self.shapes)} tensors shaped like the "
                             f"function's outputs, got {len(leaves)}")
        for t, s in zip(leaves, self.shapes):
            if t.shape != s:
                raise ValueError(f"{what}: expected shape {list(s)}, got {list(t.shape)}")
        if self.spec is None:
            return leaves[0]
        return _C.cat([t.reshape(-1) for t in leaves])


def _detach_aux(aux):
    """aux leaves leave the transform as plain tensors at the outermost level."""
    if _C._func_transform_depth() > 0:
        return aux
    leaves, spec = _flatten(aux)
    return _unflatten([x.detach() if isinstance(x, Tensor) else x for x in leaves], spec)


def _split_out(out, has_aux, what):
    if not has_aux:
        return out, None
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise ValueError(f"{what}(f, has_aux=True): f must return a pair (output, aux)")
    return out[0], out[1]


def _diff_args(args, argnums, what):
    """The differentiated arguments flattened: (primals, per-argnum specs, a rebuild function)."""
    primals, specs, counts = [], [], []
    for a in argnums:
        leaves, spec = _flatten(args[a])
        _check_tensors(leaves, what)
        primals += leaves
        specs.append(spec)
        counts.append(len(leaves))

    def rebuild(xs):
        full = list(args)
        start = 0
        for a, spec, n in zip(argnums, specs, counts):
            full[a] = _unflatten(xs[start:start + n], spec)
            start += n
        return full

    def regroup(values):
        out, start = [], 0
        for spec, n in zip(specs, counts):
            out.append(_unflatten(values[start:start + n], spec))
            start += n
        return out
    return primals, rebuild, regroup


def _result(per_argnum, argnums):
    return per_argnum[0] if isinstance(argnums, builtins.int) else tuple(per_argnum)


# ---- reverse mode ------------------------------------------------------------------------------
def grad_and_value(func, argnums=0, has_aux=False):
    """grad(func) that also returns func's value: (gradient, value), or with has_aux
    (gradient, (value, aux)), as torch.func does."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        nums = _argnums_tuple(argnums, len(args), "grad")
        primals, rebuild, regroup = _diff_args(args, nums, "grad")
        box = {}

        def f(xs):
            out, aux = _split_out(func(*rebuild(xs), **kwargs), has_aux, "grad")
            if not isinstance(out, Tensor):
                raise TypeError(f"grad: f must return a Tensor, got {type(out).__name__}")
            box["aux"] = aux
            return out
        grads, value = _C._func_grad_and_value(f, primals, list(range(len(primals))))
        g = _result(regroup(grads), argnums)
        if has_aux:
            return g, (value, _detach_aux(box["aux"]))
        return g, value
    return wrapper


def grad(func, argnums=0, has_aux=False):
    """The gradient of a function returning a 0-dim tensor, with respect to args[argnums] (a pytree
    of tensors; a tuple of argnums gives a tuple of gradients). has_aux: f returns (loss, aux) and
    grad returns (gradient, aux)."""
    gv = grad_and_value(func, argnums, has_aux)

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        g, value = gv(*args, **kwargs)
        return (g, value[1]) if has_aux else g
    return wrapper


def vjp(func, *primals, has_aux=False):
    """(func(*primals), vjp_fn[, aux]); vjp_fn(cotangents shaped like the output) returns one
    cotangent per primal (pytrees kept). vjp_fn can be called any number of times."""
    flat, spec = _flatten(list(primals))
    _check_tensors(flat, "vjp")
    packer = _Packer()
    box = {}

    def f(xs):
        out, aux = _split_out(func(*_unflatten(xs, spec)), has_aux, "vjp")
        box["aux"] = aux
        return packer.pack(out, "vjp")
    out, fn = _C._func_vjp(f, flat)

    def vjp_fn(*cotangents):
        ct = cotangents[0] if len(cotangents) == 1 else cotangents
        return tuple(_unflatten(fn(packer.pack_like(ct, "vjp_fn")), spec))
    result = (packer.split(out), vjp_fn)
    return result + (_detach_aux(box["aux"]),) if has_aux else result


def jacrev(func, argnums=0, has_aux=False):
    """The Jacobian by reverse mode: for an output of shape O and an input of shape I, a tensor of
    shape O + I (pytrees of outputs and argnums give nested results, outputs outermost)."""
    return _jacobian(func, argnums, has_aux, _C._func_jacrev, "jacrev")


def jacfwd(func, argnums=0, has_aux=False):
    """The Jacobian by forward mode (dual tensors), laid out as jacrev's."""
    return _jacobian(func, argnums, has_aux, _C._func_jacfwd, "jacfwd")


def _jacobian(func, argnums, has_aux, transform, what):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        nums = _argnums_tuple(argnums, len(args), what)
        primals, rebuild, regroup = _diff_args(args, nums, what)
        packer = _Packer()
        box = {}

        def f(xs):
            out, aux = _split_out(func(*rebuild(xs), **kwargs), has_aux, what)
            box["aux"] = aux
            return packer.pack(out, what)
        jacs = transform(f, primals, list(range(len(primals))))
        # jacs[i]: packed output shape + primal i's shape. Split the outputs, then group inputs.
        per_primal = [packer.split(j, p.shape) for j, p in zip(jacs, primals)]
        if packer.spec is None:
            out = _result(regroup(per_primal), argnums)
        else:
            leaves_per_primal = [_flatten(t)[0] for t in per_primal]
            per_out = []
            for k in range(len(packer.shapes)):
                per_out.append(_result(regroup([lp[k] for lp in leaves_per_primal]), argnums))
            out = _unflatten(per_out, packer.spec)
        return (out, _detach_aux(box["aux"])) if has_aux else out
    return wrapper


def hessian(func, argnums=0):
    """jacfwd(jacrev(func, argnums), argnums): shape O + I + I."""
    return jacfwd(jacrev(func, argnums), argnums)


# ---- forward mode ------------------------------------------------------------------------------
def jvp(func, primals, tangents, has_aux=False):
    """(func(*primals), J @ tangents[, aux]): primals and tangents are tuples (pytrees) of the same
    structure, tangents shaped like primals."""
    if not isinstance(primals, (tuple, list)) or not isinstance(tangents, (tuple, list)):
        raise TypeError("jvp: primals and tangents must be tuples")
    flat, spec = _flatten(list(primals))
    flat_t, spec_t = _flatten(list(tangents))
    _check_tensors(flat, "jvp")
    _check_tensors(flat_t, "jvp")
    if spec != spec_t:
        raise ValueError("jvp: tangents must have the same structure as primals")
    packer = _Packer()
    box = {}

    def f(xs):
        out, aux = _split_out(func(*_unflatten(xs, spec)), has_aux, "jvp")
        box["aux"] = aux
        return packer.pack(out, "jvp")
    out, t = _C._func_jvp(f, flat, flat_t)
    result = (packer.split(out), packer.split(t))
    return result + (_detach_aux(box["aux"]),) if has_aux else result


# ---- vmap --------------------------------------------------------------------------------------
def _leaf_dims(dims, arg, what):
    """in_dims for each leaf of `arg`: one int/None for all, or a pytree matching arg."""
    leaves, spec = _flatten(arg)
    if dims is None or isinstance(dims, builtins.int):
        dleaves = [dims] * len(leaves)
    else:
        dleaves, dspec = _flatten(dims)
        if dspec != spec:
            raise ValueError(f"{what}: in_dims {dims!r} does not match the structure of its argument")
    for d, x in zip(dleaves, leaves):
        if d is not None and not isinstance(x, Tensor):
            raise ValueError(f"{what}: in_dim {d} given for a non-tensor input of type "
                             f"{type(x).__name__}; use None")
    return dleaves


def _move_dim(t, src, dst):
    dst = dst % t.ndim if t.ndim else 0
    if src == dst:
        return t
    order = [d for d in range(t.ndim) if d != src]
    order.insert(dst, src)
    return t.permute(order)


def vmap(func, in_dims=0, out_dims=0, randomness="error", *, chunk_size=None):
    """func over a batch dimension: input leaves are split along in_dims (int, None, or a tuple
    with one entry per argument, nested like it), outputs stacked along out_dims. Runs func once
    on batched tensors (kiln/autograd/functional.h, Note [vmap]). chunk_size runs that many
    examples at a time. randomness is accepted for torch compatibility; random ops draw different
    values per example (torch's 'different')."""
    if randomness not in ("error", "different", "same"):
        raise ValueError(f"vmap: randomness must be 'error', 'different' or 'same', got {randomness!r}")

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        if isinstance(in_dims, (tuple, list)):
            if len(in_dims) != len(args):
                raise ValueError(f"vmap: in_dims has {len(in_dims)} entries but the function was "
                                 f"called with {len(args)} positional arguments")
            per_arg = in_dims
        elif in_dims is None or isinstance(in_dims, builtins.int):
            per_arg = [in_dims] * len(args)
        else:
            raise ValueError(f"vmap: in_dims must be an int, None or a tuple, got {in_dims!r}")
        flat, spec = _flatten(list(args))
        dims = []
        for d, a in zip(per_arg, args):
            dims += _leaf_dims(d, a, "vmap")
        tensor_pos = [k for k, x in enumerate(flat) if isinstance(x, Tensor)]
        if not any(dims[k] is not None for k in tensor_pos):
            raise ValueError("vmap: at least one input must be batched (an in_dim that is not None "
                             "for a tensor)")
        box = {}

        def f(xs):
            full = list(flat)
            for k, x in zip(tensor_pos, xs):
                full[k] = x
            leaves, ospec = _flatten(func(*_unflatten(full, spec), **kwargs))
            _check_tensors(leaves, "vmap")
            box["spec"] = ospec
            return leaves
        outs = _C._func_vmap(f, [flat[k] for k in tensor_pos], [dims[k] for k in tensor_pos],
                             chunk_size)
        odims = [out_dims] * len(outs) if isinstance(out_dims, builtins.int) else _flatten(out_dims)[0]
        if len(odims) != len(outs):
            raise ValueError(f"vmap: out_dims has {len(odims)} entries for {len(outs)} outputs")
        return _unflatten([_move_dim(t, 0, d) for t, d in zip(outs, odims)], box["spec"])
    return wrapper
