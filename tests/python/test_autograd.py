"""Autograd through the kiln package: backward, .grad, autograd.grad, grad modes as context
managers and decorators, hooks, custom Functions in Python."""
import numpy as np
import pytest

import kiln


def test_backward_and_grad():
    x = kiln.tensor([1.0, 2.0, 3.0], requires_grad=True)
    assert x.is_leaf and x.grad is None and x.grad_fn is None
    y = (x * x).sum()
    assert y.grad_fn.name() == "SumBackward0" and not y.is_leaf
    assert y.grad_fn.next_functions[0][0].name() == "MulBackward0"
    y.backward()
    assert x.grad.tolist() == [2.0, 4.0, 6.0]
    (x * 3).sum().backward()  # accumulates
    assert x.grad.tolist() == [5.0, 7.0, 9.0]
    x.grad = None
    assert x.grad is None
    z = x * 2
    z.backward(kiln.ones(3))
    assert x.grad.tolist() == [2.0, 2.0, 2.0]
    (gx,) = kiln.autograd.grad((x ** 3).sum(), x)
    np.testing.assert_allclose(gx.numpy(), 3 * x.detach().numpy() ** 2)
    gx, = kiln.autograd.grad((x ** 3).sum(), [x], create_graph=True)
    (ggx,) = kiln.autograd.grad(gx.sum(), x)
    np.testing.assert_allclose(ggx.numpy(), 6 * x.detach().numpy())
    w = kiln.ones(3, requires_grad=True)
    kiln.autograd.backward([(w * 4).sum()])
    assert w.grad.tolist() == [4.0] * 3
    u = kiln.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError):
        kiln.autograd.grad((x * 2).sum(), [x, u])
    assert kiln.autograd.grad((x * 2).sum(), [x, u], allow_unused=True)[1] is None


def test_retain_grad_and_requires_grad():
    x = kiln.ones(2, requires_grad=True)
    h = x * 2
    h.retain_grad()
    (h * h).sum().backward()
    assert h.retains_grad and h.grad.tolist() == [4.0, 4.0]
    t = kiln.ones(2)
    t.requires_grad = True
    assert t.requires_grad and t.requires_grad_(False) is t and not t.requires_grad
    d = (x * 2).detach()
    assert not d.requires_grad and d.grad_fn is None
    with pytest.raises(RuntimeError):
        kiln.ones(2, dtype=kiln.int64).requires_grad_()


def test_grad_modes():
    x = kiln.ones(2, requires_grad=True)
    with kiln.no_grad():
        assert not kiln.is_grad_enabled() and not (x * 2).requires_grad
        with kiln.enable_grad():
            assert (x * 2).requires_grad
    assert kiln.is_grad_enabled()

    @kiln.no_grad()
    def f(a):
        return a * 2

    @kiln.no_grad
    def g(a):
        return a * 2

    assert not f(x).requires_grad and not g(x).requires_grad and kiln.is_grad_enabled()
    kiln.set_grad_enabled(False)
    assert not kiln.is_grad_enabled()
    kiln.set_grad_enabled(True)
    with kiln.set_grad_enabled(False):
        assert not (x * 2).requires_grad
    assert kiln.is_grad_enabled()
    with kiln.inference_mode():
        assert kiln.is_inference_mode_enabled()
        y = x * 2
        assert not y.requires_grad and y.is_inference()
    assert not kiln.is_inference_mode_enabled()

    @kiln.inference_mode()
    def h(a):
        return a * 2

    @kiln.inference_mode
    def k(a):
        return a * 2

    assert h(x).is_inference() and k(x).is_inference()
    with kiln.inference_mode(False):
        assert not kiln.is_inference_mode_enabled()
    # an exception inside restores the mode
    with pytest.raises(ZeroDivisionError):
        with kiln.no_grad():
            1 / 0
    assert kiln.is_grad_enabled()


def test_hooks():
    x = kiln.ones(3, requires_grad=True)
    seen = []
    h = x.register_hook(lambda g: seen.append(g.tolist()))
    y = x * 2
    y.register_hook(lambda g: g * 10)  # replaces the gradient flowing on
    y.sum().backward()
    assert seen == [[20.0] * 3] and x.grad.tolist() == [20.0] * 3
    h.remove()
    x.grad = None
    (x * 2).sum().backward()
    assert len(seen) == 1

    def bad(g):
        raise KeyError("from the hook")

    z = kiln.ones(2, requires_grad=True)
    z.register_hook(bad)
    with pytest.raises(KeyError, match="from the hook"):
        (z * 2).sum().backward()


class Exp(kiln.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * y


class MulConst(kiln.autograd.Function):
    @staticmethod
    def forward(ctx, x, c):
        ctx.c = c
        assert ctx.needs_input_grad == (True, False)
        return x * c, x + 0

    @staticmethod
    def backward(ctx, g1, g2):
        return g1 * ctx.c + g2, None


def test_custom_function():
    x = kiln.tensor([0.0, 1.0], requires_grad=True)
    y = Exp.apply(x)
    assert y.grad_fn.name() == "ExpBackward" and y.requires_grad
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.exp([0.0, 1.0]), rtol=1e-6)
    x.grad = None
    a, b = MulConst.apply(x, 3.0)
    (a + b).sum().backward()
    assert x.grad.tolist() == [4.0, 4.0]
    with kiln.no_grad():
        assert not Exp.apply(x).requires_grad

    class Wrong(kiln.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1

        @staticmethod
        def backward(ctx, g):
            return g, g

    with pytest.raises(RuntimeError, match="incorrect number of gradients"):
        Wrong.apply(x).sum().backward()


def test_an_output_kept_on_ctx_is_named():
    """ctx.y = y for an output is a reference cycle through the C++ node that Python's collector
    cannot break (see the warning); save_for_backward is not, and says nothing."""
    import warnings

    ctxs = []

    class KeepsOutput(kiln.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = x.exp()
            ctx.y = y
            ctxs.append(ctx)
            return y

        @staticmethod
        def backward(ctx, g):
            return g * ctx.y

    x = kiln.ones(3, requires_grad=True)
    with pytest.warns(UserWarning, match="KeepsOutput.forward keeps its output as ctx.y"):
        KeepsOutput.apply(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Exp.apply(x).sum().backward()
        with kiln.no_grad():
            KeepsOutput.apply(x)  # no graph, no cycle
    for ctx in ctxs:  # the test's own cycle, broken by hand
        del ctx.y
