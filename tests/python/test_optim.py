"""kiln.optim: optimizer updates vs NumPy references over several steps, param groups, state
dicts; schedulers vs closed forms."""
import math

import numpy as np
import pytest

import kiln
import kiln.nn as nn
from kiln.optim import lr_scheduler as S

STEPS = 4


def setup(seed=0):
    """Two parameters and a fixed gradient sequence: grads[t][i] for step t, param i."""
    rng = np.random.default_rng(seed)
    init = [rng.standard_normal((3, 2)).astype(np.float32), rng.standard_normal(4).astype(np.float32)]
    grads = [[rng.standard_normal(p.shape).astype(np.float32) for p in init] for _ in range(STEPS)]
    params = [nn.Parameter(kiln.tensor(p)) for p in init]
    return init, grads, params


def run(opt_cls, ref_update, **kw):
    init, grads, params = setup()
    opt = opt_cls(params, **kw)
    ref = [p.astype(np.float64) for p in init]
    state = [{} for _ in ref]
    for t in range(STEPS):
        for p, g in zip(params, grads[t]):
            p.grad = kiln.tensor(g)
        opt.step()
        for i in range(len(ref)):
            ref[i] = ref_update(ref[i], grads[t][i].astype(np.float64), state[i], t + 1, **kw)
    for p, r in zip(params, ref):
        np.testing.assert_allclose(p.detach().numpy(), r, rtol=1e-5, atol=1e-6)
    return opt, params


def sgd_ref(p, g, s, t, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False, maximize=False):
    g = -g if maximize else g
    g = g + weight_decay * p
    if momentum:
        s["b"] = g.copy() if t == 1 else momentum * s["b"] + (1 - dampening) * g
        g = g + momentum * s["b"] if nesterov else s["b"]
    return p - lr * g


def adam_ref(p, g, s, t, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False,
             decoupled=False, maximize=False):
    g = -g if maximize else g
    if decoupled:
        p = p * (1 - lr * weight_decay)
    else:
        g = g + weight_decay * p
    b1, b2 = betas
    s["m"] = b1 * s.get("m", 0) + (1 - b1) * g
    s["v"] = b2 * s.get("v", 0) + (1 - b2) * g * g
    v = s["v"]
    if amsgrad:
        s["vmax"] = np.maximum(s.get("vmax", 0), v)
        v = s["vmax"]
    denom = np.sqrt(v) / math.sqrt(1 - b2 ** t) + eps
    return p - lr / (1 - b1 ** t) * s["m"] / denom


def rmsprop_ref(p, g, s, t, lr, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0, centered=False):
    g = g + weight_decay * p
    s["sq"] = alpha * s.get("sq", 0) + (1 - alpha) * g * g
    if centered:
        s["ga"] = alpha * s.get("ga", 0) + (1 - alpha) * g
        avg = np.sqrt(s["sq"] - s["ga"] ** 2) + eps
    else:
        avg = np.sqrt(s["sq"]) + eps
    if momentum:
        s["b"] = momentum * s.get("b", 0) + g / avg
        return p - lr * s["b"]
    return p - lr * g / avg


def adagrad_ref(p, g, s, t, lr, lr_decay=0, weight_decay=0, initial_accumulator_value=0, eps=1e-10):
    g = g + weight_decay * p
    s["sum"] = s.get("sum", initial_accumulator_value) + g * g
    return p - lr / (1 + (t - 1) * lr_decay) * g / (np.sqrt(s["sum"]) + eps)


@pytest.mark.parametrize("kw", [dict(lr=0.1), dict(lr=0.1, momentum=0.9),
                                dict(lr=0.05, momentum=0.8, dampening=0.3, weight_decay=0.1),
                                dict(lr=0.1, momentum=0.9, nesterov=True, maximize=True)])
def test_sgd(kw):
    opt, params = run(kiln.optim.SGD, sgd_ref, **kw)
    if kw.get("momentum"):
        assert set(opt.state[params[0]]) == {"momentum_buffer"}


