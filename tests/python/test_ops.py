"""Ops through Python against NumPy over many shapes and dtypes (bfloat16 and float16 are
compared after rounding NumPy's float32 result), and every op of the table bound once with its
keyword names and defaults."""
import glob
import os
import re
import tomllib

import numpy as np
import pytest

import kiln

SHAPES = [(), (1,), (7,), (3, 4), (2, 1, 5), (0, 3), (2, 3, 4, 2)]
FLOAT_DTYPES = ["float32", "float64", "bfloat16", "float16"]
INT_DTYPES = ["int32", "int64", "int16", "int8", "uint8"]
TOL = {"float32": 1e-5, "float64": 1e-10, "bfloat16": 2e-2, "float16": 2e-3}


def make(shape, dtype, low=-3.0, high=3.0, seed=0):
    rng = np.random.default_rng(seed + len(shape) * 31 + sum(shape))
    a = rng.uniform(low, high, size=shape)
    if dtype in INT_DTYPES or dtype == "bool":
        a = np.round(a).astype(dtype if dtype != "uint8" else "int64")
        if dtype == "uint8":
            a = np.abs(a).astype(np.uint8)
        elif dtype == "bool":
            a = a > 0
    t = kiln.tensor(a.astype(np.float32) if dtype == "bfloat16" else a)
    t = t.to(getattr(kiln, dtype))
    ref = t.float().numpy().astype(np.float64) if dtype in ("bfloat16", "float16") else t.numpy()
    return t, ref


def check(got, want, dtype, rtol=None):
    g = got.float().numpy() if got.dtype is kiln.bfloat16 else got.numpy()
    tol = TOL.get(dtype, 0) if rtol is None else rtol
    assert g.shape == np.shape(want)
    np.testing.assert_allclose(g.astype(np.float64), np.asarray(want, dtype=np.float64), rtol=tol,
                               atol=tol)


UNARY = {
    "neg": np.negative, "abs": np.abs, "exp": np.exp, "sin": np.sin, "cos": np.cos,
    "tanh": np.tanh, "sigmoid": lambda a: 1 / (1 + np.exp(-a)), "relu": lambda a: np.maximum(a, 0),
    "floor": np.floor, "ceil": np.ceil, "sign": np.sign, "expm1": np.expm1,
    "silu": lambda a: a / (1 + np.exp(-a)),
}
POSITIVE = {"log": np.log, "sqrt": np.sqrt, "rsqrt": lambda a: 1 / np.sqrt(a), "log1p": np.log1p,
            "reciprocal": lambda a: 1 / a}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_unary(shape, dtype):
    t, a = make(shape, dtype)
    for name, f in UNARY.items():
        check(getattr(kiln, name)(t), f(a), dtype)
        check(getattr(t, name)(), f(a), dtype)
    p, pa = make(shape, dtype, 0.1, 4.0)
    for name, f in POSITIVE.items():
        check(getattr(kiln, name)(p), f(pa), dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + ["int32", "int64"])
def test_binary_broadcast(dtype):
    pairs = [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 1, 5), (3, 1)), ((), (2, 3)), ((0, 3), (1, 3))]
    for sa, sb in pairs:
        x, a = make(sa, dtype, seed=1)
        y, b = make(sb, dtype, seed=2)
        check(x + y, a + b, dtype)
        check(kiln.sub(x, y, alpha=2), a - 2 * b, dtype)
        check(x * y, a * b, dtype)
        check(kiln.maximum(x, y), np.maximum(a, b), dtype)
        check(kiln.minimum(x, y), np.minimum(a, b), dtype)
        np.testing.assert_array_equal((x < y).numpy(), a < b)
        np.testing.assert_array_equal(kiln.eq(x, y).numpy(), a == b)
        if dtype in FLOAT_DTYPES:
            ny = kiln.where(y == 0, 1.0, y).to(y.dtype)
            nb = np.where(b == 0, 1.0, b)
            check(x / ny, a / nb, dtype, rtol=TOL[dtype] * 4)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "int32"])
@pytest.mark.parametrize("shape", [(7,), (3, 4), (2, 3, 4, 2), (0, 3)])
def test_reductions(shape, dtype):
    t, a = make(shape, dtype)
    check(t.sum(), a.sum(), dtype)
    for d in range(len(shape)):
        check(t.sum(d), a.sum(d), dtype)
        check(t.sum(d, keepdim=True), a.sum(d, keepdims=True), dtype)
        check(kiln.cumsum(t, d), np.cumsum(a, d), dtype)
        if a.size:
            check(t.max(d).values, a.max(d), dtype)
            check(t.min(dim=d).values, a.min(d), dtype)
            np.testing.assert_array_equal(t.argmax(d).numpy(), a.argmax(d))
    if dtype.startswith("float"):
        check(t.mean(), a.mean() if a.size else np.nan, dtype) if a.size else None
        if a.size > 1:
            check(t.var(), a.var(ddof=1), dtype, rtol=1e-4)
            check(t.std(0, correction=0), a.std(0), dtype, rtol=1e-4)
            check(kiln.logsumexp(t, [0]), np.log(np.exp(a).sum(0)), dtype, rtol=1e-4)
            check(kiln.softmax(t, -1), np.exp(a) / np.exp(a).sum(-1, keepdims=True), dtype, rtol=1e-4)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "bool", "bfloat16"])
