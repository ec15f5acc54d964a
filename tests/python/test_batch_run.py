"""Batch jobs end to end (Note [Batch jobs] in worker/src/batch.h): kiln.batch.save_job writes a
data-parallel MLP + AdamW step, `kiln submit --batch` runs it on a coordinator's gang of two
kiln-workers with no client, and its final checkpoint holds the weights that single-process
training on the same global batches reaches; with dropout, each step and rank draws its own masks
(Note [Random batch steps]), which an eager run at the same generator states reproduces. Then the
chaos test through a batch job: a worker SIGKILLed mid-run (20 trials), a spare takes its place,
the job restarts from its last checkpoint and ends with weights bit for bit those of an
uninterrupted run. Then the same for a step on a 2x2 mesh (Note [Batch jobs on a mesh]): tensor
parallel within data parallel, saved by four ranks, run on four workers."""
import json
import os
import random
import subprocess
import sys
import time

import pytest

import kiln
import kiln.distributed.checkpoint as dcp
import kiln.nn as nn
import kiln.nn.functional as F

from gang_jobs import CLI, coordinator_and_workers, kiln_cli, killable_workers
from kiln_run import EXPECT, KILN_CLI, run_ranks

WORLD, BATCH, ROWS = 2, 16, 64


def model_and_opt(dropout=False):
    kiln.manual_seed(0)
    mid = [nn.Dropout(0.5)] if dropout else []
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), *mid, nn.Linear(16, 4))
    return model, kiln.optim.AdamW(model.parameters(), lr=0.01)


def make_job(tmp_path, steps, dropout=False, seed=0):
    """The data file, the initial checkpoint and the spec; returns the spec's path."""
    g = kiln.Generator().manual_seed(1)
    x, y = kiln.randn(ROWS, 8, generator=g), kiln.randn(ROWS, 4, generator=g)
    kiln.save({"x": x, "y": y}, str(tmp_path / "data.safetensors"))
    model, opt = model_and_opt(dropout)
    # The optimizer's state must exist before the capture: one zero-gradient step makes it.
    for p in model.parameters():
        p.grad = kiln.zeros_like(p)
    opt.step()

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        for p in model.parameters():
            p.grad = kiln._C.all_reduce(p.grad, "avg", "world")
        opt.step()
        return loss

    rows = BATCH // WORLD
    spec = tmp_path / "job.kbj"
    kiln.batch.save_job(spec, step, {"x": x[:rows], "y": y[:rows]},
                        {"model": model.state_dict(), "optim": opt.state_dict()},
                        data_file=tmp_path / "data.safetensors", batch_size=BATCH, steps=steps,
                        init_checkpoint=tmp_path / "init", world_size=WORLD, seed=seed)
    return spec


def reference(tmp_path, steps, dropout=False, seed=0, rng_count=0, sizes=()):
    """Single-process training from the initial checkpoint on the same global batches. With
    dropout, each rank's rows run separately with the default generator where that rank's step
    draws (Note [Random batch steps]), and the gradients are averaged as the all_reduce does.
    sizes=[(S, B), ...]: from step S on, global batches of B rows (Note [Elastic batch jobs])."""
    model, opt = model_and_opt(dropout)
    for p in model.parameters():
        p.grad = kiln.zeros_like(p)
    opt.step()
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    dcp.load(state, checkpoint_id=tmp_path / "init")
    opt.load_state_dict(state["optim"])
    data = kiln.load(str(tmp_path / "data.safetensors"))
    parts = WORLD if dropout else 1
    for s in range(steps):
        opt.zero_grad(set_to_none=True)
        b = ([BATCH] + [b for start, b in sorted(sizes) if s >= start])[-1]
        rows = b // parts
        for r in range(parts):
            idx = kiln.arange(s * b + r * rows, s * b + (r + 1) * rows) % ROWS
            x, y = data["x"].index_select(0, idx), data["y"].index_select(0, idx)
            if dropout:
                kiln.default_generator().set_state((seed, (s * WORLD + r) * rng_count))
            (F.mse_loss(model(x), y) / parts).backward()
        opt.step()
    return {k: v.clone() for k, v in model.state_dict().items()}


