"""No training step leaves a reference cycle that holds tensors: each step's tensors die with
their last reference, not at the next garbage collection. A cycle per step (kiln.func's
_unflatten closure had one, held by every kiln.compile call) kept every step's activations alive,
21 MB a step on the benchmark's CNN. Each user path below runs two warm-up steps, then two steps
under gc.DEBUG_SAVEALL, and fails naming what the collector found holding a tensor."""
import gc
import socket
import types

import numpy as np
import pytest

import kiln
import kiln.distributed as dist
import kiln.nn as nn
import kiln.nn.functional as F
from kiln.utils.data import DataLoader, TensorDataset


def _holds_tensor(o):
    if isinstance(o, (kiln.Tensor, kiln.nested.NestedTensor)):
        return True
    if isinstance(o, types.CellType):
        try:
            return isinstance(o.cell_contents, kiln.Tensor)
        except ValueError:  # an empty cell
            return False
    if isinstance(o, dict):
        return any(isinstance(v, kiln.Tensor) for v in o.values())
    if isinstance(o, (list, tuple, set)):
        return any(isinstance(v, kiln.Tensor) for v in o)
    return False


def assert_no_garbage(step, warmup=2, steps=2, keeps=False):
    """Runs step() warmup times, then steps times with the collector saving what it frees; no
    tensor (nor a list, tuple, dict or cell holding one) may be among it, and (unless the step
    keeps what it makes) no more tensors may be alive after the steps than before."""
    for _ in range(warmup):
        step()
    gc.collect()
    live = _live_tensors()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(steps):
            step()
        gc.collect()
        held = [o for o in gc.garbage if _holds_tensor(o)]
        report = sorted({type(o).__name__ for o in held})
        # What else was in the cycles: a function or frame names the culprit.
        culprits = sorted({o.__qualname__ if isinstance(o, types.FunctionType) else o.f_code.co_name
                           for o in gc.garbage
                           if isinstance(o, (types.FunctionType, types.FrameType))})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert held == [], f"{len(held)} garbage objects hold tensors: {report}; functions and " \
                       f"frames among the garbage: {culprits}"
    if keeps:
        return
    gc.collect()
    # A cycle through C++ (an autograd node holding a Python object) is never garbage: it leaks.
    assert _live_tensors() <= live, f"the steps left {_live_tensors() - live} more tensors alive"


def _live_tensors():
    return sum(isinstance(o, kiln.Tensor) for o in gc.get_objects())


def mlp():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def mlp_and_adamw():
    """The seeded MLP most paths train, and its AdamW."""
    kiln.manual_seed(0)
    model = mlp()
    return model, kiln.optim.AdamW(model.parameters(), lr=1e-2)


def batch(n=6):
    return kiln.randn(n, 8), kiln.randint(0, 4, (n,))


def train_step(model, opt, x, y, *, clip=None):
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    if clip is not None:
        nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    return loss.item()


# ---- eager training ----------------------------------------------------------------------------
def test_eager_training_with_adamw():
    model, opt = mlp_and_adamw()
    x, y = batch()
    assert_no_garbage(lambda: train_step(model, opt, x, y))


def test_a_cnn_with_dropout_and_batchnorm():
    kiln.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Flatten(), nn.Dropout(0.1), nn.Linear(4 * 4 * 4, 4))
    opt = kiln.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = kiln.randn(5, 1, 8, 8), kiln.randint(0, 4, (5,))
    assert_no_garbage(lambda: train_step(model, opt, x, y))


def test_clip_grad_norm():
    model, opt = mlp_and_adamw()
    x, y = batch()
    assert_no_garbage(lambda: train_step(model, opt, x, y, clip=0.5))
    assert_no_garbage(lambda: nn.utils.clip_grad_value_(model.parameters(), 0.1))


def test_lr_scheduler():
    model, opt = mlp_and_adamw()
    sched = kiln.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    x, y = batch()

    def step():
        train_step(model, opt, x, y)
        sched.step()
    assert_no_garbage(step)


