"""Creation functions with PyTorch's Python conveniences over the generated ops: a
requires_grad keyword, arange(end), randint(high, size), *_like random functions, and
kiln.tensor / as_tensor / from_numpy / from_dlpack."""
import functools

import numpy as _np

from kiln import _C
from kiln._C import Tensor

__all__ = ["zeros", "ones", "empty", "full", "rand", "randn", "empty_strided", "zeros_like",
           "ones_like", "empty_like", "full_like", "linspace", "eye", "randperm", "arange",
           "randint", "rand_like", "randn_like", "randint_like", "tensor", "as_tensor",
           "from_numpy", "from_dlpack", "is_tensor", "numel", "get_default_dtype"]


def _requires_grad_kwarg(fn):
    @functools.wraps(fn)
    def f(*args, requires_grad=False, **kwargs):
        t = fn(*args, **kwargs)
        return t.requires_grad_() if requires_grad else t
    return f


for _name in ["zeros", "ones", "empty", "full", "rand", "randn", "empty_strided", "zeros_like",
              "ones_like", "empty_like", "full_like", "linspace", "eye", "randperm"]:
    globals()[_name] = _requires_grad_kwarg(getattr(_C, _name))


def arange(start, end=None, step=1, *, dtype=None, device=None, requires_grad=False):
    if end is None:
        start, end = 0, start
    t = _C.arange(start, end, step, dtype=dtype, device=device)
    return t.requires_grad_() if requires_grad else t


def randint(low, high=None, size=None, *, generator=None, dtype=None, device=None, requires_grad=False):
    if size is None:  # randint(high, size)
        low, high, size = 0, low, high
    return _C.randint(low, high, size, generator=generator, dtype=dtype, device=device)


def rand_like(input, *, dtype=None, device=None, requires_grad=False):
    t = _C.rand(input.shape, dtype=dtype or input.dtype, device=device or input.device)
    return t.requires_grad_() if requires_grad else t


def randn_like(input, *, dtype=None, device=None, requires_grad=False):
    t = _C.randn(input.shape, dtype=dtype or input.dtype, device=device or input.device)
    return t.requires_grad_() if requires_grad else t


def randint_like(input, low, high=None, *, dtype=None, device=None):
    if high is None:
        low, high = 0, low
    return _C.randint(low, high, input.shape, dtype=dtype or input.dtype, device=device or input.device)


def get_default_dtype():
    return _C.float32


def tensor(data, *, dtype=None, device=None, requires_grad=False):
    """A new tensor holding a copy of `data` (a Tensor, a NumPy array or scalar, or nested lists
    of numbers). Python floats become float32, ints int64 and bools bool, as in PyTorch; NumPy
    data keeps its dtype. With dtype, Python floats convert to it directly (float64 keeps them
    exact)."""
    if isinstance(data, Tensor):
        t = data.detach().clone()
    else:
        arr = _np.asarray(data)
        if arr.dtype == object:
            raise TypeError(f"kiln.tensor: cannot build a tensor from {type(data).__name__} data "
                            "(expected numbers, nested lists of numbers, or an array)")
        if dtype is None and not isinstance(data, (_np.ndarray, _np.generic)) \
                and arr.dtype == _np.float64:
            arr = arr.astype(_np.float32)
        t = _C.from_numpy(_np.array(arr, order="C", copy=True)).clone()
        if device is None and _C.get_default_device().type != "cpu":
            device = _C.get_default_device()  # as torch.set_default_device applies to tensor()
    if dtype is not None or device is not None:
        t = _C.to(t, dtype, device)
    return t.requires_grad_() if requires_grad else t


def as_tensor(data, dtype=None, device=None):
    """`data` as a tensor, sharing memory where it can (a Tensor, or a NumPy array of the right
    dtype on the CPU), else a copy."""
    if isinstance(data, Tensor):
        return _C.to(data, dtype, device)
    if isinstance(data, _np.ndarray) and data.dtype != _np.uint16:
        return _C.to(from_numpy(data), dtype, device)
    return tensor(data, dtype=dtype, device=device)


def from_numpy(ndarray):
    """A tensor sharing `ndarray`'s memory (writes through either are seen by both)."""
    if not isinstance(ndarray, _np.ndarray):
        raise TypeError(f"expected np.ndarray (got {type(ndarray).__name__})")
    return _C.from_numpy(ndarray)


def from_dlpack(ext_tensor):
    """A tensor sharing the memory of an object that implements __dlpack__ (NumPy, PyTorch, ...)."""
    return _C.from_dlpack(ext_tensor)


def is_tensor(obj):
    return isinstance(obj, Tensor)


def numel(input):
    return input.numel()
