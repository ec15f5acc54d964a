"""In-place writes to views of tensors that require grad (PyTorch's CopySlices; issue 18): the
issue's examples and model-code patterns, with gradients compared to values derived by hand and
to central finite differences in float64."""
import numpy as np
import pytest

import kiln


def leaf(a):
    return kiln.tensor(np.asarray(a, dtype=np.float64), requires_grad=True)


def rand(*shape, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, shape)


def numeric_grads(f, arrays, eps=1e-6):
    """Central differences of the scalar f(*arrays) (numpy in, float out) for each array."""
    grads = []
    for i, a in enumerate(arrays):
        g = np.zeros_like(a)
        for k in np.ndindex(a.shape):
            hi = [b.copy() for b in arrays]
            lo = [b.copy() for b in arrays]
            hi[i][k] += eps
            lo[i][k] -= eps
            g[k] = (f(*hi) - f(*lo)) / (2 * eps)
        grads.append(g)
    return grads


def check_grads(program, *arrays):
    """program(*leaves) -> a scalar kiln tensor: its gradients match central differences."""
    leaves = [leaf(a) for a in arrays]
    program(*leaves).backward()

    def value(*xs):
        with kiln.no_grad():
            return float(program(*[kiln.tensor(x) for x in xs]))
    for x, want in zip(leaves, numeric_grads(value, [np.array(a, dtype=np.float64) for a in arrays])):
        np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-6, atol=1e-7)


def test_strided_slice_assignment():
    x, w, c = rand(4, 5, seed=1), rand(2, 3, seed=2), rand(4, 5, seed=3)
    xt, wt = leaf(x), leaf(w)
    y = xt * 2
    y[1:3, ::2] = wt
    assert y.grad_fn.name() == "CopySlices"
    (y * kiln.tensor(c)).sum().backward()
    inside = np.zeros((4, 5), dtype=bool)
    inside[1:3, ::2] = True
    np.testing.assert_allclose(xt.grad.numpy(), np.where(inside, 0, 2 * c))
    np.testing.assert_allclose(wt.grad.numpy(), c[1:3, ::2])

    def program(x, w):
        y = x * x
        y[1:3, ::2] = w * 3
        return (y * y).sum()
    check_grads(program, x, w)


def test_column_assignment_of_a_number():
    x, c = rand(3, 4, seed=4), rand(3, 4, seed=5)
    xt = leaf(x)
    y = xt.sin()
    y[:, -1] = 7
    assert y[:, -1].tolist() == [7.0] * 3
    (y * kiln.tensor(c)).sum().backward()
    want = c * np.cos(x)
    want[:, -1] = 0
    np.testing.assert_allclose(xt.grad.numpy(), want, rtol=1e-12)

    def program(x):
        y = x.sin()
        y[:, -1] = 7
        return (y * y).sum()
    check_grads(program, x)


def test_row_assigned_from_another_row():
    x, c = rand(5, 3, seed=6), rand(5, 3, seed=7)
    xt = leaf(x)
    y = xt * 3
    y[4] = y[0]
    (y * kiln.tensor(c)).sum().backward()
    want = 3 * c
    want[0] += 3 * c[4]
    want[4] = 0
    np.testing.assert_allclose(xt.grad.numpy(), want, atol=1e-12)

    def program(x):
        y = x.sin()
        y[4] = y[0]
        return (y * y).sum()
    check_grads(program, x)


