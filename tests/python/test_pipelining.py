"""kiln.distributed.pipelining under `kiln run`: a small GPT cut by pipeline() and trained through
every schedule on 2 and 4 ranks, and pp 2 x dp 2 x tp 2 on 8 ranks, against single-process
training (losses and gradients within 1e-5, float32), the action lists and timelines, and the errors (a stage that cannot take its
input, too few microbatches, a model that is not a chain). The measured bubbles are in
test_pipeline_bubble.py."""
import textwrap
from pathlib import Path

import pytest

import kiln
import kiln.nn as nn
from kiln.distributed import pipelining as pp

from kiln_run import EXPECT, run_ranks

# The small GPT as a chain (examples/chargpt.py's gpt_chain; pipeline() cuts chains).
EXAMPLES = str(Path(__file__).resolve().parents[2] / "examples")
MODEL = textwrap.dedent(f"""
    import sys
    sys.path.insert(0, {EXAMPLES!r})
""") + textwrap.dedent("""
    import kiln
    import kiln.nn.functional as F
    from chargpt import gpt_chain

    def gpt(layers):
        kiln.manual_seed(0)
        return gpt_chain(vocab=32, block=8, layers=layers, heads=2, width=16)

    def lm_loss(logits, y):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    from kiln.distributed import pipelining as pp
    SCHEDULES = {"gpipe": pp.ScheduleGPipe, "1f1b": pp.Schedule1F1B, "zbh1": pp.ScheduleZBH1,
                 "interleaved_1f1b": pp.ScheduleInterleaved1F1B}

    def reference_step(ref, ref_opt, step, rows):
        # Step `step`'s batch of `rows` sequences, and the reference's loss and gradients on it.
        kiln.manual_seed(10 + step)
        x, y = kiln.randint(0, 32, (rows, 8)), kiln.randint(0, 32, (rows, 8))
        ref_opt.zero_grad()
        want = lm_loss(ref(x), y)
        want.backward()
        return x, y, want.item()

    def check(what, got_loss, want_loss, params, ref, grad=lambda g: g):
        # The pipeline's loss (None: not on this rank) and its parameters' gradients (`grad`
        # makes each a local CPU tensor) against the reference's, within 1e-5.
        if got_loss is not None:
            assert abs(got_loss - want_loss) <= 1e-5 * max(1, abs(want_loss)), \
                (what, got_loss, want_loss)
        names = dict(ref.named_parameters())
        for name, p in params:
            g, w = grad(p.grad), names[name].grad
            err = ((g - w).abs().max() / w.abs().max().clamp(min=1e-12)).item()
            assert err <= 1e-5, (what, name, err)
""")

COMMON = textwrap.dedent("""
    import math, os, sys
    import kiln, kiln.distributed as dist, kiln.nn as nn
    import kiln.nn.functional as F

    dist.init_process_group()
    RANK, WORLD = dist.get_rank(), dist.get_world_size()

""") + EXPECT + MODEL

PARITY = COMMON + textwrap.dedent("""
    kind, m = sys.argv[1], int(sys.argv[2])
    v = 2 if kind == "interleaved_1f1b" else 1
    n_stages = WORLD * v
    layers = 2 * n_stages - 2          # each middle stage gets 2 blocks
    ref, model = gpt(layers), gpt(layers)
    # Stage 0: embeddings + 1 block; last: 1 block + norm + head; the others 2 blocks.
    cuts = [f"1.{2 * i - 1}" for i in range(1, n_stages)]
    pipe = pp.pipeline(model, split_points=cuts)
    assert pipe.num_stages == n_stages
    stages = [pipe.build_stage(c * WORLD + RANK) for c in range(v)]
    schedule = SCHEDULES[kind](stages if v > 1 else stages[0], n_microbatches=m,
                               loss_fn=lm_loss)
    ref_opt = kiln.optim.SGD(ref.parameters(), lr=0.1)
    opt = kiln.optim.SGD([p for s in stages for p in s.submod.parameters()], lr=0.1)
    last = (n_stages - 1) % WORLD == RANK
    for step in range(3):
        x, y, want = reference_step(ref, ref_opt, step, 2 * m)
        opt.zero_grad()
        losses = []
        if RANK == 0:
            out = schedule.step(x, target=y if last else None, losses=losses)
        else:
            out = schedule.step(target=y if last else None, losses=losses)
        if last:
            assert len(losses) == m and tuple(out.shape) == (2 * m, 8, 32), (losses, out.shape)
        else:
            assert out is None and losses == []
        check((kind, step), sum(l.item() for l in losses) / m if last else None, want,
              [np for s in stages for np in s.submod.named_parameters()], ref)
        ref_opt.step()
        opt.step()
    print(f"rank {RANK} ok", flush=True)
""")

