"""What a PyTorch user writes, run through kiln: scalar overloads, binary_cross_entropy at the
edges of its domain, the overloads and names PyTorch has (result_type with numbers,
floor_divide, where(cond), nonzero(as_tuple), split with sizes, amax/amin, var/std(unbiased),
norm('fro'), round(decimals), trunc/fix, softplus, clamp with tensor bounds, max(a, b),
conv padding strings, LambdaLR), that `import kiln` loads no NCCL, and that a safetensors header
with bad UTF-8 is a ValueError. torch is not installed here: every expected value is PyTorch's,
written out (or PyTorch's formula, evaluated with NumPy)."""
import math
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

import kiln
import kiln.nn.functional as F


def vals(t):
    return t.detach().numpy().tolist()


def close(t, want, rtol=1e-6, atol=1e-6):
    np.testing.assert_allclose(t.detach().numpy(), np.asarray(want, dtype=np.float64), rtol=rtol,
                               atol=atol)


# ---- a Python number is a scalar value, not a float64 source ------------------------------------

IDX = [[0, 3], [1, 2]]


def test_scatter_takes_a_python_float_as_the_value():
    idx = kiln.tensor(IDX)
    want = [[2.5, 0, 0, 2.5], [0, 2.5, 2.5, 0]]
    y = kiln.zeros(2, 4).scatter(1, idx, 2.5)
    assert y.dtype is kiln.float32 and vals(y) == want
    assert vals(kiln.scatter(kiln.zeros(2, 4), 1, idx, 2.5)) == want
    assert vals(kiln.zeros(2, 4).scatter(1, idx, value=2.5)) == want
    x = kiln.zeros(2, 4)
    assert x.scatter_(1, idx, 2.5) is x and vals(x) == want
    # cast to self's dtype, as PyTorch's scatter.value
    ints = kiln.zeros(2, 4, dtype=kiln.int64).scatter(1, idx, 2.5)
    assert vals(ints) == [[2, 0, 0, 2], [0, 2, 2, 0]]
    # a tensor is still the source
    src = kiln.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert vals(kiln.zeros(2, 4).scatter(1, idx, src)) == [[1, 0, 0, 2], [0, 3, 4, 0]]


def test_scatter_value_gradient_and_errors():
    x = kiln.ones(2, 4, requires_grad=True)
    x.scatter(1, kiln.tensor(IDX), 2.5).sum().backward()
    assert vals(x.grad) == [[0, 1, 1, 0], [1, 0, 0, 1]]
    with pytest.raises(TypeError, match="int64"):
        kiln.zeros(2, 4).scatter(1, kiln.tensor([[0.0]]), 1.0)
    with pytest.raises(ValueError, match="larger than self"):
        kiln.zeros(2, 4).scatter(1, kiln.zeros(3, 1, dtype=kiln.int64), 1.0)
    with pytest.raises(IndexError):
        kiln.zeros(2, 4).scatter(1, kiln.tensor([[4]]), 1.0)


def test_fill_like_ops_take_python_floats_as_values():
    m = kiln.tensor([True, False, True])
    assert kiln.zeros(3).masked_fill(m, 2.5).dtype is kiln.float32
    assert vals(kiln.zeros(3).masked_fill(m, 2.5)) == [2.5, 0, 2.5]
    assert vals(kiln.zeros(3).masked_fill(m, kiln.tensor(1.5, dtype=kiln.float64))) == [1.5, 0, 1.5]
    assert vals(kiln.zeros(3, dtype=kiln.int32).masked_fill_(m, 2.5)) == [2, 0, 2]
    assert vals(kiln.zeros(2).fill_(2.5)) == [2.5, 2.5]
    x = kiln.zeros(3)
    x[m] = 2.5
    assert vals(x) == [2.5, 0, 2.5]


# ---- binary_cross_entropy at input 0 and 1 ------------------------------------------------------

def bce_grad_input(x, t, w=None, n=1):
    """PyTorch: grad * (x - t) / max((1 - x) x, EPSILON=1e-12) [* w] [/ numel], in float32."""
    x, t = np.float32(x), np.float32(t)
    g = (x - t) / np.maximum((np.float32(1) - x) * x, np.float32(1e-12))
    if w is not None:
        g = g * np.float32(w)
    return g / np.float32(n)


