"""kiln.compile: capture a function (a whole training step, say) once and replay it.

    step = kiln.compile(train_step)          # or @kiln.compile
    for x, y in loader:
        loss = step(x, y)                    # call 1 captures, later calls replay
    print(step.explain())                    # [("capture", "..."), ("recompile", "argument 0 sizes ...")]

The C++ side (kiln/compiler/compile.h, Note [Capture] and Note [Guards]) guards the tensors.
Here the arguments are flattened (tuples, lists, dicts); their non-tensor leaves, and for a
module its parameters' and buffers' identities, pick one C++ compiled function each, so a
Python value the function branches on is guarded too.
"""
from kiln import _C
from kiln._C import Tensor
from kiln.func import _flatten, _unflatten

__all__ = ["compile"]

_MODES = ("default", "reduce-overhead")


def _const_key(x):
    try:
        hash(x)
        return (type(x), x)
    except TypeError:
        return (type(x), id(x))


class CompiledFunction:
    """What kiln.compile returns: call it as the original function."""

    def __init__(self, fn, recompile_limit, module=None):
        self._fn = fn
        self._module = module
        self._limit = recompile_limit
        # key -> (C++ compiled function, box with the output spec, the flat function it calls,
        # which only this holds: C++ keeps a weak reference)
        self._entries = {}

    def _entry(self, leaves, spec):
        consts = tuple(_const_key(x) for x in leaves if not isinstance(x, Tensor))
        key = (repr(spec), consts)
        if self._module is not None:
            key += (tuple(id(t) for t in self._module.parameters()),
                    tuple(id(t) for t in self._module.buffers()))
        entry = self._entries.get(key)
        if entry is None:
            template, fn, box = list(leaves), self._fn, {}

            def flat(tensors):
                it = iter(tensors)
                full = [next(it) if isinstance(x, Tensor) else x for x in template]
                args, kwargs = _unflatten(full, spec)
                out_leaves, box["spec"] = _flatten(fn(*args, **kwargs))
                box["leaves"] = [None if isinstance(x, Tensor) else x for x in out_leaves]
                return [x for x in out_leaves if isinstance(x, Tensor)]

            entry = (_C._compile(flat, self._limit), box, flat)
            self._entries[key] = entry
        return entry

    def __call__(self, *args, **kwargs):
        leaves, spec = _flatten((args, kwargs))
        compiled, box, _ = self._entry(leaves, spec)
        tensors = iter(compiled([x for x in leaves if isinstance(x, Tensor)]))
        out = [next(tensors) if x is None else x for x in box["leaves"]]
        return _unflatten(out, box["spec"])

    def explain(self):
        """Every capture, recompile (with the guard that failed), graph break, fallback and
        compiled segment, as (kind, reason) pairs."""
        return [e for compiled, *_ in self._entries.values() for e in compiled.explain()]

    @property
    def num_recompiles(self):
        # A new Python-level key (a different constant argument) is a recompile as well.
        n = sum(c.num_recompiles for c, *_ in self._entries.values())
        return n + max(0, sum(1 for c, *_ in self._entries.values() if c.num_programs) - 1)

    @property
    def num_programs(self):
        return sum(c.num_programs for c, *_ in self._entries.values())

    @property
    def num_replays(self):
        return sum(c.num_replays for c, *_ in self._entries.values())

    @property
    def num_segment_runs(self):
        """Runs of compiled segments in calls that a graph break splits."""
        return sum(c.num_segment_runs for c, *_ in self._entries.values())

    def graphs(self):
        """The printed graph of every program."""
        return [c.graph_str(i) for c, *_ in self._entries.values() for i in range(c.num_programs)]

    def saved_activation_bytes(self):
        """(eager, compiled) bytes of the activations each program keeps from its forward for its
        backward: eager autograd's, and after recomputing cheap pointwise ones."""
        return [c.saved_activation_bytes(i) for c, *_ in self._entries.values()
                for i in range(c.num_programs)]

    def reset(self):
        """Forgets every program (after replacing a parameter object, say)."""
        self._entries.clear()

    def __getattr__(self, name):  # a compiled module still looks like the module
        module = self.__dict__.get("_module")
        if module is None:
            raise AttributeError(name)
        return getattr(module, name)


def compile(fn=None, *, mode="default", recompile_limit=8):
    """Compiles `fn`, a function of tensors (and other values) or an nn.Module.

    mode: "default" or "reduce-overhead". On the CPU both replay the captured program with no
    per-op dispatch; they differ only where CUDA graphs exist, which Kiln does not use yet.
    recompile_limit: programs kept per argument structure; past it, calls run eagerly.
    """
    if mode not in _MODES:
        raise ValueError(f"kiln.compile: mode must be one of {_MODES}, got {mode!r}")
    if not isinstance(recompile_limit, int) or recompile_limit < 1:
        raise ValueError(f"kiln.compile: recompile_limit must be an int >= 1, got {recompile_limit!r}")
    if fn is None:
        return lambda f: compile(f, mode=mode, recompile_limit=recompile_limit)
    from kiln import nn
    if isinstance(fn, nn.Module):
        return CompiledFunction(fn, recompile_limit, module=fn)
    if not callable(fn):
        raise TypeError(f"kiln.compile: expected a function or an nn.Module, got {type(fn).__name__}")
    return CompiledFunction(fn, recompile_limit)
