"""The Tensor surface of the kiln package: creation, dtypes, devices, properties, operators,
indexing, repr, and NumPy/DLPack interop (zero-copy checked by mutating through NumPy)."""
import numpy as np
import pytest

import kiln

DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32",
          "float64"]


def test_version_and_dtypes():
    assert isinstance(kiln.__version__, str) and kiln.__version__.count(".") == 2
    for name in DTYPES:
        dt = getattr(kiln, name)
        assert repr(dt) == f"kiln.{name}"
        assert kiln.zeros(2, dtype=dt).dtype is dt
    assert kiln.float is kiln.float32 and kiln.double is kiln.float64 and kiln.long is kiln.int64
    assert kiln.half is kiln.float16 and kiln.int is kiln.int32
    assert kiln.float32.is_floating_point and not kiln.int64.is_floating_point
    assert kiln.bfloat16.itemsize == 2
    assert kiln.zeros(1, dtype=float).dtype is kiln.float64
    assert kiln.promote_types(kiln.int32, kiln.float32) is kiln.float32


def test_device():
    d = kiln.device("cpu")
    assert str(d) == "cpu" and d.type == "cpu" and d.index is None
    assert repr(d) == "device(type='cpu')"
    assert kiln.ones(2).device == d and kiln.ones(2).device == "cpu"
    assert kiln.device("cuda", 1).index == 1
    m = kiln.empty(1024, 1024, device="meta")
    assert kiln.mm(m, m).shape == (1024, 1024) and m.is_meta
    with pytest.raises(ValueError):
        kiln.device("nope")


def test_creation():
    assert kiln.zeros(2, 3).shape == (2, 3) == kiln.zeros((2, 3)).shape == kiln.zeros([2, 3]).shape
    assert kiln.ones(4).tolist() == [1.0] * 4
    assert kiln.full((2,), 7).tolist() == [7, 7]
    assert kiln.empty(3, dtype=kiln.int32).dtype is kiln.int32
    assert kiln.arange(5).tolist() == [0, 1, 2, 3, 4] and kiln.arange(5).dtype is kiln.int64
    assert kiln.arange(1, 2, 0.25).tolist() == [1.0, 1.25, 1.5, 1.75]
    np.testing.assert_allclose(kiln.linspace(0, 1, 5).numpy(), np.linspace(0, 1, 5), rtol=1e-6)
    np.testing.assert_array_equal(kiln.eye(3).numpy(), np.eye(3, dtype=np.float32))
    np.testing.assert_array_equal(kiln.eye(2, 3).numpy(), np.eye(2, 3, dtype=np.float32))
    x = kiln.rand(1000)
    assert 0 <= x.min().item() and x.max().item() < 1
    assert abs(kiln.randn(10000).mean().item()) < 0.05
    r = kiln.randint(3, 7, (100,))
    assert r.dtype is kiln.int64 and 3 <= r.min().item() and r.max().item() < 7
    assert kiln.randint(5, (3,)).shape == (3,)
    base = kiln.ones(2, 3, dtype=kiln.float64)
    for f in [kiln.zeros_like, kiln.ones_like, kiln.empty_like, kiln.rand_like, kiln.randn_like]:
        t = f(base)
        assert t.shape == (2, 3) and t.dtype is kiln.float64
    assert kiln.full_like(base, 3).tolist() == [[3.0] * 3] * 2
    assert kiln.zeros(2, requires_grad=True).requires_grad
    assert sorted(kiln.randperm(5).tolist()) == [0, 1, 2, 3, 4]


def test_tensor_from_data():
    t = kiln.tensor([[1.5, 2], [3, 4]])
    assert t.dtype is kiln.float32 and t.tolist() == [[1.5, 2.0], [3.0, 4.0]]
    assert kiln.tensor([1, 2]).dtype is kiln.int64
    assert kiln.tensor([True, False]).dtype is kiln.bool
    assert kiln.tensor(np.arange(3.0)).dtype is kiln.float64
    assert kiln.tensor(2.5).shape == () and kiln.tensor(2.5).item() == 2.5
    assert kiln.tensor([1, 2], dtype=kiln.float64).dtype is kiln.float64
    assert kiln.tensor([]).shape == (0,)
    a = np.arange(4.0)
    t = kiln.tensor(a)
    a[0] = 9  # kiln.tensor copies
    assert t[0].item() == 0
    with pytest.raises(TypeError):
        kiln.tensor([object()])


