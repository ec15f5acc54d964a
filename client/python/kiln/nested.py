"""kiln.nested: nested tensors in the jagged layout (torch.nested with layout=torch.jagged): a
batch of B variable-length sequences stored without padding, as one packed `values()` tensor
(sum of lengths, ...) and int64 `offsets()` (B + 1); sequence b is values()[offsets[b]:offsets[b+1]].

    import kiln, kiln.nn.functional as F
    nt = kiln.nested.nested_tensor([kiln.randn(3, 8), kiln.randn(5, 8)], layout=kiln.jagged)
    nt.size()                                     # (2, None, 8): dim 1 is ragged
    y = F.gelu(F.linear(nt, w, b)) + 1            # packed-values ops, autograd into the values
    y.to_padded_tensor(0.0)                       # (2, 5, out)

Note [Nested tensors]: a NestedTensor is a Python object holding (values, offsets, ragged dim),
not a kiln.Tensor: every op it supports is written here over its values, so an op it does not
support raises instead of silently computing on the packed values. Its logical shape is
(B, *values.shape[1:]) with None inserted at the ragged dim, which is 1, or 2 after
transpose(1, 2) (the (B, H, j, D) form scaled_dot_product_attention takes; the values stay
(T, H, D)). Ops that act on the dims after the ragged one (elementwise, linear, layer_norm,
softmax, cross_entropy, embedding) run once on the values; attention runs the fused kernel
that takes the offsets (_jagged_attention, Note [Jagged attention] in
kernels/cpu/attention.cpp). kiln.nn.functional and the layers route a NestedTensor input here
(See Note [Nested dispatch] in kiln/nn/functional.py). Two nested operands must have equal
offsets; derived tensors share their offsets object, so the check is usually an identity test.
"""
from kiln import _C, _creation
from kiln._C import Tensor

__all__ = ["NestedTensor", "nested_tensor", "as_nested_tensor", "nested_tensor_from_jagged",
           "jagged"]


class _Layout:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"kiln.{self.name}"


jagged = _Layout("jagged")


def _check_offsets(offsets, total):
    """The offsets as a list, after checking they are an int64 (B + 1) tensor starting at 0,
    non-decreasing and ending at `total`."""
    if not isinstance(offsets, Tensor):
        raise TypeError(f"nested: offsets must be a kiln.Tensor, got {type(offsets).__name__}")
    if offsets.dtype is not _C.int64:
        raise TypeError(f"nested: offsets must be int64, got {offsets.dtype}")
    if offsets.ndim != 1 or offsets.shape[0] < 1:
        raise ValueError(f"nested: offsets must have shape (B + 1), got {tuple(offsets.shape)}")
    off = offsets.tolist()
    if off[0] != 0:
        raise ValueError(f"nested: offsets must start at 0, got offsets[0] = {off[0]}")
    for b in range(1, len(off)):
        if off[b] < off[b - 1]:
            raise ValueError(f"nested: offsets must not decrease, got offsets[{b - 1}] = "
                             f"{off[b - 1]} > offsets[{b}] = {off[b]}")
    if off[-1] != total:
        raise ValueError(f"nested: offsets must end at the values' length {total}, got "
                         f"offsets[{len(off) - 1}] = {off[-1]}")
    return off