# 3-D parallelism on 8 ranks: pp 2 x dp 2 x tp 2. The small GPT is cut in 2 stages; each stage's
# blocks are tensor parallel over "tp" (chargpt's plan), then fully_shard-ed over "dp"; each dp
# rank's pipeline takes its half of the batch in m microbatches. Losses and every gradient
# against one process training the whole model on the whole batch, float32.
THREE_D = COMMON + textwrap.dedent("""
    from kiln.distributed.device_mesh import init_device_mesh
    from kiln.distributed.fsdp import fully_shard
    from kiln.distributed.tensor import DTensor
    from kiln.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                  parallelize_module)
    kind, m = sys.argv[1], int(sys.argv[2])
    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("pp", "dp", "tp"))
    s, dp = mesh.get_local_rank("pp"), mesh.get_local_rank("dp")
    ref, model = gpt(4), gpt(4)
    stage_mod = pp.pipeline(model, split_points=["1.2"]).get_stage_module(s)
    parallelize_module(stage_mod, mesh["tp"],
                       {"1.*.qkv": ColwiseParallel(use_local_output=False),
                        "1.*.proj": RowwiseParallel(),
                        "1.*.fc": ColwiseParallel(),
                        "1.*.out": RowwiseParallel()})
    for block in stage_mod._modules["1"]:
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(stage_mod, mesh=mesh["dp"])
    stage = pp.PipelineStage(stage_mod, s, 2, group=mesh.get_group("pp"))
    schedule = SCHEDULES[kind](stage, n_microbatches=m, loss_fn=lm_loss)
    ref_opt = kiln.optim.SGD(ref.parameters(), lr=0.1)
    opt = kiln.optim.SGD(stage_mod.parameters(), lr=0.1)
    rows = 2 * m                                  # each dp rank's part of the batch
    for step in range(3):
        x, y, want = reference_step(ref, ref_opt, step, 2 * rows)
        opt.zero_grad()
        xs, ys = x[dp * rows:(dp + 1) * rows], y[dp * rows:(dp + 1) * rows]
        losses, got = [], None
        if s == 0:
            schedule.step(xs)
        else:
            schedule.step(target=ys, losses=losses)
            mine = kiln.tensor([sum(l.item() for l in losses) / m])
            dist.all_reduce(mine, group=mesh.get_group("dp"))
            got = mine.item() / 2
        check((kind, step), got, want, stage_mod.named_parameters(), ref,
              lambda g: g.full_tensor() if isinstance(g, DTensor) else g)
        ref_opt.step()
        opt.step()
    print(f"rank {RANK} ok", flush=True)
""")

