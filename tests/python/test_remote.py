"""kiln.connect on embedded workers ("inproc"): remote ops equal eager ones, an MLP training
step equals eager to 1e-6, reads raise remote errors naming the op and the recording line, and
data-parallel helpers (scatter, all_reduce_gradients) average as one big batch would."""
import inspect

import numpy as np
import pytest

import kiln
import kiln.nn as nn


@pytest.fixture
def session():
    with kiln.connect("inproc") as s:
        yield s


def _close(a, b, tol=1e-6):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


def test_session_basics(session):
    assert session.world_size == 1
    assert session.device.type == "remote"
    assert session.session_id == ""
    assert "world_size=1" in repr(session)


def test_ops_equal_eager(session):
    kiln.manual_seed(0)
    a, b = kiln.randn(4, 5), kiln.randn(5, 3)
    ra, rb = a.to(session.device), b.to(session.device)
    cases = [
        (lambda x, y: x @ y, (a, b), (ra, rb)),
        (lambda x, y: (x * 2 + 1).relu().sum(1), (a, b), (ra, rb)),
        (lambda x, y: x.softmax(-1).mean(0), (a, b), (ra, rb)),
        (lambda x, y: x.t()[1:3, ::2].contiguous(), (a, b), (ra, rb)),
        (lambda x, y: kiln.cat([x, x.exp()], 0).max(0).values, (a, b), (ra, rb)),
        (lambda x, y: x[kiln.tensor([3, 0]).to(x.device)].argmax(1), (a, b), (ra, rb)),
    ]
    for f, eager_args, remote_args in cases:
        want = f(*eager_args)
        got = f(*remote_args)
        assert got.device == session.device
        assert got.shape == want.shape and got.dtype == want.dtype
        _close(got.numpy(), want.numpy())
    # In place on a remote tensor, then every kind of read.
    r = ra.clone()
    r.add_(1).mul_(2)
    want = (a + 1) * 2
    _close(r.to("cpu").numpy(), want.numpy())
    _close(r.tolist(), want.tolist())
    assert r[0, 0].item() == pytest.approx(want[0, 0].item())
    assert "device='remote:" in repr(r) and repr(want)[7:20] in repr(r)


def test_mlp_step_equals_eager(session):
    kiln.manual_seed(1)
    eager = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    remote = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    remote.load_state_dict(eager.state_dict())
    remote.to(session.device)
    x, y = kiln.randn(6, 8), kiln.tensor([0, 1, 2, 0, 1, 2])
    opt_e = kiln.optim.AdamW(eager.parameters(), lr=1e-2)
    opt_r = kiln.optim.AdamW(remote.parameters(), lr=1e-2)
    for _ in range(2):
        losses = []
        for model, opt, dev in ((eager, opt_e, None), (remote, opt_r, session.device)):
            xb, yb = (x, y) if dev is None else (x.to(dev), y.to(dev))
            loss = nn.functional.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        _close(losses[1], losses[0])
    for pe, pr in zip(eager.parameters(), remote.parameters()):
        assert pr.device == session.device
        _close(pr.detach().numpy(), pe.detach().numpy())


def test_error_at_read_names_op_and_line(session):
    r = kiln.arange(6.0).reshape(2, 3).to(session.device)
    line = inspect.currentframe().f_lineno + 1
    bad = kiln.index_select(r, 0, kiln.tensor([5]).to(session.device))
    downstream = (bad * 2).sum()  # poisoned: raises the original error
    with pytest.raises(IndexError) as e:
        downstream.item()
    msg = str(e.value)
    assert "index_select" in msg and f"test_remote.py:{line} in test_error_at_read" in msg, msg
    assert "INVALID_ARGUMENT" in msg and "out of bounds" in msg, msg
    # Independent work goes on; sync reports the first failure since the last sync.
    assert r.sum().item() == 15.0
    with pytest.raises(IndexError, match="index_select"):
        session.sync()
    session.sync()


def test_error_in_module_names_the_callers_line(session):
    emb = nn.Embedding(4, 3).to(session.device)
    idx = kiln.tensor([1, 9]).to(session.device)
    line = inspect.currentframe().f_lineno + 1
    out = emb(idx).sum()  # recorded inside kiln/nn: the error names this line, not the package's
    with pytest.raises(IndexError) as e:
        out.item()
    assert f"test_remote.py:{line} in test_error_in_module" in str(e.value), str(e.value)
    assert "embedding" in str(e.value)


def test_close_ends_the_session():
    s = kiln.connect("inproc")
    r = kiln.ones(3).to(s.device)
    with s:
        assert r.sum().item() == 3.0
    s.close()  # idempotent
    with pytest.raises(ValueError, match="not connected"):
        (r + 1).item()


def test_connect_errors(monkeypatch):
    with pytest.raises(ValueError, match="workers must be >= 1"):
        kiln.connect("inproc", workers=0)
    monkeypatch.delenv("KILN_SESSION", raising=False)
    monkeypatch.delenv("KILN_COORDINATOR", raising=False)
    with pytest.raises(ValueError, match="no address given"):
        kiln.connect()


def test_gang_inproc_scatter_and_one_program():
    with kiln.connect("inproc", workers=2) as s:
        assert s.world_size == 2 and s.device.type == "remote"
        x = kiln.arange(8.0).reshape(4, 2)
        xs = s.scatter(x)  # rank r holds rows 2r, 2r+1; reads come from rank 0
        assert xs.shape == (2, 2) and xs.device == s.device
        _close((xs * 2).numpy(), (x[:2] * 2).numpy())
        with pytest.raises(ValueError, match="does not split into 2 equal shards"):
            s.scatter(kiln.ones(3, 2))
        # Embedded workers have no process group: refused before anything is recorded.
        w = kiln.ones(2).to(s.device).requires_grad_()
        (xs * w).sum().backward()
        with pytest.raises(RuntimeError, match="no process group.*COORDINATOR"):
            s.all_reduce_gradients([w])
        _close(w.grad.numpy(), [2.0, 4.0])  # rank 0's own gradient, untouched


def test_one_worker_data_parallel_helpers_are_plain(session):
    x = kiln.arange(6.0).reshape(3, 2)
    xs = session.scatter(x)
    assert xs.device == session.device and xs.shape == (3, 2)
    w = kiln.ones(2).to(session.device).requires_grad_()
    (xs * w).sum().backward()
    session.all_reduce_gradients([w])  # nothing to average over
    _close(w.grad.numpy(), [6.0, 9.0])
    session.all_reduce_gradients(nn.Linear(2, 2))  # a Module is accepted too


def test_step_on_poisoned_gradient_poisons_parameters(session):
    p = kiln.zeros(2).to(session.device).requires_grad_()
    opt = kiln.optim.AdamW([p], lr=0.1)
    (p * 1).sum().backward()
    bad = kiln.index_select(kiln.ones(2).to(session.device), 0,
                            kiln.tensor([0, 7]).to(session.device))
    with kiln.no_grad():
        p.grad.copy_(bad)
    opt.step()
    with pytest.raises(IndexError, match="index_select"):
        p.tolist()
