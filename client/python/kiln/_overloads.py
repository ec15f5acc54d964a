"""PyTorch's Python-level overloads of ops of the table, whose extra arguments the table does not
carry: nonzero(as_tuple=True), one-argument where(cond), split with a list of sizes, var/std with
unbiased=, norm with p='fro', and the fix alias of trunc. They map onto the generated ops, as
torch/functional.py and torch/_tensor.py do; each is kiln.<name> and the Tensor method.

    rows, cols = kiln.where(mask)            # nonzero(mask, as_tuple=True)
    a, b = x.split([2, 3], dim=1)
    x.var(0, unbiased=False); x.norm(p="fro")
"""
from kiln import _C
from kiln._C import Tensor

__all__ = ["nonzero", "where", "split", "var", "std", "norm", "fix", "fix_"]


def nonzero(input, *, as_tuple=False):
    """The indices of the non-zero elements: an (n, ndim) tensor, or with as_tuple one (n,) tensor
    per dim (a 0-d input counts as 1-d, as in NumPy and PyTorch)."""
    if not as_tuple:
        return _C.nonzero(input)
    if input.ndim == 0:
        input = input.unsqueeze(0)
    return _C.nonzero(input).unbind(1)


def where(condition, input=None, other=None):
    """where(condition, input, other): input where condition holds, else other (broadcast).
    where(condition): nonzero(condition, as_tuple=True)."""
    if input is None and other is None:
        return nonzero(condition, as_tuple=True)
    if input is None or other is None:
        raise TypeError("where() takes the condition alone, or the condition, input and other")
    return _C.where(condition, input, other)


def split(tensor, split_size_or_sections, dim=0):
    """Pieces of split_size along dim (the last one smaller), or of the sizes in a list."""
    if isinstance(split_size_or_sections, (list, tuple)):
        return tuple(_C.split_with_sizes(tensor, list(split_size_or_sections), dim))
    return tuple(_C.split(tensor, split_size_or_sections, dim))


def _correction(name, dim, unbiased, correction):
    """(dim, correction) from PyTorch's var/std arguments: var(x, unbiased),
    var(x, dim, unbiased, keepdim) and var(x, dim, *, correction, keepdim)."""
    if isinstance(dim, bool):  # var(x, False): the old (input, unbiased) overload
        if unbiased is not None:
            raise TypeError(f"{name}(): got unbiased twice")
        dim, unbiased = None, dim
    if unbiased is not None and correction is not None:
        raise TypeError(f"{name}(): give unbiased or correction, not both")
    if correction is None:
        correction = 0 if unbiased is False else 1
    return dim, correction


def var(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    dim, correction = _correction("var", dim, unbiased, correction)
    return _C.var(input, dim, correction=correction, keepdim=keepdim)


def std(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    dim, correction = _correction("std", dim, unbiased, correction)
    return _C.std(input, dim, correction=correction, keepdim=keepdim)


def norm(input, p="fro", dim=None, keepdim=False, dtype=None):
    """The p-norm over dim (all dims when None); p='fro' is the 2-norm over at most two dims."""
    if dtype is not None:
        input = input.to(dtype)
    if isinstance(p, str):
        if p == "nuc":
            raise NotImplementedError("norm: p='nuc' (the nuclear norm) is not implemented in Kiln")
        if p != "fro":
            raise ValueError(f"norm: p must be a number, 'fro' or 'nuc', got {p!r}")
        if isinstance(dim, (list, tuple)) and len(dim) > 2:
            raise ValueError(f"norm: p='fro' takes at most 2 dims, got dim={tuple(dim)}")
        p = 2
    return _C.norm(input, p, dim, keepdim)


fix = _C.trunc
fix_ = _C.trunc_

Tensor.nonzero = lambda self, *, as_tuple=False: nonzero(self, as_tuple=as_tuple)
Tensor.split = split
Tensor.var = var
Tensor.std = std
Tensor.norm = norm
Tensor.fix = Tensor.trunc
Tensor.fix_ = Tensor.trunc_