class NestedTensor:
    """A jagged batch: values() (T, ...) and offsets() (B + 1). See Note [Nested tensors]."""
    __slots__ = ("_values", "_offsets", "_off", "_ragged_idx")
    is_nested = True
    layout = jagged

    def __init__(self, values, offsets, _off=None, _ragged_idx=1):
        if values.ndim < 1:
            raise ValueError("nested: values must have at least 1 dim (the packed length)")
        self._values, self._offsets, self._ragged_idx = values, offsets, _ragged_idx
        self._off = _off if _off is not None else _check_offsets(offsets, values.shape[0])

    def _like(self, values, ragged_idx=None):
        return NestedTensor(values, self._offsets, self._off,
                            self._ragged_idx if ragged_idx is None else ragged_idx)

    # ---- components -----------------------------------------------------------------------
    def values(self):
        return self._values

    def offsets(self):
        return self._offsets

    def lengths(self):
        n = len(self._off) - 1
        return self._offsets.narrow(0, 1, n) - self._offsets.narrow(0, 0, n)

    def size(self, dim=None):
        shape = [len(self._off) - 1] + list(self._values.shape[1:])
        shape.insert(self._ragged_idx, None)
        return tuple(shape) if dim is None else tuple(shape)[dim]

    shape = property(size)

    def dim(self):
        return self._values.ndim + 1

    ndim = property(dim)
    dtype = property(lambda self: self._values.dtype)
    device = property(lambda self: self._values.device)
    is_leaf = property(lambda self: self._values.is_leaf)

    @property
    def requires_grad(self):
        return self._values.requires_grad

    @requires_grad.setter
    def requires_grad(self, flag):
        self._values.requires_grad_(flag)

    def requires_grad_(self, flag=True):
        self._values.requires_grad_(flag)
        return self

    @property
    def grad(self):
        g = self._values.grad
        return None if g is None else self._like(g)

    def detach(self):
        return self._like(self._values.detach())

    def clone(self):
        return self._like(self._values.clone())

    def contiguous(self):
        return self

    def is_contiguous(self):
        return True

    def to(self, *args, **kwargs):
        return self._like(self._values.to(*args, **kwargs))

    def __repr__(self):
        return (f"NestedTensor(size={self.size()}, offsets={self._off}, dtype={self.dtype}"
                f"{', requires_grad=True' if self.requires_grad else ''})")

    def __len__(self):
        return len(self._off) - 1

    def unbind(self, dim=0):
        if dim != 0:
            raise NotImplementedError("nested: unbind is supported over dim 0 only")
        out = []
        for b in range(len(self._off) - 1):
            s = self._values.narrow(0, self._off[b], self._off[b + 1] - self._off[b])
            out.append(s.movedim(0, self._ragged_idx - 1) if self._ragged_idx != 1 else s)
        return tuple(out)

    def to_padded_tensor(self, padding, output_size=None):
        """(B, max length, ...) with `padding` past each sequence's end; differentiable in the
        values (one index_select from the values and a padding row)."""
        self._need_ragged_1("to_padded_tensor")
        lens = [self._off[b + 1] - self._off[b] for b in range(len(self._off) - 1)]
        L = max(lens, default=0) if output_size is None else output_size[1]
        if L < max(lens, default=0):
            raise ValueError(f"to_padded_tensor: output_size {tuple(output_size)} is shorter "
                             f"than the longest sequence ({max(lens)})")
        T, rest = self._values.shape[0], list(self._values.shape[1:])
        idx = [self._off[b] + i if i < n else T for b, n in enumerate(lens) for i in range(L)]
        pad = _C.full([1] + rest, padding, dtype=self.dtype, device=self.device)
        src = _C.cat([self._values, pad], 0)
        index = _creation.tensor(idx, dtype=_C.int64) if idx else _C.zeros([0], dtype=_C.int64)
        return src.index_select(0, index.to(self.device)).reshape([len(lens), L] + rest)

    def _need_ragged_1(self, op):
        if self._ragged_idx != 1:
            raise NotImplementedError(f"nested: {op} needs the ragged dim at 1; transpose back "
                                      f"first (the ragged dim is {self._ragged_idx})")

    # ---- dims after the ragged one ----------------------------------------------------------
    def _inner(self):
        """How many logical dims follow the ragged one."""
        return self.ndim - 1 - self._ragged_idx

    def _values_dim(self, dim, op):
        """The values' dim of logical dim `dim`, which must follow the ragged dim."""
        d = dim + self.ndim if dim < 0 else dim
        if d <= self._ragged_idx or d >= self.ndim:
            raise ValueError(f"nested: {op} over dim {dim} of a nested tensor of size "
                             f"{self.size()}: only the dims after the ragged dim "
                             f"{self._ragged_idx} are supported")
        return d - 1

    def transpose(self, dim0, dim1):
        d0, d1 = sorted(d + self.ndim if d < 0 else d for d in (dim0, dim1))
        if d0 == d1:
            return self
        if (d0, d1) == (1, 2) and self.ndim >= 4:
            return self._like(self._values, 2 if self._ragged_idx == 1 else 1)
        if d0 > self._ragged_idx:
            return self._like(self._values.transpose(d0 - 1, d1 - 1))
        raise NotImplementedError(f"nested: transpose({dim0}, {dim1}) of size {self.size()}: "
                                  "only (1, 2) and dims after the ragged one are supported")

    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (list, tuple)):
            shape = tuple(shape[0])
        self._need_ragged_1("reshape")
        B = len(self._off) - 1
        if len(shape) < 2 or shape[0] not in (B, -1) or shape[1] not in (None, -1):
            raise ValueError(f"nested: cannot reshape size {self.size()} to {shape}: keep the "
                             "batch dim and the ragged dim 1 (None or -1) and reshape the rest")
        return self._like(self._values.reshape([self._values.shape[0]] + list(shape[2:])))

    view = reshape

    def split(self, split_size, dim=0):
        vd = self._values_dim(dim, "split")
        return tuple(self._like(v) for v in self._values.split(split_size, vd))

    def chunk(self, chunks, dim=0):
        vd = self._values_dim(dim, "chunk")
        return tuple(self._like(v) for v in self._values.chunk(chunks, vd))

    def softmax(self, dim, dtype=None):
        return self._like(_C.softmax(self._values, self._values_dim(dim, "softmax"), dtype))

    def log_softmax(self, dim, dtype=None):
        return self._like(_C.log_softmax(self._values, self._values_dim(dim, "log_softmax"), dtype))

    # ---- elementwise -------------------------------------------------------------------------
    def _operand(self, other, op):
        """other's values for an elementwise op with self: a nested tensor of equal offsets, a
        number, or a dense tensor broadcast over the dims after the ragged one."""
        if isinstance(other, NestedTensor):
            if other._offsets is not self._offsets and other._off != self._off:
                raise ValueError(f"nested: {op} of nested tensors with different offsets "
                                 f"{self._off} and {other._off}")
            if other._ragged_idx != self._ragged_idx:
                raise ValueError(f"nested: {op} of nested tensors of sizes {self.size()} and "
                                 f"{other.size()}")
            return other._values
        if isinstance(other, Tensor) and other.ndim > self._inner():
            raise ValueError(f"nested: {op} of a nested tensor of size {self.size()} and a dense "
                             f"tensor of shape {tuple(other.shape)}: a dense operand broadcasts "
                             f"over the {self._inner()} dim(s) after the ragged dim only")
        return other

    def apply_values(self, fn, *args, **kwargs):
        """fn(values, *args, **kwargs) as a nested tensor of the same offsets: for an op that
        acts on the dims after the ragged one."""
        return self._like(fn(self._values, *args, **kwargs))

    def _binary(name):  # noqa: N805 (a class-body factory)
        op = getattr(Tensor, name)
        return lambda self, other: self._like(op(self._values, self._operand(other, name)))

    __add__ = __radd__ = _binary("__add__")
    __mul__ = __rmul__ = _binary("__mul__")
    __sub__ = _binary("__sub__")
    __truediv__ = _binary("__truediv__")
    __pow__ = _binary("__pow__")

    def __rsub__(self, other):
        return self._like(self._operand(other, "__rsub__") - self._values)

    def __rtruediv__(self, other):
        return self._like(self._operand(other, "__rtruediv__") / self._values)

    def __neg__(self):
        return self._like(-self._values)

    add = __add__
    sub = __sub__
    mul = __mul__
    div = __truediv__
    pow = __pow__

    def _unary(name):  # noqa: N805
        op = getattr(_C, name)
        return lambda self, *args, **kwargs: self._like(op(self._values, *args, **kwargs))

    for _name in ["relu", "gelu", "silu", "tanh", "sigmoid", "exp", "log", "sqrt", "rsqrt",
                  "abs", "sin", "cos", "neg", "reciprocal", "sign", "erf"]:
        locals()[_name] = _unary(_name)
    del _name, _binary, _unary


