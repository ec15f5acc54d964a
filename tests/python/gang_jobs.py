"""Helpers for the tests that run jobs on a kiln-coordinator's gang of real kiln-workers
(test_desync, test_telemetry, test_hang, test_dashboard): the daemons, `kiln submit` of a Python
driver, and a driver that trains with step telemetry and a straggler."""
import contextlib
import json
import os
import subprocess
import sys

import pytest

from test_remote_worker import COORDINATOR, WORKER, start_daemon, start_worker, stop

CLI = os.path.join(os.path.dirname(WORKER), "kiln")

# A data-parallel MLP on a gang of two, marking each step with log_step; rank 1 also multiplies
# a matrix that lives on it alone, so it is the straggler. Prints "loss STEP VALUE" per step, and
# with a path argument, "trained" and then waits (up to 240 s) until that file exists.
STRAGGLER_DRIVER = r"""
import os, sys, time
import kiln, kiln.nn as nn, kiln.nn.functional as F
STEPS = int(os.environ.get("DRIVER_STEPS", "8"))
s = kiln.connect()
kiln.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).to(s.device)
opt = kiln.optim.SGD(model.parameters(), lr=0.1)
g = kiln.Generator()
g.manual_seed(0)
with kiln._C._StageScope([1]):
    big = kiln.randn(384, 384).to(s.device)  # lives on rank 1: ops on it run there alone
for step in range(1, STEPS + 1):
    x, y = kiln.randn(64, 32, generator=g), kiln.randint(0, 10, (64,), generator=g)
    loss = F.cross_entropy(model(s.scatter(x)), s.scatter(y))
    opt.zero_grad()
    loss.backward()
    w = big
    for _ in range(64):
        w = (w @ big).tanh()  # rank 1's extra work: it is the straggler
    s.all_reduce_gradients(model)
    opt.step()
    s.log_step(loss, tokens=64)
    print("loss", step, repr(loss.item()), flush=True)
if len(sys.argv) > 1:
    print("trained; waiting for the test", flush=True)
    deadline = time.monotonic() + 240
    while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
        time.sleep(0.1)
"""


@contextlib.contextmanager
def coordinator_and_workers(tmp_path, workers, coordinator_args=(), worker_args=(), env=None,
                            prefix="w"):
    """A kiln-coordinator (state in tmp_path) with `workers` registered kiln-workers named
    PREFIX0, PREFIX1, ...; yields the coordinator's address. Skips without the binary."""
    if not os.access(COORDINATOR, os.X_OK):
        pytest.skip(f"kiln-coordinator not built ({COORDINATOR})")
    procs = []
    try:
        c, address = start_daemon(tmp_path, "coordinator",
                                  [COORDINATOR, "--state", str(tmp_path / "state.db"),
                                   *coordinator_args])
        procs.append(c)
        for r in range(workers):
            procs.append(start_worker(tmp_path, f"{prefix}{r}",
                                      ["--coordinator", address, *worker_args], env=env)[0])
        yield address
    finally:
        for p in reversed(procs):
            stop(p)


class Workers:
    """kiln-workers registered with the coordinator at `address`, by their address, to kill and
    replace (the restart and chaos tests)."""

    def __init__(self, tmp_path, address, env):
        self.tmp_path, self.address, self.env, self.procs = tmp_path, address, env, {}

    def add(self, name):
        proc, where = start_worker(self.tmp_path, name, ["--coordinator", self.address], self.env)
        self.procs[where] = proc

    def kill(self, where):
        """SIGKILLs the worker at `where`."""
        self.procs.pop(where).kill()


@contextlib.contextmanager
def killable_workers(tmp_path, workers, coordinator_args=(), env=None):
    """coordinator_and_workers, yielding (address, Workers) with `workers` workers named w0, w1,
    ... that a test may kill and add to."""
    with coordinator_and_workers(tmp_path, 0, coordinator_args, env=env) as address:
        gang = Workers(tmp_path, address, env)
        try:
            for r in range(workers):
                gang.add(f"w{r}")
            yield address, gang
        finally:
            for proc in gang.procs.values():
                stop(proc)


def submit(address, tmp_path, source, workers, args=(), cli_args=(), env=None):
    """`kiln submit --workers N -- python DRIVER ARGS` of `source`, as a Popen whose stdout
    (text, stderr merged) is the driver's output."""
    driver = tmp_path / "driver.py"
    driver.write_text(source)
    env = dict(os.environ if env is None else env, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.Popen([CLI, "submit", "--coordinator", address, *cli_args, "--workers",
                             str(workers), "--", sys.executable, str(driver), *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def kiln_cli(address, *args):
    """The output of `kiln ARGS --coordinator ADDRESS`, which must succeed."""
    r = subprocess.run([CLI, *args, "--coordinator", address], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def only_job(address):
    """The coordinator's one job (kiln jobs --json)."""
    return json.loads(kiln_cli(address, "jobs", "--json").splitlines()[0])