# The same GPT on a coordinator's gang (Note [Gang stages]): this one process records every
# stage; stage s's subprogram runs on worker s % 2 alone, activations and gradients go worker to
# worker. Losses and gradients against one process, as above; then a stage whose worker died.
REMOTE_PP = EXPECT + MODEL + textwrap.dedent("""
    import os, sys
    from kiln.distributed.device_mesh import init_device_mesh
    kind = sys.argv[1]
    W = int(os.environ.get("KILN_TEST_WORKERS", "2"))
    session = kiln.connect(os.environ["KILN_TEST_GANG"], workers=W, wait_ms=20000)
    dev = session.device
    v = 2 if kind == "interleaved_1f1b" else 1
    n_stages, m = 2 * v, 4
    layers = 2 * n_stages - 2
    ref, model = gpt(layers), gpt(layers)
    pipe = pp.pipeline(model, split_points=[f"1.{2 * i - 1}" for i in range(1, n_stages)])
    if W == 4:   # a (pp, dp) mesh: stage s on workers 2(s % 2) and 2(s % 2) + 1, replicas
        mesh = init_device_mesh(str(dev), (2, 2), mesh_dim_names=("pp", "dp"))
        stages = [pipe.build_stage(i, group=mesh) for i in range(n_stages)]
        want_workers = [[2 * (i % 2), 2 * (i % 2) + 1] for i in range(n_stages)]
    else:
        stages = [pipe.build_stage(i, device=dev) for i in range(n_stages)]
        want_workers = [[i % min(W, n_stages)] for i in range(n_stages)]
    dp = len(want_workers[0])
    assert [s.workers for s in stages] == want_workers, [s.workers for s in stages]
    assert all(str(p.device) == str(dev) for p in model.parameters())
    cls = SCHEDULES[kind]
    schedule = cls(stages, n_microbatches=m, loss_fn=lm_loss)
    ref_opt = kiln.optim.SGD(ref.parameters(), lr=0.1)
    opt = kiln.optim.SGD(model.parameters(), lr=0.1)
    for step in range(2):
        x, y, want = reference_step(ref, ref_opt, step, 2 * m * dp)
        opt.zero_grad()
        losses = []
        out = schedule.step(x, target=y, losses=losses)
        assert tuple(out.shape) == (2 * m * dp, 8, 32) and str(out.device) == str(dev), out
        check((kind, step), sum(l.item() for l in losses) / m, want, model.named_parameters(),
              ref, lambda g: g.cpu())
        ref_opt.step()
        opt.step()
    names = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        assert (p.cpu() - names[name].detach()).abs().max().item() <= 1e-5, name
    with kiln.no_grad():
        logits = schedule.eval(x).cpu()
        assert (logits - ref(x)).abs().max().item() <= 1e-5
    # Misuse: one stage of a gang pipeline; a stage already on every worker.
    expect(lambda: cls(stages[:1], n_microbatches=m, loss_fn=lm_loss), ValueError,
           f"runs all {n_stages} stages from this one process")
    expect(lambda: pp.PipelineStage(gpt(1).to(dev), 0, 2, device=dev), ValueError,
           "is on remote:0 already, on every worker")
    print("rank 0 ok", flush=True)
""")


# A gang pipeline whose worker dies between steps: the next step raises on the client, within
# the timeout, naming the worker, and nothing hangs (the other stage's worker, waiting for a
# transfer from the dead one, times out: KILN_COMM_TIMEOUT_S=20 for gang_of's workers).
DEAD_PP = MODEL + textwrap.dedent("""
    import os, signal, sys, time
    session = kiln.connect(os.environ["KILN_TEST_GANG"], workers=2, wait_ms=20000)
    model = gpt(2)
    pipe = pp.pipeline(model, split_points=["1.1"])
    stages = [pipe.build_stage(i, device=session.device) for i in range(2)]
    schedule = pp.Schedule1F1B(stages, n_microbatches=2, loss_fn=lm_loss)
    x, y = kiln.randint(0, 32, (4, 8)), kiln.randint(0, 32, (4, 8))
    losses = []
    schedule.step(x, target=y, losses=losses)
    assert all(l.item() > 0 for l in losses)
    os.kill(int(os.environ["KILN_TEST_KILL"]), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        losses = []
        schedule.step(x, target=y, losses=losses)
        print([l.item() for l in losses])
        session.sync()
    except RuntimeError as e:
        assert "UNAVAILABLE" in str(e) or "rank" in str(e), str(e)
    else:
        raise AssertionError("a step on a gang with a dead worker succeeded")
    assert time.monotonic() - t0 < 60, time.monotonic() - t0
    print("rank 0 ok", flush=True)
""")


# Each rank saves its stage's state (the model's own names), and one process without a pipeline
# loads it into the whole model: PP to no PP, bit for bit.
PP_SAVE = COMMON + textwrap.dedent("""
    import kiln.distributed.checkpoint as dcp
    model = gpt(2)
    with kiln.no_grad():
        for p in model.parameters():
            p.add_(kiln.randn(p.shape))      # not the init: the load must bring these
    pipe = pp.pipeline(model, split_points=["1.1"])
    stage = pipe.build_stage(RANK)
    dcp.save({"model": stage.submod.state_dict(), "step": 7}, checkpoint_id=sys.argv[1])
    if RANK == 0:
        kiln.save(model.state_dict(), sys.argv[2])   # what the whole model must come back as
    print(f"rank {RANK} ok", flush=True)
""")