def test_properties():
    t = kiln.zeros(2, 3, 4)
    assert t.ndim == 3 == t.dim() and t.numel() == 24 and t.size() == (2, 3, 4) and t.size(-1) == 4
    assert t.stride() == (12, 4, 1) and t.stride(0) == 12 and t.is_contiguous()
    assert not t.transpose(0, 2).is_contiguous()
    assert t.element_size() == 4 and t.nbytes == 96
    assert len(t) == 2 and [x.shape for x in t] == [(3, 4), (3, 4)]
    assert kiln.tensor(3).item() == 3 and isinstance(kiln.tensor(3).item(), int)
    assert isinstance(kiln.tensor(True).item(), bool)
    assert float(kiln.tensor(2.5)) == 2.5 and int(kiln.tensor(7)) == 7
    assert [0, 1, 2][kiln.tensor(1)] == 1
    assert bool(kiln.tensor([1.0])) and f"{kiln.tensor(1.23456):.2f}" == "1.23"
    with pytest.raises(RuntimeError):
        bool(kiln.ones(2))
    with pytest.raises(TypeError):
        len(kiln.tensor(1.0))
    assert t.T.shape == (4, 3, 2) and t.mT.shape == (2, 4, 3)


def test_repr():
    assert repr(kiln.tensor([1.0, 2.5])) == "tensor([1.0000, 2.5000])"
    assert repr(kiln.tensor([1, 2], dtype=kiln.int32)) == "tensor([1, 2], dtype=kiln.int32)"
    assert repr(kiln.ones(2, requires_grad=True)) == "tensor([1., 1.], requires_grad=True)"
    assert repr(kiln.ones(2, requires_grad=True) * 2) == "tensor([2., 2.], grad_fn=<MulBackward0>)"


