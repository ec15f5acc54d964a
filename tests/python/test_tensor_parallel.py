"""kiln.distributed.tensor.parallel under `kiln run --nproc 2`: parallelize_module with the
styles against the unsharded module (outputs, gradients, a few SGD steps, parameter placements),
SequenceParallel, PrepareModuleInput/Output, loss_parallel against cross_entropy, and the
errors. Hooks themselves are checked in one process."""
import textwrap

import pytest

import kiln
import kiln.nn as nn

from kiln_run import EXPECT, run_ranks

# How a script lays its mesh: over the ranks of `kiln run` (embedded), or over the gang of a
# kiln.connect session (remote: one client records for every worker, Note [Remote DTensor]).
EMBEDDED = 'DEVICE = "cpu"\n'
REMOTE = textwrap.dedent("""
    import os, kiln
    session = kiln.connect(os.environ["KILN_TEST_GANG"], workers=int(os.environ["KILN_TEST_WORKERS"]),
                           wait_ms=20000)
    DEVICE = str(session.device)
""")

COMMON = textwrap.dedent("""
    import kiln, kiln.distributed as dist
    import kiln.nn as nn
    import kiln.nn.functional as F
    from kiln.distributed.device_mesh import init_device_mesh
    from kiln.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor, fallback_ops
    from kiln.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                  PrepareModuleOutput, RowwiseParallel,
                                                  SequenceParallel, loss_parallel,
                                                  parallelize_module)

    def full(t):  # on CPU: a remote run's results are read from rank 0
        return (t.full_tensor() if isinstance(t, DTensor) else t).to("cpu")

    def close(a, b, what=""):
        a, b = full(a), full(b)
        assert tuple(a.shape) == tuple(b.shape), (what, a.shape, b.shape)
        err = (a - b).abs().max().item()
        assert err <= 1e-5 * max(1.0, b.abs().max().item()), (what, err)

    def grads_equal(tp, ref):
        for (n, p), (m, q) in zip(tp.named_parameters(), ref.named_parameters()):
            assert n == m
            close(p.grad, q.grad, "grad of " + n)

    def params_equal(tp, ref):
        for (n, p), (_, q) in zip(tp.named_parameters(), ref.named_parameters()):
            close(p.detach(), q.detach(), n)

    def sgd(model, lr):
        # DTensor and plain parameters in separate groups: one fused step takes one kind.
        ps = list(model.parameters())
        groups = [{"params": [p for p in ps if isinstance(p, DTensor)]},
                  {"params": [p for p in ps if not isinstance(p, DTensor)]}]
        return kiln.optim.SGD([g for g in groups if g["params"]], lr=lr)

    def twins(make):  # the model to parallelize (on the mesh's device), and the reference
        kiln.manual_seed(1)
        ref = make()
        kiln.manual_seed(1)
        return make().to(DEVICE), ref

    mesh = init_device_mesh(DEVICE, (2,))
    rank = dist.get_rank()
    kiln.manual_seed(0)
""")