ERRORS = COMMON + textwrap.dedent("""
    # Stage 0 makes 16 features, stage 1 wants 12: every rank raises, naming the stage.
    mod = nn.Linear(8, 16) if RANK == 0 else nn.Linear(12, 4)
    stage = pp.PipelineStage(mod, RANK, 2)
    sched = pp.Schedule1F1B(stage, n_microbatches=2, loss_fn=F.mse_loss)
    want = ("pipeline: stage 1 cannot take stage 0's output ([2, 16] float32)" if RANK == 1
            else "pipeline: stage 1 (rank 1) cannot take its input")
    expect(lambda: sched.step(kiln.randn(4, 8)) if RANK == 0
           else sched.step(target=kiln.randn(4, 4)), ValueError, want)
    # The same stages, fixed, then run: the failed inference left nothing behind.
    mod = nn.Linear(8, 16) if RANK == 0 else nn.Linear(16, 4)
    stage = pp.PipelineStage(mod, RANK, 2)
    sched = pp.Schedule1F1B(stage, n_microbatches=2, loss_fn=F.mse_loss)
    sched.step(kiln.randn(4, 8)) if RANK == 0 else sched.step(target=kiln.randn(4, 4))
    # Too few microbatches for the interleaved schedule, and a stage on the wrong rank.
    stages = [pp.PipelineStage(nn.Linear(4, 4), c * WORLD + RANK, 2 * WORLD) for c in range(2)]
    expect(lambda: pp.ScheduleInterleaved1F1B(stages, n_microbatches=1), ValueError,
           f"interleaved_1f1b over {WORLD} ranks needs a multiple of {WORLD} microbatches")
    expect(lambda: pp.PipelineStage(nn.Linear(4, 4), (RANK + 1) % WORLD, WORLD), ValueError,
           f"belongs on rank {(RANK + 1) % WORLD}")
    # The rank of stage 0 must pass inputs; a batch smaller than the microbatch count.
    stage = pp.PipelineStage(nn.Linear(4, 4), RANK, WORLD)
    sched = pp.ScheduleGPipe(stage, n_microbatches=3, loss_fn=F.mse_loss)
    if RANK == 0:
        expect(lambda: sched.step(), ValueError, "this rank runs stage 0 and must pass the inputs")
        expect(lambda: sched.step(kiln.randn(2, 4)), ValueError,
               "of shape [2, 4] cannot be split in 3 microbatches")
    print(f"rank {RANK} ok", flush=True)
""")


def run(tmp_path, name, script, nproc, *args, env=None):
    return run_ranks(tmp_path, name, script, nproc, *args, timeout=150, env=env)


@pytest.mark.parametrize("kind,m", [("gpipe", 3), ("1f1b", 5), ("zbh1", 4),
                                    ("interleaved_1f1b", 4)])
def test_every_schedule_matches_single_process(tmp_path, kind, m):
    run(tmp_path, "parity", PARITY, 2, kind, str(m))


@pytest.mark.parametrize("kind,m", [("1f1b", 6), ("zbh1", 4), ("interleaved_1f1b", 4)])
def test_four_ranks_match_single_process(tmp_path, kind, m):
    run(tmp_path, "parity", PARITY, 4, kind, str(m))


def test_pipeline_checkpoint_loads_without_a_pipeline(tmp_path):
    import kiln.distributed.checkpoint as dcp
    ckpt, want = tmp_path / "ckpt", tmp_path / "want.kiln"
    run(tmp_path, "pp_save", PP_SAVE, 2, str(ckpt), str(want))
    ns = {}
    exec(MODEL, ns)
    kiln.manual_seed(123)
    model = ns["gpt"](2)
    state = {"model": model.state_dict(), "step": 0}
    dcp.load(state, checkpoint_id=ckpt)
    assert state["step"] == 7
    saved = kiln.load(want)
    assert sorted(saved) == sorted(model.state_dict())
    for name, t in model.state_dict().items():
        assert bool((t == saved[name]).all()), name


def test_errors(tmp_path):
    run(tmp_path, "errors", ERRORS, 2)


