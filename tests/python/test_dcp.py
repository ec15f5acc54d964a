"""kiln.distributed.checkpoint (Note [Distributed checkpoint format]): a checkpoint saved by 4
ranks (a 1-d mesh with uneven Shard(0), a Partial value, a 2x2 mesh, plain tensors and non-tensor
values) loads bit for bit into 2 ranks with other placements, into 3 ranks, and into one process
without a mesh; a flipped bit names the file and the tensor; missing and unexpected keys; a second
save replaces the first atomically, and a save killed at any moment leaves a loadable checkpoint."""
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import kiln
import kiln.distributed.checkpoint as dcp

from kiln_run import KILN_CLI, run_ranks

# The values every script expects: the same seed everywhere.
COMMON = textwrap.dedent("""
    import sys
    import kiln, kiln.distributed as dist
    import kiln.distributed.checkpoint as dcp
    from kiln.distributed.device_mesh import init_device_mesh
    from kiln.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    kiln.manual_seed(0)
    W, B, G, H = kiln.randn(10, 6), kiln.randn(7), kiln.randn(5, 3), kiln.randn(7, 2)
    P = kiln.full((5,), 10.0)   # the sum over 4 ranks of rank + 1

    def same(a, b, what):
        a = a.full_tensor() if isinstance(a, DTensor) else a
        assert a.shape == b.shape and a.dtype == b.dtype and bool((a == b).all()), (what, a, b)
""")

SAVE = COMMON + textwrap.dedent("""
    mesh = init_device_mesh("cpu", (4,))
    mesh2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("a", "b"))
    r = dist.get_rank()
    state = {
        "model": {"w": distribute_tensor(W, mesh, [Shard(0)]),         # rows 3, 3, 3, 1
                  "b": distribute_tensor(B, mesh, [Replicate()]),
                  "g": distribute_tensor(G, mesh2, [Shard(0), Shard(1)]),
                  "h": distribute_tensor(H, mesh2, [Shard(0), Shard(0)]),   # 7 rows: 3+1, 2+1
                  "e": distribute_tensor(kiln.zeros(0, 3), mesh, [Shard(0)])},
        "p": DTensor.from_local(kiln.full((5,), r + 1.0), mesh, [Partial()]),
        "count": kiln.tensor(7),
        "step": int(sys.argv[2]), "sched": {"lr": 0.5, "milestones": [1, 2]},
    }
    dcp.save(state, checkpoint_id=sys.argv[1])
    print(f"rank {r} ok")
""")

LOAD_TWO = COMMON + textwrap.dedent("""
    mesh = init_device_mesh("cpu", (2,))
    r = dist.get_rank()
    state = {
        "model": {"w": distribute_tensor(kiln.zeros(10, 6), mesh, [Shard(1)]),
                  "b": distribute_tensor(kiln.zeros(7), mesh, [Shard(0)]),   # 4 + 3
                  "g": distribute_tensor(kiln.zeros(5, 3), mesh, [Replicate()]),
                  "h": distribute_tensor(kiln.zeros(7, 2), mesh, [Shard(1)]),
                  "e": distribute_tensor(kiln.zeros(0, 3), mesh, [Shard(1)])},
        "p": distribute_tensor(kiln.zeros(5), mesh, [Shard(0)]),
        "count": kiln.tensor(0),
        "step": 0, "sched": {"lr": 0.0, "milestones": []},
    }
    dcp.load(state, checkpoint_id=sys.argv[1])
    m = state["model"]
    assert m["w"].placements == (Shard(1),) and m["w"].to_local().shape == (10, 3)
    same(m["w"], W, "w"); same(m["b"], B, "b"); same(m["g"], G, "g"); same(state["p"], P, "p")
    same(m["h"], H, "h"); same(m["e"], kiln.zeros(0, 3), "e")
    same(state["count"], kiln.tensor(7), "count")
    assert state["step"] == int(sys.argv[2]) and state["sched"] == {"lr": 0.5, "milestones": [1, 2]}
    print(f"rank {r} ok")
""")