@pytest.mark.parametrize("kw", [dict(lr=0.01), dict(lr=0.02, betas=(0.8, 0.9), weight_decay=0.1),
                                dict(lr=0.01, amsgrad=True, maximize=True)])
def test_adam(kw):
    opt, params = run(kiln.optim.Adam, adam_ref, **kw)
    assert opt.state[params[1]]["step"].item() == STEPS


@pytest.mark.parametrize("kw", [dict(lr=0.01), dict(lr=0.02, weight_decay=0.5, amsgrad=True)])
def test_adamw(kw):
    kw.setdefault("weight_decay", 1e-2)
    run(kiln.optim.AdamW, lambda *a, **k: adam_ref(*a, decoupled=True, **k), **kw)


@pytest.mark.parametrize("kw", [dict(lr=0.01), dict(lr=0.01, momentum=0.9, centered=True,
                                                    weight_decay=0.1)])
def test_rmsprop(kw):
    run(kiln.optim.RMSprop, rmsprop_ref, **kw)


@pytest.mark.parametrize("kw", [dict(lr=0.1), dict(lr=0.1, lr_decay=0.1, weight_decay=0.1,
                                                   initial_accumulator_value=0.5)])
def test_adagrad(kw):
    run(kiln.optim.Adagrad, adagrad_ref, **kw)


def test_param_groups_zero_grad_and_errors():
    a, b = nn.Parameter(kiln.ones(2)), nn.Parameter(kiln.ones(2))
    opt = kiln.optim.SGD([{"params": [a]}, {"params": b, "lr": 1.0}], lr=0.1)
    assert [g["lr"] for g in opt.param_groups] == [0.1, 1.0]
    a.grad, b.grad = kiln.ones(2), kiln.ones(2)
    opt.step()
    np.testing.assert_allclose(a.detach().numpy(), [0.9, 0.9])
    np.testing.assert_allclose(b.detach().numpy(), [0.0, 0.0])
    opt.zero_grad(set_to_none=False)
    assert a.grad.tolist() == [0, 0]
    opt.zero_grad()
    assert a.grad is None
    opt.step()  # no gradients: nothing moves
    with pytest.raises(ValueError, match="more than one parameter group"):
        opt.add_param_group({"params": [a]})
    with pytest.raises(ValueError, match="empty parameter list"):
        kiln.optim.Adam([])
    with pytest.raises(ValueError, match="Invalid learning rate"):
        kiln.optim.SGD([a], lr=-1)
    with pytest.raises(ValueError, match="Nesterov"):
        kiln.optim.SGD([a], lr=0.1, nesterov=True)


def test_closure():
    p = nn.Parameter(kiln.tensor([2.0]))
    opt = kiln.optim.SGD([p], lr=0.25)

    def closure():
        opt.zero_grad()
        loss = (p * p).sum()
        loss.backward()
        return loss
    assert opt.step(closure).item() == 4.0
    assert p.item() == 1.0


def test_state_dict_resume_matches_uninterrupted():
    def train(opt, params, grads):
        for g in grads:
            for p, gi in zip(params, g):
                p.grad = kiln.tensor(gi)
            opt.step()
    init, grads, params = setup()
    full = kiln.optim.Adam(params, lr=0.01, amsgrad=True)
    train(full, params, grads)
    _, _, p2 = setup()
    first = kiln.optim.Adam(p2, lr=0.01, amsgrad=True)
    train(first, p2, grads[:2])
    sd = first.state_dict()
    assert sorted(sd["state"]) == [0, 1] and sd["param_groups"][0]["params"] == [0, 1]
    assert set(sd["state"][0]) == {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"}
    p3 = [nn.Parameter(p.detach().clone()) for p in p2]
    resumed = kiln.optim.Adam(p3, lr=0.5, amsgrad=True)
    resumed.load_state_dict(sd)
    assert resumed.param_groups[0]["lr"] == 0.01
    train(resumed, p3, grads[2:])
    for a, b in zip(params, p3):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-6)


