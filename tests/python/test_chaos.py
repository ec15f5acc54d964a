"""Jobs that survive failures (Note [Restarts] in coordinator/src/jobs.cpp, Note [Gang checkpoints]
in kiln/dist/remote.h), as a chaos test: an FSDP x TP job on a 2x2 gang of real kiln-workers,
submitted with --max-restarts and a checkpoint every K steps, has a random worker SIGKILLed at a
random step, in each of KILN_CHAOS_TRIALS trials (20 by default). A spare worker stands by, and
each killed one is replaced, so the world size stays 4. Every job must succeed; the restarted
driver must resume from a checkpoint less than K steps behind the last step it had finished; and
its final loss and weights must equal an uninterrupted run's, bit for bit."""
import json
import os
import random
import subprocess
import sys
import time

import pytest

from gang_jobs import CLI, kiln_cli, killable_workers

STEPS, EVERY = 12, 3
TRIALS = int(os.environ.get("KILN_CHAOS_TRIALS", "20"))

# The job's driver: it resumes from KILN_CHECKPOINT_DIR when a checkpoint is there, saves one every
# KILN_CHECKPOINT_EVERY steps, and prints "run R", "resume from S", "step N LOSS" (after the step's
# checkpoint) and "final LOSS CHECKSUM". Its first run waits after step CHAOS_PAUSE_AT until the
# file CHAOS_GO exists: the test kills a worker there, so the job cannot end first. Its second run
# waits after step CHAOS_GROW_AT, for the coordinator to make it grow.
DRIVER = r"""
import os, sys, time, warnings
import kiln, kiln.nn as nn, kiln.nn.functional as F
import kiln.distributed.checkpoint as dcp
from kiln.distributed.device_mesh import init_device_mesh
from kiln.distributed.fsdp import fully_shard
from kiln.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
warnings.simplefilter("ignore")
steps = int(sys.argv[1])
ckpt, every = os.environ.get("KILN_CHECKPOINT_DIR"), int(os.environ.get("KILN_CHECKPOINT_EVERY", 0))
print("run", os.environ["KILN_RESTARTS"], flush=True)
s = kiln.connect()
dims = dict(d.split("=") for d in os.environ["KILN_MESH"].split(","))
mesh = init_device_mesh(str(s.device), (int(dims["dp"]), int(dims["tp"])),
                        mesh_dim_names=("dp", "tp"))
kiln.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 8))
parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
fully_shard(model, mesh=mesh["dp"])
opt = kiln.optim.AdamW(model.parameters(), lr=0.01)

def train(step):
    g = kiln.Generator().manual_seed(1000 + step)
    x, y = kiln.randn(8, 16, generator=g), kiln.randn(8, 8, generator=g)
    opt.zero_grad()
    loss = F.mse_loss(model(x.to(s.device)), y.to(s.device))
    loss.backward()
    opt.step()
    return loss

def state(step):
    return {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}

start = 0
if ckpt and os.path.exists(os.path.join(ckpt, ".metadata")):
    train(0)  # the optimizer's state exists to load into; the checkpoint overwrites it all
    st = state(0)
    dcp.load(st, checkpoint_id=ckpt)
    opt.load_state_dict(st["optim"])
    start = st["step"]
    print("resume from", start, flush=True)
for step in range(start + 1, steps + 1):
    loss = train(step)
    s.log_step(loss, tokens=8)
    if every and step % every == 0:
        dcp.save(state(step), checkpoint_id=ckpt)
    print("step", step, repr(loss.item()), flush=True)
    if step == int(os.environ.get("CHAOS_PAUSE_AT", -1)) and os.environ["KILN_RESTARTS"] == "0":
        while not os.path.exists(os.environ["CHAOS_GO"]):
            time.sleep(0.01)
    if step == int(os.environ.get("CHAOS_GROW_AT", -1)) and os.environ["KILN_RESTARTS"] == "1":
        time.sleep(120)  # the second run waits here to be asked to grow (SIGTERM)
total = sum(float(p.full_tensor().double().abs().sum()) for p in model.parameters())
print("final", repr(loss.item()), repr(total), flush=True)
"""