# ---- construction ------------------------------------------------------------------------------
def _components(tensors, dtype, device):
    ts = [t if isinstance(t, Tensor) else _creation.tensor(t) for t in tensors]
    if not ts:
        raise ValueError("nested: expected at least one component tensor")
    rest = list(ts[0].shape[1:])
    for i, t in enumerate(ts):
        if t.ndim < 1:
            raise ValueError(f"nested: component {i} is 0-dim; components need a ragged dim 0")
        if list(t.shape[1:]) != rest:
            raise ValueError(f"nested: component {i} has shape {tuple(t.shape)}, but component 0 "
                             f"has {tuple(ts[0].shape)}: only dim 0 may differ (the jagged layout)")
        if t.dtype is not ts[0].dtype:
            raise TypeError(f"nested: component {i} has dtype {t.dtype}, component 0 "
                            f"{ts[0].dtype}")
    if dtype is not None or device is not None:
        ts = [t.to(dtype=dtype or t.dtype, device=device or t.device) for t in ts]
    off = [0]
    for t in ts:
        off.append(off[-1] + t.shape[0])
    return ts, off


def _check_layout(layout):
    if layout is not None and layout is not jagged:
        raise NotImplementedError(f"nested: only layout=kiln.jagged is supported, got {layout!r}")