MODULES = COMMON + textwrap.dedent("""
    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 8)

        def forward(self, x):
            return self.fc2(F.relu(self.fc1(x)))

    # ---- a 2-layer MLP: Colwise then Rowwise, forward, backward, SGD -------------------------
    tp, ref = twins(MLP)
    assert parallelize_module(tp, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}) is tp
    for name, want in [("fc1.weight", Shard(0)), ("fc1.bias", Shard(0)), ("fc2.weight", Shard(1)),
                       ("fc2.bias", Replicate())]:
        p = tp.get_parameter(name)
        assert isinstance(p, DTensor) and isinstance(p, nn.Parameter), name
        assert p.placements == (want,) and p.requires_grad, (name, p.placements)
    assert tp.fc1.weight.to_local().shape == (8, 8) and tp.fc2.weight.to_local().shape == (8, 8)
    params_equal(tp, ref)
    opt, ref_opt = sgd(tp, 0.1), sgd(ref, 0.1)
    for step in range(3):
        x = kiln.randn(4, 8)
        xt, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
        y, y_ref = tp(xt), ref(xr)
        assert not isinstance(y, DTensor)  # use_local_output: RowwiseParallel's Replicate local
        close(y, y_ref, "mlp output")
        c = kiln.randn(4, 8)
        (y * c.to(y.device)).sum().backward()
        (y_ref * c).sum().backward()
        close(xt.grad, xr.grad, "input grad")
        grads_equal(tp, ref)
        opt.step(); ref_opt.step(); opt.zero_grad(); ref_opt.zero_grad()
        params_equal(tp, ref)
        for n, p in tp.named_parameters():
            assert isinstance(p, DTensor), n
    assert tp.fc1.weight.placements == (Shard(0),) and tp.fc2.weight.placements == (Shard(1),)

    # Uneven shards: a hidden size of 5 on 2 ranks (3 + 2 features).
    def uneven():
        return nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))
    tp, ref = twins(uneven)
    parallelize_module(tp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    assert tp[0].weight.to_local().shape == ((3, 4) if rank == 0 else (2, 4))
    x = kiln.randn(2, 4)
    y, y_ref = tp(x), ref(x)
    close(y, y_ref, "uneven output")
    y.sum().backward()
    y_ref.sum().backward()
    grads_equal(tp, ref)

    # src_data_rank=0 (the default): ranks that initialised differently get rank 0's values.
    kiln.manual_seed(100)
    rank0 = MLP()
    kiln.manual_seed(100 + rank)
    m = parallelize_module(MLP(), mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    params_equal(m, rank0)

    # ---- an attention + MLP block with a vocab-sharded embedding and head ----------------------
    class Block(nn.Module):
        def __init__(self, vocab=11, d=8, heads=2, ff=16):
            super().__init__()
            self.heads, self.hd = heads, d // heads
            self.tok = nn.Embedding(vocab, d)
            self.pos = nn.Embedding(6, d)
            self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.wq, self.wk, self.wv = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d, bias=False)
            self.wo = nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, ff), nn.Linear(ff, d)
            self.head = nn.Linear(d, vocab, bias=False)

        def forward(self, idx):
            B, T = idx.shape
            x = self.tok(idx) + self.pos(kiln.arange(T))
            y = self.norm1(x)
            def split(t):  # (B, T, local features) -> (B, local heads, T, hd)
                return t.reshape([B, T, -1, self.hd]).transpose(1, 2)
            a = F.scaled_dot_product_attention(split(self.wq(y)), split(self.wk(y)),
                                               split(self.wv(y)), is_causal=True)
            x = x + self.wo(a.transpose(1, 2).reshape([B, T, -1]))
            x = x + self.fc2(F.gelu(self.fc1(self.norm2(x))))
            return self.head(x.reshape([B * T, -1]))

    plan = {"tok": RowwiseParallel(), "pos": ColwiseParallel(output_layouts=Replicate()),
            "w[qkv]": ColwiseParallel(), "wo": RowwiseParallel(), "fc1": ColwiseParallel(),
            "fc2": RowwiseParallel(), "head": ColwiseParallel(use_local_output=False)}
    tp, ref = twins(Block)
    parallelize_module(tp, mesh, plan)
    assert tp.tok.weight.placements == (Shard(0),) and tp.pos.weight.placements == (Shard(1),)
    assert tp.wv.weight.placements == (Shard(0),) and tp.wo.weight.placements == (Shard(1),)
    assert not isinstance(tp.norm1.weight, DTensor)
    opt, ref_opt = sgd(tp, 0.05), sgd(ref, 0.05)
    for step in range(3):
        idx = kiln.randint(0, 11, (2, 6))
        target = kiln.randint(0, 11, (12,))
        target[3] = -100  # ignored
        logits, logits_ref = tp(idx), ref(idx)
        assert isinstance(logits, DTensor) and logits.placements == (Shard(1),)
        close(logits, logits_ref, "block logits")
        with loss_parallel():
            loss = F.cross_entropy(logits, target, ignore_index=-100)
            loss.backward()
        loss_ref = F.cross_entropy(logits_ref, target, ignore_index=-100)
        loss_ref.backward()
        assert isinstance(loss, DTensor) and loss.placements == (Replicate(),)
        close(loss, loss_ref, "block loss")
        grads_equal(tp, ref)
        opt.step(); ref_opt.step(); opt.zero_grad(); ref_opt.zero_grad()
        params_equal(tp, ref)
    print(f"rank {rank} ok")
""")