def submit(address, tmp_path, args=(), **env):
    driver = tmp_path / "chaos_driver.py"
    driver.write_text(DRIVER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), **env)
    return subprocess.Popen([CLI, "submit", "--coordinator", address, "--mesh", "dp=2,tp=2",
                             *args, "--", sys.executable, str(driver), str(STEPS)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def final_line(out):
    finals = [line for line in out.splitlines() if line.startswith("final ")]
    assert len(finals) == 1, out
    return finals[0]


def test_killing_a_random_worker_at_a_random_step(tmp_path):
    env = dict(os.environ, KILN_COMM_TIMEOUT_S="10", OMP_NUM_THREADS="1")
    # Four workers for the gang, one spare.
    with killable_workers(tmp_path, 5, ["--heartbeat-ms", "200", "--dead-after", "3"],
                          env=env) as (address, workers):
        ref = submit(address, tmp_path)
        out, _ = ref.communicate(timeout=300)
        assert ref.returncode == 0, out
        want = final_line(out)
        for trial in range(TRIALS):
            rng = random.Random(trial)
            kill_at = rng.randint(1, STEPS - 1)
            go = tmp_path / f"go{trial}"
            p = submit(address, tmp_path, ["--max-restarts", "3", "--checkpoint-dir",
                                           str(tmp_path / f"ckpt{trial}"),
                                           "--checkpoint-every", str(EVERY)],
                       CHAOS_PAUSE_AT=str(kill_at), CHAOS_GO=str(go))
            lines = []
            for line in p.stdout:
                lines.append(line.rstrip("\n"))
                if line.startswith(f"step {kill_at} "):
                    break
            else:
                pytest.fail(f"trial {trial}: the driver ended before step {kill_at}:\n"
                            + "\n".join(lines))
            job = next(j for j in map(json.loads,
                                      kiln_cli(address, "jobs", "--json").splitlines())
                       if j["state"] == "running")
            victim = rng.choice(job["worker_addresses"])
            workers.kill(victim)
            workers.add(f"spare{trial}")  # the world size stays 4
            go.write_text("")
            t_kill = time.monotonic()
            rest, _ = p.communicate(timeout=300)
            print(f"trial {trial}: killed {victim} after step {kill_at}; done "
                  f"{time.monotonic() - t_kill:.1f} s later")
            out = "\n".join(lines) + "\n" + rest
            assert p.returncode == 0, f"trial {trial} (kill at step {kill_at}):\n{out}"
            assert final_line(out) == want, f"trial {trial}:\n{out}"
            runs = {}  # run -> its "step N" and "resume from S" numbers
            for line in out.splitlines():
                words = line.split()
                if line.startswith("run "):
                    run = runs.setdefault(int(words[1]), {"steps": [], "resume": None})
                elif line.startswith("step "):
                    run["steps"].append(int(words[1]))
                elif line.startswith("resume from "):
                    run["resume"] = int(words[2])
            assert len(runs) >= 2, f"trial {trial}: the job did not restart:\n{out}"
            # The last run resumed from the latest checkpoint (none before step EVERY: from 0).
            resumed = runs[max(runs)]["resume"] or 0
            assert (resumed > 0) == (max(runs[0]["steps"]) >= EVERY), f"trial {trial}:\n{out}"
            assert max(runs[0]["steps"]) - resumed < EVERY, \
                f"trial {trial}: lost more than a checkpoint interval:\n{out}"
            status = json.loads(kiln_cli(address, "status", job["job_id"], "--json"))
            assert status["state"] == "succeeded" and status["restarts"] >= 1, status
            assert any(f["kind"] == "restart" for f in status["findings"]), status


def reference_loss(address, tmp_path):
    """The final loss of an uninterrupted run."""
    ref = submit(address, tmp_path)
    out, _ = ref.communicate(timeout=300)
    assert ref.returncode == 0, out
    return float(final_line(out).split()[1])


def submit_elastic(address, tmp_path, **env):
    """The job with --min-workers 2, one restart and a checkpoint every EVERY steps."""
    return submit(address, tmp_path, ["--max-restarts", "1", "--min-workers", "2",
                                      "--checkpoint-dir", str(tmp_path / "ckpt"),
                                      "--checkpoint-every", str(EVERY)], **env)


def test_an_elastic_job_restarts_on_fewer_workers_and_reshards(tmp_path):
    """--min-workers 2: with no spare, the 2x2 job restarts on the two workers left of three (dp
    shrinks to 1), loads its dp=2 checkpoint resharded, and ends at the uninterrupted run's loss
    (to rounding: the reductions now run over other shards)."""
    env = dict(os.environ, KILN_COMM_TIMEOUT_S="10", OMP_NUM_THREADS="1")
    with killable_workers(tmp_path, 4, ["--heartbeat-ms", "200", "--dead-after", "3"],
                          env=env) as (address, workers):
        want = reference_loss(address, tmp_path)
        go = tmp_path / "go"
        p = submit_elastic(address, tmp_path, CHAOS_PAUSE_AT="7", CHAOS_GO=str(go))
        for line in p.stdout:
            if line.startswith("step 7 "):
                break
        job = json.loads(kiln_cli(address, "jobs", "--json").splitlines()[-1])
        workers.kill(job["worker_addresses"][-1])
        go.write_text("")
        rest, _ = p.communicate(timeout=300)
        assert p.returncode == 0, rest
        assert "resume from 6" in rest, rest
        got = float(final_line(rest).split()[1])
        assert abs(got - want) <= 1e-5 * abs(want), (got, want)
        status = json.loads(kiln_cli(address, "status", job["job_id"], "--json"))
        assert status["workers"] == 2 and status["max_workers"] == 4, status
        assert status["mesh"] == [{"name": "dp", "size": 1}, {"name": "tp", "size": 2}], status


def test_an_elastic_job_grows_back_when_workers_return(tmp_path):
    """See Note [Growing back]: the 2x2 job, shrunk to two workers by a lost one (as above), grows
    back to four once two workers are idle for --grow-after-s: its driver is stopped, and runs a
    third time on the full mesh from its last checkpoint, without using up a restart."""
    env = dict(os.environ, KILN_COMM_TIMEOUT_S="10", OMP_NUM_THREADS="1")
    with killable_workers(tmp_path, 4, ["--heartbeat-ms", "200", "--dead-after", "3",
                                        "--grow-after-s", "1"], env=env) as (address, workers):
        want = reference_loss(address, tmp_path)
        go = tmp_path / "go"
        p = submit_elastic(address, tmp_path, CHAOS_PAUSE_AT="4", CHAOS_GO=str(go),
                           CHAOS_GROW_AT="7")
        lines = []
        for line in p.stdout:
            lines.append(line)
            if line.startswith("step 4 "):
                break
        job = json.loads(kiln_cli(address, "jobs", "--json").splitlines()[-1])
        workers.kill(job["worker_addresses"][-1])
        go.write_text("")
        for line in p.stdout:  # the second run, on two workers (the third alive stays idle)
            lines.append(line)
            if line.startswith("step 7 "):
                break
        status = json.loads(kiln_cli(address, "status", job["job_id"], "--json"))
        assert status["workers"] == 2, status
        workers.add("back")  # two idle now: one more "dp" row of the mesh
        rest, _ = p.communicate(timeout=300)
        out = "".join(lines) + rest
        assert p.returncode == 0, out
        assert "run 2" in out and "resume from 6" in out.split("run 2")[1], out
        got = float(final_line(out).split()[1])
        assert abs(got - want) <= 1e-5 * abs(want), (got, want)
        status = json.loads(kiln_cli(address, "status", job["job_id"], "--json"))
        assert status["state"] == "succeeded" and status["workers"] == 4, status
        assert status["restarts"] == 1, status  # the growth is not a restart
        assert status["mesh"] == [{"name": "dp", "size": 2}, {"name": "tp", "size": 2}], status
        grow = [f for f in status["findings"] if f["kind"] == "grow"]
        assert grow and "growing from 2 to 4 workers" in grow[0]["text"], status