def test_dataloader_with_shuffle():
    model, opt = mlp_and_adamw()
    xs, ys = kiln.randn(20, 8), kiln.randint(0, 4, (20,))
    loader = DataLoader(TensorDataset(xs, ys), batch_size=6, shuffle=True,
                        generator=kiln.Generator().manual_seed(0))

    def epoch():
        for xb, yb in loader:
            train_step(model, opt, xb, yb)
    assert_no_garbage(epoch)

    def abandoned_pass():  # a pass left after its first batch
        for xb, yb in loader:
            train_step(model, opt, xb, yb)
            break
    assert_no_garbage(abandoned_pass)

    threaded = DataLoader(TensorDataset(xs, ys), batch_size=6, shuffle=True, num_workers=2)
    assert_no_garbage(lambda: [train_step(model, opt, xb, yb) for xb, yb in threaded])


class Stream(kiln.utils.data.IterableDataset):
    def __init__(self, xs, ys):
        self.xs, self.ys = xs, ys

    def __iter__(self):
        for i in range(self.xs.shape[0]):
            yield {"x": self.xs[i], "y": self.ys[i]}

    def __len__(self):
        return self.xs.shape[0]


def test_other_datasets():
    from kiln.utils.data import ConcatDataset, Subset, random_split
    model, opt = mlp_and_adamw()
    xs, ys = kiln.randn(20, 8), kiln.randint(0, 4, (20,))
    full = TensorDataset(xs, ys)
    a, b = random_split(full, [15, 5], generator=kiln.Generator().manual_seed(0))
    mapped = DataLoader(ConcatDataset([a, Subset(b, [0, 2, 4])]), batch_size=6, shuffle=True,
                        drop_last=True)
    stream = DataLoader(Stream(xs, ys), batch_size=6)
    assert_no_garbage(lambda: [train_step(model, opt, xb, yb) for xb, yb in mapped])
    assert_no_garbage(lambda: [train_step(model, opt, d["x"], d["y"]) for d in stream])

    loader = DataLoader(full, batch_size=6, shuffle=True)

    def resume():  # a pass saved after one batch, and resumed
        it = iter(loader)
        next(it)
        state = loader.state_dict()
        loader.load_state_dict(state)
        for xb, yb in loader:
            train_step(model, opt, xb, yb)
    assert_no_garbage(resume)


def test_autocast_bf16():
    model, opt = mlp_and_adamw()
    x, y = batch()

    def step():
        with kiln.autocast("cpu", dtype=kiln.bfloat16):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert_no_garbage(step)

    @kiln.autocast("cpu")
    def forward(x):
        return model(x)
    assert_no_garbage(lambda: F.cross_entropy(forward(x), y).backward())


@pytest.mark.parametrize("make", [
    lambda ps: kiln.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4),
    lambda ps: kiln.optim.Adam(ps, lr=1e-2, amsgrad=True),
    lambda ps: kiln.optim.RMSprop(ps, lr=1e-2, momentum=0.5),
    lambda ps: kiln.optim.Adagrad(ps, lr=1e-2),
], ids=["sgd-nesterov", "adam-amsgrad", "rmsprop", "adagrad"])
def test_optimizers_with_a_closure(make):
    kiln.manual_seed(0)
    model = mlp()
    opt = make(model.parameters())
    x, y = batch()

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss
    assert_no_garbage(lambda: opt.step(closure))


def test_lr_schedulers():
    kiln.manual_seed(0)
    model = mlp()
    opt = kiln.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = kiln.optim.lr_scheduler.SequentialLR(opt, [
        kiln.optim.lr_scheduler.LinearLR(opt, start_factor=0.5, total_iters=2),
        kiln.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)], milestones=[3])
    other = kiln.optim.AdamW(mlp().parameters())
    one = kiln.optim.lr_scheduler.OneCycleLR(other, max_lr=0.1, total_steps=100)
    lam = kiln.optim.lr_scheduler.LambdaLR(other, lambda e: 0.9 ** e)
    x, y = batch()

    def step():
        train_step(model, opt, x, y)
        sched.step()
        other.step()
        one.step()
        lam.step()
        sched.load_state_dict(sched.state_dict())
        lam.load_state_dict(lam.state_dict())
    assert_no_garbage(step)


def test_grad_scaler():
    scaler_type = getattr(kiln.amp, "GradScaler", None)
    if scaler_type is None:
        pytest.skip("kiln.amp has no GradScaler (bf16 autocast needs none)")
    model, opt = mlp_and_adamw()
    scaler = scaler_type()
    x, y = batch()

    def step():
        with kiln.autocast("cpu", dtype=kiln.float16):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
    assert_no_garbage(step)


