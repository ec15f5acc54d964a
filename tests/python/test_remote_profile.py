"""`kiln profile JOB --steps N` end to end (Note [Remote profiling] in
coordinator/src/profiles.h): a data-parallel job trains on a gang of two real kiln-workers, one of
whose clocks is 30 s ahead; `kiln profile` records two steps on both ranks and writes the
coordinator's merged Chrome trace, with both ranks' events on the coordinator's clock. The
coordinator's rules in detail (bad requests, missing ranks): tests/coordinator/profile_test.cpp."""
import json
import os
import subprocess
import urllib.request

from gang_jobs import CLI, coordinator_and_workers, only_job, submit
from test_remote_worker import start_worker, stop

# Trains until the file named by argv[1] exists (at most 5000 steps), marking every step.
DRIVER = r"""
import os, sys
import kiln, kiln.nn as nn, kiln.nn.functional as F
s = kiln.connect()
kiln.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).to(s.device)
opt = kiln.optim.SGD(model.parameters(), lr=0.1)
for step in range(1, 5001):
    x, y = kiln.randn(64, 32), kiln.randint(0, 10, (64,))
    loss = F.cross_entropy(model(s.scatter(x)), s.scatter(y))
    opt.zero_grad()
    loss.backward()
    s.all_reduce_gradients(model)
    opt.step()
    s.log_step(loss, tokens=64)
    loss.item()
    if step == 3:
        print("training", flush=True)
    if os.path.exists(sys.argv[1]):
        break
print("done", step, flush=True)
"""

SKEW_US = 30_000_000


def test_profile_two_ranks_merged_and_aligned(tmp_path):
    skewed = dict(os.environ, KILN_WORKER_CLOCK_SKEW_US=str(SKEW_US))
    port_file = tmp_path / "dashboard.port"
    with coordinator_and_workers(tmp_path, 1, coordinator_args=[
            "--heartbeat-ms", "200", "--dashboard-listen", "127.0.0.1:0",
            "--dashboard-port-file", str(port_file)]) as address:
        late, _ = start_worker(tmp_path, "w1", ["--coordinator", address], env=skewed)
        stop_file = tmp_path / "stop"
        sub = submit(address, tmp_path, DRIVER, 2, args=[stop_file])
        try:
            seen = []
            while not seen or seen[-1] not in ("training", ""):  # kiln submit's lines come first
                seen.append(sub.stdout.readline().strip())
            assert seen[-1] == "training", seen
            job = only_job(address)
            out = tmp_path / "merged.json"
            r = subprocess.run([CLI, "profile", job["job_id"], "--steps", "2", "-o", str(out),
                                "--timeout", "120", "--coordinator", address],
                               capture_output=True, text=True, timeout=200)
            assert r.returncode == 0, r.stdout + r.stderr
            assert "2 of 2 ranks" in r.stdout, r.stdout

            # Bad input is refused naming the problem, and the job keeps running.
            bad = subprocess.run([CLI, "profile", job["job_id"], "--steps", "0",
                                  "--coordinator", address], capture_output=True, text=True,
                                 timeout=30)
            assert bad.returncode != 0 and "--steps must be at least 1" in bad.stderr, bad.stderr
            bad = subprocess.run([CLI, "profile", "job-nope", "--steps", "2",
                                  "--coordinator", address], capture_output=True, text=True,
                                 timeout=30)
            assert bad.returncode != 0 and "unknown job job-nope" in bad.stderr, bad.stderr
        finally:
            stop_file.write_text("")
            output = sub.communicate(timeout=300)[0]
            stop(late)
        assert sub.returncode == 0, output

        trace = json.loads(out.read_text())
        names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
                 if e.get("ph") == "M" and e.get("name") == "process_name"}
        assert sorted(names) == [0, 1], names
        assert all(n.startswith(f"rank {p} (worker ") for p, n in names.items()), names
        clocks = {c["rank"]: c for c in trace["otherData"]["ranks"]}
        skews = sorted(abs(c["clock_offset_us"]) for c in clocks.values())
        assert skews[0] < 1_000_000 and abs(skews[1] - SKEW_US) < 1_000_000, clocks

        spans = {0: [], 1: []}
        steps = {0: {}, 1: {}}
        for e in trace["traceEvents"]:
            if e.get("ph") != "X":
                continue
            spans[e["pid"]].append((e["tid"], e["ts"], e["ts"] + e["dur"]))
            if e["name"].startswith("ProfilerStep#"):
                steps[e["pid"]][e["name"]] = (e["ts"], e["ts"] + e["dur"])
        for rank in (0, 1):
            # Two profiled steps, in order (monotonic), holding all of the rank's events.
            assert sorted(steps[rank]) == ["ProfilerStep#0", "ProfilerStep#1"], steps[rank]
            s0, s1 = steps[rank]["ProfilerStep#0"], steps[rank]["ProfilerStep#1"]
            assert s0[0] <= s0[1] <= s1[0] + 1 and s1[0] <= s1[1], steps[rank]
            ops = spans[rank]
            assert len(ops) > 10, ops
            assert all(s0[0] - 1 <= b <= e <= s1[1] + 1 for _, b, e in ops), (s0, s1)
        # Aligned: the ranks ran the same steps in lockstep (all-reduce every step), so their
        # windows overlap on the coordinator's clock although one clock is 30 s ahead.
        a, b = steps[0]["ProfilerStep#0"], steps[1]["ProfilerStep#0"]
        assert abs(a[0] - b[0]) < 2_000_000, (a, b)
        assert trace["otherData"]["base_unix_us"] > 0

        # The job lists the profile, and the dashboard serves it.
        listed = only_job(address)["profiles"]
        assert len(listed) == 1 and listed[0]["ranks"] == [0, 1], listed
        port = int(port_file.read_text())
        url = f"http://127.0.0.1:{port}/api/jobs/{job['job_id']}"
        with urllib.request.urlopen(url, timeout=10) as r:
            assert json.loads(r.read())["profiles"] == listed
        with urllib.request.urlopen(f"{url}/profiles/{listed[0]['profile_id']}", timeout=10) as r:
            assert r.read() == out.read_bytes()
        text = subprocess.run([CLI, "status", "--coordinator", address, job["job_id"]],
                              capture_output=True, text=True, timeout=30).stdout
        assert "2 steps, 2 ranks" in text and \
            f"/api/jobs/{job['job_id']}/profiles/{listed[0]['profile_id']}" in text, text
