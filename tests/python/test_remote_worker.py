"""kiln.connect against real kiln-worker processes on loopback (started here with --listen
127.0.0.1:0 --port-file, killed at the end; skipped when the binary was not built): digits.py
--remote trains to >= 95%, and a killed worker makes the next read raise UNAVAILABLE quickly.
With a kiln-coordinator binary (build/bin, or KILN_COORDINATOR_BIN) two registered workers
form a gang: gradients average over it, and digits.py --workers 2 trains data-parallel."""
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

import kiln

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The build tree's package is build/python/kiln; the daemon is build/bin/kiln-worker.
BUILD = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__))))
WORKER = os.environ.get("KILN_WORKER_BIN", os.path.join(BUILD, "bin", "kiln-worker"))
COORDINATOR = os.environ.get("KILN_COORDINATOR_BIN", os.path.join(BUILD, "bin", "kiln-coordinator"))

pytestmark = pytest.mark.skipif(not os.access(WORKER, os.X_OK),
                                reason=f"kiln-worker not built ({WORKER})")


def start_worker(tmp_path, name="w", extra=(), env=None):
    """A kiln-worker on a free loopback port; returns (process, "127.0.0.1:PORT")."""
    return start_daemon(tmp_path, name, [WORKER, "--worker-id", name, *extra], env)


