"""Kiln's error kinds map to Python exceptions with the C++ message; bad arguments never crash."""
import pytest

import kiln


def test_error_kinds():
    a = kiln.ones(2, 3)
    with pytest.raises(ValueError, match=r"2x3 and 2x3"):
        kiln.mm(a, a)
    with pytest.raises(IndexError, match="out of range"):
        a.select(0, 5)
    with pytest.raises(IndexError):
        a.sum(7)
    with pytest.raises(TypeError):
        kiln.ones(2, dtype=kiln.int64).add_(1.5)
    with pytest.raises(ValueError, match="not broadcastable"):
        kiln.ones(2) + kiln.ones(3)
    with pytest.raises(RuntimeError, match="does not require grad|requires_grad"):
        kiln.ones(2).sum().backward()


def test_argument_errors():
    a = kiln.ones(2, 3)
    with pytest.raises(TypeError, match="argument 'size' must be int\\[\\], not str"):
        a.view("x")
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        kiln.add(a, a, bogus=1)
    with pytest.raises(TypeError, match="missing required argument 'other'"):
        kiln.add(a)
    with pytest.raises(TypeError, match="positional arguments"):
        kiln.relu(a, a)
    with pytest.raises(TypeError, match="multiple values"):
        kiln.add(a, a, other=a)
    with pytest.raises(TypeError, match="no overload matches"):
        kiln.max(a, "x")
    with pytest.raises(TypeError):
        kiln.cat([a, 1])
    with pytest.raises(TypeError):
        kiln.zeros(2, dtype="float32")
    with pytest.raises(TypeError):
        kiln.ones(2 ** 70)
    with pytest.raises((ValueError, RuntimeError)):
        kiln.ones(-1)
    with pytest.raises(TypeError):
        a.sum(dim=1.5)
    with pytest.raises(ValueError):
        kiln.zeros(2, device="gpu7")
    with pytest.raises(TypeError):
        kiln.Tensor()
    assert kiln.ones(2).sum().item() == 2  # the interpreter is fine afterwards
