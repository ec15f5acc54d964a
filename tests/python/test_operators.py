"""The Tensor type's C++ arithmetic slots (Note [Python dispatch speed] in module.cpp): results and
dtypes equal the op bindings' for every operand kind."""
import numpy as np
import pytest

import kiln


def arr(t):
    return t.detach().numpy()


@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64, kiln.int32, kiln.int64, kiln.float16])
@pytest.mark.parametrize("other", [2, 0.5, True, -3])
def test_number_operands_match_ops(dtype, other):
    a = kiln.tensor([[1, 2, 3], [4, 5, 6]], dtype=dtype)
    cases = [(lambda: a + other, lambda: kiln.add(a, other)), (lambda: other + a, lambda: kiln.add(other, a)),
             (lambda: a - other, lambda: kiln.sub(a, other)), (lambda: other - a, lambda: kiln.sub(other, a)),
             (lambda: a * other, lambda: kiln.mul(a, other)), (lambda: other * a, lambda: kiln.mul(other, a)),
             (lambda: a / other, lambda: kiln.div(a, other)), (lambda: other / a, lambda: kiln.div(other, a))]
    for op, ref in cases:
        try:
            want = ref()
        except TypeError:  # subtracting a bool
            with pytest.raises(TypeError):
                op()
            continue
        got = op()
        assert got.dtype is want.dtype
        np.testing.assert_array_equal(arr(got), arr(want))


def test_promotion():
    i = kiln.tensor([1, 2], dtype=kiln.int32)
    assert (i + 1).dtype is kiln.int32
    assert (i + 1.5).dtype is kiln.float32
    assert (i / 2).dtype is kiln.float32
    np.testing.assert_allclose(arr(i / 2), [0.5, 1.0])
    b = kiln.tensor([True, False])
    assert (b + 1).dtype is kiln.int64
    assert (b + True).dtype is kiln.bool
    h = kiln.tensor([1.0], dtype=kiln.bfloat16)
    assert (h * 0.1).dtype is kiln.bfloat16
    assert (kiln.ones(2) + kiln.ones(2, dtype=kiln.float64)).dtype is kiln.float64
    assert (kiln.ones(2) + np.float64(2.0)).dtype is kiln.float32
    assert (kiln.ones(2) + 2**40).dtype is kiln.float32


def test_tensor_operands_broadcast_and_grad():
    x = kiln.tensor([[1.0, 2.0]], requires_grad=True)
    y = kiln.tensor([[3.0], [4.0]])
    z = ((x + y) * x - y / x) * 2 - 1
    np.testing.assert_allclose(arr(z), 2 * ((np.array([[1, 2]]) + [[3], [4]]) * [[1, 2]]
                                            - np.array([[3], [4]]) / [[1, 2]]) - 1, rtol=1e-6)
    z.sum().backward()
    xs = np.array([[1.0, 2.0]])  # sum over y in {3, 4} of 2 (2x + y + y / x^2)
    np.testing.assert_allclose(arr(x.grad), 2 * (4 * xs + 7 + 7 / xs**2), rtol=1e-6)


def test_inplace_keeps_identity():
    a = kiln.ones(3)
    ref = a
    a += 2
    a *= 3
    a -= kiln.ones(3)
    a /= 2
    assert a is ref
    np.testing.assert_array_equal(arr(a), [4.0, 4.0, 4.0])
    i = kiln.ones(2, dtype=kiln.int64)
    with pytest.raises(TypeError, match="can't be cast"):
        i /= 2  # the float result cannot be written into an integer tensor


def test_unsupported_operands():
    a = kiln.ones(2)
    with pytest.raises(TypeError):
        a + "x"
    with pytest.raises(TypeError):
        "x" - a
    with pytest.raises(TypeError):
        a * object()
    assert a.__add__("x") is NotImplemented
    with pytest.raises(ValueError):
        kiln.ones(2) + kiln.ones(3)


def test_large_operands_release_the_gil():
    import threading
    n = 1 << 17  # above the GIL-release threshold
    a, b = kiln.ones(n), kiln.full([n], 2.0)
    results = []

    def work():
        c = a * b + 1
        c -= b
        results.append(float(c.sum()))
    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [float(n)] * 3
    with pytest.raises(ValueError):
        kiln.ones(n) + kiln.ones(n + 1)  # an error raised without the GIL comes back as usual