def test_operators():
    a, b = kiln.tensor([1.0, 2.0, 3.0]), kiln.tensor([4.0, 5.0, 6.0])
    an, bn = a.numpy(), b.numpy()
    for got, want in [(a + b, an + bn), (a - b, an - bn), (a * b, an * bn), (a / b, an / bn),
                      (a + 1, an + 1), (1 + a, 1 + an), (2 - a, 2 - an), (a - 2, an - 2),
                      (2 * a, 2 * an), (2 / a, 2 / an), (a ** 2, an ** 2), (2 ** a, 2 ** an),
                      (a ** b, an ** bn), (-a, -an), (abs(-a), an), (b // a, bn // an),
                      (b % 4, bn % 4), (7 % a, 7 % an), (a @ b, an @ bn)]:
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
    for got, want in [(a < b, an < bn), (a <= 2, an <= 2), (a > 2, an > 2), (a >= 2, an >= 2),
                      (a == 2, an == 2), (a != 2, an != 2)]:
        assert got.dtype is kiln.bool
        np.testing.assert_array_equal(got.numpy(), want)
    m = a > 1
    np.testing.assert_array_equal((~m).numpy(), ~(an > 1))
    np.testing.assert_array_equal((m & (a < 3)).numpy(), (an > 1) & (an < 3))
    np.testing.assert_array_equal((m | (a < 2)).numpy(), (an > 1) | (an < 2))
    assert (a == None) is False and a != "x"  # noqa: E711
    assert (kiln.ones(2, dtype=kiln.int64) + 1.5).dtype is kiln.float32  # scalars promote like torch
    assert (kiln.ones(2, dtype=kiln.int32) + 1).dtype is kiln.int32


def test_inplace_operators_keep_identity():
    a = kiln.ones(3)
    ida = id(a)
    a += 1
    a *= 3
    a -= 1
    a /= 5
    assert id(a) == ida and a.tolist() == [1.0, 1.0, 1.0]
    assert a.add_(1) is a and a.zero_() is a and a.fill_(2) is a
    with pytest.raises(TypeError):
        i = kiln.ones(2, dtype=kiln.int64)
        i += 1.5


def test_methods_and_keywords():
    x = kiln.arange(6.0).view(2, 3)
    assert x.sum().item() == 15 and x.sum(1).tolist() == [3, 12]
    assert x.sum(dim=0, keepdim=True).shape == (1, 3) and x.sum((0, 1)).item() == 15
    assert x.view(3, 2).shape == (3, 2) and x.reshape(-1).shape == (6,)
    assert x.permute(1, 0).shape == (3, 2) and x.permute((1, 0)).shape == (3, 2)
    assert x.transpose(0, 1).shape == (3, 2) and x.t().shape == (3, 2)
    assert x.unsqueeze(0).shape == (1, 2, 3) and x.flatten().shape == (6,)
    assert x.max(dim=1).values.tolist() == [2, 5] and x.max(1).indices.tolist() == [2, 2]
    values, indices = x.sort(dim=1, descending=True)
    assert indices.tolist() == [[2, 1, 0], [2, 1, 0]]
    assert kiln.clamp(x, min=1, max=4).tolist() == [[1, 1, 2], [3, 4, 4]]
    assert x.to(kiln.int64).dtype is kiln.int64 and x.to("cpu").device == "cpu"
    assert x.to(dtype=kiln.float64).dtype is kiln.float64 and x.double().dtype is kiln.float64
    assert x.long().dtype is kiln.int64 and x.type_as(kiln.ones(1, dtype=kiln.int32)).dtype is kiln.int32
    out = kiln.empty(2, 3)
    assert kiln.add(x, x, out=out) is out and out.tolist() == (x * 2).tolist()
    assert [t.shape for t in x.split(1, 1)] == [(2, 1)] * 3
    assert kiln.cat([x, x], dim=1).shape == (2, 6) and kiln.stack([x, x]).shape == (2, 2, 3)
    assert kiln.where(x > 2, x, 0.0).tolist() == [[0, 0, 0], [3, 4, 5]]
    assert x.new_zeros(2).dtype is x.dtype and x.new_ones((1, 2)).shape == (1, 2)
    g = kiln.Generator().manual_seed(3)
    assert kiln.rand(3, generator=g).shape == (3,)
    state = g.get_state()  # (seed, offset), and back
    first = kiln.rand(3, generator=g).tolist()
    g.set_state(state)
    assert state[0] == 3 and kiln.rand(3, generator=g).tolist() == first
    assert "add(Tensor self, Tensor other, *, Scalar alpha=1)" in kiln.add.__doc__


def _check_get(x, xn, key):
    got = x[key]
    want = xn[key]
    np.testing.assert_array_equal(np.asarray(got.numpy()), want, err_msg=f"key {key!r}")


def test_getitem_matches_numpy():
    xn = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    x = kiln.from_numpy(xn.copy())
    idx = np.array([2, 0, -1])
    keys = [0, -1, (1, 2), slice(None), slice(1, None), slice(None, None, 2), (slice(None), 1),
            (Ellipsis, 1), (None, 0), (0, None, Ellipsis, None), (1, slice(0, 3, 2), Ellipsis, -1),
            [1, 0], (slice(None), [0, 2]), (slice(None), slice(None), [3, 1]),
            (slice(None), [0, 1], [1, 2]), ([0, 1], slice(None), [1, 2]),
            (slice(None), [[0], [2]], [1, 3]), (Ellipsis, [0, 4]), (0, [1, 2], slice(None), [0, 1]),
            (slice(None), idx), xn[:, :, 0, 0] > 5, (0, xn[0, :, :, 0] > 20), (Ellipsis, xn[0, 0, 0] > 1)]
    for key in keys:
        k = key
        if isinstance(key, np.ndarray):
            k = kiln.from_numpy(key)
        elif isinstance(key, tuple):
            k = tuple(kiln.from_numpy(e) if isinstance(e, np.ndarray) else e for e in key)
        got = x[k]
        np.testing.assert_array_equal(got.numpy(), xn[key], err_msg=f"key {key!r}")
    assert x[0, 0, 0, 0].shape == () and x[0, 0, 0, 0].item() == 0
    assert x[1:].is_contiguous() and x[:, 1]._version == x._version  # basic indexing gives views


def test_setitem_matches_numpy():
    keys = [0, (1, 2), slice(1, None), (slice(None), 1), (Ellipsis, 0), [1, 0],
            (slice(None), [0, 2]), (slice(None), [0, 1], [1, 2]), ([0, 1], slice(None), [1, 2]),
            (slice(None), slice(None), [3, 1])]
    for key in keys:
        xn = np.zeros((2, 3, 4), dtype=np.float32)
        x = kiln.zeros(2, 3, 4)
        xn[key] = 7
        x[key] = 7
        np.testing.assert_array_equal(x.numpy(), xn, err_msg=f"key {key!r}")
        shape = xn[key].shape
        vn = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        xn[key] = vn
        x[key] = kiln.from_numpy(vn.copy())
        np.testing.assert_array_equal(x.numpy(), xn, err_msg=f"key {key!r} (tensor value)")
    x = kiln.arange(6.0)
    x[x > 2] = 0
    assert x.tolist() == [0, 1, 2, 0, 0, 0]
    x[1:3] = kiln.tensor([5.0, 6.0])
    assert x.tolist() == [0, 5, 6, 0, 0, 0]
    with pytest.raises(IndexError):
        x[10]
    with pytest.raises(IndexError):
        x[0, 0]
    with pytest.raises(ValueError):
        x[::-1]


def test_numpy_zero_copy():
    t = kiln.zeros(2, 3)
    n = t.numpy()
    n[1, 2] = 5  # writes through NumPy are seen by the tensor
    assert t[1, 2].item() == 5
    t.fill_(3)  # and the other way round
    assert n[0, 0] == 3
    v = t.transpose(0, 1).numpy()  # strided views stay views
    assert v.shape == (3, 2) and v.strides == (4, 12)
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    s = kiln.from_numpy(a)
    assert s.dtype is kiln.int32 and s.tolist() == a.tolist()
    a[0, 0] = 42
    assert s[0, 0].item() == 42
    s[1, 1] = -1
    assert a[1, 1] == -1
    st = kiln.from_numpy(a[:, ::2])  # a strided array keeps its strides
    assert st.stride() == (3, 2) and st.tolist() == a[:, ::2].tolist()
    assert np.shares_memory(np.asarray(t), n)
    ai = t.__array_interface__
    assert ai["typestr"] == "<f4" and ai["shape"] == (2, 3) and ai["data"][0] == t.data_ptr()
    del t  # the array keeps the storage alive
    n[0, 0] = 1
    assert n.sum() == 3 * 5 + 1
    for name in DTYPES:
        if name == "bfloat16":
            continue
        x = kiln.ones(3, dtype=getattr(kiln, name))
        assert x.numpy().dtype == np.dtype(name) and kiln.from_numpy(x.numpy()).dtype is x.dtype
    with pytest.raises(TypeError):
        kiln.ones(2, dtype=kiln.bfloat16).numpy()
    assert kiln.ones(2, dtype=kiln.bfloat16).tolist() == [1.0, 1.0]
    with pytest.raises(RuntimeError, match="requires grad"):
        kiln.ones(2, requires_grad=True).numpy()
    with pytest.raises(ValueError, match="negative strides"):
        kiln.from_numpy(np.arange(3.0)[::-1])
    with pytest.raises(TypeError):
        kiln.from_numpy(np.zeros(2, dtype=np.complex64))


def test_dlpack():
    t = kiln.arange(6.0).view(2, 3)
    assert t.__dlpack_device__() == (1, 0)
    n = np.from_dlpack(t)
    n[0, 0] = 9
    assert t[0, 0].item() == 9
    back = kiln.from_dlpack(n)
    back[1, 1] = -3
    assert t[1, 1].item() == -3
    u = kiln.from_dlpack(np.arange(4, dtype=np.int16))
    assert u.dtype is kiln.int16 and u.tolist() == [0, 1, 2, 3]


def test_misc_runtime():
    kiln.manual_seed(7)
    a = kiln.randn(5)
    kiln.manual_seed(7)
    assert kiln.randn(5).tolist() == a.tolist()
    n = kiln.get_num_threads()
    kiln.set_num_threads(1)
    assert kiln.get_num_threads() == 1
    kiln.set_num_threads(n)
    with pytest.raises(ValueError):
        kiln.set_num_threads(0)