LOAD_THREE = COMMON + textwrap.dedent("""
    mesh = init_device_mesh("cpu", (3,))
    r = dist.get_rank()
    w = distribute_tensor(kiln.zeros(10, 6), mesh, [Shard(0)])   # rows 4, 4, 2
    g = distribute_tensor(kiln.zeros(5, 3), mesh, [Shard(1)])    # one column each
    state = {"model": {"w": w, "b": kiln.zeros(7), "g": g, "h": kiln.zeros(7, 2),
                       "e": kiln.zeros(0, 3)}, "p": kiln.zeros(5),
             "count": kiln.tensor(0), "step": 0, "sched": {"lr": 0.0, "milestones": []}}
    dcp.load(state, checkpoint_id=sys.argv[1])
    same(w, W, "w"); same(state["model"]["b"], B, "b"); same(g, G, "g"); same(state["p"], P, "p")
    same(state["model"]["h"], H, "h")
    print(f"rank {r} ok")
""")


# async_save: the call snapshots; writing into the tensors afterwards does not reach the files.
SAVE_ASYNC = SAVE.replace("""    dcp.save(state, checkpoint_id=sys.argv[1])""", """
    f = dcp.async_save(state, checkpoint_id=sys.argv[1])
    with kiln.no_grad():
        state["model"]["w"].to_local().zero_()
        state["count"].zero_()
    f.result()
    assert f.done()""")


def one_process_state():
    kiln.manual_seed(0)
    want = {"w": kiln.randn(10, 6), "b": kiln.randn(7), "g": kiln.randn(5, 3),
            "h": kiln.randn(7, 2), "e": kiln.zeros(0, 3)}
    state = {"model": {k: kiln.zeros(*v.shape) for k, v in want.items()}, "p": kiln.zeros(5),
             "count": kiln.tensor(0), "step": 0, "sched": {"lr": 0.0, "milestones": []}}
    return state, want


def test_save_on_four_ranks_load_anywhere(tmp_path):
    ckpt = tmp_path / "ckpt"
    run_ranks(tmp_path, "save", SAVE, 4, ckpt, 100)
    files = sorted(os.listdir(ckpt))
    assert ".metadata" in files and len([f for f in files if f.endswith(".safetensors")]) == 4
    run_ranks(tmp_path, "load2", LOAD_TWO, 2, ckpt, 100)
    run_ranks(tmp_path, "load3", LOAD_THREE, 3, ckpt)
    # One process, no mesh: plain tensors get the whole values.
    state, want = one_process_state()
    assert dcp.load(state, checkpoint_id=ckpt) == ([], [])
    for k, v in want.items():
        assert bool((state["model"][k] == v).all()), k
    assert bool((state["p"] == kiln.full((5,), 10.0)).all()) and int(state["count"]) == 7
    assert state["step"] == 100 and state["sched"] == {"lr": 0.5, "milestones": [1, 2]}
    # A second save (generation 2) replaces the first: its files only, and its values.
    run_ranks(tmp_path, "save_again", SAVE, 4, ckpt, 200)
    assert len([f for f in os.listdir(ckpt) if f.startswith("__")]) == 4
    state, _ = one_process_state()
    dcp.load(state, checkpoint_id=ckpt)
    assert state["step"] == 200


def test_async_save_snapshots_then_writes(tmp_path):
    ckpt = tmp_path / "ckpt"
    run_ranks(tmp_path, "save_async", SAVE_ASYNC, 4, ckpt, 300)
    state, want = one_process_state()
    dcp.load(state, checkpoint_id=ckpt)
    assert bool((state["model"]["w"] == want["w"]).all()) and int(state["count"]) == 7
    assert state["step"] == 300