# ---- schedulers ----------------------------------------------------------------------------------
def lrs(sched, n):
    out = []
    for _ in range(n):
        out.append(sched.get_last_lr()[0])
        sched.optimizer.step()
        sched.step()
    return out


def opt(lr=1.0, cls=kiln.optim.SGD, **kw):
    return cls([nn.Parameter(kiln.zeros(1))], lr=lr, **kw)


def test_step_multistep_exponential():
    assert lrs(S.StepLR(opt(), 3, 0.5), 7) == pytest.approx([1, 1, 1, .5, .5, .5, .25])
    assert lrs(S.MultiStepLR(opt(), [4, 2], 0.1), 6) == pytest.approx([1, 1, .1, .1, .01, .01])
    assert lrs(S.ExponentialLR(opt(2.0), 0.9), 5) == pytest.approx([2 * 0.9 ** e for e in range(5)])


def test_cosine_linear():
    got = lrs(S.CosineAnnealingLR(opt(0.1), T_max=10, eta_min=0.01), 15)
    assert got == pytest.approx([0.01 + 0.09 * (1 + math.cos(math.pi * e / 10)) / 2 for e in range(15)])
    got = lrs(S.LinearLR(opt(0.1), start_factor=0.25, total_iters=4), 6)
    assert got == pytest.approx([0.1 * (0.25 + 0.75 * min(e, 4) / 4) for e in range(6)])


def test_one_cycle():
    o = opt(cls=kiln.optim.AdamW)
    sched = S.OneCycleLR(o, max_lr=1.0, total_steps=10, pct_start=0.3)
    got, betas = [], []
    for _ in range(10):
        got.append(sched.get_last_lr()[0])
        betas.append(o.param_groups[0]["betas"][0])
        o.step()
        sched.step()

    def cos(a, b, pct):
        return b + (a - b) / 2 * (math.cos(math.pi * pct) + 1)
    ref = [cos(0.04, 1.0, e / 2) if e <= 2 else cos(1.0, 4e-6, (e - 2) / 7) for e in range(10)]
    assert got == pytest.approx(ref)
    assert betas[0] == pytest.approx(0.95) and betas[2] == pytest.approx(0.85)
    with pytest.raises(ValueError, match="Tried to step 11 times"):
        sched.step()
    with pytest.raises(ValueError, match="momentum or betas"):
        S.OneCycleLR(opt(cls=kiln.optim.Adagrad), max_lr=1.0, total_steps=5)


def test_sequential_and_state_dict():
    o = opt(1.0)
    warm = S.LinearLR(o, start_factor=0.5, total_iters=2)
    decay = S.ExponentialLR(o, 0.5)
    seq = S.SequentialLR(o, [warm, decay], milestones=[3])
    assert lrs(seq, 6) == pytest.approx([0.5, 0.75, 1.0, 1.0, 0.5, 0.25])
    sd = S.StepLR(opt(), 2, 0.1)
    for _ in range(3):
        sd.step()
    state = sd.state_dict()
    fresh = S.StepLR(opt(), 2, 0.1)
    fresh.load_state_dict(state)
    assert fresh.last_epoch == 3 and fresh.get_last_lr() == pytest.approx([0.1])
    assert fresh.optimizer.param_groups[0]["lr"] == pytest.approx(0.1)
    # A SequentialLR holding a LambdaLR resumes where it stopped, its function kept.
    def make_seq(o):
        return S.SequentialLR(o, [S.LambdaLR(o, lambda e: 0.5 ** e), S.ExponentialLR(o, 0.1)],
                              milestones=[4])
    run = make_seq(opt(1.0))
    first = lrs(run, 2)
    resumed = make_seq(opt(1.0))
    resumed.load_state_dict(run.state_dict())
    straight = make_seq(opt(1.0))
    assert first + lrs(resumed, 4) == pytest.approx(lrs(straight, 6))