def saved(ckpt, dropout=False):
    model, opt = model_and_opt(dropout)
    state = {"model": model.state_dict(), "step": 0}
    dcp.load(state, checkpoint_id=ckpt, strict=False)
    return state["step"], {k: v.clone() for k, v in model.state_dict().items()}


def assert_trained_as_one_process(tmp_path, steps):
    """The job's final checkpoint holds the weights of reference(), to rounding."""
    step, got = saved(tmp_path / "ckpt")
    assert step == steps
    want = reference(tmp_path, steps)
    for k in want:
        err = float((got[k] - want[k]).abs().max())
        assert err <= 1e-5 * float(want[k].abs().max()), (k, err)


def submit(address, spec, *args, workers=WORLD):
    return subprocess.Popen([CLI, "submit", "--coordinator", address, "--batch", str(spec),
                             "--workers", str(workers), *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def test_a_batch_job_trains_with_no_client(tmp_path):
    steps = 10
    spec = make_job(tmp_path, steps)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with coordinator_and_workers(tmp_path, WORLD, env=env) as address:
        p = submit(address, spec, "--checkpoint-dir", tmp_path / "ckpt", "--checkpoint-every", 5)
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out
        assert "[kiln-worker rank 0] finished step 10" in out, out
        job = json.loads(kiln_cli(address, "jobs", "--json").splitlines()[-1])
        assert job["state"] == "succeeded" and job["command"] == [], job
        steps_out = kiln_cli(address, "steps", job["job_id"], "--json").splitlines()
        records = [json.loads(l) for l in steps_out]
        assert sorted({(r["step"], r["rank"]) for r in records}) == \
            [(s, r) for s in range(1, steps + 1) for r in range(WORLD)], records
        assert all(r["loss"] > 0 for r in records), records
    assert_trained_as_one_process(tmp_path, steps)


def test_a_batch_job_with_dropout_draws_per_step_and_rank(tmp_path):
    steps, seed = 6, 1234
    spec = make_job(tmp_path, steps, dropout=True, seed=seed)
    info = kiln.batch.load_job(spec)
    assert info["rng_count"] > 0, info
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with coordinator_and_workers(tmp_path, WORLD, env=env) as address:
        p = submit(address, spec, "--checkpoint-dir", tmp_path / "ckpt", "--checkpoint-every", 3)
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out
    step, got = saved(tmp_path / "ckpt", dropout=True)
    assert step == steps
    want = reference(tmp_path, steps, dropout=True, seed=seed, rng_count=info["rng_count"])
    other = reference(tmp_path, steps, dropout=True, seed=seed + 1, rng_count=info["rng_count"])
    for k in want:
        err = float((got[k] - want[k]).abs().max())
        assert err <= 1e-5 * float(want[k].abs().max()), (k, err)
    # The masks matter: another seed's masks end elsewhere.
    assert any(float((got[k] - v).abs().max()) > 1e-3 for k, v in other.items()), other


def chaos(tmp_path, spec, world, steps, every, trials):
    """`trials` trials: a random worker of the gang of `world` is SIGKILLed at a random step past
    the first checkpoint; a spare takes its place. Each job succeeds after one restart, resumes
    less than a checkpoint interval behind the step its surviving ranks reached, and ends with the
    uninterrupted run's weights, bit for bit: the model has dropout, so the restarted steps must
    draw the masks the uninterrupted run drew (Note [Random batch steps])."""
    env = dict(os.environ, OMP_NUM_THREADS="1", KILN_COMM_TIMEOUT_S="10")

    with killable_workers(tmp_path, world + 1, ["--heartbeat-ms", "200", "--dead-after", "3"],
                          env=env) as (address, workers):  # one spare
        ref = submit(address, spec, "--checkpoint-dir", tmp_path / "ref", "--checkpoint-every",
                     every, workers=world)
        out, _ = ref.communicate(timeout=600)
        assert ref.returncode == 0, out
        ref_step, want = saved(tmp_path / "ref", dropout=True)
        assert ref_step == steps
        for trial in range(trials):
            rng = random.Random(trial)
            # Well before the end: the steps a rank reports reach the coordinator ~0.1 s late.
            kill_after = rng.randint(every + 1, steps - 5 * every)
            ckpt = tmp_path / f"ckpt{trial}"
            p = submit(address, spec, "--checkpoint-dir", ckpt, "--checkpoint-every", every,
                       "--max-restarts", "2", workers=world)
            deadline = time.monotonic() + 300
            while True:  # until the job is past `kill_after`
                job = [j for j in map(json.loads, kiln_cli(address, "jobs", "--json").split(
                    "\n")[:-1]) if j["checkpoint_dir"] == str(ckpt)] or [{"state": "queued"}]
                job = job[0]
                done = max((s["step"] for s in job.get("last_steps", [])), default=0)
                if job["state"] == "running" and done >= kill_after:
                    break
                assert job["state"] in ("queued", "running") and time.monotonic() < deadline, job
                time.sleep(0.01)
            workers.kill(rng.choice(job["worker_addresses"]))
            workers.add(f"spare{trial}")
            out, _ = p.communicate(timeout=600)
            assert p.returncode == 0, f"trial {trial}:\n{out}"
            assert done < steps, f"trial {trial}: the job ended before the kill"
            status = json.loads(kiln_cli(address, "status", job["job_id"], "--json"))
            assert status["state"] == "succeeded" and status["restarts"] == 1, status
            # The surviving ranks' last step, and where the restart resumed.
            failed = [int(l.split("failed after step ")[1].split()[0].rstrip(":"))
                      for l in out.splitlines() if "failed after step" in l]
            resumed = [int(l.split("resumed after step ")[1].rstrip(")"))
                       for l in out.splitlines() if "finished step" in l and "resumed" in l]
            assert failed and resumed, f"trial {trial}:\n{out}"
            # (A survivor that failed inside a save the other ranks committed resumes ahead.)
            assert max(failed) - resumed[0] < every, f"trial {trial}:\n{out}"
            step, got = saved(ckpt, dropout=True)
            assert step == steps, f"trial {trial}"
            for k in want:
                assert bool((got[k] == want[k]).all()), (trial, k)
            print(f"trial {trial}: killed after step {done}; the survivors reached step "
                  f"{max(failed)}, the restart resumed after step {resumed[0]}")


TRIALS = int(os.environ.get("KILN_CHAOS_TRIALS", "20"))


def test_a_batch_job_survives_a_killed_worker(tmp_path):
    """The chaos test on a data-parallel gang of two (KILN_CHAOS_TRIALS trials, 20 by default)."""
    chaos(tmp_path, make_job(tmp_path, 2000, dropout=True, seed=7), WORLD, 2000, 200, TRIALS)


def drained_steps(out):
    """The steps after which ranks drained, from `kiln submit`'s log (Note [Draining batch jobs])."""
    return {int(l.split("drained after step ")[1].split(":")[0].split(" ")[0])
            for l in out.splitlines() if "drained after step" in l}


def running_past(address, step, deadline):
    """The latest job, once it runs and has reported a step past `step`."""
    while True:
        jobs = [json.loads(l) for l in kiln_cli(address, "jobs", "--json").splitlines()]
        job = jobs[-1] if jobs else {"state": "queued"}
        done = max((s["step"] for s in job.get("last_steps", [])), default=0)
        if job["state"] == "running" and done > step:
            return job
        assert job["state"] in ("queued", "running") and time.monotonic() < deadline, job
        time.sleep(0.01)


def shrink(tmp_path, spec, world, min_workers, steps, every, grow=False):
    """Runs `spec` on `world` workers with --min-workers and no spare, kills one past the first
    checkpoint, and checks the job ends on `min_workers` where one process training on the
    batches it ran does: 16 rows a step, then 8 from the step it resumed after (each
    data-parallel rank keeps its 8 rows: Note [Elastic batch jobs]). With `grow`, a worker comes
    back once the job runs small, and the job grows back to `world` (16 rows again from the step
    it resumed after then: Note [Growing back]); its weights are not compared then."""
    env = dict(os.environ, OMP_NUM_THREADS="1", KILN_COMM_TIMEOUT_S="10")
    with killable_workers(tmp_path, world, ["--heartbeat-ms", "200", "--dead-after", "3",
                                            "--grow-after-s", "1"], env=env) as (address, workers):
        p = submit(address, spec, "--checkpoint-dir", tmp_path / "ckpt", "--checkpoint-every",
                   every, "--max-restarts", "1", "--min-workers", min_workers, workers=world)
        deadline = time.monotonic() + 120
        job = running_past(address, every, deadline)
        workers.kill(job["worker_addresses"][-1])
        if grow:
            while True:  # until it runs small
                now = json.loads(kiln_cli(address, "status", job["job_id"], "--json"))
                if now["state"] == "running" and now["workers"] == min_workers:
                    break
                assert now["state"] in ("restarting", "running"), now
                assert time.monotonic() < deadline + 120, now
                time.sleep(0.01)
            workers.add("back")
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out
        status = json.loads(kiln_cli(address, "status", job["job_id"], "--json"))
        assert status["state"] == "succeeded", status
        assert status["workers"] == (world if grow else min_workers), status
    resumed = []  # where each run after the first resumed, as its ranks report it
    for line in out.splitlines():
        if "(resumed after step " in line:
            r = int(line.split("(resumed after step ")[1].split(")")[0])
            resumed += [] if r in resumed else [r]
    assert len(resumed) == 1 + grow and every <= resumed[0] < steps, out
    if grow:  # the grow drained the small gang at one step and resumed there (nothing lost)
        assert drained_steps(out) == {resumed[1]}, out
    step, got = saved(tmp_path / "ckpt")
    assert step == steps
    if grow:  # tens of thousands of steps (for time to grow): rounding blurs a comparison
        return status
    want = reference(tmp_path, steps, sizes=[(resumed[0], BATCH // 2)])
    unshrunk = reference(tmp_path, steps)
    for k in want:
        err = float((got[k] - want[k]).abs().max())
        assert err <= 1e-4 * float(want[k].abs().max()), (k, err)
        assert float((got[k] - unshrunk[k]).abs().max()) > 1e-2 * float(want[k].abs().max()), k
    return status


def test_an_elastic_batch_job_goes_on_with_fewer_workers(tmp_path):
    """The data-parallel job restarts on the one worker left."""
    shrink(tmp_path, make_job(tmp_path, 600), WORLD, 1, 600, 100)


def test_an_elastic_batch_job_grows_back(tmp_path):
    """The data-parallel job shrinks to one worker, then grows back to two when one returns."""
    status = shrink(tmp_path, make_job(tmp_path, 40000), WORLD, 1, 40000, 2000, grow=True)
    assert any(f["kind"] == "grow" for f in status["findings"]), status
    assert status["restarts"] == 1, status


def test_an_elastic_batch_job_on_a_2x2_mesh_shrinks_its_first_dim(tmp_path):
    """The 2x2 job (its two steps repeat along "dp") restarts on two of the three workers left,
    dp=1, each rank running the step of its place in its tp pair."""
    status = shrink(tmp_path, make_mesh_job(tmp_path, 600), 4, 2, 600, 100)
    assert status["mesh"] == [{"name": "dp", "size": 1}, {"name": "tp", "size": 2}], status


def test_a_batch_job_whose_data_is_gone_fails_clearly(tmp_path):
    """A worker's error (here: the data file was removed after save_job) fails the job with the
    worker's message, after its restarts, and frees the gang."""
    spec = make_job(tmp_path, 5)
    os.remove(tmp_path / "data.safetensors")
    with coordinator_and_workers(tmp_path, WORLD, env=dict(os.environ, OMP_NUM_THREADS="1")) \
            as address:
        p = submit(address, spec, "--max-restarts", 1)
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 1, out
        job = json.loads(kiln_cli(address, "jobs", "--json").splitlines()[-1])
        assert job["state"] == "failed" and job["restarts"] == 1, job
        assert "data.safetensors" in job["message"] and "rank" in job["message"], job
        assert "failed after step 0" in out, out
        workers = [json.loads(l) for l in kiln_cli(address, "workers", "--json").splitlines()]
        assert all(w["state"] == "idle" for w in workers), workers


# The 2x2 job's maker, run by four ranks (`kiln run --nproc 4`): the model of model_and_opt, its
# Linears column- and row-wise parallel over "tp", the gradients averaged over "dp" in the step;
# the data and init checkpoint as make_job writes them. Args: DIR STEPS DROPOUT(0/1) SEED.
MESH_JOB = r"""
import sys
import kiln, kiln.nn as nn, kiln.nn.functional as F
import kiln.distributed as dist
from kiln.distributed.device_mesh import init_device_mesh
from kiln.distributed.tensor import DTensor
from kiln.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
out, steps, dropout, seed = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])
BATCH, ROWS = 16, 64
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
kiln.manual_seed(0)
mid = [nn.Dropout(0.5)] if dropout else []
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), *mid, nn.Linear(16, 4))
parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(),
                                       str(len(model) - 1): RowwiseParallel()})
opt = kiln.optim.AdamW(model.parameters(), lr=0.01)
for p in model.parameters():
    p.grad = kiln.zeros_like(p)
opt.step()
opt.zero_grad(set_to_none=True)
dp = mesh.get_group("dp").name

def step(x, y):
    loss = F.mse_loss(model(x), y)
    loss.backward()
    for p in model.parameters():
        g = p.grad
        p.grad = DTensor.from_local(kiln._C.all_reduce(g.to_local(), "avg", dp), g.device_mesh,
                                    g.placements)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss

if dist.get_rank() == 0:
    g = kiln.Generator().manual_seed(1)
    x, y = kiln.randn(ROWS, 8, generator=g), kiln.randn(ROWS, 4, generator=g)
    kiln.save({"x": x, "y": y}, f"{out}/data.safetensors")
dist.barrier()
data = kiln.load(f"{out}/data.safetensors")
rows = BATCH // 2
kiln.batch.save_job(f"{out}/job.kbj", step, {"x": data["x"][:rows], "y": data["y"][:rows]},
                    {"model": model.state_dict(), "optim": opt.state_dict()},
                    data_file=f"{out}/data.safetensors", batch_size=BATCH, steps=steps,
                    init_checkpoint=f"{out}/init", mesh=mesh, seed=seed)
"""


def make_mesh_job(tmp_path, steps, dropout=False, seed=0):
    if not KILN_CLI.exists():
        pytest.skip(f"{KILN_CLI} is not built")
    script = tmp_path / "mesh_job.py"
    script.write_text(MESH_JOB)
    r = subprocess.run([str(KILN_CLI), "run", "--nproc", "4", "--timeout", "120", sys.executable,
                        str(script), str(tmp_path), str(steps), str(int(dropout)), str(seed)],
                       capture_output=True, text=True, timeout=180,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path),
                                KILN_COMM_TIMEOUT_S="30", OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stdout + r.stderr
    return tmp_path / "job.kbj"


def test_a_batch_job_on_a_2x2_mesh_trains_as_one_process(tmp_path):
    """Four ranks save the job; the spec carries the mesh and, since a row-wise layer adds its
    bias on one rank of each tp pair, two steps. On four workers it ends with one process's
    weights on the same global batches (to rounding: TP splits the sums)."""
    steps = 8
    spec = make_mesh_job(tmp_path, steps)
    info = kiln.batch.load_job(spec)
    assert info["mesh"] == [("dp", 2), ("tp", 2)] and info["programs"] == 2, info
    with coordinator_and_workers(tmp_path, 4, env=dict(os.environ, OMP_NUM_THREADS="1")) \
            as address:
        p = submit(address, spec, "--checkpoint-dir", tmp_path / "ckpt", "--checkpoint-every", 4,
                   workers=4)
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out
        job = json.loads(kiln_cli(address, "jobs", "--json").splitlines()[-1])
        assert job["state"] == "succeeded", job
        status = json.loads(kiln_cli(address, "status", job["job_id"], "--json"))
        assert status["mesh"] == [{"name": "dp", "size": 2}, {"name": "tp", "size": 2}], status
        # A --mesh other than the spec's is refused at submit.
        bad = subprocess.run([CLI, "submit", "--coordinator", address, "--batch", str(spec),
                              "--workers", "4", "--mesh", "dp=4,tp=1"],
                             capture_output=True, text=True, timeout=60)
        assert bad.returncode != 0 and "captured on (dp=2,tp=2)" in bad.stderr, bad.stderr
    assert_trained_as_one_process(tmp_path, steps)


def test_a_batch_job_on_a_2x2_mesh_survives_a_killed_worker(tmp_path):
    """The chaos test on the 2x2 job (tensor parallel within data parallel, with dropout): four
    workers and a spare, KILN_CHAOS_TRIALS trials."""
    chaos(tmp_path, make_mesh_job(tmp_path, 1000, dropout=True, seed=7), 4, 1000, 100, TRIALS)


# Two ranks save a step on a mesh wrongly; every rank raises, none waits in a collective.
MESH_ERRORS = r"""
import kiln, kiln.nn as nn, kiln.nn.functional as F
import kiln.distributed as dist
from kiln.distributed.device_mesh import init_device_mesh
out = __import__("sys").argv[1]
mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
rank = dist.get_rank()
kiln.manual_seed(0)
model = nn.Linear(4, 2)
opt = kiln.optim.SGD(model.parameters(), lr=0.1)
def step(x, y):
    opt.zero_grad(set_to_none=True)
    loss = F.mse_loss(model(x), y)
    loss.backward()
    for p in model.parameters():
        p.grad = kiln._C.all_reduce(p.grad, "avg", mesh.get_group("dp").name)
    opt.step()
    return loss
data = {"x": kiln.randn(2, 4), "y": kiln.randn(2, 2)}
state = {"model": model.state_dict()}
def save(state, steps):
    kiln.batch.save_job(f"{out}/job.kbj", step, data, state, data_file=f"{out}/d.safetensors",
                        batch_size=4, steps=steps, init_checkpoint=f"{out}/init", mesh=mesh)
# Rank 1 leaves the model out of its state: it names the tensor, rank 0 names rank 1.
if rank == 1:
    expect(lambda: save({}, 5), ValueError, "not in `state`")
else:
    expect(lambda: save(state, 5), RuntimeError, "rank 1 could not capture the step")
# The ranks disagree on the step count: rank 0 refuses to merge, rank 1 hears of it.
if rank == 0:
    expect(lambda: save(state, 5), ValueError, "rank 1 captured the step with other settings")
else:
    expect(lambda: save(state, 6), RuntimeError, "rank 0 could not write the spec")
import os
assert not os.path.exists(f"{out}/job.kbj") and not os.path.exists(f"{out}/init")
print(f"rank {rank} ok")
"""


def test_a_step_on_a_mesh_that_a_rank_cannot_save_fails_on_every_rank(tmp_path):
    run_ranks(tmp_path, "mesh_errors", EXPECT + MESH_ERRORS, 2, str(tmp_path))


def test_a_preempted_batch_job_checkpoints_where_it_stopped(tmp_path):
    """A higher-priority job takes the workers of a running batch job. Its ranks agree on a step,
    checkpoint it and stop (Note [Draining batch jobs]); the job shows preempted, then resumes
    from that very step, past its last periodic checkpoint: no step is lost."""
    steps, every = 40000, 10000  # about 0.3 ms a step: long enough to be caught running
    spec = make_job(tmp_path, steps)
    (tmp_path / "u").mkdir()
    urgent = make_job(tmp_path / "u", 5)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with coordinator_and_workers(tmp_path, WORLD, ["--heartbeat-ms", "200"], env=env) as address:
        low = submit(address, spec, "--checkpoint-dir", tmp_path / "ckpt", "--checkpoint-every",
                     every)
        deadline = time.monotonic() + 120
        job = running_past(address, every, deadline)
        high = submit(address, urgent, "--priority", 5, "--checkpoint-dir", tmp_path / "u" / "ckpt")
        seen = set()
        while "preempted" not in seen:
            now = json.loads(kiln_cli(address, "status", job["job_id"], "--json"))
            seen.add(now["state"])
            assert now["state"] in ("running", "preempted") and time.monotonic() < deadline, now
            time.sleep(0.01)
        out_high, _ = high.communicate(timeout=300)
        assert high.returncode == 0, out_high
        out, _ = low.communicate(timeout=300)
        assert low.returncode == 0, out
        status = json.loads(kiln_cli(address, "status", job["job_id"], "--json"))
        assert status["state"] == "succeeded" and status["restarts"] == 0, status
    drained = drained_steps(out)
    resumed = {int(l.split("(resumed after step ")[1].split(")")[0])
               for l in out.splitlines() if "finished step" in l and "(resumed after step " in l}
    assert len(drained) == 1 and resumed == drained, out  # every rank stopped at one step
    assert every < drained.pop() < steps, out
    step, _ = saved(tmp_path / "ckpt")
    assert step == steps