# ---- autograd ----------------------------------------------------------------------------------
def test_activation_checkpointing():
    from kiln.utils.checkpoint import checkpoint
    kiln.manual_seed(0)
    block, head = mlp(), nn.Linear(4, 4)
    opt = kiln.optim.AdamW(list(block.parameters()) + list(head.parameters()), lr=1e-2)
    x, y = batch()

    def step():
        h = checkpoint(block, x, use_reentrant=False)
        a, b = checkpoint(lambda u: (u * 2, u.relu()), h)
        loss = F.cross_entropy(head(a + b), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert_no_garbage(step)


class Exp(kiln.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ctx.save_for_backward(y)
        ctx.scale = 1.0
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * y * ctx.scale


class ScaleInPlace(kiln.autograd.Function):
    @staticmethod
    def forward(ctx, x, k):
        ctx.k = k
        ctx.mark_dirty(x)
        idx = x.argmax(-1)
        ctx.mark_non_differentiable(idx)
        return x.mul_(k), idx

    @staticmethod
    def backward(ctx, grad, _):
        return grad * ctx.k if ctx.needs_input_grad[0] else None, None


def test_custom_autograd_function():
    kiln.manual_seed(0)
    model = mlp()
    x = kiln.randn(6, 8)

    def step():
        model.zero_grad()
        h, _ = ScaleInPlace.apply(model(x) * 1.0, 0.5)
        Exp.apply(h * 0.1).sum().backward()
    assert_no_garbage(step)


def test_autograd_grad_and_tensor_hooks():
    x = kiln.randn(4, 3, requires_grad=True)

    def step():
        y = (x * 2).relu()
        y.register_hook(lambda g: g * 2)
        (g,) = kiln.autograd.grad(y.sum(), [x], create_graph=True)
        g.sum().backward()
        x.grad = None
    assert_no_garbage(step)


def test_module_forward_hooks():
    model, opt = mlp_and_adamw()
    seen = []
    model[0].register_forward_pre_hook(lambda m, args: (args[0] * 1.0,))
    model[0].register_forward_pre_hook(lambda m, args, kwargs: (args, kwargs), with_kwargs=True)
    model[1].register_forward_hook(lambda m, args, out: out * 1.0)
    handle = model[2].register_forward_hook(lambda m, args, out: seen.append(out.shape))
    x, y = batch()
    assert_no_garbage(lambda: train_step(model, opt, x, y))
    assert seen
    handle.remove()


# ---- kiln.func ---------------------------------------------------------------------------------
def test_func_transforms():
    from kiln.func import grad, grad_and_value, jacrev, jvp, vjp, vmap
    w = kiln.randn(3, 4)
    x = kiln.randn(5, 3)

    def f(w, x):
        return (x @ w).tanh().sum()

    assert_no_garbage(lambda: grad(f)(w, x))
    assert_no_garbage(lambda: grad_and_value(f, argnums=(0, 1), has_aux=False)(w, x))
    assert_no_garbage(lambda: vmap(lambda r: (r @ w).relu())(x))
    assert_no_garbage(lambda: vmap(grad(f), in_dims=(None, 0))(w, x.unsqueeze(1)))
    assert_no_garbage(lambda: vjp(lambda a: a.sin(), x)[1](kiln.ones(5, 3)))
    assert_no_garbage(lambda: jvp(lambda a: a.sin(), (x,), (kiln.ones(5, 3),)))
    assert_no_garbage(lambda: jacrev(lambda a: a.sin().sum(0))(x))


def test_functional_call():
    func = getattr(kiln.func, "functional_call", None) or \
        getattr(getattr(nn.utils, "stateless", None), "functional_call", None)
    if func is None:
        pytest.skip("neither kiln.func.functional_call nor kiln.nn.utils.stateless exists")
    model = mlp()
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = kiln.randn(6, 8)
    assert_no_garbage(lambda: kiln.func.grad(lambda p: func(model, p, (x,)).sum())(params))


# ---- nested tensors ----------------------------------------------------------------------------
def test_nested_tensors():
    kiln.manual_seed(0)
    lin = nn.Linear(4, 3)
    parts = [kiln.randn(n, 4) for n in (3, 1, 5)]

    def step():
        nt = kiln.nested.nested_tensor(parts, layout=kiln.jagged)
        out = F.linear(nt, lin.weight, lin.bias).relu()
        lin.zero_grad()
        out.values().sum().backward()
    assert_no_garbage(step)


# ---- state dicts and checkpoints ---------------------------------------------------------------
def test_optimizer_and_module_state_dicts():
    model, opt = mlp_and_adamw()
    x, y = batch()
    train_step(model, opt, x, y)

    def step():
        train_step(model, opt, x, y)
        opt.load_state_dict(opt.state_dict())
        model.load_state_dict(model.state_dict())
    assert_no_garbage(step)


def test_save_and_load(tmp_path):
    model, opt = mlp_and_adamw()
    x, y = batch()

    def step():
        train_step(model, opt, x, y)
        kiln.save(model.state_dict(), tmp_path / "model.safetensors")
        model.load_state_dict(kiln.load(tmp_path / "model.safetensors"))
        kiln.save({"model": model.state_dict(), "step": 3, "loader": {"epoch": 1}},
                  tmp_path / "ckpt")
        model.load_state_dict(kiln.load(tmp_path / "ckpt")["model"])
    assert_no_garbage(step)


def test_numpy_round_trip():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert_no_garbage(lambda: kiln.from_numpy(a).mul(2).numpy().sum())


# ---- distributed, a world of one in this process -----------------------------------------------
@pytest.fixture
def world_of_one(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    dist.init_process_group("ucx")
    yield
    dist.destroy_process_group()


def test_ddp(world_of_one):
    kiln.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(mlp())
    opt = kiln.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = batch()
    assert_no_garbage(lambda: train_step(model, opt, x, y))


def test_fsdp(world_of_one):
    from kiln.distributed.device_mesh import init_device_mesh
    from kiln.distributed.fsdp import fully_shard
    kiln.manual_seed(0)
    mesh = init_device_mesh("cpu", (1,))
    model = mlp()
    fully_shard(model[0], mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = kiln.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = batch()
    assert_no_garbage(lambda: train_step(model, opt, x, y, clip=1.0))


def test_fully_shard_keeps_no_unsharded_parameters(world_of_one):
    """fully_shard's parameter walk was a self-recursive closure: the unsharded parameters it
    collected stayed alive after it returned, until the next collection."""
    from kiln.distributed.device_mesh import init_device_mesh
    from kiln.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (1,))
    models = []

    def setup():
        model = mlp()
        fully_shard(model[0], mesh=mesh)
        models.append(fully_shard(model, mesh=mesh))
    assert_no_garbage(setup, keeps=True)


def test_dtensor(world_of_one):
    from kiln.distributed.device_mesh import init_device_mesh
    from kiln.distributed.tensor import Replicate, Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (1,))
    w = kiln.randn(8, 4, requires_grad=True)

    def step():
        d = distribute_tensor(w, mesh, [Shard(0)])
        out = (d.redistribute(mesh, [Replicate()]) * 2).full_tensor()
        out.sum().backward()
        w.grad = None
    assert_no_garbage(step)


def test_tensor_parallel_and_loss_parallel(world_of_one):
    from kiln.distributed.device_mesh import init_device_mesh
    from kiln.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                  RowwiseParallel, SequenceParallel,
                                                  loss_parallel, parallelize_module)
    from kiln.distributed.tensor import Replicate, Shard
    kiln.manual_seed(0)
    mesh = init_device_mesh("cpu", (1,))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(8)
            self.fc1, self.fc2, self.head = nn.Linear(8, 16), nn.Linear(16, 8), nn.Linear(8, 4)

        def forward(self, x):
            return self.head(self.fc2(F.relu(self.fc1(self.norm(x)))))

    model = parallelize_module(Block(), mesh, {
        "norm": SequenceParallel(sequence_dim=0, use_local_output=True),
        "fc1": ColwiseParallel(), "fc2": RowwiseParallel(),
        "head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)})
    parallelize_module(model, mesh, PrepareModuleInput(input_layouts=(Replicate(),),
                                                       desired_input_layouts=(Replicate(),),
                                                       use_local_output=True))
    opt = kiln.optim.SGD(model.parameters(), lr=0.1)
    x, y = batch()

    def step():
        with loss_parallel():
            logits = model(x)
            loss = F.cross_entropy(logits, y) + F.nll_loss(F.log_softmax(logits, -1), y)
            loss.backward()
        opt.step()
        opt.zero_grad()
    assert_no_garbage(step)


def test_pipeline_schedule(world_of_one):
    import kiln.distributed.pipelining as pp
    kiln.manual_seed(0)
    stage = pp.PipelineStage(mlp(), 0, 1)
    sched = pp.ScheduleGPipe(stage, n_microbatches=2, loss_fn=F.mse_loss)
    opt = kiln.optim.SGD(stage.submod.parameters(), lr=0.1)
    x, target = kiln.randn(4, 8), kiln.randn(4, 4)

    def step():
        sched.step(x, target=target)
        opt.step()
        opt.zero_grad()
    assert_no_garbage(step)


def test_distributed_checkpoint(tmp_path):
    import kiln.distributed.checkpoint as dcp
    model, opt = mlp_and_adamw()
    x, y = batch()

    def step():
        train_step(model, opt, x, y)
        state = {"model": model.state_dict(), "step": 1, "sched": {"lr": 0.5}}
        dcp.save(state, checkpoint_id=tmp_path / "ckpt")
        dcp.load(state, checkpoint_id=tmp_path / "ckpt")
    assert_no_garbage(step)


# ---- layers, quantization, the profiler, export ------------------------------------------------
def test_transformer_layers():
    kiln.manual_seed(0)
    enc = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.1, batch_first=True)
    dec = nn.TransformerDecoderLayer(8, 2, dim_feedforward=16, dropout=0.1, batch_first=True)
    emb = nn.Embedding(11, 8)
    params = list(enc.parameters()) + list(dec.parameters()) + list(emb.parameters())
    opt = kiln.optim.AdamW(params, lr=1e-3)
    tok = kiln.randint(0, 11, (2, 5))

    def step():
        h = emb(tok)
        causal = kiln.ones(5, 5, dtype=kiln.bool).triu(1)
        out = dec(h, enc(h, src_mask=causal, is_causal=True), tgt_mask=causal, tgt_is_causal=True)
        opt.zero_grad()
        out.pow(2).mean().backward()
        opt.step()
    assert_no_garbage(step)


def test_qat_training():
    import kiln.ao.quantization as q
    kiln.manual_seed(0)
    model = q.prepare_qat(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)))
    opt = kiln.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = batch()
    assert_no_garbage(lambda: train_step(model, opt, x, y))


