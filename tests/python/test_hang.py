"""Hang detection end to end (Note [Hang detection] in coordinator/src/coordinator.cpp): a job on
a gang of two real kiln-workers marks a few steps, then rank 0 alone enters an all_reduce that
rank 1 never joins. With --hang-after-s 2, the coordinator asks both workers what they are doing
and shows the answers together, long before the communicator's timeout: rank 0's executor in the
all_reduce, its process group's collective started, its threads' stacks; rank 1 idle."""
import json
import os
import time

from gang_jobs import coordinator_and_workers, kiln_cli, only_job, submit

DRIVER = r"""
import kiln
s = kiln.connect()
x = kiln.ones(4).to(s.device)
for step in range(1, 4):
    x = x * 1.0
    s.log_step(x.sum(), tokens=4)
    s.sync()
with kiln._C._StageScope([0]):
    a = kiln.ones(8).to(s.device)
y = kiln.all_reduce(a, "sum", "world")  # rank 0 alone: it waits for rank 1 forever
print("stuck", flush=True)
s.sync()
"""


def test_a_job_whose_steps_stop_gets_every_ranks_account(tmp_path):
    env = dict(os.environ, KILN_COMM_TIMEOUT_S="30")
    with coordinator_and_workers(tmp_path, 2, coordinator_args=["--hang-after-s", "2"], env=env,
                                 prefix="h") as address:
        sub = submit(address, tmp_path, DRIVER, 2)
        try:
            for line in sub.stdout:
                if line.startswith("stuck"):
                    break
            stuck = time.monotonic()
            job_id = only_job(address)["job_id"]
            finding = None
            while finding is None and time.monotonic() - stuck < 20:
                found = json.loads(kiln_cli(address, "status", "--json", job_id))["findings"]
                finding = next((f for f in found if f["kind"] == "hang"), None)
                time.sleep(0.2)
            assert finding is not None, "no hang reported within 20 s"
            took = time.monotonic() - stuck
            print(f"hang reported {took:.1f} s after the driver got stuck")
            assert took < 10, took  # 2 s without a step, a beat to ask, a beat to answer
            text = finding["text"]
            assert text.startswith("no step for ") and "after step 3" in text, text
            rank0 = text[text.index("--- rank 0"):text.index("--- rank 1")]
            rank1 = text[text.index("--- rank 1"):]
            assert "executor: running instruction #" in rank0 and "'all_reduce'" in rank0, rank0
            assert "group 'world'" in rank0 and "all_reduce float32[8]: started" in rank0, rank0
            assert "threads:" in rank0 and "thread " in rank0, rank0
            assert "executor: idle" in rank1, rank1
            assert "[kiln-coordinator] hang: no step for" in kiln_cli(address, "logs", job_id)
        finally:
            sub.terminate()  # kiln submit cancels the job and stops its driver
            sub.communicate(timeout=60)