def test_keys_corruption_and_bad_input(tmp_path):
    ckpt = tmp_path / "ckpt"
    kiln.manual_seed(0)
    state = {"w": kiln.randn(4, 3), "b": kiln.randn(3), "step": 3}
    dcp.save(state, checkpoint_id=ckpt)
    other = {"w": kiln.zeros(4, 3), "extra": kiln.zeros(2), "step": 0}
    with pytest.raises(ValueError, match=r"missing keys \['extra'\], unexpected keys \['b'\]"):
        dcp.load(other, checkpoint_id=ckpt)
    assert bool((other["w"] == 0).all()) and other["step"] == 0  # a strict failure wrote nothing
    res = dcp.load(other, checkpoint_id=ckpt, strict=False)
    assert res.missing_keys == ["extra"] and res.unexpected_keys == ["b"]
    assert bool((other["w"] == state["w"]).all()) and other["step"] == 3
    with pytest.raises(ValueError, match=r"'w' is float32 of shape \[4, 2\] here but float32 of "
                                         r"shape \[4, 3\] in the checkpoint"):
        dcp.load({"w": kiln.zeros(4, 2)}, checkpoint_id=ckpt, strict=False)
    with pytest.raises(ValueError, match="no checkpoint in"):
        dcp.load(other, checkpoint_id=tmp_path / "nothing")
    with pytest.raises(TypeError, match="must be JSON data"):
        dcp.save({"w": state["w"], "bad": object()}, checkpoint_id=tmp_path / "bad")
    with pytest.raises(TypeError, match="must be JSON data"):
        dcp.save({"best": float("inf")}, checkpoint_id=tmp_path / "bad")
    with pytest.raises(ValueError, match="two entries of the state dict have the path 'a.b'"):
        dcp.save({"a.b": state["w"], "a": {"b": state["b"]}}, checkpoint_id=tmp_path / "bad")
    # A flipped bit in a shard: the CRC-32 names the file and the tensor.
    shard = next(p for p in ckpt.iterdir() if p.suffix == ".safetensors")
    data = bytearray(shard.read_bytes())
    n = int.from_bytes(data[:8], "little")
    begin = json.loads(data[8:8 + n])["b"]["data_offsets"][0]
    data[8 + n + begin + 1] ^= 0x10   # a bit of b's first element
    shard.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=rf"'b' in '.*{shard.name}' is corrupt: its CRC-32"):
        dcp.load({"b": kiln.zeros(3)}, checkpoint_id=ckpt, strict=False)
    # A metadata file that lies: refused with its name, not a crash.
    meta = ckpt / ".metadata"
    meta.write_text(meta.read_text().replace('"file":"__0', '"file":"../../etc/passwd__0'))
    with pytest.raises(ValueError, match="is not a shard file of the checkpoint"):
        dcp.load({"b": kiln.zeros(3)}, checkpoint_id=ckpt, strict=False)
    meta.write_text("{")
    with pytest.raises(ValueError, match="is not valid JSON"):
        dcp.load({"b": kiln.zeros(3)}, checkpoint_id=ckpt, strict=False)


KILLED_SAVE = textwrap.dedent("""
    import sys, kiln
    import kiln.distributed.checkpoint as dcp
    step = int(sys.argv[2])
    state = {"w": kiln.full((256, 1024), float(step)), "v": kiln.full((64, 1024), float(step)),
             "step": step}
    print("saving", flush=True)
    dcp.save(state, checkpoint_id=sys.argv[1])
""")


def test_a_killed_save_leaves_the_old_or_the_new_checkpoint(tmp_path):
    """SIGKILL at a random moment of a save, 50 times: load finds one whole generation."""
    ckpt, script = tmp_path / "ckpt", tmp_path / "save.py"
    script.write_text(KILLED_SAVE)
    subprocess.run([sys.executable, str(script), str(ckpt), "1"], check=True, timeout=120)
    rng = random.Random(0)
    for trial in range(50):
        step = trial + 2
        p = subprocess.Popen([sys.executable, str(script), str(ckpt), str(step)],
                             stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "saving"
        time.sleep(rng.uniform(0.0, 0.05))
        p.send_signal(signal.SIGKILL)
        p.wait()
        state = {"w": kiln.zeros(256, 1024), "v": kiln.zeros(64, 1024), "step": 0}
        dcp.load(state, checkpoint_id=ckpt)
        s = state["step"]
        assert s <= step
        assert bool((state["w"] == float(s)).all()) and bool((state["v"] == float(s)).all()), s


# FSDP to tensor parallel: an MLP fully_shard-ed over 4 ranks saves its state dict; the same MLP
# parallelized column- and row-wise over 2 ranks loads it, and one process loads it plain.
MLP = textwrap.dedent("""
    import sys
    import kiln, kiln.distributed as dist, kiln.nn as nn
    import kiln.distributed.checkpoint as dcp
    from kiln.distributed.device_mesh import init_device_mesh

    def mlp(seed):
        kiln.manual_seed(seed)
        return nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 5))
""")

SAVE_FSDP = MLP + textwrap.dedent("""
    from kiln.distributed.fsdp import fully_shard
    model = mlp(0)
    fully_shard(model, mesh=init_device_mesh("cpu", (4,)))
    dcp.save({"model": model.state_dict()}, checkpoint_id=sys.argv[1])
    print(f"rank {dist.get_rank()} ok")
""")

LOAD_TP = MLP + textwrap.dedent("""
    from kiln.distributed.tensor import DTensor, Shard
    from kiln.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    want = mlp(0)
    model = mlp(1)
    parallelize_module(model, init_device_mesh("cpu", (2,)),
                       {"0": ColwiseParallel(), "2": RowwiseParallel()})
    assert model[0].weight.placements == (Shard(0),)
    dcp.load({"model": model.state_dict()}, checkpoint_id=sys.argv[1])
    for (k, p), q in zip(model.named_parameters(), want.parameters()):
        full = p.full_tensor() if isinstance(p, DTensor) else p
        assert bool((full == q).all()), k
    x = kiln.randn(3, 6)
    out = model(x)
    assert bool((out - want(x)).abs().max() < 1e-6)
    print(f"rank {dist.get_rank()} ok")
""")


def test_fsdp_checkpoint_loads_into_tensor_parallel_and_one_process(tmp_path):
    ckpt = tmp_path / "ckpt"
    run_ranks(tmp_path, "save_fsdp", SAVE_FSDP, 4, ckpt)
    run_ranks(tmp_path, "load_tp", LOAD_TP, 2, ckpt)
    import kiln.nn as nn
    kiln.manual_seed(0)
    want = nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 5))
    kiln.manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 5))
    dcp.load({"model": model.state_dict()}, checkpoint_id=ckpt)
    for (k, p), q in zip(model.named_parameters(), want.parameters()):
        assert bool((p == q).all()), k