def nested_tensor(tensor_list, *, dtype=None, layout=None, device=None, requires_grad=False,
                  pin_memory=False):
    """A new leaf nested tensor from a list of tensors (or nested lists) whose dim 0 varies;
    the components are copied (no autograd into them), as in torch.nested.nested_tensor."""
    _check_layout(layout)
    ts, off = _components(tensor_list, dtype, device)
    values = _C.cat([t.detach() for t in ts], 0)
    if requires_grad:
        values.requires_grad_()
    return NestedTensor(values, _creation.tensor(off, dtype=_C.int64), off)


def as_nested_tensor(ts, dtype=None, device=None, layout=None):
    """A nested tensor from a list of tensors, keeping autograd: gradients of its values flow
    back into the components. A nested tensor is returned as is."""
    _check_layout(layout)
    if isinstance(ts, NestedTensor):
        return ts.to(dtype=dtype or ts.dtype, device=device or ts.device)
    ts, off = _components(ts, dtype, device)
    return NestedTensor(_C.cat(ts, 0), _creation.tensor(off, dtype=_C.int64), off)


def nested_tensor_from_jagged(values, offsets):
    """A nested tensor viewing `values` (T, ...) split at `offsets` (int64 (B + 1), from 0 to T,
    non-decreasing); autograd flows into `values`."""
    return NestedTensor(values, offsets)


# ---- ops routed here from kiln.nn.functional (See Note [Nested dispatch]) -------------------
def _need_inner(nt, k, op):
    if k > nt._inner():
        raise ValueError(f"nested: {op} over the last {k} dims of a nested tensor of size "
                         f"{nt.size()}: only the {nt._inner()} dim(s) after the ragged one")


def linear(input, weight, bias=None):
    _need_inner(input, 1, "linear")
    return input._like(_C.linear(input._values, weight, bias))


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    shape = [normalized_shape] if isinstance(normalized_shape, int) else list(normalized_shape)
    _need_inner(input, len(shape), "layer_norm")
    return input._like(_C.layer_norm(input._values, shape, weight, bias, eps))


def embedding(input, weight, *args):
    return input._like(_C.embedding(weight, input._values, *args))


def cross_entropy(input, target, *args):
    """Over the packed tokens: input (B, j, C), target (B, j) nested (or the packed (T,))."""
    input._need_ragged_1("cross_entropy")
    _need_inner(input, 1, "cross_entropy")
    if isinstance(target, NestedTensor):
        if target._off != input._off:
            raise ValueError(f"nested: cross_entropy of input and target with different offsets "
                             f"{input._off} and {target._off}")
        target = target._values
    return _C.cross_entropy(input._values, target, *args)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None):
    """query, key, value: (B, H, j, D) nested (transpose(1, 2) of (B, j, H, D)), each sequence
    attending only to itself, through the fused kernel that takes the offsets."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, NestedTensor):
            raise TypeError(f"scaled_dot_product_attention: {name} is dense while query is "
                            "nested; pass nested query, key and value")
        if t._ragged_idx != 2 or t.ndim != 4:
            raise ValueError(f"scaled_dot_product_attention: expected nested {name} of size "
                             f"(B, H, None, D), got {t.size()}")
    if key._off != query._off or value._off != query._off:
        raise ValueError("scaled_dot_product_attention: query, key and value have different "
                         f"offsets {query._off}, {key._off} and {value._off}")
    if attn_mask is not None:
        raise NotImplementedError("scaled_dot_product_attention: attn_mask with nested inputs "
                                  "(each sequence already attends only to itself)")
    if dropout_p > 0:
        raise NotImplementedError("scaled_dot_product_attention: dropout with nested inputs")
    out, _ = _C._jagged_attention(query._values, key._values, value._values, query._offsets,
                                  is_causal, scale)
    return query._like(out)


def _install():
    Tensor.is_nested = property(lambda self: False)


_install()
