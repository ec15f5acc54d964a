"""kiln.distributed.fsdp.fully_shard under `kiln run`: an MLP and a small transformer trained
under FSDP on 2 and 3 ranks (uneven shards) against single-process training on the full batch,
sharded parameters and state dicts, per-rank parameter memory, gradient accumulation with
set_requires_gradient_sync(False), clip_grad_norm_ over the sharded gradients, mixed precision,
the errors, FSDP over tensor parallel on a 2x2 mesh, and reshard_after_forward=2 on 4 ranks."""
import textwrap

import pytest

from kiln_run import EXPECT, run_ranks

# How a script lays its mesh: over the ranks of `kiln run` (embedded), or over the gang of a
# kiln.connect session (remote: one client records for every worker, Note [Remote DTensor]).
EMBEDDED = textwrap.dedent("""
    import os
    DEVICE, WORLD = "cpu", int(os.environ["WORLD_SIZE"])
""")
REMOTE = textwrap.dedent("""
    import os, kiln
    WORLD = int(os.environ["KILN_TEST_WORKERS"])
    session = kiln.connect(os.environ["KILN_TEST_GANG"], workers=WORLD, wait_ms=20000)
    DEVICE = str(session.device)
""")

COMMON = EXPECT + textwrap.dedent("""
    import copy, os, sys, warnings
    import kiln, kiln.distributed as dist, kiln.nn as nn
    import kiln.nn.functional as F
    from kiln.distributed.device_mesh import init_device_mesh
    from kiln.distributed.tensor import DTensor, Shard, distribute_tensor
    from kiln.distributed.fsdp import (FSDPModule, MixedPrecisionPolicy, CPUOffloadPolicy,
                                       fully_shard)
    warnings.simplefilter("ignore")   # DTensor's replicate-path warnings

    def rel(a, b):
        a, b = a.to("cpu"), b.to("cpu")  # a remote run's values are read from rank 0
        return ((a - b).abs().max() / b.abs().max().clamp(min=1e-12)).item()


    class MLP(nn.Module):
        def __init__(self, device=None):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(7, 13, device=device), nn.Tanh()),
                                         nn.Sequential(nn.Linear(13, 9, device=device), nn.Tanh())])
            self.head = nn.Linear(9, 5, device=device)
        def forward(self, x):
            for b in self.blocks:
                x = b(x)
            return self.head(x)

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(11, 8)
            self.blocks = nn.ModuleList([nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0,
                                                                    batch_first=True)
                                         for _ in range(2)])
            self.norm = nn.LayerNorm(8)
            self.head = nn.Linear(8, 11)
        def forward(self, x):
            h = self.emb(x)
            for b in self.blocks:
                h = b(h)
            return self.head(self.norm(h))

    def data(kind, step, batch):
        g = kiln.Generator().manual_seed(100 + step)
        if kind == "mlp":
            return kiln.randn(batch, 7, generator=g), kiln.randn(batch, 5, generator=g)
        x = kiln.randint(0, 11, (batch, 6), generator=g)
        return x, kiln.randint(0, 11, (batch, 6), generator=g)

    def loss_of(kind, out, y):
        if kind == "mlp":
            return F.mse_loss(out, y)
        return F.cross_entropy(out.reshape(-1, 11), y.reshape(-1))

    def rows(t, mesh=None, placements=None):  # this rank's rows (a gang's workers: their own)
        return distribute_tensor(t, mesh or MESH, placements or [Shard(0)]).to_local()

    def shard(model, mesh, **kw):
        for b in model.blocks:
            fully_shard(b, mesh=mesh, **kw)
        return fully_shard(model, mesh=mesh, **kw)

    mesh = MESH = init_device_mesh(DEVICE, (WORLD,))
    r, n = dist.get_rank(), dist.get_world_size()
""")