def start_daemon(tmp_path, name, argv, env=None):
    port_file = tmp_path / f"{name}.port"
    p = subprocess.Popen([*argv, "--listen", "127.0.0.1:0", "--port-file", str(port_file)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if port_file.exists() and port_file.read_text().strip():
            return p, f"127.0.0.1:{int(port_file.read_text().strip())}"
        if p.poll() is not None:
            raise RuntimeError(f"{name} exited with {p.returncode}: {p.stderr.read().decode()}")
        time.sleep(0.02)
    p.kill()
    p.wait()
    raise RuntimeError(f"{name} did not write its port file within 20 s")


def stop(p):
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@pytest.fixture
def worker(tmp_path):
    p, address = start_worker(tmp_path)
    yield p, address
    stop(p)


def digits_data(tmp_path):
    data = os.path.join(ROOT, "build", "data", "digits")
    if not os.path.exists(os.path.join(data, "y.npy")):
        data = str(tmp_path / "digits")
        subprocess.run([sys.executable, os.path.join(ROOT, "examples", "digits", "export_digits.py"),
                        data], check=True, timeout=300)
    return data


def test_ops_on_worker(worker):
    _, address = worker
    with kiln.connect(address) as s:
        assert s.world_size == 1 and s.device.type == "remote"
        a = kiln.arange(12.0).reshape(3, 4)
        r = a.to(s.device)
        assert ((r @ r.t()).numpy() == (a @ a.t()).numpy()).all()
        with pytest.raises(IndexError, match=r"index_select.*test_remote_worker\.py:\d+"):
            kiln.index_select(r, 0, kiln.tensor([7]).to(s.device)).sum().item()
        with pytest.raises(IndexError, match="index_select"):  # the first failure since the last sync
            s.sync()
        s.sync()
    with pytest.raises(ValueError, match="is a worker, not a coordinator"):
        kiln.connect(address, workers=2)


def test_a_repeated_training_step_runs_compiled_on_the_worker(tmp_path):
    """The worker's compiled-graph cache (Note [Compiled batches] in worker/src/session_compiled.cpp):
    the same recorded step, streamed again, runs compiled from its second time on, with no change
    to the client, and the losses equal embedded eager's."""
    p, address = start_worker(tmp_path, extra=("--metrics-listen", "127.0.0.1:0"))
    try:
        port = int(p.stderr.readline().decode().split("metrics on port ")[1].split()[0])

        def train(device):
            kiln.manual_seed(0)
            model = kiln.nn.Sequential(kiln.nn.Linear(8, 16), kiln.nn.Tanh(), kiln.nn.Linear(16, 4))
            if device is not None:
                model.to(device)
            opt = kiln.optim.AdamW(model.parameters(), lr=1e-2)
            g = kiln.Generator()
            g.manual_seed(1)
            losses = []
            for _ in range(6):
                x, y = kiln.randn(32, 8, generator=g), kiln.randint(0, 4, (32,), generator=g)
                if device is not None:
                    x, y = x.to(device), y.to(device)
                loss = kiln.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
            return losses

        eager = train(None)
        with kiln.connect(address) as s:
            remote = train(s.device)
        assert remote == pytest.approx(eager, rel=1e-5, abs=1e-7)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        compiled = float(re.search(r"^kiln_worker_compiled_steps_total (\S+)$", text, re.M).group(1))
        assert compiled >= 4, text
    finally:
        stop(p)


def test_token(tmp_path, monkeypatch):
    monkeypatch.delenv("KILN_TOKEN", raising=False)
    p, address = start_worker(tmp_path, "guarded", ["--token", "s3cret"])
    try:
        with pytest.raises(RuntimeError, match="UNAUTHENTICATED"):
            kiln.connect(address)
        with pytest.raises(RuntimeError, match="UNAUTHENTICATED"):
            kiln.connect(address, token="wrong")
        with kiln.connect(address, token="s3cret") as s:
            assert (kiln.ones(2).to(s.device) * 3).tolist() == [3.0, 3.0]
    finally:
        stop(p)


def test_a_worker_serves_one_session_at_a_time(worker):
    """Issue 18: a second direct session is refused while one is open (it used to run beside it,
    past --memory-limit), and served once the first has closed."""
    _, address = worker
    first = kiln.connect(address)
    assert (kiln.ones(2).to(first.device) * 2).tolist() == [2.0, 2.0]
    with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED.*one session at a time"):
        kiln.connect(address)
    first.close()
    with kiln.connect(address) as s:
        assert (kiln.ones(2).to(s.device) * 3).tolist() == [3.0, 3.0]


def test_released_memory_is_free_for_the_next_allocation(tmp_path):
    """Issue 18: under --memory-limit 256M, `del` of 240 MB then a 100 MB allocation succeeds the
    first time: the Free goes to the worker ahead of the allocation."""
    p, address = start_worker(tmp_path, "small", ["--memory-limit", "256M"])
    try:
        with kiln.connect(address) as s:
            x = kiln.ones(60 * 2**20, device=s.device)  # 240 MiB, made on the worker
            assert x[-1].item() == 1.0
            del x
            y = kiln.ones(25 * 2**20, device=s.device)  # 100 MiB
            assert y[-1].item() == 1.0
    finally:
        stop(p)


def test_digits_remote(worker, tmp_path):
    _, address = worker
    data = digits_data(tmp_path)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "digits.py"), data,
                        "--remote", address, "--mlp-only", "--epochs", "12"],
                       capture_output=True, text=True, env=os.environ, timeout=500)
    assert r.returncode == 0, r.stdout + r.stderr
    line = next(l for l in r.stdout.splitlines() if l.startswith("mlp: held-out accuracy"))
    assert float(line.split()[3].rstrip("%")) >= 95.0, line


def test_killed_worker_raises_unavailable(tmp_path):
    p, address = start_worker(tmp_path, "doomed")
    try:
        s = kiln.connect(address)
        r = kiln.ones(4, 4).to(s.device)
        assert (r * 2).sum().item() == 32.0
        p.kill()
        p.wait()
        start = time.monotonic()
        with pytest.raises(RuntimeError, match="UNAVAILABLE"):
            (r + 1).sum().item()
        assert time.monotonic() - start < 5.0
        s.close()  # closing a dead session does not hang or raise
    finally:
        stop(p)


