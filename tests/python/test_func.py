"""kiln.func over Python callables: against NumPy, closed forms and finite differences."""
import numpy as np
import pytest

import kiln
from kiln.func import grad, grad_and_value, hessian, jacfwd, jacrev, jvp, vjp, vmap


def arr(t):
    return t.detach().numpy()


def rnd(*shape, seed=0):
    return kiln.from_numpy(np.random.default_rng(seed).standard_normal(shape))  # float64


def fd_grad(f, x, eps=1e-6):
    """Central differences of a scalar function of a float64 NumPy array."""
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = eps
        g[i] = (f(x + e) - f(x - e)) / (2 * eps)
    return g


def f_np(x):
    return float((np.sin(x) * x * x).sum())


def f_k(x):
    return (x.sin() * x * x).sum()


def test_grad_matches_closed_form_and_fd():
    x = rnd(3, 4)
    g = arr(grad(f_k)(x))
    xn = arr(x)
    np.testing.assert_allclose(g, np.cos(xn) * xn**2 + 2 * xn * np.sin(xn), rtol=1e-10)
    np.testing.assert_allclose(g, fd_grad(f_np, xn), rtol=1e-6, atol=1e-8)
    assert not grad(f_k)(x).requires_grad


def test_grad_argnums_pytrees_and_aux():
    w, b, x = rnd(3, seed=1), rnd(1, seed=2), rnd(5, 3, seed=3)

    def loss(params, x, scale):
        w, b = params["w"], params["b"]
        out = x @ w + b
        return (out * out).sum() * scale, out

    (gw, gx), (value, out) = grad_and_value(loss, argnums=(0, 1), has_aux=True)(
        {"w": w, "b": b}, x, 0.5)
    wn, bn, xn = arr(w), arr(b), arr(x)
    o = xn @ wn + bn
    assert isinstance(gw, dict) and set(gw) == {"w", "b"}
    np.testing.assert_allclose(arr(gw["w"]), xn.T @ o, rtol=1e-10)
    np.testing.assert_allclose(arr(gw["b"]), [o.sum()], rtol=1e-10)
    np.testing.assert_allclose(arr(gx), np.outer(o, wn), rtol=1e-10)
    np.testing.assert_allclose(float(value), 0.5 * (o * o).sum(), rtol=1e-10)
    np.testing.assert_allclose(arr(out), o, rtol=1e-10)
    assert not out.requires_grad
    g, aux = grad(loss, has_aux=True)({"w": w, "b": b}, x, 0.5)
    np.testing.assert_allclose(arr(g["w"]), xn.T @ o, rtol=1e-10)


def test_grad_errors():
    x = rnd(3)
    with pytest.raises(ValueError):
        grad(lambda x: x * 2)(x)  # not 0-dim
    with pytest.raises(ValueError, match="argnum 2"):
        grad(f_k, argnums=2)(x)
    with pytest.raises(TypeError):
        grad(f_k)([1.0, 2.0])
    with pytest.raises(ZeroDivisionError):  # Python exceptions inside f come through
        grad(lambda x: 1 / 0)(x)


def test_nested_grad():
    x = rnd(4)
    d2 = grad(lambda x: grad(f_k)(x).sum())(x)
    xn = arr(x)
    # d/dx [cos x x^2 + 2x sin x] = -sin x x^2 + 4x cos x + 2 sin x
    np.testing.assert_allclose(arr(d2), -np.sin(xn) * xn**2 + 4 * xn * np.cos(xn) + 2 * np.sin(xn),
                               rtol=1e-9)


def test_vjp_multiple_outputs_and_reuse():
    x, y = rnd(3, seed=4), rnd(3, seed=5)
    (a, b), fn = vjp(lambda x, y: (x * y, (x * x).sum()), x, y)
    np.testing.assert_allclose(arr(a), arr(x) * arr(y))
    gx, gy = fn((kiln.ones(3, dtype=kiln.float64), kiln.tensor(2.0, dtype=kiln.float64)))
    np.testing.assert_allclose(arr(gx), arr(y) + 4 * arr(x), rtol=1e-12)
    np.testing.assert_allclose(arr(gy), arr(x), rtol=1e-12)
    gx2, _ = fn((kiln.zeros(3, dtype=kiln.float64), kiln.tensor(1.0, dtype=kiln.float64)))
    np.testing.assert_allclose(arr(gx2), 2 * arr(x), rtol=1e-12)
    with pytest.raises(ValueError):
        fn(kiln.ones(3, dtype=kiln.float64))