def test_binary_cross_entropy_forward_clamps_the_logs_at_minus_100():
    x = kiln.tensor([0.0, 1.0, 0.5, 0.0, 1.0, 0.3])
    t = kiln.tensor([0.0, 1.0, 0.5, 1.0, 0.0, 0.8])
    # (t - 1) max(log1p(-x), -100) - t max(log x, -100)
    want = [0.0, 0.0, math.log(2), 100.0, 100.0, -(0.8 * math.log(0.3) + 0.2 * math.log(0.7))]
    close(F.binary_cross_entropy(x, t, reduction="none"), want)
    close(F.binary_cross_entropy(x, t), sum(want) / 6)
    close(F.binary_cross_entropy(x, t, reduction="sum"), sum(want), rtol=1e-6)


@pytest.mark.parametrize("reduction,n", [("sum", 1), ("mean", 6)])
def test_binary_cross_entropy_backward_is_pytorchs_at_the_edges(reduction, n):
    xs = [0.0, 1.0, 0.0, 1.0, 0.3, 1e-13]
    ts = [0.0, 1.0, 1.0, 0.0, 0.8, 0.0]
    x = kiln.tensor(xs, requires_grad=True)
    F.binary_cross_entropy(x, kiln.tensor(ts), reduction=reduction).backward()
    g = x.grad.numpy()
    assert np.isfinite(g).all()
    np.testing.assert_allclose(g, bce_grad_input(xs, ts, n=n), rtol=1e-6)
    # exactly: 0 where x == t at an edge, -+1e12 (the EPSILON) where they differ, and 0.1 where
    # (1 - x) x = 1e-13 < EPSILON
    np.testing.assert_allclose(g[:4] * n, [0, 0, -1e12, 1e12], rtol=1e-6)
    np.testing.assert_allclose(g[5] * n, 0.1, rtol=1e-6)


def test_binary_cross_entropy_weight_and_target_gradients():
    xs, ts, ws = [0.0, 0.3, 1.0], [1.0, 0.8, 1.0], [2.0, 0.5, 3.0]
    x = kiln.tensor(xs, requires_grad=True)
    t = kiln.tensor(ts, requires_grad=True)
    F.binary_cross_entropy(x, t, weight=kiln.tensor(ws), reduction="sum").backward()
    np.testing.assert_allclose(x.grad.numpy(), bce_grad_input(xs, ts, ws), rtol=1e-6)
    # target: -logit(x) * grad * w, as PyTorch's binary_cross_entropy_target_backward
    tg = t.grad.numpy()
    assert tg[0] == np.inf and tg[2] == -np.inf
    np.testing.assert_allclose(tg[1], -math.log(0.3 / 0.7) * 0.5, rtol=1e-6)


def test_binary_cross_entropy_float64_and_bad_input():
    x = kiln.tensor([0.0, 0.25, 1.0], dtype=kiln.float64, requires_grad=True)
    t = kiln.tensor([1.0, 0.0, 1.0], dtype=kiln.float64)
    F.binary_cross_entropy(x, t, reduction="sum").backward()
    np.testing.assert_allclose(x.grad.numpy(), [-1e12, 0.25 / 0.1875, 0.0], rtol=1e-12)
    with pytest.raises(ValueError, match="between 0 and 1"):
        F.binary_cross_entropy(kiln.tensor([1.5]), kiln.tensor([1.0]))
    with pytest.raises(ValueError, match="between 0 and 1"):
        F.binary_cross_entropy(kiln.tensor([float("nan")]), kiln.tensor([1.0]))
    with pytest.raises(ValueError, match="shape"):
        F.binary_cross_entropy(kiln.tensor([0.5, 0.5]), kiln.tensor([1.0]))
    # zero-size and non-contiguous inputs
    assert F.binary_cross_entropy(kiln.zeros(0), kiln.zeros(0), reduction="sum").item() == 0
    xn = kiln.tensor([[0.2, 0.9], [0.4, 0.6]]).t()
    tn = kiln.tensor([[1.0, 0.0], [0.0, 1.0]]).t()
    close(F.binary_cross_entropy(xn, tn, reduction="none"),
          [[-math.log(0.2), -math.log(0.6)], [-math.log(0.1), -math.log(0.6)]], rtol=1e-5)


