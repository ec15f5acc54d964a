"""Step telemetry end to end (Note [Step telemetry] in worker/src/reports.h, Note [Stragglers] in
coordinator/src/stragglers.h): a job trains data-parallel on a gang of two real kiln-workers and
marks each step with `session.log_step(loss, tokens)`; one rank also does extra work each step.
The coordinator keeps every rank's steps (`kiln steps`: rank 0's loss is the one the driver read),
shows each rank's latest in `kiln status`, and names the slow rank a straggler. The rules in
detail: tests/coordinator/telemetry_test.cpp."""
import json
import os
import subprocess
import sys
import time

import pytest

from test_remote_worker import COORDINATOR, WORKER, start_daemon, start_worker, stop

CLI = os.path.join(os.path.dirname(WORKER), "kiln")

DRIVER = r"""
import kiln, kiln.nn as nn, kiln.nn.functional as F
s = kiln.connect()
kiln.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).to(s.device)
opt = kiln.optim.SGD(model.parameters(), lr=0.1)
g = kiln.Generator()
g.manual_seed(0)
with kiln._C._StageScope([1]):
    big = kiln.randn(384, 384).to(s.device)  # lives on rank 1: ops on it run there alone
for step in range(1, 9):
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
"""


def kiln_cli(address, *args):
    r = subprocess.run([CLI, *args, "--coordinator", address], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_steps_per_rank_and_a_straggler(tmp_path):
    if not os.access(COORDINATOR, os.X_OK):
        pytest.skip(f"kiln-coordinator not built ({COORDINATOR})")
    procs = []
    try:
        c, address = start_daemon(tmp_path, "coordinator",
                                  [COORDINATOR, "--state", str(tmp_path / "state.db")])
        procs.append(c)
        for r in range(2):
            procs.append(start_worker(tmp_path, f"t{r}", ["--coordinator", address])[0])
        driver = tmp_path / "driver.py"
        driver.write_text(DRIVER)
        sub = subprocess.run([CLI, "submit", "--coordinator", address, "--workers", "2", "--",
                              sys.executable, str(driver)], capture_output=True, text=True,
                             timeout=300, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
        assert sub.returncode == 0, sub.stdout + sub.stderr
        read = {int(l.split()[1]): float(l.split()[2]) for l in sub.stdout.splitlines()
                if l.startswith("loss ")}
        assert sorted(read) == list(range(1, 9))
        job = json.loads(kiln_cli(address, "jobs", "--json").splitlines()[0])
        # The workers' last reports come with their next beat (within about 100 ms).
        deadline = time.monotonic() + 10
        while True:
            steps = [json.loads(l) for l in
                     kiln_cli(address, "steps", "--json", job["job_id"]).splitlines()]
            if len(steps) == 16 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert [(r["step"], r["rank"]) for r in steps] == [(n, k) for n in range(1, 9) for k in (0, 1)]
        for r in steps:
            assert r["tokens"] == 64 and 0 <= r["busy_seconds"] <= r["seconds"]
            if r["rank"] == 0:
                assert r["loss"] == read[r["step"]]  # the value the driver read
            else:
                assert r["loss"] > 0  # its own shard's loss
        # The extra work makes rank 1 busier at every step (the first ones also compile).
        busy = {(r["step"], r["rank"]): r["busy_seconds"] for r in steps}
        slower = sum(busy[n, 1] for n in range(4, 9)) / sum(busy[n, 0] for n in range(4, 9))
        assert slower > 2, (slower, steps)
        status = json.loads(kiln_cli(address, "status", "--json", job["job_id"]))
        assert [r["step"] for r in status["last_steps"]] == [8, 8]
        kinds = [(f["kind"], f["text"]) for f in status["findings"]]
        assert any(k == "straggler" and t.startswith("rank 1 is a straggler") for k, t in kinds), kinds
        human = kiln_cli(address, "status", job["job_id"])
        assert "rank 0:    step 8: loss" in human and "tokens/s" in human, human
        assert "straggler: " in human, human
    finally:
        for p in reversed(procs):
            stop(p)