def test_action_lists_and_timelines(tmp_path):
    acts = pp.schedule_actions("1f1b", 2, 2)
    assert [repr(a) for a in acts[1]] == ["1RECV_F0", "1F0", "1B0", "1SEND_B0", "1RECV_F1",
                                          "1F1", "1B1", "1SEND_B1"]
    assert (acts[0][0].op, acts[0][0].stage, acts[0][0].microbatch) == ("F", 0, 0)
    assert pp.format_actions(acts).startswith("rank 0: 0F0 0SEND_F0 0F1")
    for p, m in [(2, 4), (4, 8)]:
        want = (p - 1) / (m + p - 1)
        for kind in ("gpipe", "1f1b"):
            assert abs(pp.bubble_fraction(pp.simulate(pp.schedule_actions(kind, p, m)), p)
                       - want) < 1e-12
        zb = pp.bubble_fraction(pp.simulate(pp.schedule_actions("zbh1", p, m)), p)
        assert zb < want
    trace = pp.chrome_trace(pp.simulate(pp.schedule_actions("zbh1", 2, 2)))
    names = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {"0F0", "0I1", "1W1"} <= names
    tracks = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert tracks == {"rank 0", "rank 1"}
    with pytest.raises(ValueError, match="the schedules are gpipe, 1f1b, interleaved_1f1b, zbh1"):
        pp.schedule_actions("pipedream", 2, 2)


def test_pipeline_split():
    kiln.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Sequential(nn.Tanh(), nn.Linear(8, 8)),
                          nn.Linear(8, 2))
    pipe = pp.pipeline(model, split_points=["1.1"])
    assert pipe.num_stages == 2
    assert list(pipe.get_stage_module(1).state_dict()) == ["1.1.weight", "1.1.bias",
                                                           "2.weight", "2.bias"]
    x = kiln.randn(3, 4)
    h = pipe.get_stage_module(1)(pipe.get_stage_module(0)(x))
    assert (h - model(x)).abs().max().item() == 0
    same = pp.pipeline(model, split_spec={"1.0": pp.SplitPoint.END})
    assert list(same.get_stage_module(0).state_dict()) == ["0.weight", "0.bias"]
    with pytest.raises(ValueError, match="split point 'nope' is not a module of the chain"):
        pp.pipeline(model, split_points=["nope"])
    with pytest.raises(ValueError, match="would leave a stage empty"):
        pp.pipeline(model, split_points=["0"])
    with pytest.raises(TypeError, match="is not an nn.Sequential"):
        pp.pipeline(nn.Linear(2, 2), split_points=[])


@pytest.mark.parametrize("kind", ["gpipe", "1f1b", "zbh1"])
def test_three_d_parallel_training_matches_one_process(tmp_path, kind):
    run(tmp_path, "three_d", THREE_D, 8, kind, "2", env={"OMP_NUM_THREADS": "1"})


@pytest.mark.parametrize("kind", ["gpipe", "1f1b", "zbh1", "interleaved_1f1b"])
def test_gang_pipeline_matches_one_process(tmp_path, kind):
    from test_dtensor import run_remote
    run_remote(tmp_path, "remote_pp", REMOTE_PP, 2, kind)


@pytest.mark.parametrize("kind", ["1f1b", "zbh1"])
def test_gang_pipeline_with_data_parallel_stages(tmp_path, kind):
    """A (pp 2, dp 2) mesh of a gang of 4: each stage on two workers, the batch split between
    them, gradients and losses averaged over them."""
    from test_dtensor import run_remote
    run_remote(tmp_path, "remote_pp_dp", REMOTE_PP.replace(
        'W = int(os.environ.get("KILN_TEST_WORKERS", "2"))', "W = 4"), 4, kind)


def test_pipeline_on_one_embedded_worker(tmp_path):
    """Every stage on one worker (kiln.connect("inproc"); interleaved, the one schedule with
    several stages per worker): no transfers, the same results."""
    import os
    import subprocess
    import sys
    path = tmp_path / "one_worker.py"
    path.write_text(REMOTE_PP)
    env = dict(os.environ, KILN_TEST_GANG="inproc", KILN_TEST_WORKERS="1")
    r = subprocess.run([sys.executable, str(path), "interleaved_1f1b"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0 and "rank 0 ok" in r.stdout, r.stdout + r.stderr


def test_gang_pipeline_with_a_dead_worker_raises(tmp_path):
    import os
    import subprocess
    import sys
    from test_dtensor import gang_of
    from test_remote_worker import stop
    procs, address = gang_of(tmp_path, 2)
    try:
        path = tmp_path / "dead_pp.py"
        path.write_text(DEAD_PP)
        env = dict(os.environ, KILN_TEST_GANG=address, KILN_TEST_KILL=str(procs[2].pid))
        r = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env,
                           timeout=120)
        assert r.returncode == 0 and "rank 0 ok" in r.stdout, r.stdout + r.stderr
    finally:
        for p in reversed(procs):
            stop(p)