def test_tensor_with_a_dtype_converts_python_floats_directly():
    assert kiln.tensor([0.1], dtype=kiln.float64).item() == 0.1  # not float32(0.1)
    assert kiln.tensor(-0.05, dtype=kiln.float64).item() == -0.05
    assert kiln.tensor([0.1]).dtype is kiln.float32
    assert kiln.tensor([0.1], dtype=kiln.float16).item() == np.float16(0.1)


# ---- names and overloads -------------------------------------------------------------------------

def test_result_type_with_numbers():
    assert kiln.result_type(kiln.tensor([1, 2]), 1.0) is kiln.float32
    assert kiln.result_type(kiln.tensor([1, 2], dtype=kiln.int32), 5) is kiln.int32
    assert kiln.result_type(kiln.tensor([1.0], dtype=kiln.float16), 1.0) is kiln.float16
    assert kiln.result_type(kiln.tensor([1], dtype=kiln.uint8), -1) is kiln.uint8
    assert kiln.result_type(2, kiln.tensor([1.0], dtype=kiln.float64)) is kiln.float64
    assert kiln.result_type(kiln.tensor([True]), 2) is kiln.int64
    assert kiln.result_type(1, 2.0) is kiln.float32
    assert kiln.result_type(1, 2) is kiln.int64
    assert kiln.result_type(True, False) is kiln.bool
    f64 = kiln.tensor([1.0], dtype=kiln.float64)
    assert kiln.result_type(kiln.tensor([1]), f64) is kiln.float64
    assert kiln.result_type(tensor=kiln.tensor([1]), other=2.5) is kiln.float32
    with pytest.raises(TypeError, match="result_type"):
        kiln.result_type("a", 1)


def test_floor_divide():
    assert vals(kiln.floor_divide(kiln.tensor([7, -7]), 2)) == [3, -4]
    assert vals(kiln.tensor([7.0, -7.0]).floor_divide(2)) == [3.0, -4.0]
    assert vals(kiln.floor_divide(kiln.tensor([5.5]), kiln.tensor([2.0]))) == [2.0]
    assert vals(kiln.tensor([[7], [8]]).floor_divide(kiln.tensor([2, 3]))) == [[3, 2], [4, 2]]
    x = kiln.tensor([9, -9])
    assert x.floor_divide_(4) is x and vals(x) == [2, -3]
    assert vals(kiln.tensor([7, -7]) // 2) == [3, -4]
    with pytest.raises(TypeError):
        kiln.tensor([7]).floor_divide_(2.5)  # int64 result cannot hold the float quotient


def test_where_with_one_argument_and_nonzero_as_tuple():
    m = kiln.tensor([[True, False, True], [False, False, True]])
    rows, cols = kiln.where(m)
    assert vals(rows) == [0, 0, 1] and vals(cols) == [0, 2, 2]
    for got in (kiln.nonzero(m, as_tuple=True), m.nonzero(as_tuple=True)):
        assert isinstance(got, tuple) and [vals(g) for g in got] == [[0, 0, 1], [0, 2, 2]]
    assert vals(m.nonzero()) == [[0, 0], [0, 2], [1, 2]]
    x = kiln.tensor([[1.0, -2.0], [-3.0, 4.0]])
    assert vals(x[kiln.where(x > 0)]) == [1.0, 4.0]
    # a 0-d input counts as 1-d
    assert [vals(g) for g in kiln.nonzero(kiln.tensor(5), as_tuple=True)] == [[0]]
    assert [vals(g) for g in kiln.tensor(0).nonzero(as_tuple=True)] == [[]]
    assert vals(kiln.where(kiln.tensor([True, False]), 1.0, 0.0)) == [1.0, 0.0]
    with pytest.raises(TypeError, match="where"):
        kiln.where(m, x)


def test_split_with_a_list_of_sizes():
    x = kiln.arange(10).reshape(5, 2)
    a, b = x.split([2, 3])
    assert vals(a) == [[0, 1], [2, 3]] and vals(b) == [[4, 5], [6, 7], [8, 9]]
    c, d = kiln.split(x, [1, 1], dim=1)
    assert vals(c) == [[0], [2], [4], [6], [8]] and d.shape == (5, 1)
    assert [p.shape for p in x.split((0, 5))] == [(0, 2), (5, 2)]
    assert [p.shape for p in x.split(2)] == [(2, 2), (2, 2), (1, 2)]
    assert isinstance(x.split(2), tuple) and isinstance(x.split([5]), tuple)
    a[0, 0] = 100  # views of x
    assert x[0, 0].item() == 100
    with pytest.raises(ValueError, match="sum exactly to 5"):
        x.split([2, 2])
    with pytest.raises(ValueError, match="non-negative"):
        x.split([-1, 6])
    w = kiln.ones(5, 2, requires_grad=True)
    p, q = w.split([2, 3])
    ((p * 2).sum() + q.sum()).backward()
    assert vals(w.grad) == [[2, 2], [2, 2], [1, 1], [1, 1], [1, 1]]


def test_amax_amin_values_and_ties():
    x = kiln.tensor([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]])
    assert vals(x.amax(1)) == [3.0, 2.0] and vals(kiln.amin(x, 1)) == [1.0, 0.0]
    assert vals(x.amin(0)) == [1.0, 2.0, 0.0]
    assert x.amax().item() == 3.0 and x.amax(dim=(0, 1)).item() == 3.0
    assert x.amax(1, keepdim=True).shape == (2, 1)
    assert vals(x.t().amax(0)) == [3.0, 2.0]  # non-contiguous
    assert vals(kiln.tensor([[1, 5], [7, 2]]).amax(0)) == [7, 5]
    assert math.isnan(kiln.tensor([1.0, float("nan"), 2.0]).amax().item())
    assert kiln.zeros(0, 3).amax(1).shape == (0,)
    with pytest.raises(IndexError, match="non-zero size"):
        kiln.zeros(0, 3).amax(0)
    # the gradient is shared evenly among ties (max.dim would pick one)
    x = kiln.tensor([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]], requires_grad=True)
    x.amax(1).sum().backward()
    assert vals(x.grad) == [[0, 0.5, 0.5], [0.5, 0.5, 0]]
    x.grad = None
    x.amax().backward()
    assert vals(x.grad) == [[0, 0.5, 0.5], [0, 0, 0]]
    x.grad = None
    x.amin(1).sum().backward()
    assert vals(x.grad) == [[1, 0, 0], [0, 0, 1]]


