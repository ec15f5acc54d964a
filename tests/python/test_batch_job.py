"""kiln.batch.save_job / load_job (client/python/kiln/batch.py over compiler::export_step): the spec
and the initial checkpoint of an MLP + AdamW step, the state left as it was, a data-parallel step
with its all_reduce on a fake group of the job's size, every step a batch job cannot replay
refused with what to change, and bad input. Running a spec is test_batch_run.py's."""
import os

import pytest

import kiln
import kiln.distributed as dist
import kiln.distributed.checkpoint as dcp
import kiln.nn as nn
import kiln.nn.functional as F
from test_distributed import free_port
from kiln.distributed.checkpoint import _split


def mlp_and_adamw():
    kiln.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 4))
    return model, kiln.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)


def batch(rows, seed=1):
    g = kiln.Generator().manual_seed(seed)
    return kiln.randn(rows, 6, generator=g), kiln.randint(0, 4, [rows], generator=g)


def train_step(model, opt, all_reduce=False):
    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        if all_reduce:
            for p in model.parameters():
                p.grad = kiln._C.all_reduce(p.grad, "avg", "world")
        opt.step()
        return loss
    return step


def stepped_once():
    """A step run once eagerly (the optimizer's state exists), its data and its state."""
    model, opt = mlp_and_adamw()
    step = train_step(model, opt)
    x, y = batch(4)
    step(x, y)
    return step, {"x": x, "y": y}, {"model": model.state_dict(), "optim": opt.state_dict()}


def snapshot(state):
    return {k: v.clone() for k, v in _split(state)[0].items()}


def assert_equal_state(state, want):
    got = _split(state)[0]
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].shape == want[k].shape and bool((got[k] == want[k]).all()), k


def save(tmp_path, step, data, state, **kw):
    args = dict(data_file=tmp_path / "data.safetensors", batch_size=8, steps=5,
                init_checkpoint=tmp_path / "init")
    args.update(kw)
    kiln.batch.save_job(tmp_path / "job.kbj", step, data, state, **args)
    return tmp_path / "job.kbj"


def test_save_job_writes_the_spec_and_the_initial_checkpoint(tmp_path):
    model, opt = mlp_and_adamw()
    step = train_step(model, opt)
    x, y = batch(8)
    step(x, y)  # AdamW's state exists from here on
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    before = snapshot(state)
    spec = save(tmp_path, step, {"x": x, "y": y}, state, seed=7)

    assert_equal_state(state, before)  # the capture's step is undone
    loaded = {"model": model.state_dict(), "optim": opt.state_dict()}
    with kiln.no_grad():
        for t in _split(loaded)[0].values():
            t.zero_()
    dcp.load(loaded, checkpoint_id=tmp_path / "init")
    assert_equal_state(loaded, before)
    assert not [f for f in os.listdir(tmp_path) if ".tmp." in f]

    s = kiln.batch.load_job(spec)
    assert (s["steps"], s["batch_size"], s["seed"], s["loss"]) == (5, 8, 7, 0)
    assert s["init_checkpoint"] == str(tmp_path / "init")
    assert s["data"] == str(tmp_path / "data.safetensors")
    assert s["inputs"][:2] == [("data", "x"), ("data", "y")]
    states = {name for kind, name in s["inputs"] if kind == "state"}
    assert states == set(before)  # every parameter and AdamW state, each once
    assert all(kind in ("state", "data", "constant") for kind, _ in s["inputs"])
    assert s["outputs"] == 1 and s["nodes"] == sum(s["ops"].values())
    assert s["ops"]["_fused_adamw_"] == 1 and "all_reduce" not in s["ops"]