TRAIN = COMMON + textwrap.dedent("""
    kind, opt_name, steps, reshard = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
    kiln.manual_seed(0)
    ref = MLP() if kind == "mlp" else GPT()
    model = copy.deepcopy(ref)
    shard(model, mesh, reshard_after_forward=reshard)
    assert isinstance(model, FSDPModule) and isinstance(model.blocks[0], FSDPModule)
    names = [k for k, _ in ref.named_parameters()]
    assert [k for k, _ in model.named_parameters()] == names
    for p in model.parameters():
        assert isinstance(p, DTensor) and isinstance(p, nn.Parameter) and p.is_leaf
        assert p.placements == (Shard(0),)
    # per-rank parameter memory: about 1/N (chunk's ceil rounding at most)
    local = sum(p.to_local().numel() for p in model.parameters())
    whole = sum(p.numel() for p in ref.parameters())
    bound = sum(-(-p.shape[0] // n) * (p.numel() // p.shape[0]) for p in ref.parameters())
    assert local <= bound and bound < whole / n + whole * 0.1 + 64, (local, bound, whole)
    # sharded state dict: the shards themselves, no communication
    sd = model.state_dict()
    assert list(sd) == list(ref.state_dict())
    assert all(isinstance(v, DTensor) and v.placements == (Shard(0),) for v in sd.values())

    def make_opt(params):
        if opt_name == "sgd":
            return kiln.optim.SGD(params, lr=0.1)
        if opt_name == "sgdm":
            return kiln.optim.SGD(params, lr=0.1, momentum=0.9)
        return kiln.optim.AdamW(params, lr=0.01, weight_decay=0.1)
    ropt, fopt = make_opt(ref.parameters()), make_opt(model.parameters())
    batch = 6 * n
    for step in range(steps):
        x, y = data(kind, step, batch)
        ropt.zero_grad()
        loss_of(kind, ref(x), y).backward()
        ropt.step()
        fopt.zero_grad()
        xs, ys = rows(x), rows(y)
        loss_of(kind, model(xs), ys).backward()
        for b in model.blocks:   # after backward only the shards remain
            assert not b._fsdp_state.group.is_unsharded
        for (k, p), q in zip(model.named_parameters(), ref.parameters()):
            assert p.grad.placements == (Shard(0),), k
            assert rel(p.grad.full_tensor(), q.grad) < 1e-5, (step, k, rel(p.grad.full_tensor(), q.grad))
        fopt.step()
    for (k, p), q in zip(model.named_parameters(), ref.parameters()):
        got, want = p.full_tensor(), q.detach()
        if k.endswith("in_proj_bias") and opt_name == "adamw":
            # The key bias's true gradient is zero (softmax ignores a per-query constant): its
            # float-rounding residue, which differs with the summation order, is what Adam's
            # g / sqrt(v) steps on. Compare the query and value biases.
            got, want = kiln.cat([got[:8], got[16:]]), kiln.cat([want[:8], want[16:]])
        e = rel(got, want)
        assert e < 1e-5, (k, e)
    print(f"rank {r} ok")
""")