def test_var_std_unbiased():
    x = kiln.tensor([1.0, 2.0, 3.0, 4.0])
    close(x.var(), 5 / 3)
    close(x.var(unbiased=False), 1.25)
    close(x.var(False), 1.25)
    close(kiln.var(x, 0, False), 1.25)
    close(kiln.std(x, unbiased=False), math.sqrt(1.25))
    close(x.std(0, True), math.sqrt(5 / 3))
    assert x.var(0, True, True).shape == (1,)
    close(x.var(correction=0), 1.25)
    close(kiln.tensor([[1.0, 2.0], [3.0, 5.0]]).var(1, unbiased=False), [0.25, 1.0])
    with pytest.raises(TypeError, match="unbiased or correction"):
        x.var(unbiased=True, correction=1)


def test_norm_fro_and_nuc():
    x = kiln.tensor([[3.0, 4.0], [0.0, 0.0]])
    close(x.norm(p="fro"), 5.0)
    close(kiln.norm(x), 5.0)  # PyTorch's default p is 'fro'
    close(x.norm("fro", dim=(0, 1)), 5.0)
    close(x.norm("fro", dim=1), [5.0, 0.0])
    assert x.norm("fro", dim=1, keepdim=True).shape == (2, 1)
    assert x.norm(dtype=kiln.float64).dtype is kiln.float64
    close(x.norm(1), 7.0)
    with pytest.raises(NotImplementedError, match="nuc"):
        x.norm(p="nuc")
    with pytest.raises(ValueError, match="'fro' or 'nuc'"):
        x.norm(p="max")
    w = kiln.tensor([[3.0, 4.0], [0.0, 0.0]], requires_grad=True)
    w.norm(p="fro").backward()
    close(w.grad, [[0.6, 0.8], [0.0, 0.0]])