def test_profiler_steps():
    model, opt = mlp_and_adamw()
    x, y = batch()
    traces = []
    prof = kiln.profiler.profile(schedule=kiln.profiler.schedule(wait=0, warmup=0, active=1),
                                 on_trace_ready=lambda p: traces.append(p.key_averages()))

    def step():
        with kiln.profiler.record_function("train_step"):
            train_step(model, opt, x, y)
        prof.step()
    with prof:
        assert_no_garbage(step)
    assert traces


def test_exported_program():
    kiln.manual_seed(0)
    model = mlp()
    prog = kiln.export(model, (kiln.randn(6, 8),))
    x = kiln.randn(6, 8)
    assert_no_garbage(lambda: prog(x))


def test_quantized_inference():
    import kiln.ao.quantization as q
    kiln.manual_seed(0)
    qat = q.prepare_qat(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)))
    qat(kiln.randn(6, 8))
    converted = q.convert(qat.eval())
    dynamic = q.quantize_dynamic(mlp(), {nn.Linear}, dtype=q.qint8)
    x = kiln.randn(6, 8)

    def step():
        with kiln.no_grad():
            converted(x)
            dynamic(x)
    assert_no_garbage(step)


def test_tensor_indexing_and_views():
    x = kiln.randn(6, 8, requires_grad=True)
    idx = kiln.tensor([0, 2, 5])

    def step():
        y = x * 1.0
        y[1:3] = 0.0
        y[idx, 0] += 1.0
        z = y[y > 0].sum() + y[:, ::2].T.reshape(-1).sum() + y.unbind()[0].sum()
        z.backward()
        x.grad = None
        for row in y.detach():
            float(row.sum())
        y.detach().numpy()
    assert_no_garbage(step)


def test_a_compiled_training_step():
    kiln.manual_seed(0)
    model = mlp()
    fwd = kiln.compile(model)
    opt = kiln.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = batch()
    assert_no_garbage(lambda: train_step(fwd, opt, x, y))
