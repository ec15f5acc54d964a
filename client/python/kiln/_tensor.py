"""Python-level methods of kiln.Tensor: operators, indexing, conversions and NumPy interop.
The ops themselves are generated from the op table (kiln._C); this file only maps Python's
protocols onto them, as torch/_tensor.py does."""
import builtins

from kiln import _C
from kiln._C import Tensor

_NUMPY_TYPESTR = {
    "bool": "|b1", "uint8": "|u1", "int8": "|i1", "int16": "<i2", "int32": "<i4",
    "int64": "<i8", "float16": "<f2", "float32": "<f4", "float64": "<f8",
}


def _dtype_name(t):
    return repr(t.dtype).split(".")[-1]


# ---- operators -------------------------------------------------------------------------------
def _reflected(op):
    return lambda self, other: op(other, self)


def _compare(op):
    def f(self, other):
        try:
            return op(self, other)
        except TypeError:
            return NotImplemented
    return f


def _bool_only(name, op):
    def f(self, other):
        if self.dtype is not _C.bool:
            raise TypeError(f"operator {name} is only supported for bool tensors in Kiln (got {self.dtype})")
        return op(self, other)
    return f


def _invert(self):
    if self.dtype is not _C.bool:
        raise TypeError(f"operator ~ is only supported for bool tensors in Kiln (got {self.dtype})")
    return _C.logical_not(self)


# + - * / and their reflected and in-place forms are the type's C++ number slots (module.cpp,
# Note [Python dispatch speed]).
Tensor.__floordiv__ = lambda self, other: _C.div(self, other, rounding_mode="floor")
Tensor.__rfloordiv__ = lambda self, other: _C.div(other, self, rounding_mode="floor")
Tensor.__mod__ = Tensor.remainder
Tensor.__rmod__ = _reflected(_C.remainder)
Tensor.__pow__ = Tensor.pow
Tensor.__rpow__ = _reflected(_C.pow)
Tensor.__ipow__ = Tensor.pow_
Tensor.__matmul__ = Tensor.matmul
Tensor.__rmatmul__ = _reflected(_C.matmul)
Tensor.__neg__ = Tensor.neg
Tensor.__pos__ = lambda self: self
Tensor.__abs__ = Tensor.abs
Tensor.__invert__ = _invert
Tensor.__and__ = _bool_only("&", _C.logical_and)
Tensor.__or__ = _bool_only("|", _C.logical_or)
Tensor.__xor__ = _bool_only("^", _C.logical_xor)
Tensor.__rand__ = Tensor.__and__
Tensor.__ror__ = Tensor.__or__
Tensor.__rxor__ = Tensor.__xor__
Tensor.__eq__ = _compare(_C.eq)
Tensor.__ne__ = _compare(_C.ne)
Tensor.__lt__ = _compare(_C.lt)
Tensor.__le__ = _compare(_C.le)
Tensor.__gt__ = _compare(_C.gt)
Tensor.__ge__ = _compare(_C.ge)
Tensor.__hash__ = object.__hash__


# ---- Python number and sequence protocols ------------------------------------------------------
def _one_value(self, what):
    if self.numel() != 1:
        raise RuntimeError(f"{what} of a Tensor with {self.numel()} elements is ambiguous")
    return self.item()


def _index(self):
    if self.dtype.is_floating_point or self.numel() != 1:
        raise TypeError("only integer tensors of a single element can be converted to an index")
    return self.item()


def _len(self):
    if self.ndim == 0:
        raise TypeError("len() of a 0-d tensor")
    return self.shape[0]


def _iter(self):
    if self.ndim == 0:
        raise TypeError("iteration over a 0-d tensor")
    return (self.select(0, i) for i in range(self.shape[0]))


def _format(self, spec):
    if self.ndim == 0:
        return self.item().__format__(spec)
    return object.__format__(repr(self), spec)


Tensor.__bool__ = lambda self: builtins.bool(_one_value(self, "Boolean value"))
Tensor.__float__ = lambda self: builtins.float(_one_value(self, "float()"))
Tensor.__int__ = lambda self: builtins.int(_one_value(self, "int()"))
Tensor.__index__ = _index
Tensor.__len__ = _len
Tensor.__iter__ = _iter
Tensor.__format__ = _format
Tensor.__reduce_ex__ = lambda self, proto: (_ for _ in ()).throw(
    TypeError("kiln tensors are not picklable; use kiln.save (safetensors)"))


# ---- indexing ---------------------------------------------------------------------------------
# Note [Python indexing]: basic items (ints, slices, None, Ellipsis) become views (select, slice,
# unsqueeze); integer and bool tensors (or lists) are advanced indices, applied with the `index` op
# over the leading dims after a permute. As in NumPy, adjacent advanced indices put their broadcast
# dims where the first of them was; separated ones put them first.
def _as_index(k):
    if isinstance(k, Tensor):
        return k
    from kiln._creation import tensor
    return tensor(k)