FEATURES = COMMON + textwrap.dedent("""
    kiln.manual_seed(0)
    ref = MLP()
    model = shard(copy.deepcopy(ref), mesh)
    batch = 4 * n
    x1, y1 = data("mlp", 1, batch)
    x2, y2 = data("mlp", 2, batch)
    # gradient accumulation: no reduction, then one synced backward
    model.set_requires_gradient_sync(False)
    loss_of("mlp", model(rows(x1)), rows(y1)).backward()
    assert all(p.grad is None for p in model.parameters())
    model.set_requires_gradient_sync(True)
    loss_of("mlp", model(rows(x2)), rows(y2)).backward()
    (loss_of("mlp", ref(x1), y1) + loss_of("mlp", ref(x2), y2)).backward()
    for (k, p), q in zip(model.named_parameters(), ref.parameters()):
        assert rel(p.grad.full_tensor(), q.grad) < 1e-5, (k, rel(p.grad.full_tensor(), q.grad))
    # clip_grad_norm_ over the sharded gradients equals the unsharded one
    t_ref = nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
    t = nn.utils.clip_grad_norm_(model.parameters(), 0.05)
    assert not isinstance(t, DTensor) and rel(t, t_ref) < 1e-5, (t.item(), t_ref.item())
    for (k, p), q in zip(model.named_parameters(), ref.parameters()):
        assert rel(p.grad.full_tensor(), q.grad) < 1e-5, k
    # mixed precision: bf16 parameters in forward/backward, fp32 reduction; shards stay fp32
    mp = shard(copy.deepcopy(ref), mesh,
               mp_policy=MixedPrecisionPolicy(param_dtype=kiln.bfloat16, reduce_dtype=kiln.float32))
    ref.zero_grad()
    loss_of("mlp", ref(x1), y1).backward()
    out = mp(rows(x1))
    assert out.dtype == kiln.bfloat16
    loss_of("mlp", out.float(), rows(y1)).backward()
    for (k, p), q in zip(mp.named_parameters(), ref.parameters()):
        assert p.dtype == kiln.float32 and p.grad.dtype == kiln.float32
        # bf16 keeps 8 bits of mantissa: a few 1e-2 relative over two layers
        assert rel(p.grad.full_tensor(), q.grad) < 5e-2, (k, rel(p.grad.full_tensor(), q.grad))
    # meta-device init: built on meta, sharded, then only this rank's shards get memory
    meta = shard(MLP(device="meta"), mesh)
    assert all(str(p.to_local().device) == "meta" for p in meta.parameters())
    meta.to_empty(device=DEVICE)
    with kiln.no_grad():
        for p, q in zip(meta.parameters(), ref.parameters()):
            assert isinstance(p, nn.Parameter) and str(p.to_local().device) == DEVICE
            p.to_local().copy_(distribute_tensor(q.detach(), mesh, [Shard(0)]).to_local())
    loss_of("mlp", meta(rows(x1)), rows(y1)).backward()
    for (k, p), q in zip(meta.named_parameters(), ref.parameters()):
        assert rel(p.grad.full_tensor(), q.grad) < 1e-5, (k, rel(p.grad.full_tensor(), q.grad))
    # errors
    expect(lambda: fully_shard(model, mesh=mesh), ValueError, "already fully sharded")
    expect(lambda: fully_shard(nn.Linear(2, 2), mesh="cpu"), TypeError, "mesh must be a DeviceMesh")
    lin = nn.Linear(4, 4)
    other = init_device_mesh("cpu", (n,), mesh_dim_names=("other",))
    lin.weight = nn.Parameter(distribute_tensor(kiln.randn(4, 4), other, [Shard(0)]))
    expect(lambda: fully_shard(lin, mesh=mesh), ValueError,
           "parameter 'weight' is already a DTensor on DeviceMesh('cpu', ")
    expect(lambda: fully_shard(nn.Linear(2, 2), mesh=mesh, offload_policy=CPUOffloadPolicy()),
           NotImplementedError, "CPUOffloadPolicy")
    if n == 4:
        expect(lambda: fully_shard(nn.Linear(2, 2), mesh=init_device_mesh("cpu", (2, 2))),
               ValueError, "the mesh must be 1-d")
    print(f"rank {r} ok")
""")

# A module called twice in one forward: each call's gathered parameters are resharded after it
# and gathered again for its own backward.
TWICE = COMMON + textwrap.dedent("""
    class Twice(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner
        def forward(self, x):
            return self.inner(self.inner(x))

    kiln.manual_seed(0)
    ref = nn.Sequential(nn.Linear(6, 6), nn.Tanh())
    model = Twice(copy.deepcopy(ref))
    fully_shard(model.inner, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for step in range(2):
        x = kiln.randn(4 * n, 6)
        ref.zero_grad()
        model.zero_grad()
        (ref(ref(x)) ** 2).mean().backward()
        (model(rows(x)) ** 2).mean().backward()
        for (k, p), q in zip(model.named_parameters(), ref.parameters()):
            assert rel(p.grad.full_tensor(), q.grad) < 1e-5, (step, k)
    print(f"rank {r} ok")
""")