@pytest.fixture
def gang(tmp_path):
    """A kiln-coordinator with two registered workers; yields the coordinator's address."""
    if not os.access(COORDINATOR, os.X_OK):
        pytest.skip(f"kiln-coordinator not built ({COORDINATOR})")
    procs = []
    try:
        c, address = start_daemon(tmp_path, "coordinator",
                                  [COORDINATOR, "--state", str(tmp_path / "state.db")])
        procs.append(c)
        for r in range(2):
            procs.append(start_worker(tmp_path, f"g{r}", ["--coordinator", address])[0])
        yield address
    finally:
        for p in reversed(procs):
            stop(p)


def test_gang_averages_gradients(gang):
    with kiln.connect(gang, workers=2, wait_ms=10000) as s:
        assert s.world_size == 2 and s.session_id
        x = kiln.arange(8.0).reshape(4, 2)
        w = kiln.ones(2).to(s.device).requires_grad_()
        (s.scatter(x) * w).sum().backward()  # rank 0: rows 0-1, rank 1: rows 2-3
        s.all_reduce_gradients([w])
        assert w.grad.tolist() == [6.0, 8.0]  # the mean of [2, 4] and [10, 12]
        s.sync()


def test_digits_remote_gang(gang, tmp_path):
    data = digits_data(tmp_path)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "digits.py"), data,
                        "--remote", gang, "--workers", "2", "--mlp-only", "--epochs", "12"],
                       capture_output=True, text=True, env=os.environ, timeout=500)
    assert r.returncode == 0, r.stdout + r.stderr
    line = next(l for l in r.stdout.splitlines() if l.startswith("mlp: held-out accuracy"))
    assert float(line.split()[3].rstrip("%")) >= 95.0, line


def test_killed_gang_worker_fails_the_client_and_is_marked_dead(tmp_path):
    """Issue 8's fault test end to end: a coordinator, two workers, a client on both; SIGKILL one
    worker mid-session -> the client's next read raises UNAVAILABLE within seconds, and the
    coordinator marks the worker dead (3 missed beats of 200 ms)."""
    if not os.access(COORDINATOR, os.X_OK):
        pytest.skip(f"kiln-coordinator not built ({COORDINATOR})")
    procs = []
    try:
        c, address = start_daemon(tmp_path, "coordinator",
                                  [COORDINATOR, "--state", str(tmp_path / "state.db"),
                                   "--heartbeat-ms", "200"])
        procs.append(c)
        for r in range(2):
            procs.append(start_worker(tmp_path, f"k{r}", ["--coordinator", address])[0])
        s = kiln.connect(address, workers=2, wait_ms=10000)
        x = kiln.ones(4).to(s.device)
        assert (x * 2).sum().item() == 8.0
        procs[2].kill()
        procs[2].wait()
        start = time.monotonic()
        with pytest.raises(RuntimeError, match="UNAVAILABLE"):
            (x + 1).sum().item()
        assert time.monotonic() - start < 5.0
        cli = os.path.join(os.path.dirname(WORKER), "kiln")
        deadline = time.monotonic() + 10
        state = None
        while time.monotonic() < deadline:
            out = subprocess.run([cli, "workers", "--json", "--coordinator", address],
                                 capture_output=True, text=True, timeout=30).stdout
            state = {w["worker_id"]: w["state"]
                     for w in (json.loads(line) for line in out.splitlines() if line.strip())}
            if state and state.get("k1") == "dead":
                break
            time.sleep(0.2)
        assert state and state.get("k1") == "dead", out
        s.close()
    finally:
        for p in reversed(procs):
            stop(p)