def test_round_decimals_trunc_fix():
    x = kiln.tensor([1.2345, -2.5551, 0.5, 1.5, 2.5])
    close(x.round(decimals=2), [1.23, -2.56, 0.5, 1.5, 2.5])
    assert vals(kiln.round(x, decimals=0)) == [1.0, -3.0, 0.0, 2.0, 2.0]  # half to even
    close(kiln.tensor([15.0, 25.0, 123.0]).round(decimals=-1), [20.0, 20.0, 120.0])
    d = kiln.tensor([-0.05, 1.2345], dtype=kiln.float64)
    assert vals(d.round(decimals=1)) == [-0.0, 1.2] and vals(d.round(decimals=3)) == [-0.05, 1.234]
    y = kiln.tensor([0.125, 0.375])
    assert y.round_(decimals=2) is y
    close(y, [0.12, 0.38])
    assert vals(kiln.tensor([3, 4]).round(decimals=0)) == [3, 4]
    with pytest.raises(TypeError, match="decimals"):
        kiln.tensor([3, 4]).round(decimals=1)
    t = kiln.tensor([1.7, -1.7, 0.5, -0.5, 2.0])
    assert vals(t.trunc()) == [1.0, -1.0, 0.0, -0.0, 2.0]
    assert vals(kiln.fix(t)) == vals(kiln.trunc(t)) == vals(t.fix())
    assert vals(kiln.tensor([-3, 3]).trunc()) == [-3, 3]
    u = t.clone()
    assert u.fix_() is u and vals(u) == vals(t.trunc())
    g = kiln.tensor([1.7, -1.2], requires_grad=True)
    (g.trunc() + g.round(decimals=1)).sum().backward()
    assert vals(g.grad) == [0.0, 0.0]


def test_softplus():
    x = kiln.tensor([-1.0, 0.0, 1.0, 30.0])
    close(F.softplus(x), [math.log1p(math.exp(-1)), math.log(2), math.log1p(math.e), 30.0])
    close(F.softplus(kiln.tensor([0.25, 1.0]), beta=2, threshold=1),
          [math.log1p(math.exp(0.5)) / 2, 1.0])  # beta x = 2 > threshold: x itself
    close(kiln.nn.Softplus(beta=2)(kiln.tensor([0.25])), [math.log1p(math.exp(0.5)) / 2])
    g = kiln.tensor([0.0, 1.0, 50.0, -100.0], requires_grad=True)
    F.softplus(g).sum().backward()
    # sigmoid(beta x) below the threshold, 1 above it; never nan (exp(50) is not computed)
    close(g.grad, [0.5, 1 / (1 + math.exp(-1)), 1.0, 0.0], atol=1e-7)
    with pytest.raises(TypeError, match="floating"):
        F.softplus(kiln.tensor([1, 2]))