def test_jvp_vs_fd():
    x, v = rnd(5, seed=6), rnd(5, seed=7)
    out, t = jvp(f_k, (x,), (v,))
    xn, vn = arr(x), arr(v)
    np.testing.assert_allclose(float(out), f_np(xn), rtol=1e-12)
    fd = (f_np(xn + 1e-6 * vn) - f_np(xn - 1e-6 * vn)) / 2e-6
    np.testing.assert_allclose(float(t), fd, rtol=1e-6)
    with pytest.raises(ValueError):
        jvp(f_k, (x,), (v, v))


@pytest.mark.parametrize("jac", [jacrev, jacfwd])
def test_jacobians(jac):
    x = rnd(3, seed=8)
    A = rnd(2, 3, seed=9)
    J = jac(lambda x: (A @ x).tanh())(x)
    xn, An = arr(x), arr(A)
    np.testing.assert_allclose(arr(J), (1 - np.tanh(An @ xn) ** 2)[:, None] * An, rtol=1e-10)
    # several outputs and argnums: nested, outputs outermost
    (ja, jb), (ka, kb) = jac(lambda a, b: (a * b, (a * a).sum()), argnums=(0, 1))(x, x)
    np.testing.assert_allclose(arr(ja), np.diag(xn), rtol=1e-12)
    np.testing.assert_allclose(arr(ka), 2 * xn, rtol=1e-12)
    np.testing.assert_allclose(arr(kb), np.zeros(3))
    assert ja.shape == (3, 3) and ka.shape == (3,)


def test_hessian_vs_closed_form():
    x = rnd(3, seed=10)
    H = arr(hessian(f_k)(x))
    xn = arr(x)
    np.testing.assert_allclose(H, np.diag(-np.sin(xn) * xn**2 + 4 * xn * np.cos(xn) + 2 * np.sin(xn)),
                               rtol=1e-9, atol=1e-12)
    M = rnd(3, 3, seed=11)
    H2 = hessian(lambda x: x @ (M @ x))(x)
    np.testing.assert_allclose(arr(H2), arr(M) + arr(M).T, rtol=1e-10)


def test_vmap_in_out_dims_and_nesting():
    a, b = rnd(4, 3, seed=12), rnd(3, 4, seed=13)
    dots = vmap(lambda u, v: (u * v).sum(), in_dims=(0, 1))(a, b)
    np.testing.assert_allclose(arr(dots), (arr(a) * arr(b).T).sum(1), rtol=1e-12)
    c = rnd(3, seed=14)
    outer = vmap(vmap(lambda u, v: u * v, in_dims=(None, 0)), in_dims=(0, None))(c, c)
    np.testing.assert_allclose(arr(outer), np.outer(arr(c), arr(c)), rtol=1e-12)
    r = vmap(lambda u: (u * 2, u.sum()), out_dims=(1, 0))(a)
    np.testing.assert_allclose(arr(r[0]), 2 * arr(a).T)
    np.testing.assert_allclose(arr(r[1]), arr(a).sum(1), rtol=1e-12)
    d = vmap(lambda p, s: p["x"] * s, in_dims=({"x": 0}, None))({"x": a}, 3.0)
    np.testing.assert_allclose(arr(d), 3 * arr(a))
    big = rnd(10, 3, seed=15)
    np.testing.assert_allclose(arr(vmap(lambda u: u.exp().sum(), chunk_size=3)(big)),
                               np.exp(arr(big)).sum(1), rtol=1e-12)


def test_vmap_errors():
    a = rnd(4, 3)
    with pytest.raises(ValueError):
        vmap(lambda u: u, in_dims=None)(a)
    with pytest.raises(ValueError):
        vmap(lambda u, v: u + v)(a, rnd(5, 3))
    with pytest.raises(ValueError):
        vmap(lambda u: u, in_dims=(0, 0))(a)
    with pytest.raises(ValueError):
        vmap(lambda u, s: u, in_dims=(0, 0))(a, 1.0)


def test_per_sample_gradients():
    rng = np.random.default_rng(16)
    w = kiln.from_numpy(rng.standard_normal(3))
    xs = kiln.from_numpy(rng.standard_normal((6, 3)))
    ys = kiln.from_numpy(rng.standard_normal(6))

    def loss(w, x, y):
        return ((x * w).sum() - y) ** 2

    g = vmap(grad(loss), in_dims=(None, 0, 0))(w, xs, ys)
    wn, xn, yn = arr(w), arr(xs), arr(ys)
    want = 2 * ((xn @ wn) - yn)[:, None] * xn
    np.testing.assert_allclose(arr(g), want, rtol=1e-10)
    for i in range(6):
        np.testing.assert_allclose(arr(grad(loss)(w, xs[i], ys[i])), want[i], rtol=1e-10)
