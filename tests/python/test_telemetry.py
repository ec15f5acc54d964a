"""Step telemetry end to end (Note [Step telemetry] in worker/src/reports.h, Note [Stragglers] in
coordinator/src/stragglers.h): a job trains data-parallel on a gang of two real kiln-workers and
marks each step with `session.log_step(loss, tokens)`; one rank also does extra work each step
(gang_jobs.STRAGGLER_DRIVER). The coordinator keeps every rank's steps (`kiln steps`: rank 0's
loss is the one the driver read), shows each rank's latest in `kiln status`, and names the slow
rank a straggler. The rules in detail: tests/coordinator/telemetry_test.cpp."""
import json
import time

from gang_jobs import STRAGGLER_DRIVER, coordinator_and_workers, kiln_cli, only_job, submit


def test_steps_per_rank_and_a_straggler(tmp_path):
    with coordinator_and_workers(tmp_path, 2, prefix="t") as address:
        sub = submit(address, tmp_path, STRAGGLER_DRIVER, 2)
        out = sub.communicate(timeout=300)[0]
        assert sub.returncode == 0, out
        read = {int(l.split()[1]): float(l.split()[2]) for l in out.splitlines()
                if l.startswith("loss ")}
        assert sorted(read) == list(range(1, 9))
        job = only_job(address)
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