def test_view_of_a_non_leaf_modified_in_place():
    x, b, w, c = rand(2, 3, seed=8), rand(6, seed=9), rand(3, 2, seed=10), rand(2, 3, seed=11)
    xt, bt, wt = leaf(x), leaf(b), leaf(w)
    h = xt * 1
    h.view(6).add_(bt)
    h.view(3, 2).mul_(wt)
    (h * kiln.tensor(c)).sum().backward()
    w23 = w.reshape(2, 3)
    np.testing.assert_allclose(xt.grad.numpy(), c * w23, atol=1e-12)
    np.testing.assert_allclose(bt.grad.numpy(), (c * w23).reshape(6), atol=1e-12)
    np.testing.assert_allclose(wt.grad.numpy(), (c * (x + b.reshape(2, 3))).reshape(3, 2), atol=1e-12)

    def program(x, b, w):
        h = x * x
        h.view(6).add_(b)
        h.t()[1:3].mul_(w)  # transpose, then slice
        return h.exp().sum()
    check_grads(program, x, b, rand(2, 2, seed=12))


def test_views_see_a_write_to_their_base():
    x, c = rand(3, 2, seed=13), rand(2, seed=14)
    xt = leaf(x)
    h = xt * 1
    v = h[1]
    h.mul_(3)
    assert v.grad_fn.name() == "AsStridedBackward0"
    (v * kiln.tensor(c)).sum().backward()
    want = np.zeros((3, 2))
    want[1] = 3 * c
    np.testing.assert_allclose(xt.grad.numpy(), want, atol=1e-12)

    def program(x):
        h = x * x
        first, rest = h[0], h[1:]
        h.mul_(x)
        first.add_(x[2])
        return (rest * first).sum()
    check_grads(program, x)


def test_kv_cache_loop():
    T, D = 4, 3
    x, w, c = rand(T, D, seed=15), rand(D, seed=16), rand(T, D, seed=17)
    xt, wt = leaf(x), leaf(w)
    cache = kiln.zeros(T, D, dtype=kiln.float64)
    for t in range(T):
        cache[t] = xt[t] * wt
    assert cache.requires_grad and not cache.is_leaf
    (cache * kiln.tensor(c)).sum().backward()
    np.testing.assert_allclose(xt.grad.numpy(), c * w, atol=1e-12)
    np.testing.assert_allclose(wt.grad.numpy(), (c * x).sum(0), atol=1e-12)

    def program(x, w):
        cache = kiln.zeros(T, D, dtype=kiln.float64)
        for t in range(T):
            k = x[t] * w
            if t > 0:
                k = k + cache[t - 1]
            cache[t] = k.tanh()
        return (cache @ cache.t()).sum()
    check_grads(program, x, w)


def test_first_write_makes_a_plain_tensor_require_grad():
    w = leaf([1.5, -2.0])
    y = kiln.zeros(4, dtype=kiln.float64)
    v = y[1:3]
    v.copy_(w)
    assert y.requires_grad and not y.is_leaf and y.grad_fn.name() == "CopySlices"
    (y * kiln.tensor([1.0, 2.0, 3.0, 4.0], dtype=kiln.float64)).sum().backward()
    assert w.grad.tolist() == [2.0, 3.0]
    # Other views of the base would not see its history: refused, with the reason.
    z = kiln.zeros(4, dtype=kiln.float64)
    a, b = z[:2], z[2:]
    with pytest.raises(NotImplementedError, match="share their storage"):
        a.copy_(w)


def test_mixed_basic_and_mask_assignment_into_a_plain_tensor():
    """y[1:3, mask] = w: __setitem__'s intermediate view must not block the first write."""
    w = kiln.ones(2, 2, dtype=kiln.float64, requires_grad=True)
    y = kiln.zeros(4, 4, dtype=kiln.float64)
    y[1:3, kiln.tensor([True, False, True, False])] = w * 2
    (y * kiln.arange(16.0, dtype=kiln.float64).view(4, 4)).sum().backward()
    assert w.grad.tolist() == [[8.0, 12.0], [16.0, 20.0]]