# 2-D FSDP x TP (Note [FSDP over TP]): the MLP's first linear column-wise and second row-wise
# over "tp", then fully_shard over "dp", each "dp" rank taking its rows of the batch; AdamW and
# clip_grad_norm_ against one process on the whole batch.
TWO_D = COMMON + textwrap.dedent("""
    from kiln.distributed.tensor import Replicate
    from kiln.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                  parallelize_module)
    mesh2 = init_device_mesh(DEVICE, (2, 2), mesh_dim_names=("dp", "tp"))
    dp = mesh2.get_local_rank("dp")
    kiln.manual_seed(0)
    ref = MLP()
    model = copy.deepcopy(ref)
    parallelize_module(model, mesh2["tp"], {"blocks.0.0": ColwiseParallel(),
                                            "blocks.1.0": RowwiseParallel()})
    shard(model, mesh2["dp"])
    w1, b2, head = model.blocks[0][0].weight, model.blocks[1][0].bias, model.head.weight
    assert w1.placements == (Shard(0), Shard(0)), w1.placements
    assert w1.device_mesh.mesh_dim_names == ("tp", "dp"), w1.device_mesh
    assert model.blocks[1][0].weight.placements == (Shard(1), Shard(0))
    assert b2.placements == (Replicate(), Shard(0)) and head.placements == (Shard(0),)
    assert w1.to_local().shape[0] in (3, 4)   # 13 rows: 7 and 6 over tp, then 4 and 3 over dp
    ropt = kiln.optim.AdamW(ref.parameters(), lr=0.01, weight_decay=0.1)
    fopt = kiln.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    for step in range(5):
        x, y = data("mlp", step, 8)
        ropt.zero_grad()
        loss_of("mlp", ref(x), y).backward()
        rn = kiln.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        ropt.step()
        fopt.zero_grad()
        xs, ys = (rows(t, mesh2, [Shard(0), Replicate()]) for t in (x, y))
        loss_of("mlp", model(xs), ys).backward()
        fn = kiln.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        assert abs(float(fn) - float(rn)) < 1e-5 * float(rn), (step, float(fn), float(rn))
        for (k, p), q in zip(model.named_parameters(), ref.parameters()):
            assert p.grad.placements == p.placements, k
            assert rel(p.grad.full_tensor(), q.grad) < 1e-5, (step, k)
        fopt.step()
    for (k, p), q in zip(model.named_parameters(), ref.parameters()):
        assert rel(p.full_tensor(), q.detach()) < 1e-5, k
    print(f"rank {r} ok")
""")


# reshard_after_forward=2 on 4 ranks (Note [FSDP reshard to k ranks]): the blocks keep their
# halves over pairs of ranks after forward and gather over the pair in backward; training matches
# reshard_after_forward=True and one process. Then the int form's errors and its k == 1 and
# k == N meanings, and set_reshard_after_forward.
RESHARD_K = COMMON + textwrap.dedent("""
    kind, opt_name = sys.argv[1], sys.argv[2]
    kiln.manual_seed(0)
    ref = MLP() if kind == "mlp" else GPT()
    model_t = shard(copy.deepcopy(ref), mesh)
    model_k = shard(copy.deepcopy(ref), mesh, reshard_after_forward=2)
    def make_opt(params):
        if opt_name == "sgd":
            return kiln.optim.SGD(params, lr=0.1)
        return kiln.optim.AdamW(params, lr=0.01, weight_decay=0.1)
    ropt, topt, kopt = (make_opt(m.parameters()) for m in (ref, model_t, model_k))
    for step in range(4):
        x, y = data(kind, step, 6 * n)
        xs, ys = x[r * 6:(r + 1) * 6], y[r * 6:(r + 1) * 6]
        for m, o in ((ref, ropt), (model_t, topt)):
            o.zero_grad()
            loss_of(kind, m(x if m is ref else xs), y if m is ref else ys).backward()
        kopt.zero_grad()
        kiln._C._fsdp_gather_stats(True)
        loss = loss_of(kind, model_k(xs), ys)
        for b in model_k.blocks:   # between forward and backward: only the kept halves
            g = b._fsdp_state.group
            assert not g.is_unsharded and g.reshard_after_forward_size == 2
        loss.backward()
        st = kiln._C._fsdp_gather_stats(True)
        assert st["post_forward"] == len(model_k.blocks), st   # backward gathers over the pairs
        for (k, p), q, t in zip(model_k.named_parameters(), ref.parameters(),
                                model_t.parameters()):
            assert p.grad.placements == (Shard(0),), k
            assert rel(p.grad.full_tensor(), t.grad.full_tensor()) < 1e-6, (step, k)
            assert rel(p.grad.full_tensor(), q.grad) < 1e-5, (step, k)
        for o in (ropt, topt, kopt):
            o.step()
    for (k, p), q in zip(model_k.named_parameters(), ref.parameters()):
        got, want = p.full_tensor(), q.detach()
        if k.endswith("in_proj_bias"):   # see TRAIN: the key bias's gradient is rounding noise
            got, want = kiln.cat([got[:8], got[16:]]), kiln.cat([want[:8], want[16:]])
        assert rel(got, want) < 1e-5, k

    for k in (3, 0, -2, 8):
        expect(lambda: fully_shard(nn.Linear(2, 2), mesh=mesh, reshard_after_forward=k),
               ValueError, f"reshard_after_forward={k} must be a divisor of the FSDP mesh size 4")
    for bad in (2.0, "2", None):
        expect(lambda: fully_shard(nn.Linear(2, 2), mesh=mesh, reshard_after_forward=bad),
               TypeError, f"reshard_after_forward must be a bool or an int")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        one = fully_shard(nn.Linear(2, 2), mesh=mesh, reshard_after_forward=1)
    assert one._fsdp_state.reshard_after_forward is False
    assert any("reshard_after_forward=1" in str(x.message) for x in w), [str(x.message) for x in w]
    four = fully_shard(nn.Linear(2, 2), mesh=mesh, reshard_after_forward=4)
    assert four._fsdp_state.reshard_after_forward is True
    model_t.set_reshard_after_forward(2)
    assert all(b._fsdp_state.group.reshard_after_forward_size == 2 for b in model_t.blocks)
    expect(lambda: model_t.set_reshard_after_forward(3), ValueError, "mesh size 4")
    expect(lambda: model_t.set_reshard_after_forward(1.5), TypeError, "got float 1.5")
    print(f"rank {r} ok")
""")