def test_shape_ops(dtype):
    t, a = make((2, 3, 4), dtype)
    check(t.transpose(0, 2), a.transpose(2, 1, 0), dtype)
    check(t.permute(1, 2, 0), a.transpose(1, 2, 0), dtype)
    check(t.reshape(4, 6), a.reshape(4, 6), dtype)
    check(t.flip(1), a[:, ::-1], dtype)
    check(kiln.roll(t, 1, 2), np.roll(a, 1, 2), dtype)
    check(kiln.cat([t, t], 1), np.concatenate([a, a], 1), dtype)
    check(kiln.stack([t, t], -1), np.stack([a, a], -1), dtype)
    check(t.repeat(2, 1, 1), np.tile(a, (2, 1, 1)), dtype)
    check(kiln.tril(t), np.tril(a), dtype)
    check(kiln.triu(t, 1), np.triu(a, 1), dtype)
    check(t.unsqueeze(1).expand(2, 5, 3, 4), np.broadcast_to(a[:, None], (2, 5, 3, 4)), dtype)
    check(t.squeeze(), a.squeeze(), dtype)
    check(t.narrow(2, 1, 2), a[:, :, 1:3], dtype)
    check(t.transpose(0, 1).contiguous(), np.ascontiguousarray(a.transpose(1, 0, 2)), dtype)
    check(kiln.gather(t, 2, kiln.tensor([[[0, 3]] * 3] * 2)), np.take_along_axis(a, np.array([[[0, 3]] * 3] * 2), 2), dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_matmul(dtype):
    for sa, sb in [((3, 4), (4, 5)), ((2, 3, 4), (4, 2)), ((4,), (4, 3)), ((5, 1, 3, 4), (2, 4, 6))]:
        x, a = make(sa, dtype, seed=3)
        y, b = make(sb, dtype, seed=4)
        check(x @ y, a @ b, dtype, rtol=TOL[dtype] * 10)
    x, a = make((3, 4), dtype, seed=5)
    w, b = make((5, 4), dtype, seed=6)
    check(kiln.linear(x, w), a @ b.T, dtype, rtol=TOL[dtype] * 10)


def test_non_contiguous_inputs():
    t, a = make((4, 6), "float32")
    v, va = t.t(), a.T
    check(v.exp(), np.exp(va), "float32")
    check(v + v[0], va + va[0], "float32")
    check(t[:, ::2].sum(1), a[:, ::2].sum(1), "float32")


def _table_rows():
    here = os.path.dirname(os.path.abspath(__file__))
    for path in sorted(glob.glob(os.path.join(here, "..", "..", "tensor", "ops", "*.toml"))):
        if path.endswith("rules.toml"):
            continue
        with open(path, "rb") as f:
            for row in tomllib.load(f).get("op", []):
                yield row


def test_every_op_is_bound_with_its_schema():
    """Each row is kiln.<name> (its schema in the docstring: keyword names and defaults),
    in-place variants kiln.<name>_, and Tensor.<name> where the C++ Tensor has the method."""
    rows = list(_table_rows())
    assert len(rows) > 150
    for row in rows:
        schema = row["schema"]
        full = schema.split("(")[0]
        base = full.split(".")[0]
        fn = getattr(kiln._C, base)
        args = schema[schema.index("(") + 1:schema.index(") ->")]
        assert full + "(" in fn.__doc__, full
        for name in re.findall(r"(\w+)(?:=[^,]*)?(?:,|$)", args):
            assert name in fn.__doc__
        if "inplace" in row.get("variants", []):
            assert getattr(kiln._C, base + "_")
        first = args.split(",")[0].strip()
        is_method = re.fullmatch(r"Tensor(\(a!?\))? self", first) and row.get("method", True)
        if is_method:
            assert hasattr(kiln.Tensor, base), base


def test_defaults_and_keywords_from_the_table():
    x = kiln.randn(2, 3, 4, 4)
    w = kiln.randn(5, 3, 3, 3)
    assert kiln.conv2d(x, w).shape == (2, 5, 2, 2)
    assert kiln.conv2d(x, w, padding=1).shape == (2, 5, 4, 4)  # a bare int for int[2]
    assert kiln.conv2d(x, w, None, 1, "same").shape == (2, 5, 4, 4)  # the .padding overload
    assert kiln.max_pool2d(x, 2).shape == (2, 3, 2, 2)
    assert kiln.avg_pool2d(x, kernel_size=2, stride=1).shape == (2, 3, 3, 3)
    y = kiln.randn(4, 10)
    t = kiln.tensor([1, 0, 3, 9])
    l1 = kiln.cross_entropy(y, t)
    l2 = kiln.cross_entropy(y, t, reduction="sum")
    assert abs(l2.item() - 4 * l1.item()) < 1e-4
    assert kiln.gelu(y, approximate="tanh").shape == y.shape
    assert kiln.dropout(y, 0.5, False).tolist() == y.tolist()
    assert kiln.layer_norm(y, [10]).shape == y.shape