SEQUENCE = COMMON + textwrap.dedent("""
    # ---- SequenceParallel on a LayerNorm: input and output Shard(1) ---------------------------
    tp, ref = twins(lambda: nn.LayerNorm(8))
    with kiln.no_grad():
        ref.weight.copy_(kiln.randn(8)); ref.bias.copy_(kiln.randn(8))
        tp.weight.copy_(ref.weight); tp.bias.copy_(ref.bias)
    parallelize_module(tp, mesh, SequenceParallel())
    assert tp.weight.placements == (Replicate(),) and tp.bias.placements == (Replicate(),)
    x = kiln.randn(2, 6, 8)
    local = x[:, 3 * rank:3 * rank + 3].contiguous().requires_grad_()
    xr = x.clone().requires_grad_()
    y, y_ref = tp(local), ref(xr)
    assert isinstance(y, DTensor) and y.placements == (Shard(1),) and y.shape == (2, 6, 8)
    close(y, y_ref, "layernorm output")
    c = kiln.randn(2, 6, 8)
    (y.full_tensor() * c).sum().backward()
    (y_ref * c).sum().backward()
    grads_equal(tp, ref)
    close(local.grad, xr.grad[:, 3 * rank:3 * rank + 3], "layernorm input grad")

    # ---- norm (SequenceParallel) -> Colwise (from Shard(1)) -> Rowwise (to Shard(1)) ----------
    class Seq(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.fc1, self.fc2 = nn.LayerNorm(8), nn.Linear(8, 12), nn.Linear(12, 8)

        def forward(self, x):
            return self.fc2(F.relu(self.fc1(self.norm(x))))

    tp, ref = twins(Seq)
    parallelize_module(tp, mesh, {"norm": SequenceParallel(),
                                  "fc1": ColwiseParallel(input_layouts=Shard(1)),
                                  "fc2": RowwiseParallel(output_layouts=Shard(1))})
    y, y_ref = tp(local.detach()), ref(x)
    assert not isinstance(y, DTensor) and y.shape == (2, 3, 8)
    close(y, y_ref[:, 3 * rank:3 * rank + 3], "sequence-parallel block")
    (y * c[:, 3 * rank:3 * rank + 3]).sum().backward()
    (y_ref * c).sum().backward()
    grads_equal(tp, ref)

    # ---- PrepareModuleInput / PrepareModuleOutput --------------------------------------------
    class Twice(nn.Module):
        def forward(self, a, b=None):
            assert isinstance(a, DTensor) and a.placements == (Replicate(),), a
            return a * 2.0, b

    m = Twice()
    parallelize_module(m, mesh, PrepareModuleInput(input_layouts=(Shard(0),),
                                                   desired_input_layouts=(Replicate(),)))
    parallelize_module(m, mesh, PrepareModuleOutput(output_layouts=(Replicate(), None),
                                                    desired_output_layouts=(Shard(0), None)))
    rows = x[0]
    out, passed = m(rows[3 * rank:3 * rank + 3], b="unchanged")
    assert passed == "unchanged" and not isinstance(out, DTensor)
    close(out, rows[3 * rank:3 * rank + 3] * 2.0, "prepared module")
    print(f"rank {rank} ok")
""")

