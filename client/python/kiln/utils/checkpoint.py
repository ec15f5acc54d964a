"""kiln.utils.checkpoint: activation checkpointing over the C++ one (kiln/autograd/checkpoint.h,
Note [Checkpointing]): the forward keeps no intermediates, backward runs fn again with the default
generator's state replayed, so dropout masks match and the gradients equal the plain call's.

    from kiln.utils.checkpoint import checkpoint
    h = checkpoint(block, x, use_reentrant=False)   # block(x), recomputed during backward
    h.sum().backward()
"""
from kiln import _C
from kiln._C import Tensor

__all__ = ["checkpoint"]


def checkpoint(function, *args, use_reentrant=None, preserve_rng_state=True, **kwargs):
    """function(*args, **kwargs) without keeping its intermediates for backward. The tensor
    arguments are the checkpoint's inputs; other arguments are passed through. function must
    return a Tensor or a tuple/list of Tensors. Both use_reentrant values run Kiln's one
    checkpoint; like PyTorch's reentrant flavour, tensors function captures (parameters) get
    their .grad accumulated during backward, so it does not compose with autograd.grad."""
    del use_reentrant  # accepted for torch compatibility; one implementation serves both
    positions = [k for k, a in enumerate(args) if isinstance(a, Tensor)]
    box = {}

    def run(xs):
        full = list(args)
        for k, x in zip(positions, xs):
            full[k] = x
        out = function(*full, **kwargs)
        single = isinstance(out, Tensor)
        outs = [out] if single else out
        if not isinstance(outs, (tuple, list)) or not all(isinstance(o, Tensor) for o in outs):
            raise TypeError("checkpoint: the function must return a Tensor or a tuple of Tensors, "
                            f"got {type(out).__name__}")
        box["kind"] = None if single else type(out)
        return list(outs)
    outs = _C._checkpoint(run, [args[k] for k in positions], preserve_rng_state)
    return outs[0] if box["kind"] is None else box["kind"](outs)