def test_conversion_to_and_from_one_safetensors_file(tmp_path):
    """A 4-rank checkpoint as one safetensors file (the safetensors package reads it), and that
    file split into 3 shards, which loads on 2 ranks with other placements. Only tensors convert:
    the non-tensor values stay behind (a non-strict load reports them missing)."""
    ckpt, flat, split = tmp_path / "ckpt", tmp_path / "model.safetensors", tmp_path / "split"
    run_ranks(tmp_path, "save", SAVE, 4, ckpt, 100)
    dcp.dcp_to_safetensors(ckpt, flat)
    from safetensors.numpy import load_file
    arrays = load_file(str(flat))
    kiln.manual_seed(0)
    assert sorted(arrays) == ["count", "model.b", "model.e", "model.g", "model.h", "model.w", "p"]
    assert (arrays["model.w"] == kiln.randn(10, 6).numpy()).all() and (arrays["p"] == 10.0).all()
    dcp.safetensors_to_dcp(flat, split, shards=3)
    assert len([f for f in os.listdir(split) if f.endswith(".safetensors")]) == 3
    tensors_only = (LOAD_TWO.replace("dcp.load(state, checkpoint_id=sys.argv[1])",
                                     "res = dcp.load(state, checkpoint_id=sys.argv[1], strict=False)\n"
                                     "assert res.missing_keys == ['sched.lr', 'sched.milestones', "
                                     "'step'], res")
                    .replace('assert state["step"] == int(sys.argv[2]) and state["sched"] == '
                             '{"lr": 0.5, "milestones": [1, 2]}', ""))
    run_ranks(tmp_path, "load_split", tensors_only, 2, split, 0)
    with pytest.raises(ValueError, match="shards must be >= 1"):
        dcp.safetensors_to_dcp(flat, tmp_path / "x", shards=0)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\xff" * 16)
    with pytest.raises(ValueError, match="is not a safetensors file"):
        dcp.safetensors_to_dcp(bad, tmp_path / "y")