def run(tmp_path, name, script, nproc, *args):
    run_ranks(tmp_path, name, EMBEDDED + script, nproc, *args)


@pytest.mark.parametrize("nproc", [2, 3])
@pytest.mark.parametrize("kind", ["mlp", "gpt"])
def test_fsdp_training_matches_single_process(tmp_path, kind, nproc):
    run(tmp_path, "train", TRAIN, nproc, kind, "sgd", "8", "1")


def test_fsdp_keep_unsharded_after_forward(tmp_path):
    run(tmp_path, "train", TRAIN, 2, "mlp", "sgd", "5", "0")


@pytest.mark.parametrize("nproc", [2, 3])
def test_fsdp_features(tmp_path, nproc):
    run(tmp_path, "features", FEATURES, nproc)


@pytest.mark.parametrize("kind,nproc,opt", [("mlp", 2, "adamw"), ("gpt", 3, "adamw"),
                                            ("mlp", 3, "sgdm")])
def test_fsdp_stateful_optimizers(tmp_path, kind, nproc, opt):
    run(tmp_path, "train", TRAIN, nproc, kind, opt, "10", "1")


def test_fsdp_over_tensor_parallel(tmp_path):
    run(tmp_path, "two_d", TWO_D, 4)


@pytest.mark.parametrize("kind,opt", [("mlp", "adamw"), ("gpt", "sgd")])
def test_fsdp_reshard_after_forward_int(tmp_path, kind, opt):
    run(tmp_path, "reshard_k", RESHARD_K, 4, kind, opt)


# ---- The same scripts on a coordinator's gang (Note [FSDP on a gang]) ------------------------

@pytest.mark.parametrize("kind,opt", [("mlp", "sgd"), ("gpt", "adamw")])
def test_fsdp_training_on_a_gang(tmp_path, kind, opt):
    from test_dtensor import run_remote
    run_remote(tmp_path, "train", REMOTE + TRAIN, 2, kind, opt, "6", "1")


def test_fsdp_features_on_a_gang(tmp_path):
    from test_dtensor import run_remote
    run_remote(tmp_path, "features", REMOTE + FEATURES, 2)


def test_fsdp_module_called_twice(tmp_path):
    run(tmp_path, "twice", TWICE, 2)


def test_fsdp_module_called_twice_on_a_gang(tmp_path):
    from test_dtensor import run_remote
    run_remote(tmp_path, "twice", REMOTE + TWICE, 2)


def test_fsdp_over_tensor_parallel_on_a_gang(tmp_path):
    from test_dtensor import run_remote
    run_remote(tmp_path, "two_d", REMOTE + TWO_D, 4)