def test_clamp_with_tensor_bounds():
    x = kiln.tensor([-2.0, 0.0, 2.0, 5.0])
    lo = kiln.tensor([-1.0, 1.0, 1.0, 1.0])
    hi = kiln.tensor([1.0, 2.0, 3.0, 4.0])
    assert vals(x.clamp(lo, hi)) == [-1.0, 1.0, 2.0, 4.0]
    assert vals(kiln.clamp(x, min=lo)) == [-1.0, 1.0, 2.0, 5.0]
    assert vals(x.clamp(max=hi)) == [-2.0, 0.0, 2.0, 4.0]
    assert vals(x.clamp(kiln.tensor(0.0), kiln.tensor([1.0]))) == [0.0, 0.0, 1.0, 1.0]
    assert vals(x.clamp(kiln.tensor(2.0), kiln.tensor(1.0))) == [1.0, 1.0, 1.0, 1.0]  # min > max
    assert vals(x.clamp(min=0.0, max=hi)) == [0.0, 0.0, 2.0, 4.0]
    assert vals(x.clamp(0, 1)) == [0.0, 0.0, 1.0, 1.0]  # the Scalar overload
    r = kiln.tensor([-3, 7]).clamp(min=kiln.tensor([0.5, 0.5]))
    assert r.dtype is kiln.float32 and vals(r) == [0.5, 7.0]
    assert math.isnan(kiln.tensor([1.0]).clamp(min=kiln.tensor([float("nan")])).item())
    y = x.clone()
    assert y.clamp_(lo, hi) is y and vals(y) == [-1.0, 1.0, 2.0, 4.0]
    with pytest.raises(ValueError, match="at least one"):
        kiln.clamp(x, min=None, max=None)
    with pytest.raises(ValueError, match="broadcast"):
        x.clamp(kiln.zeros(3))
    # PyTorch's gradients: the bound that is the result (max when min > max), self inside, an
    # even share at a tie with one bound, self when min == max == self, self for nan
    nan = float("nan")
    cases = [  # x, min, max -> grads of x, min, max
        (-2.0, -1.0, 1.0, 0, 1, 0), (2.0, 1.0, 3.0, 1, 0, 0), (5.0, 1.0, 4.0, 0, 0, 1),
        (1.0, 1.0, 3.0, 0.5, 0.5, 0), (3.0, 1.0, 3.0, 0.5, 0, 0.5), (1.0, 1.0, 1.0, 1, 0, 0),
        (0.0, 1.0, 1.0, 0, 1, 0), (2.0, 1.0, 1.0, 0, 0, 1), (1.0, 2.0, 1.0, 0, 0, 1),
        (0.0, 2.0, 1.0, 0, 0, 1), (nan, 0.0, 1.0, 1, 0, 0), (0.5, nan, 1.0, 1, 0, 0)]
    xg, lg, hg = (kiln.tensor([c[i] for c in cases], requires_grad=True) for i in range(3))
    y = xg.clamp(lg, hg)
    y.sum().backward()
    close(y, [-1, 2, 4, 1, 3, 1, 1, 1, 1, 1, nan, nan])
    assert vals(xg.grad) == [c[3] for c in cases]
    assert vals(lg.grad) == [c[4] for c in cases]
    assert vals(hg.grad) == [c[5] for c in cases]
    one = kiln.tensor([1.0], requires_grad=True)
    lo = kiln.tensor([1.0], requires_grad=True)
    one.clamp(min=lo).backward()
    assert vals(one.grad) == [0.5] and vals(lo.grad) == [0.5]


def test_binary_max_min():
    a = kiln.tensor([1.0, 5.0, 3.0])
    b = kiln.tensor([4.0, 2.0, 3.0])
    assert vals(kiln.max(a, b)) == [4.0, 5.0, 3.0] and vals(a.min(b)) == [1.0, 2.0, 3.0]
    assert vals(kiln.min(a, other=b)) == [1.0, 2.0, 3.0]
    assert vals(kiln.max(kiln.tensor([[1.0], [6.0]]), b)) == [[4.0, 2.0, 3.0], [6.0, 6.0, 6.0]]
    x = kiln.tensor([[1.0, 7.0], [9.0, 2.0]])
    values, indices = x.max(1)  # still the reduction
    assert vals(values) == [7.0, 9.0] and vals(indices) == [1, 0]
    assert vals(kiln.max(x, 0).values) == [9.0, 7.0] and x.max().item() == 9.0
    ga, gb = a.clone().requires_grad_(), b.clone().requires_grad_()
    kiln.max(ga, gb).sum().backward()
    assert vals(ga.grad) == [0, 1, 0.5] and vals(gb.grad) == [1, 0, 0.5]


def test_conv_padding_strings():
    x = kiln.ones(1, 1, 4, 4)
    w = kiln.ones(1, 1, 3, 3)
    same = F.conv2d(x, w, padding="same")
    assert same.shape == (1, 1, 4, 4)
    assert vals(same)[0][0] == [[4, 6, 6, 4], [6, 9, 9, 6], [6, 9, 9, 6], [4, 6, 6, 4]]
    assert vals(F.conv2d(x, w, padding="valid"))[0][0] == [[9, 9], [9, 9]]
    assert vals(F.conv2d(x, w, kiln.tensor([1.0]), 1, "valid"))[0][0] == [[10, 10], [10, 10]]
    y1 = F.conv1d(kiln.ones(1, 1, 5), kiln.ones(1, 1, 3), padding="same")
    assert vals(y1) == [[[2, 3, 3, 3, 2]]]
    # an even kernel pads one more on the right, as PyTorch
    x1 = kiln.tensor([[[1.0, 2.0, 3.0, 4.0]]])
    assert vals(F.conv1d(x1, kiln.ones(1, 1, 2), padding="same")) == [[[3, 5, 7, 4]]]
    assert kiln.nn.Conv2d(1, 2, 3, padding="same")(x).shape == (1, 2, 4, 4)
    assert kiln.nn.Conv1d(1, 2, 3, padding="valid")(kiln.ones(1, 1, 5)).shape == (1, 2, 3)
    with pytest.raises(ValueError, match="same"):
        F.conv2d(x, w, stride=2, padding="same")
    with pytest.raises(ValueError, match="padding"):
        F.conv2d(x, w, padding="full")


