"""Desync detection end to end (Note [Desync detection] in coordinator/src/desync.h): a job on a
gang of three real kiln-workers whose ranks run different collectives; the coordinator names the
rank out of step within 2 seconds, long before the communicator's timeout, in `kiln status` and
in the job's log. The coordinator's rules in detail: tests/coordinator/desync_test.cpp."""
import json
import os
import subprocess
import sys
import time

import pytest

from test_remote_worker import COORDINATOR, WORKER, start_daemon, start_worker, stop

CLI = os.path.join(os.path.dirname(WORKER), "kiln")

# The driver: ranks 0 and 1 all-reduce while rank 2 all-gathers (each value lives on the workers
# of the StageScope it was made in, so each instruction goes to those alone).
DRIVER = r"""
import os, time, kiln
s = kiln.connect()
with kiln._C._StageScope([0, 1]):
    a = kiln.ones(8).to(s.device)
with kiln._C._StageScope([2]):
    b = kiln.ones(2).to(s.device)
x = kiln.all_reduce(a, "sum", "world")
y = kiln.all_gather_into_tensor(b, 3, "world")
print("issued", time.time(), flush=True)
try:
    s.sync()
except Exception as e:
    print("failed:", str(e).splitlines()[0], flush=True)
    raise SystemExit(3)
"""


def status(address, job_id):
    r = subprocess.run([CLI, "status", "--json", "--coordinator", address, job_id],
                       capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def test_a_rank_that_runs_another_collective_is_named_within_two_seconds(tmp_path):
    if not os.access(COORDINATOR, os.X_OK):
        pytest.skip(f"kiln-coordinator not built ({COORDINATOR})")
    env = dict(os.environ, KILN_COMM_TIMEOUT_S="15")  # the communicator's own verdict, later
    procs = []
    try:
        c, address = start_daemon(tmp_path, "coordinator",
                                  [COORDINATOR, "--state", str(tmp_path / "state.db")])
        procs.append(c)
        for r in range(3):
            procs.append(start_worker(tmp_path, f"d{r}", ["--coordinator", address], env=env)[0])
        driver = tmp_path / "driver.py"
        driver.write_text(DRIVER)
        sub = subprocess.Popen([CLI, "submit", "--coordinator", address, "--workers", "3", "--",
                                sys.executable, str(driver)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
        procs.append(sub)
        issued = None
        for line in sub.stdout:
            if line.startswith("issued "):
                issued = float(line.split()[1])
                break
        assert issued is not None, "the driver never issued its collectives"
        jobs = subprocess.run([CLI, "jobs", "--json", "--coordinator", address],
                              capture_output=True, text=True, timeout=20)
        job_id = next(json.loads(l)["job_id"] for l in jobs.stdout.splitlines() if l.strip())
        finding = None
        while finding is None and time.time() - issued < 10:
            found = status(address, job_id)["findings"]
            finding = found[0] if found else None
            if finding is None:
                time.sleep(0.05)
        assert finding is not None, "no desync reported within 10 s"
        assert finding["kind"] == "desync"
        # Named within 2 s of the driver's issuing (the workers' reports come with a beat at most
        # 100 ms after a collective), against a 15 s communicator timeout.
        delay = finding["unix_ms"] / 1000.0 - issued
        print(f"desync named {delay:.3f} s after the driver issued: {finding['text']}")
        assert delay < 2.0, (finding, issued)
        text = finding["text"]
        assert "rank 2 skipped or reordered a collective" in text, text
        assert "rank 2 ran all_gather_into_tensor float32[2]" in text, text
        assert "where ranks 0, 1 ran all_reduce float32[8]" in text, text
        # The job's log has it; the driver then fails on the communicator's timeout.
        out = sub.communicate(timeout=120)[0]
        assert sub.returncode != 0, out
        logs = subprocess.run([CLI, "logs", "--coordinator", address, job_id],
                              capture_output=True, text=True, timeout=20).stdout
        assert "[kiln-coordinator] desync: rank 2 skipped or reordered" in logs, logs
        human = subprocess.run([CLI, "status", "--coordinator", address, job_id],
                               capture_output=True, text=True, timeout=20).stdout
        assert "desync:" in human and "rank 2" in human, human
    finally:
        for p in reversed(procs):
            stop(p)