LOSS = COMMON + EXPECT + textwrap.dedent("""
    # ---- loss_parallel against cross_entropy ----------------------------------------------------
    for vocab in (10, 7):  # 7: uneven shards (4 + 3)
        logits = kiln.randn(6, vocab) * 3.0
        target = kiln.randint(0, vocab, (6,))
        target[1] = -1
        target[4] = -1
        weight = kiln.rand(vocab) + 0.5
        for reduction in ("mean", "sum", "none"):
            for kw in ({}, {"weight": weight}, {"label_smoothing": 0.2}):
                d = distribute_tensor(logits, mesh, [Shard(-1)]).requires_grad_()
                r = logits.clone().requires_grad_()
                with loss_parallel():
                    loss = nn.CrossEntropyLoss(ignore_index=-1, reduction=reduction, **kw)(d, target)
                ref = F.cross_entropy(r, target, ignore_index=-1, reduction=reduction, **kw)
                what = f"vocab {vocab} {reduction} {sorted(kw)}"
                assert isinstance(loss, DTensor) and loss.placements == (Replicate(),), what
                close(loss, ref, "loss " + what)
                c = kiln.randn(6) if reduction == "none" else kiln.tensor(1.5)
                (loss.full_tensor() * c.to(DEVICE)).sum().backward()
                (ref * c).sum().backward()
                assert d.grad.placements == (Shard(1),), (what, d.grad.placements)
                close(d.grad, r.grad, "logits grad " + what)
    # log_softmax then nll_loss, as PyTorch's loss_parallel also allows.
    for vocab in (10, 7):
        logits = kiln.randn(6, vocab) * 3.0
        target = kiln.randint(0, vocab, (6,))
        target[2] = -100
        for reduction in ("mean", "sum", "none"):
            for w in (None, kiln.rand(vocab) + 0.5):
                d = distribute_tensor(logits, mesh, [Shard(1)]).requires_grad_()
                r = logits.clone().requires_grad_()
                with loss_parallel():
                    lp = F.log_softmax(d, dim=-1)
                    loss = nn.NLLLoss(w, reduction=reduction)(lp, target)
                lp_ref = F.log_softmax(r, dim=-1)
                ref = F.nll_loss(lp_ref, target, w, reduction=reduction)
                what = f"nll vocab {vocab} {reduction} weight {w is not None}"
                assert isinstance(lp, DTensor) and lp.placements == (Shard(1),), what
                close(lp, lp_ref, "log_softmax " + what)
                close(loss, ref, "loss " + what)
                c = kiln.randn(6) if reduction == "none" else kiln.tensor(0.7)
                (loss.full_tensor() * c.to(DEVICE)).sum().backward()
                (ref * c).sum().backward()
                close(d.grad, r.grad, "logits grad " + what)
    # A 1-d input (one sample), and a Replicate() DTensor target.
    logits = kiln.randn(9)
    d = distribute_tensor(logits, mesh, [Shard(0)]).requires_grad_()
    t = distribute_tensor(kiln.tensor(5), mesh, [Replicate()])
    with loss_parallel():
        loss = F.cross_entropy(d, t)
    loss.backward()
    r = logits.clone().requires_grad_()
    F.cross_entropy(r, kiln.tensor(5)).backward()
    close(loss, F.cross_entropy(logits, kiln.tensor(5)), "1-d loss")
    close(d.grad, r.grad, "1-d grad")
    # The logits were never gathered: no op ran on them on the replicate path.
    assert not {"cross_entropy", "log_softmax", "nll_loss", "amax", "exp", "logsumexp"} & set(
        fallback_ops())
    # Outside the context, DTensor logits take the ordinary path (gathered); plain logits inside
    # it are unaffected.
    d = distribute_tensor(logits.reshape([1, 9]), mesh, [Shard(-1)])
    t = distribute_tensor(kiln.tensor([5]), mesh, [Replicate()])
    close(F.cross_entropy(d, t), F.cross_entropy(logits.reshape([1, 9]), kiln.tensor([5])))
    with loss_parallel():
        assert not isinstance(F.cross_entropy(logits.reshape([1, 9]), kiln.tensor([5])), DTensor)

    # ---- errors -----------------------------------------------------------------------------
    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.norm = nn.Linear(4, 4), nn.LayerNorm(4)


    m = MLP()
    expect(lambda: parallelize_module(m, mesh, {"fc1": ColwiseParallel(), "fc9": RowwiseParallel()}),
           ValueError, "has no child matching 'fc9'")
    assert not isinstance(m.fc1.weight, DTensor)  # a bad plan changes nothing
    expect(lambda: parallelize_module(m, mesh, {"fc1": ColwiseParallel(), "norm": RowwiseParallel()}),
           NotImplementedError, "RowwiseParallel on 'norm': RowwiseParallel supports nn.Linear and "
           "nn.Embedding only, got LayerNorm")
    assert not isinstance(m.fc1.weight, DTensor)
    expect(lambda: parallelize_module(m, mesh, {"fc1": SequenceParallel()}), NotImplementedError,
           "SequenceParallel supports nn.LayerNorm")
    expect(lambda: parallelize_module(m, mesh, {"fc1": "colwise"}), TypeError,
           "expected a ParallelStyle in the plan, got str")
    expect(lambda: PrepareModuleInput(input_layouts=(Shard(0), Shard(1)),
                                      desired_input_layouts=(Replicate(),)), ValueError,
           "must have the same length")
    parallelize_module(m, mesh, {"fc1": ColwiseParallel()})
    expect(lambda: parallelize_module(m, mesh, {"fc1": ColwiseParallel()}), ValueError,
           "already a DTensor")
    d = distribute_tensor(kiln.randn(4, 6), mesh, [Shard(0)])
    with loss_parallel():
        expect(lambda: F.cross_entropy(d, kiln.tensor([0, 1, 2, 3])), ValueError,
               "expected the logits sharded on the class dim (Shard(-1))")
        d = distribute_tensor(kiln.randn(4, 6), mesh, [Shard(1)])
        expect(lambda: F.cross_entropy(d, kiln.tensor([0, 1, 2, 9])), IndexError,
               "target 9 is out of bounds for 6 classes")
        expect(lambda: F.cross_entropy(d, kiln.tensor([0, 1, 2])), ValueError,
               "expected a target of shape (4,)")
        expect(lambda: F.cross_entropy(d, kiln.tensor([0, 1, 2, 3]), weight=kiln.ones(6),
                                       label_smoothing=0.1), NotImplementedError,
               "label_smoothing with class weights")
        expect(lambda: F.log_softmax(d, dim=0), ValueError,
               "expected dim to be the class dim (1 or -1), the sharded one, got 0")
    print(f"rank {rank} ok")
""")