# Resuming: FSDP on 2 ranks with AdamW, an LR schedule and dropout (each rank's generator) trains
# 6 steps; a run that stops after 3, saves everything, and a new run that loads it and trains 3
# more ends with the same parameters, bit for bit.
RESUME = textwrap.dedent("""
    import sys
    import kiln, kiln.distributed as dist, kiln.nn as nn
    import kiln.distributed.checkpoint as dcp
    from kiln.distributed.device_mesh import init_device_mesh
    from kiln.distributed.fsdp import fully_shard
    from kiln.optim.lr_scheduler import LinearLR
    from kiln.utils.data import DataLoader, TensorDataset

    ckpt, mode = sys.argv[1], sys.argv[2]
    mesh = init_device_mesh("cpu", (2,))
    r = dist.get_rank()

    def build(seed):
        kiln.manual_seed(seed)
        model = nn.Sequential(nn.Linear(6, 12), nn.Dropout(0.2), nn.Tanh(), nn.Linear(12, 3))
        fully_shard(model, mesh=mesh)
        opt = kiln.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)
        return model, opt, LinearLR(opt, start_factor=0.5, total_iters=4)

    # Each rank's own shuffled rows (drawn from its default generator), 4 batches a pass: the
    # checkpoint falls 3 batches into the first pass, and the run goes on into the second.
    loader = DataLoader(TensorDataset(kiln.randn(16, 6, generator=kiln.Generator().manual_seed(5))),
                        batch_size=4, shuffle=True)

    def batches():
        while True:
            yield from loader
    stream = batches()

    def train(model, opt, sched, steps):
        for step in steps:
            (x,) = next(stream)
            opt.zero_grad()
            (model(x) ** 2).mean().backward()
            opt.step()
            sched.step()

    def state_of(model, opt, sched, step):
        return {"model": model.state_dict(), "optim": opt.state_dict(),
                "sched": sched.state_dict(), "rng": list(kiln.default_generator().get_state()),
                "loader": loader.state_dict(), "step": step}

    kiln.manual_seed(1000 + r)  # each rank's dropout stream differs
    if mode == "full":
        model, opt, sched = build(0)
        kiln.manual_seed(1000 + r)
        train(model, opt, sched, range(6))
    elif mode == "first":
        model, opt, sched = build(0)
        kiln.manual_seed(1000 + r)
        train(model, opt, sched, range(3))
        dcp.save(state_of(model, opt, sched, 3), checkpoint_id=ckpt)
    else:
        model, opt, sched = build(7)       # other values everywhere, then the checkpoint's
        train(model, opt, sched, range(1))  # the optimizer's state exists to load into
        state = state_of(model, opt, sched, 0)
        dcp.load(state, checkpoint_id=ckpt)
        opt.load_state_dict(state["optim"])
        sched.load_state_dict(state["sched"])
        kiln.default_generator().set_state(tuple(state["rng"]))
        loader.load_state_dict(state["loader"])
        stream = batches()                  # the next pass resumes after the 3 batches seen
        assert state["step"] == 3 and state["loader"]["batches_yielded"] == 3
        train(model, opt, sched, range(3, 6))
    values = [p.full_tensor().tolist() for p in model.parameters()]
    print(f"rank {r} params {values!r}")
    print(f"rank {r} ok")
""")


def test_resume_equals_the_uninterrupted_run(tmp_path):
    ckpt = tmp_path / "ckpt"
    outs = []
    for mode in ("full", "first", "second"):
        path = tmp_path / f"resume_{mode}.py"
        path.write_text(RESUME)
        r = subprocess.run([str(KILN_CLI), "run", "--nproc", "2", "--timeout", "120",
                            sys.executable, str(path), str(ckpt), mode], capture_output=True,
                           text=True, env=dict(os.environ, KILN_COMM_TIMEOUT_S="30"), timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr
        outs.append(sorted(l for l in r.stdout.splitlines() if " params " in l))
    assert outs[0] == outs[2], (outs[0], outs[2])
    assert outs[0] != outs[1]


def test_a_full_disk_fails_clearly_and_keeps_the_previous_checkpoint(tmp_path):
    """A 1 MiB tmpfs (root only; skipped elsewhere): a save that does not fit raises naming the
    file and the reason, leaves no half file, and the previous checkpoint still loads."""
    fs = tmp_path / "small"
    fs.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs",
                                            str(fs)], capture_output=True).returncode != 0:
        pytest.skip("needs to mount a small tmpfs (root)")
    try:
        ckpt = fs / "ckpt"
        dcp.save({"w": kiln.full((100, 100), 1.0), "step": 1}, checkpoint_id=ckpt)
        with pytest.raises(RuntimeError, match="No space left on device"):
            dcp.save({"w": kiln.full((100, 100), 2.0), "x": kiln.randn(1000, 1000), "step": 2},
                     checkpoint_id=ckpt)
        assert not [f for f in os.listdir(ckpt) if f.endswith(".tmp")]
        state = {"w": kiln.zeros(100, 100), "step": 0}
        dcp.load(state, checkpoint_id=ckpt)
        assert bool((state["w"] == 1.0).all()) and state["step"] == 1
    finally:
        subprocess.run(["umount", str(fs)], capture_output=True)