def _basic(self, key):
    if not isinstance(key, tuple):
        key = (key,)
    key = tuple(_as_index(k) if isinstance(k, list) or type(k).__module__ == "numpy" and hasattr(k, "ndim") and k.ndim > 0
                else k for k in key)
    consumed = 0
    for k in key:
        if isinstance(k, Tensor):
            consumed += k.ndim if k.dtype is _C.bool else 1
        elif k is not None and k is not Ellipsis:
            consumed += 1
    if consumed > self.ndim:
        raise IndexError(f"too many indices for tensor of dimension {self.ndim}")
    if builtins.sum(1 for k in key if k is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    v, dim, adv = self, 0, []
    for k in key:
        if k is None:
            v = v.unsqueeze(dim)
            dim += 1
        elif k is Ellipsis:
            dim += self.ndim - consumed
        elif isinstance(k, builtins.bool):
            raise IndexError("indexing with a Python bool is not supported")
        elif isinstance(k, builtins.int) or type(k).__module__ == "numpy" and hasattr(k, "__index__"):
            v = v.select(dim, k.__index__())
        elif isinstance(k, builtins.slice):
            step = 1 if k.step is None else k.step
            if step <= 0:
                raise ValueError("step must be greater than zero")
            if k.start is not None or k.stop is not None or step != 1:
                v = v.slice(dim, k.start, k.stop, step)
            dim += 1
        elif isinstance(k, Tensor):
            if k.dtype is not _C.bool and k.dtype.is_floating_point:
                raise IndexError("tensors used as indices must be long, int or bool tensors")
            adv.append((dim, k))
            dim += k.ndim if k.dtype is _C.bool else 1
        else:
            raise IndexError(f"only integers, slices, None, ..., lists and integer or bool tensors are "
                             f"valid indices (got {type(k).__name__})")
    return v, adv


def _covered(idx):
    return builtins.sum(t.ndim if t.dtype is _C.bool else 1 for t in idx)


def _advanced_layout(v, adv):
    """(permuted view, index tensors, number of broadcast dims, where they go or None)."""
    covered = []
    for d, t in adv:
        covered += range(d, d + (t.ndim if t.dtype is _C.bool else 1))
    rest = [d for d in range(v.ndim) if d not in covered]
    perm = covered + rest
    vp = v.permute(perm) if perm != list(range(v.ndim)) else v
    nb = builtins.max(1 if t.dtype is _C.bool else t.ndim for _, t in adv)
    contiguous = covered == list(range(covered[0], covered[0] + len(covered)))
    pos = covered[0] if contiguous and covered[0] > 0 else None
    return vp, [t for _, t in adv], nb, pos


def _getitem(self, key):
    v, adv = _basic(self, key)
    if not adv:
        return v if v is not self else v.alias()
    vp, idx, _, pos = _advanced_layout(v, adv)
    r = vp.index(idx)
    if pos is not None:  # move the broadcast dims back where the indices were
        nb = r.ndim - (vp.ndim - _covered(idx))
        r = r.permute(list(range(nb, nb + pos)) + list(range(nb)) + list(range(nb + pos, r.ndim)))
    return r


def _setitem(self, key, value):
    v, adv = _basic(self, key)
    if not isinstance(value, Tensor):
        from kiln._creation import tensor
        if adv or not isinstance(value, (builtins.int, builtins.float, builtins.bool)):
            value = tensor(value, dtype=self.dtype)
    if not adv:
        if isinstance(value, Tensor):
            v.copy_(value)
        else:
            v.fill_(value)
        return
    vp, idx, nb, pos = _advanced_layout(v, adv)
    # Only vp may alias self during the write: an in-place op that gives the base a history is
    # refused while other views of it are alive (See Note [CopySlices]).
    del v
    if value.dtype is not self.dtype:
        value = value.to(self.dtype)
    if pos is not None:  # value is laid out as the getitem result: bring its broadcast dims first
        rank = nb + vp.ndim - _covered(idx)
        while value.ndim < rank:
            value = value.unsqueeze(0)
        value = value.permute(list(range(pos, pos + nb)) + list(range(pos)) + list(range(pos + nb, rank)))
    vp.index_put_(idx, value)


Tensor.__getitem__ = _getitem
Tensor.__setitem__ = _setitem


# ---- conversions -------------------------------------------------------------------------------
_PY_DTYPES = {builtins.float: _C.float64, builtins.int: _C.int64, builtins.bool: _C.bool}


def _parse_to(args, kwargs):
    """(dtype, device, copy) from the arguments of Tensor.to / Module.to: to(device), to(dtype),
    to(device, dtype), to(tensor), with dtype=, device=, copy=, non_blocking= keywords."""
    dtype, device = kwargs.pop("dtype", None), kwargs.pop("device", None)
    copy = kwargs.pop("copy", False)
    kwargs.pop("non_blocking", None)
    if kwargs:
        raise TypeError(f"to() got an unexpected keyword argument '{next(iter(kwargs))}'")
    for a in args:
        if isinstance(a, Tensor):
            dtype, device = a.dtype, a.device
        elif isinstance(a, _C.dtype):
            dtype = a
        elif isinstance(a, type) and a in _PY_DTYPES:  # float, int, bool, as PyTorch takes them
            dtype = _PY_DTYPES[a]
        elif isinstance(a, (str, _C.device)):
            device = a
        else:
            raise TypeError(f"to() received an invalid argument of type {type(a).__name__}")
    return dtype, device, copy


def _to(self, *args, **kwargs):
    return _C.to(self, *_parse_to(args, kwargs))


Tensor.to = _to
Tensor.cpu = lambda self: _C.to(self, None, "cpu")
Tensor.cuda = lambda self, device=None: _C.to(self, None, "cuda" if device is None else device)
for _name, _dt in [("float", "float32"), ("double", "float64"), ("half", "float16"),
                   ("bfloat16", "bfloat16"), ("long", "int64"), ("int", "int32"), ("short", "int16"),
                   ("char", "int8"), ("byte", "uint8"), ("bool", "bool")]:
    setattr(Tensor, _name, (lambda dt: lambda self: _C.to(self, dt))(getattr(_C, _dt)))
Tensor.type_as = lambda self, other: _C.to(self, other.dtype)
Tensor.view_as = lambda self, other: self.view(other.shape)
Tensor.reshape_as = lambda self, other: self.reshape(other.shape)
Tensor.expand_as = lambda self, other: self.expand(other.shape)
Tensor.unbind = lambda self, dim=0: tuple(self.select(dim, i) for i in range(self.shape[dim]))
Tensor.T = property(lambda self: self.permute(list(range(self.ndim))[::-1]))
Tensor.mT = property(lambda self: self.transpose(-2, -1))
Tensor.data = property(lambda self: self.detach())
Tensor.new_zeros = lambda self, *size, dtype=None, device=None: _C.zeros(
    *size, dtype=dtype or self.dtype, device=device or self.device)
Tensor.new_ones = lambda self, *size, dtype=None, device=None: _C.ones(
    *size, dtype=dtype or self.dtype, device=device or self.device)
Tensor.new_empty = lambda self, *size, dtype=None, device=None: _C.empty(
    *size, dtype=dtype or self.dtype, device=device or self.device)
Tensor.new_full = lambda self, size, fill_value, dtype=None, device=None: _C.full(
    size, fill_value, dtype=dtype or self.dtype, device=device or self.device)


def _new_tensor(self, data, dtype=None, device=None, requires_grad=False):
    from kiln._creation import tensor
    return tensor(data, dtype=dtype or self.dtype, device=device or self.device, requires_grad=requires_grad)


Tensor.new_tensor = _new_tensor


# ---- NumPy and DLPack --------------------------------------------------------------------------
def _numpy(self, force=False):
    if force:
        self = self.detach().cpu()
        if self.dtype is _C.bfloat16:
            self = self.float()
    if self.requires_grad:
        raise RuntimeError("Can't call numpy() on Tensor that requires grad. "
                           "Use tensor.detach().numpy() instead.")
    if self.dtype is _C.bfloat16:
        raise TypeError("Got unsupported ScalarType BFloat16: NumPy has no bfloat16 (use .float() first)")
    if self.device.type == "remote":  # a read: fetches the worker's value (kiln.connect)
        self = self.cpu()
    return self._cpp_numpy()


def _tolist(self):
    t = self.detach().cpu()
    if t.dtype is _C.bfloat16:
        t = t.float()
    return t._cpp_numpy().tolist()


def _array(self, dtype=None, copy=None):
    a = self.numpy()
    if dtype is not None and a.dtype != dtype:
        return a.astype(dtype)
    return a.copy() if copy else a


def _array_interface(self):
    if self.requires_grad:
        raise RuntimeError("Can't export a Tensor that requires grad to NumPy; use tensor.detach()")
    name = _dtype_name(self)
    if name not in _NUMPY_TYPESTR or not self.device == "cpu":
        raise TypeError(f"__array_interface__: unsupported tensor ({self.dtype} on {self.device})")
    size = self.element_size()
    return {"shape": self.shape, "typestr": _NUMPY_TYPESTR[name], "version": 3,
            "data": (self.data_ptr() if self.numel() else 0, False),
            "strides": tuple(s * size for s in self.stride())}


Tensor.numpy = _numpy
Tensor.tolist = _tolist
Tensor.__array__ = _array
Tensor.__array_interface__ = property(_array_interface)