def test_lambda_lr_and_multiplicative_lr():
    p = kiln.nn.Parameter(kiln.zeros(1))
    opt = kiln.optim.SGD([p], lr=0.1)
    s = kiln.optim.lr_scheduler.LambdaLR(opt, lambda e: 0.5 ** e)
    lrs = [opt.param_groups[0]["lr"]]
    for _ in range(3):
        opt.step()
        s.step()
        lrs.append(s.get_last_lr()[0])
    np.testing.assert_allclose(lrs, [0.1, 0.05, 0.025, 0.0125])
    sd = s.state_dict()
    assert sd["lr_lambdas"] == [None] and sd["last_epoch"] == 3

    class Warmup:
        def __init__(self):
            self.steps = 2

        def __call__(self, e):
            return min(1.0, (e + 1) / self.steps)

    groups = [{"params": [kiln.nn.Parameter(kiln.zeros(1))], "lr": lr} for lr in (1.0, 2.0)]
    opt2 = kiln.optim.SGD(groups, lr=1.0)
    warm = Warmup()
    s2 = kiln.optim.lr_scheduler.LambdaLR(opt2, [warm, lambda e: 1.0])
    assert s2.get_last_lr() == [0.5, 2.0]
    warm.steps = 4
    saved = s2.state_dict()
    assert saved["lr_lambdas"][0] == {"steps": 4} and saved["lr_lambdas"][1] is None
    warm.steps = 9
    s2.load_state_dict(saved)
    assert warm.steps == 4 and s2.get_last_lr() == [0.25, 2.0]
    with pytest.raises(ValueError, match="2 lr_lambdas"):
        kiln.optim.lr_scheduler.LambdaLR(opt2, [lambda e: 1.0])

    opt3 = kiln.optim.SGD([kiln.nn.Parameter(kiln.zeros(1))], lr=0.1)
    m = kiln.optim.lr_scheduler.MultiplicativeLR(opt3, lambda e: 0.9)
    got = [m.get_last_lr()[0]]
    for _ in range(3):
        m.step()
        got.append(m.get_last_lr()[0])
    np.testing.assert_allclose(got, [0.1, 0.09, 0.081, 0.0729])
    m.step(1)
    np.testing.assert_allclose(m.get_last_lr(), [0.09])


# ---- import order: `import kiln` must leave NCCL for PyTorch to load ----------------------------

def test_import_kiln_loads_no_nccl():
    """Kiln dlopens NCCL only for the NCCL backend, so `import torch` after `import kiln` gets its
    own libnccl (See Note [Loading NCCL lazily] in sharding/comm/nccl_lib.h)."""
    code = ("import kiln, sys\n"
            "maps = open('/proc/self/maps').read()\n"
            "sys.exit(1 if 'libnccl' in maps else 0)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ))
    assert r.returncode == 0, "import kiln mapped libnccl: " + r.stderr


# ---- safetensors header with bad UTF-8 -----------------------------------------------------------

def write_safetensors(path, header: bytes, data: bytes):
    header += b" " * ((8 - len(header) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + data)


@pytest.mark.parametrize("header", [
    b'{"w\xff\xfe": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}',
    b'{"__metadata__": {"k": "\xc3("}, '
    b'"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}',
    b'{"w": {"dtype": "F\xff", "shape": [1], "data_offsets": [0, 4]}}',
])
def test_safetensors_header_with_bad_utf8_is_a_value_error(tmp_path, header):
    path = str(tmp_path / "bad.safetensors")
    write_safetensors(path, header, b"\0" * 4)
    with pytest.raises(ValueError, match="header") as e:
        kiln.load(path)
    assert type(e.value) is ValueError and path in str(e.value)
    with pytest.raises(ValueError, match="header"):
        kiln._C._load_safetensors(path)