def test_leftovers_of_a_dead_save_are_never_committed(tmp_path):
    """A dead save's files (generation 2, another save's nonce) beside a committed generation 1:
    an async save goes past them and they are removed; a save right after it commits on top."""
    ckpt = tmp_path / "ckpt"
    dcp.save({"w": kiln.full((4,), 1.0)}, checkpoint_id=ckpt)
    (ckpt / "__0.00000002.json").write_text(
        '{"rank": 0, "generation": 2, "nonce": 5, "file": "__0.00000002.safetensors", '
        '"tensors": {}, "chunks": {}}')
    (ckpt / "__0.00000002.safetensors").write_bytes(b"junk")
    (ckpt / "__notes.tmp").write_text("a user's file")
    f = dcp.async_save({"w": kiln.full((4,), 2.0)}, checkpoint_id=ckpt)
    dcp.save({"w": kiln.full((4,), 3.0)}, checkpoint_id=ckpt)  # waits for the async one
    assert f.done()
    state = {"w": kiln.zeros(4)}
    dcp.load(state, checkpoint_id=ckpt)
    assert bool((state["w"] == 3.0).all())
    assert sorted(os.listdir(ckpt)) == [".metadata", "__0.00000004.safetensors", "__notes.tmp"]


# One rank's failure reaches every rank: ranks that pass one name with different shapes fail the
# commit on rank 0 (naming the name) and the others are told, instead of waiting in a barrier.
# (Different names are fine: pipeline stages each save their own.)
DISAGREE = textwrap.dedent("""
    import sys
    import kiln, kiln.distributed as dist
    import kiln.distributed.checkpoint as dcp
    dist.init_process_group("ucx")
    r = dist.get_rank()
    state = {"w": kiln.ones(3)} if r == 0 else {"w": kiln.ones(4)}
    try:
        dcp.save(state, checkpoint_id=sys.argv[1])
        raise AssertionError("expected an error")
    except (ValueError, RuntimeError) as e:
        want = "which rank 0 saved as" if r == 0 else "another rank failed while committing"
        assert want in str(e), str(e)
    print(f"rank {r} ok")
""")


def test_a_rank_that_fails_a_save_fails_it_for_every_rank(tmp_path):
    run_ranks(tmp_path, "disagree", DISAGREE, 2, tmp_path / "ckpt")


# The same for an async save, whose background part meets the other ranks through the files: rank
# 0's failed commit leaves a marker that rank 1's wait reads (not its 600 s limit).
DISAGREE_ASYNC = DISAGREE.replace(
    "    dcp.save(state, checkpoint_id=sys.argv[1])",
    "    dcp.async_save(state, checkpoint_id=sys.argv[1]).result()").replace(
    '"another rank failed while committing"', '"rank 0 failed"')


def test_a_rank_that_fails_an_async_save_fails_it_for_every_rank(tmp_path):
    run_ranks(tmp_path, "disagree_async", DISAGREE_ASYNC, 2, tmp_path / "ckpt")