def test_pytorch_errors_remain():
    x = leaf(rand(2, 3, seed=18))
    with pytest.raises(RuntimeError, match="a view of a leaf Variable that requires grad"):
        x[0] = 1.0
    with pytest.raises(RuntimeError, match="a view of a leaf Variable that requires grad"):
        x.view(6).add_(1)
    h = x * 1
    with kiln.no_grad():
        v = h[0]
    with pytest.raises(RuntimeError, match="created in no_grad mode"):
        v.mul_(leaf([1.0, 2.0, 3.0]))
    e = x.exp()  # exp saves its result: writing it fails at backward, as in PyTorch
    e[:, -1] = 7
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        e.sum().backward()


def test_masking_and_residual_writes():
    mask = rand(3, 4, seed=19) > 0
    m = kiln.tensor(mask)

    def program(x, r):
        y = x * x
        y[m] = 0                   # on the tensor itself
        y[2][m[2]] = 0.5           # through a view
        y[:, :2] += r              # a residual write
        return y.exp().sum()
    check_grads(program, rand(3, 4, seed=20), rand(3, 2, seed=21))
    x, r = leaf(rand(3, 4, seed=22)), leaf(rand(3, 2, seed=23))
    y = x.sin()
    y[:, :2] += r
    y.sum().backward()
    assert r.grad.tolist() == [[1.0, 1.0]] * 3
    np.testing.assert_allclose(x.grad.numpy(), np.cos(x.detach().numpy()), rtol=1e-12)


def test_double_backward_through_a_view_write():
    x = leaf(rand(4, seed=24))
    y = x * x
    y[1:3] *= x[:2]
    (gx,) = kiln.autograd.grad((y * y).sum(), x, create_graph=True)
    (ggx,) = kiln.autograd.grad(gx.sum(), x)

    def first(a):  # d/dx sum(y^2), by hand: y = x^2 with y[1:3] = x[1:3]^2 x[0:2]
        y = a * a
        y[1:3] = a[1:3] ** 2 * a[:2]
        g = 2 * y * 2 * a
        g[1:3] = 2 * y[1:3] * 2 * a[1:3] * a[:2]
        g[:2] += 2 * y[1:3] * a[1:3] ** 2
        return g
    xv = x.detach().numpy()
    np.testing.assert_allclose(gx.detach().numpy(), first(xv), rtol=1e-10)
    want = numeric_grads(lambda a: first(a).sum(), [xv.copy()])[0]
    np.testing.assert_allclose(ggx.numpy(), want, rtol=1e-5, atol=1e-6)


def test_forward_mode_through_a_view_write():
    def f(x):
        cache = kiln.zeros(3, 2, dtype=kiln.float64)
        cache[1] = x * 2
        return cache

    x, t = kiln.tensor([1.0, 2.0], dtype=kiln.float64), kiln.tensor([0.5, -1.0], dtype=kiln.float64)
    out, jv = kiln.func.jvp(f, (x,), (t,))
    assert out.tolist() == [[0.0, 0.0], [2.0, 4.0], [0.0, 0.0]]
    assert jv.tolist() == [[0.0, 0.0], [1.0, -2.0], [0.0, 0.0]]


def test_remote_tensors_match_local():
    def program(x, w, dev):
        y = x * 2
        y[1:3, ::2] = w
        v = y[0]
        y.mul_(3)
        cache = kiln.zeros(2, 2, dtype=kiln.float64, device=dev)
        cache[0] = w
        cache[1] = w * 2
        return (y * y).sum() + v.sum() + (cache * cache).sum()

    x, w = rand(3, 4, seed=25), rand(2, seed=26)
    grads = []
    with kiln.connect("inproc") as s:
        for dev in (None, s.device):
            xt, wt = kiln.tensor(x), kiln.tensor(w)
            if dev is not None:
                xt, wt = xt.to(dev), wt.to(dev)
            xt.requires_grad_()
            wt.requires_grad_()
            program(xt, wt, dev).backward()
            grads.append((xt.grad.numpy(), wt.grad.numpy()))
    for local, remote in zip(*grads):
        np.testing.assert_allclose(remote, local, rtol=1e-12)
