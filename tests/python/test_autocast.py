"""kiln.autocast over kiln::AutocastGuard, and kiln.utils.checkpoint over the C++ activation
checkpoint (RNG replay)."""
import threading

import numpy as np
import pytest

import kiln
from kiln.utils.checkpoint import checkpoint


def test_autocast_context_policies_and_grads():
    x = kiln.randn(4, 3)
    w = kiln.randn(5, 3, requires_grad=True)
    t = kiln.tensor([0, 1, 2, 3])
    assert not kiln.is_autocast_enabled()
    with kiln.autocast("cpu", dtype=kiln.bfloat16):
        assert kiln.is_autocast_enabled() and kiln.is_autocast_enabled("cpu")
        assert kiln.get_autocast_dtype("cpu") is kiln.bfloat16
        y = kiln.linear(x, w)
        loss = kiln.cross_entropy(y, t)
        assert y.dtype is kiln.bfloat16        # lower_precision
        assert loss.dtype is kiln.float32      # fp32
        assert (x + x).dtype is kiln.float32   # no policy
    assert not kiln.is_autocast_enabled()
    loss.backward()
    assert w.grad.dtype is kiln.float32


def test_autocast_nesting_disable_and_decorator():
    a = kiln.randn(2, 2)
    with kiln.autocast("cpu"):
        with kiln.autocast("cpu", enabled=False):
            assert not kiln.is_autocast_enabled()
            assert (a @ a).dtype is kiln.float32
        assert kiln.is_autocast_enabled()
        with kiln.autocast("cpu", dtype=kiln.float16):
            assert (a @ a).dtype is kiln.float16
        assert (a @ a).dtype is kiln.bfloat16

    @kiln.autocast("cpu")
    def mm(u):
        return u @ u
    assert mm(a).dtype is kiln.bfloat16
    assert mm(a).dtype is kiln.bfloat16  # reusable
    assert not kiln.is_autocast_enabled()


def test_autocast_is_per_thread_and_errors():
    seen = []
    with kiln.autocast("cpu"):
        th = threading.Thread(target=lambda: seen.append(kiln.is_autocast_enabled()))
        th.start()
        th.join()
    assert seen == [False]
    with pytest.raises(ValueError):
        with kiln.autocast("cpu", dtype=kiln.float32):
            pass
    with pytest.raises(TypeError):
        kiln.autocast(kiln.float16)
    assert not kiln.is_autocast_enabled()


def test_exception_inside_autocast_restores_state():
    with pytest.raises(RuntimeError):
        with kiln.autocast("cpu"):
            raise RuntimeError("boom")
    assert not kiln.is_autocast_enabled()


def block(x, w, p):
    return kiln.dropout((x @ w).tanh(), p) * 2


def test_checkpoint_matches_plain_call_with_dropout():
    x = kiln.randn(8, 6, requires_grad=True)
    w = kiln.randn(6, 6, requires_grad=True)
    kiln.manual_seed(3)
    y = checkpoint(block, x, w, 0.5, use_reentrant=False)
    y.sum().backward()
    gx, gw = x.grad.numpy().copy(), w.grad.numpy().copy()
    x.grad, w.grad = None, None
    kiln.manual_seed(3)
    y2 = block(x, w, 0.5)
    y2.sum().backward()
    np.testing.assert_array_equal(y.detach().numpy(), y2.detach().numpy())
    np.testing.assert_allclose(gx, x.grad.numpy(), rtol=1e-6)
    np.testing.assert_allclose(gw, w.grad.numpy(), rtol=1e-6)


def test_checkpoint_tuple_outputs_kwargs_and_errors():
    x = kiln.randn(3, requires_grad=True)
    a, b = checkpoint(lambda u, scale=1.0: (u * scale, u.exp()), x, scale=3.0)
    (a.sum() + b.sum()).backward()
    np.testing.assert_allclose(x.grad.numpy(), 3 + np.exp(x.detach().numpy()), rtol=1e-6)
    with kiln.no_grad():
        assert not checkpoint(lambda u: u * 2, x).requires_grad
    with pytest.raises(TypeError, match="return a Tensor"):
        checkpoint(lambda u: 3, x)