# A gang's checkpoint (Note [Gang checkpoints] in kiln/dist/remote.h): an FSDP x TP model and its
# AdamW state on a 2x2 gang of workers are saved by the workers themselves; the same gang loads
# them into a fresh model (bit for bit), and so does a non-strict load that reports its keys. The
# test then loads the files in one process (below). Bad input: a state that mixes the gang's
# tensors with this process's, a directory with no checkpoint, a key the checkpoint lacks.
GANG_SAVE = textwrap.dedent("""
    import os, sys, warnings, kiln, kiln.nn as nn
    import kiln.distributed.checkpoint as dcp
    from kiln.distributed.device_mesh import init_device_mesh
    from kiln.distributed.fsdp import fully_shard
    from kiln.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    warnings.simplefilter("ignore")
    session = kiln.connect(os.environ["KILN_TEST_GANG"], workers=4, wait_ms=20000)
    mesh = init_device_mesh(str(session.device), (2, 2), mesh_dim_names=("dp", "tp"))
    ckpt = sys.argv[1]

    def build(seed):
        kiln.manual_seed(seed)
        model = nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 5))
        parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        fully_shard(model, mesh=mesh["dp"])
        return model, kiln.optim.AdamW(model.parameters(), lr=0.01)

    def step(model, opt):
        g = kiln.Generator().manual_seed(5)
        x = kiln.randn(4, 6, generator=g).to(session.device)
        opt.zero_grad()
        (model(x) ** 2).mean().backward()
        opt.step()

    model, opt = build(0)
    step(model, opt)
    dcp.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": 1},
             checkpoint_id=ckpt)
    assert os.path.exists(os.path.join(ckpt, ".metadata"))
    other, oopt = build(1)
    step(other, oopt)   # the optimizer's state exists to load into
    state = {"model": other.state_dict(), "optim": oopt.state_dict(), "step": 0}
    dcp.load(state, checkpoint_id=ckpt)
    assert state["step"] == 1
    for (k, p), q in zip(other.named_parameters(), model.parameters()):
        assert p.placements == q.placements and bool((p.full_tensor() == q.full_tensor()).all()), k
    step(model, opt)
    oopt.load_state_dict(state["optim"])
    step(other, oopt)   # the loaded optimizer state steps as the saved one does
    for (k, p), q in zip(other.named_parameters(), model.parameters()):
        assert bool((p.full_tensor() == q.full_tensor()).all()), k
    res = dcp.load({"model": other.state_dict(), "gone": kiln.zeros(2).to(session.device)},
                   checkpoint_id=ckpt, strict=False)
    assert res.missing_keys == ["gone"], res
    assert "step" in res.unexpected_keys and "optim.state.0.exp_avg" in res.unexpected_keys, res

    def expect(fn, kind, text):
        try:
            fn()
        except kind as e:
            assert text in str(e), str(e)
        else:
            raise AssertionError(f"expected {kind.__name__}: {text}")
    expect(lambda: dcp.save({"w": model[0].weight, "x": kiln.zeros(2)}, checkpoint_id=ckpt),
           ValueError, "lives on a gang's workers but 'x' in this process")
    expect(lambda: dcp.load({"model": other.state_dict()}, checkpoint_id=ckpt + "-none"),
           ValueError, "no checkpoint in")
    expect(lambda: dcp.load({"model": other.state_dict(), "gone": kiln.zeros(2).to(session.device)},
                            checkpoint_id=ckpt), ValueError, "missing keys ['gone']")
    # The session goes on after the refusals (`other` holds the checkpoint again: the non-strict
    # load above).
    assert float(other[0].weight.full_tensor().abs().sum()) > 0
    print("rank 0 ok")
""")


def test_a_gang_checkpoints_and_the_files_load_anywhere(tmp_path):
    from test_dtensor import run_remote
    ckpt = tmp_path / "ckpt"
    run_remote(tmp_path, "gang_save", GANG_SAVE, 4, str(ckpt))
    import kiln.nn as nn
    model = nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 5))
    opt = kiln.optim.AdamW(model.parameters(), lr=0.01)
    state = {"model": model.state_dict(), "step": 0}
    res = dcp.load(state, checkpoint_id=ckpt, strict=False)
    assert state["step"] == 1 and res.missing_keys == [], res
    # The saved weights are one AdamW step from seed 0's: not the initial ones, and finite.
    kiln.manual_seed(0)
    init = nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 5))
    for (k, p), q in zip(model.named_parameters(), init.parameters()):
        assert bool((p == p).all()) and not bool((p == q).all()), k   # no NaN; moved
        assert float((p - q).abs().max()) <= 0.0101, k   # AdamW moves each weight by <= lr
    del opt


def test_a_fake_group_cannot_checkpoint(tmp_path):
    script = tmp_path / "fake.py"
    script.write_text(textwrap.dedent("""
        import sys, kiln, kiln.distributed as dist
        import kiln.distributed.checkpoint as dcp
        dist.init_process_group("fake", rank=0, world_size=4)
        try:
            dcp.save({"w": kiln.zeros(2)}, checkpoint_id=sys.argv[1])
        except NotImplementedError as e:
            assert "fake backend" in str(e), str(e)
        else:
            raise AssertionError("a save on a fake group did not raise")
        print("ok")
    """))
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "f")], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr
