"""Desync detection end to end (Note [Desync detection] in coordinator/src/desync.h): a job on a
gang of three real kiln-workers whose ranks run different collectives; the coordinator names the
rank out of step within 2 seconds, long before the communicator's timeout, in `kiln status` and
in the job's log. The coordinator's rules in detail: tests/coordinator/desync_test.cpp."""
import json
import os
import time

from gang_jobs import coordinator_and_workers, kiln_cli, only_job, submit

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


def test_a_rank_that_runs_another_collective_is_named_within_two_seconds(tmp_path):
    env = dict(os.environ, KILN_COMM_TIMEOUT_S="15")  # the communicator's own verdict, later
    with coordinator_and_workers(tmp_path, 3, env=env, prefix="d") as address:
        sub = submit(address, tmp_path, DRIVER, 3)
        issued = None
        for line in sub.stdout:
            if line.startswith("issued "):
                issued = float(line.split()[1])
                break
        assert issued is not None, "the driver never issued its collectives"
        job_id = only_job(address)["job_id"]
        finding = None
        while finding is None and time.time() - issued < 10:
            found = json.loads(kiln_cli(address, "status", "--json", job_id))["findings"]
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
        assert "[kiln-coordinator] desync: rank 2 skipped or reordered" in kiln_cli(address, "logs", job_id)
        human = kiln_cli(address, "status", job_id)
        assert "desync:" in human and "rank 2" in human, human