def test_a_relative_path_is_kept_absolute_and_extra_outputs_follow_the_loss(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model, opt = mlp_and_adamw()
    step = train_step(model, opt)
    x, y = batch(4)
    step(x, y)

    def with_logits(x, y):
        return step(x, y), model(x).detach(), "not a tensor"

    kiln.batch.save_job("job.kbj", with_logits, {"x": x, "y": y},
                        {"model": model.state_dict(), "optim": opt.state_dict()},
                        data_file="data.safetensors", batch_size=4, steps=3,
                        init_checkpoint="init")
    s = kiln.batch.load_job("job.kbj")
    assert s["data"] == str(tmp_path / "data.safetensors")
    assert s["init_checkpoint"] == str(tmp_path / "init")
    assert (s["outputs"], s["loss"]) == (2, 0)


def test_a_data_parallel_step_captures_its_all_reduce_on_a_fake_group(tmp_path):
    model, opt = mlp_and_adamw()
    step = train_step(model, opt, all_reduce=True)
    x, y = batch(4)
    dist.init_process_group("fake", rank=0, world_size=2)
    try:
        step(x, y)
    finally:
        dist.destroy_process_group()
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    before = snapshot(state)
    spec = save(tmp_path, step, {"x": x, "y": y}, state, batch_size=8, world_size=2)
    assert not dist.is_initialized()  # the group save_job made is gone again
    assert_equal_state(state, before)
    s = kiln.batch.load_job(spec)
    assert s["ops"]["all_reduce"] == len(list(model.parameters()))
    assert s["batch_size"] == 8


def refused(tmp_path, kind, needle, step, data, state):
    before = snapshot(state)
    with pytest.raises(kind, match=needle):
        save(tmp_path, step, data, state, batch_size=len(next(iter(data.values()))))
    assert_equal_state(state, before)
    assert not (tmp_path / "job.kbj").exists() and not (tmp_path / "init").exists()


def test_a_graph_break_is_refused(tmp_path):
    model, opt = mlp_and_adamw()
    inner = train_step(model, opt)
    x, y = batch(4)
    inner(x, y)

    def step(x, y):
        loss = inner(x, y)
        print(loss.item())
        return loss

    refused(tmp_path, ValueError, "read the data", step, {"x": x, "y": y},
            {"model": model.state_dict(), "optim": opt.state_dict()})


def test_a_first_optimizer_step_asks_for_an_eager_one(tmp_path):
    model, opt = mlp_and_adamw()
    x, y = batch(4)
    refused(tmp_path, ValueError, "run one step eagerly first so the optimizer state exists",
            train_step(model, opt), {"x": x, "y": y}, {"model": model.state_dict()})


def test_old_gradients_are_refused(tmp_path):
    model, opt = mlp_and_adamw()
    x, y = batch(4)
    train_step(model, opt)(x, y)  # leaves .grad behind

    def step(x, y):
        opt.zero_grad(set_to_none=False)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    refused(tmp_path, ValueError, "zero the gradients with set_to_none at the start of the step",
            step, {"x": x, "y": y}, {"model": model.state_dict(), "optim": opt.state_dict()})


def test_a_step_without_a_backward_is_refused(tmp_path):
    model, _ = mlp_and_adamw()
    x, y = batch(4)
    refused(tmp_path, NotImplementedError, "runs no backward",
            lambda x, y: F.cross_entropy(model(x), y), {"x": x, "y": y},
            {"model": model.state_dict()})


def test_an_explicit_generator_is_refused(tmp_path):
    model, opt = mlp_and_adamw()
    step = train_step(model, opt)
    x, y = batch(4)
    step(x, y)
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    g = kiln.Generator().manual_seed(3)
    refused(tmp_path, NotImplementedError, "explicit generator",
            lambda x, y: step(x + kiln.randn(4, 6, generator=g), y), {"x": x, "y": y}, state)


def test_a_tensor_missing_from_the_state_is_named(tmp_path):
    model, opt = mlp_and_adamw()
    step = train_step(model, opt)
    x, y = batch(4)
    step(x, y)
    refused(tmp_path, ValueError, r"not in `state`: float32\[16, 6\]", step, {"x": x, "y": y},
            {"model": model.state_dict()})  # AdamW's state left out


def test_bad_input(tmp_path):
    step, data, state = stepped_once()
    with pytest.raises(ValueError, match="batch_size 9 is not a multiple of world_size 2"):
        save(tmp_path, step, data, state, batch_size=9, world_size=2)
    with pytest.raises(ValueError, match=r"data 'x' has shape \[4, 6\]; one rank's batch has 8 rows"):
        save(tmp_path, step, data, state, batch_size=8)
    with pytest.raises(ValueError, match="steps must be a positive int"):
        save(tmp_path, step, data, state, batch_size=4, steps=0)
    with pytest.raises(TypeError, match="data must be a non-empty dict"):
        save(tmp_path, step, {}, state, batch_size=4)
    with pytest.raises(ValueError, match="the step must return the loss"):
        save(tmp_path, lambda x, y: x * 2, data, state, batch_size=4)
    before = snapshot(state)
    with pytest.raises(OSError):
        kiln.batch.save_job(tmp_path / "no" / "such" / "dir" / "job.kbj", step, data, state,
                            data_file=tmp_path / "d", batch_size=4, steps=1,
                            init_checkpoint=tmp_path / "init")
    assert not (tmp_path / "init").exists()  # nothing written before the spec could be
    assert_equal_state(state, before)
    dist.init_process_group("fake", rank=0, world_size=2)
    try:
        with pytest.raises(RuntimeError, match="the default process group is a fake one"):
            save(tmp_path, step, data, state, batch_size=8, world_size=2)
    finally:
        dist.destroy_process_group()
    (tmp_path / "bad.kbj").write_bytes(b"\xff\xff not a spec")
    with pytest.raises(ValueError, match="not a BatchJob spec"):
        kiln.batch.load_job(tmp_path / "bad.kbj")


def test_a_step_on_a_mesh_needs_a_real_group_of_its_size(tmp_path, monkeypatch):
    """See Note [Batch jobs on a mesh]: every rank of a real process group saves it (the 2x2 job that
    trains is in test_batch_run.py); here the refusals, before anything is written."""
    step, data, state = stepped_once()
    with pytest.raises(TypeError, match="mesh must be a DeviceMesh, got tuple"):
        save(tmp_path, step, data, state, batch_size=4, mesh=(2, 2))
    from kiln.distributed.device_mesh import init_device_mesh
    dist.init_process_group("fake", rank=0, world_size=4)
    try:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        with pytest.raises(RuntimeError, match="every rank of a real process group"):
            save(tmp_path, step, data, state, batch_size=4, mesh=mesh)
    finally:
        dist.destroy_process_group()
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(k, v)
    one = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))  # a real world of one
    try:
        with pytest.raises(ValueError, match="the mesh has 1 ranks, the process group 1 and "
                                             "world_size is 2"):
            save(tmp_path, step, data, state, batch_size=4, mesh=one, world_size=2)
        with pytest.raises(ValueError, match=r"one rank's batch has 5 rows \(batch_size 5 over 1"):
            save(tmp_path, step, data, state, batch_size=5, mesh=one)  # rows per "dp" rank
        spec = save(tmp_path, step, data, state, batch_size=4, mesh=one)
        info = kiln.batch.load_job(spec)
        assert info["mesh"] == [("dp", 1)] and info["programs"] == 1, info
    finally:
        dist.destroy_process_group()
    assert not (tmp_path / "job.kbj.tmp").exists()