def test_tenants_see_and_use_only_their_own_sessions(tmp_path, monkeypatch):
    """Issue 18 end to end, with tenants alice and bob and a worker token: alice's gang of two
    trains (the Hellos carry her session's secret; the workers' rendezvous goes as the gang's
    workers); `kiln workers` names her session to her only, and to no one without a token."""
    if not os.access(COORDINATOR, os.X_OK):
        pytest.skip(f"kiln-coordinator not built ({COORDINATOR})")
    monkeypatch.delenv("KILN_TOKEN", raising=False)
    tokens = tmp_path / "tokens"
    tokens.write_text("alice atok\nbob btok\n")
    procs = []
    try:
        c, address = start_daemon(tmp_path, "coordinator",
                                  [COORDINATOR, "--state", str(tmp_path / "state.db"),
                                   "--tokens", str(tokens), "--worker-token", "wtok"])
        procs.append(c)
        for r in range(2):
            procs.append(start_worker(tmp_path, f"t{r}", ["--coordinator", address,
                                                          "--token", "wtok"])[0])
        cli = os.path.join(os.path.dirname(WORKER), "kiln")

        def listed(*token):
            r = subprocess.run([cli, "workers", "--json", "--coordinator", address, *token],
                               capture_output=True, text=True, timeout=30)
            return r, [json.loads(l) for l in r.stdout.splitlines() if l.strip()]

        with kiln.connect(address, workers=2, token="atok", wait_ms=10000) as s:
            x = kiln.arange(4.0).reshape(4, 1)
            w = kiln.ones(1).to(s.device).requires_grad_()
            (s.scatter(x) * w).sum().backward()
            s.all_reduce_gradients([w])
            assert w.grad.tolist() == [3.0]  # the mean of 0 + 1 and 2 + 3
            _, mine = listed("--token", "atok")
            assert {w["session_id"] for w in mine} == {s.session_id}
            _, theirs = listed("--token", "btok")
            assert {w["state"] for w in theirs} == {"busy"}
            assert {w["session_id"] for w in theirs} == {""}
            r, _ = listed()
            assert r.returncode != 0 and "UNAUTHENTICATED" in r.stderr, r.stderr
            with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED"):  # both workers are hers
                kiln.connect(address, token="btok")
    finally:
        for p in reversed(procs):
            stop(p)


def test_kiln_submit_runs_digits_on_the_jobs_gang(gang, tmp_path):
    """`kiln submit --workers 2 -- python digits.py`: the driver trains on the job's gang (no
    --remote: kiln.connect() finds the job through KILN_COORDINATOR and KILN_JOB_ID)."""
    data = digits_data(tmp_path)
    cli = os.path.join(os.path.dirname(WORKER), "kiln")
    r = subprocess.run([cli, "submit", "--coordinator", gang, "--workers", "2", "--",
                        sys.executable, os.path.join(ROOT, "examples", "digits.py"), data,
                        "--mlp-only", "--epochs", "12"],
                       capture_output=True, text=True, env=os.environ, timeout=500)
    assert r.returncode == 0, r.stdout + r.stderr
    line = next(l for l in r.stdout.splitlines() if l.startswith("mlp: held-out accuracy"))
    assert float(line.split()[3].rstrip("%")) >= 95.0, line


def all_stopped(pid):
    states = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/stat") as f:
            states.append(f.read().rsplit(")", 1)[1].split()[0])
    return all(st in ("T", "t") for st in states)


def test_frozen_worker_raises_unavailable(tmp_path, monkeypatch):
    """A worker that stops answering without closing its connection (SIGSTOP, a lost host): the
    client's keepalive pings (KILN_KEEPALIVE_S) turn the waiting read into UNAVAILABLE."""
    monkeypatch.setenv("KILN_KEEPALIVE_S", "1")
    p, address = start_worker(tmp_path, "frozen")
    try:
        s = kiln.connect(address)
        r = kiln.ones(4).to(s.device)
        time.sleep(8)  # idle pings are answered while the worker lives: no false alarm
        assert r.sum().item() == 4.0
        p.send_signal(signal.SIGSTOP)
        # The stop reaches each thread asynchronously (on a loaded machine, late): wait until
        # every thread of the worker is stopped, so no reply can slip out.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not all_stopped(p.pid):
            time.sleep(0.01)
        start = time.monotonic()
        with pytest.raises(RuntimeError, match="UNAVAILABLE"):
            (r + 1).sum().item()
        assert time.monotonic() - start < 15.0  # a ping each second, unanswered for 6 s
    finally:
        p.send_signal(signal.SIGCONT)
        stop(p)