MESH_2X2 = COMMON.replace('mesh = init_device_mesh(DEVICE, (2,))',
                          'mesh2 = init_device_mesh(DEVICE, (2, 2), mesh_dim_names=("dp", "tp"))'
                          ) + textwrap.dedent("""
    # ---- TP along "tp" of a (dp, tp) mesh: each dp row runs its own batch ---------------------
    tp_mesh = mesh2["tp"]

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2, self.head = nn.Linear(6, 8), nn.Linear(8, 6), nn.Linear(6, 10)

        def forward(self, x):
            return self.head(self.fc2(F.relu(self.fc1(x))))

    tp, ref = twins(MLP)
    parallelize_module(tp, tp_mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel(),
                                     "head": ColwiseParallel(use_local_output=False)})
    assert tp.fc1.weight.device_mesh == tp_mesh and tp.fc1.weight.placements == (Shard(0),)
    dp = mesh2.get_local_rank("dp")
    kiln.manual_seed(10 + dp)  # a different batch per dp row, the same within it
    x, target = kiln.randn(5, 6), kiln.randint(0, 10, (5,))
    logits = tp(x)
    assert logits.placements == (Shard(1),) and logits.device_mesh == tp_mesh
    with loss_parallel():
        loss = F.cross_entropy(logits, target)
    loss.backward()
    logits_ref = ref(x)
    loss_ref = F.cross_entropy(logits_ref, target)
    loss_ref.backward()
    close(logits, logits_ref, "2x2 logits")
    close(loss, loss_ref, "2x2 loss")
    grads_equal(tp, ref)
    try:
        parallelize_module(MLP(), mesh2, {"fc1": ColwiseParallel()})
        raise AssertionError("expected a ValueError")
    except ValueError as e:
        assert "expected a 1-d DeviceMesh" in str(e), str(e)
    print(f"rank {rank} ok")
""")


def run(tmp_path, name, script, nproc=2):
    run_ranks(tmp_path, name, EMBEDDED + script, nproc, timeout=240)


def test_colwise_rowwise_modules_on_two_ranks(tmp_path):
    run(tmp_path, "tp_modules", MODULES)


def test_sequence_parallel_and_prepare_on_two_ranks(tmp_path):
    run(tmp_path, "tp_sequence", SEQUENCE)


def test_loss_parallel_and_errors_on_two_ranks(tmp_path):
    run(tmp_path, "tp_loss", LOSS)


def test_tp_on_a_2x2_mesh(tmp_path):
    run(tmp_path, "tp_2x2", MESH_2X2, 4)


def test_forward_hooks():
    lin = nn.Linear(3, 2)
    calls = []
    h1 = lin.register_forward_pre_hook(lambda m, args: (args[0] * 2.0,))
    h2 = lin.register_forward_hook(lambda m, args, out: calls.append(out.shape) or out + 1.0)
    h3 = lin.register_forward_pre_hook(lambda m, args, kwargs: calls.append("first") or None,
                                       prepend=True, with_kwargs=True)
    x = kiln.randn(4, 3)
    y = lin(x)
    assert calls == ["first", (4, 2)]
    assert (y - (kiln.nn.functional.linear(x * 2.0, lin.weight, lin.bias) + 1.0)).abs().max().item() < 1e-6
    for h in (h1, h2, h3):
        h.remove()
    assert (lin(x) - kiln.nn.functional.linear(x, lin.weight, lin.bias)).abs().max().item() < 1e-6
    with pytest.raises(TypeError, match="expected a callable hook"):
        lin.register_forward_hook(3)
    with pytest.raises(RuntimeError, match="forward pre-hook must return None or a tuple"):
        lin.register_forward_pre_hook(lambda m, a, k: 5, with_kwargs=True)
        lin(x)


# ---- The same scripts on a coordinator's gang (Note [Remote DTensor]) ------------------------
# SEQUENCE is left out: its inputs are each rank's own slices, which a gang's one client has not.

@pytest.mark.parametrize("name,n", [("MODULES", 2), ("LOSS", 2), ("MESH_2X2", 4)])
def test_tp_on_a_gang(tmp_path, name, n):
    from test_dtensor import run_remote
    run_remote(tmp_path, name.lower(), REMOTE + globals()[name], n)
