"""kiln.compile's graph breaks (Note [Graph break segments] in compiler/src/segments.cpp): a
call that reads a value it computes runs as compiled segments split at the reads. Each test
compares with the same function run eagerly, bit for bit: a segment runs the kernels eager
runs, in the same order, and draws the same random numbers. A fused loop (Note [Fusion]) has
its own vectorized exp, so where one runs the bar is 1e-6 relative.
"""

import pytest

import kiln
import kiln.nn as nn
import kiln.nn.functional as F


def twice(fn, make_args, calls=6):
    """fn eagerly and compiled on the same arguments: (eager results, compiled results, the
    compiled function). make_args(i) gives call i's arguments (fresh each time)."""
    eager, compiled = [], []
    f = kiln.compile(fn)
    for i in range(calls):
        kiln.manual_seed(100 + i)
        eager.append(fn(*make_args(i)))
        kiln.manual_seed(100 + i)
        compiled.append(f(*make_args(i)))
    return eager, compiled, f


def same(a, b, rtol=0.0):
    if isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y, rtol)
    elif isinstance(a, kiln.Tensor):
        assert a.shape == b.shape and a.dtype == b.dtype
        if rtol == 0:
            assert a.tolist() == b.tolist()
        else:
            assert ((a - b).abs() <= rtol * b.abs()).all().item(), (a, b)
    elif rtol and isinstance(a, float):
        assert abs(a - b) <= rtol * abs(b), (a, b)
    else:
        assert a == b


def kinds(f):
    return [k for k, _ in f.explain()]


def test_a_training_step_with_a_data_dependent_branch_runs_in_compiled_segments():
    def train(compiled, steps=8):
        kiln.manual_seed(0)
        m = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Dropout(0.2), nn.LayerNorm(32),
                          nn.Linear(32, 4))
        opt = kiln.optim.AdamW(m.parameters(), lr=1e-2)
        logged = []

        def step(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(m(x), y)
            logged.append(loss.item())
            if loss.item() > 1.2:  # the branch depends on the value
                loss = loss * 2
            loss.backward()
            opt.step()
            return loss.detach()

        f = kiln.compile(step) if compiled else step
        kiln.manual_seed(1)
        data = [(kiln.randn(16, 8), kiln.randint(0, 4, (16,))) for _ in range(steps)]
        out = [f(x, y).item() for x, y in data]
        return out, logged, [p.detach().clone() for p in m.parameters()], f

    want, want_log, want_params, _ = train(False)
    got, got_log, got_params, f = train(True)
    assert got == want and got_log == want_log
    for p, q in zip(got_params, want_params):
        assert p.tolist() == q.tolist()
    assert kinds(f)[0] == "graph break" and kinds(f).count("segment") == 2, f.explain()
    assert f.num_programs == 0
    # call 1 captures and breaks, call 2 records each segment's key, calls 3.. run them compiled
    assert f.num_segment_runs == 2 * (8 - 2), f.explain()


def test_printing_and_numpy_reads_flush_the_pending_ops(capsys):
    def fn(x):
        y = (x * 3).relu()
        print("y", y.tolist())
        z = y + 1
        a = z.numpy().copy()
        return z * 2, float(a.sum())

    eager, compiled, f = twice(fn, lambda i: (kiln.randn(5),))
    same(eager, compiled)
    assert kinds(f)[0] == "graph break"


def test_random_ops_draw_what_eager_draws():
    def fn(x):
        a = kiln.rand(4, 3) + x
        b = F.dropout(a, 0.5) * kiln.randn(4, 3)
        s = b.sum().item()
        return b * s + kiln.randn(4, 3), kiln.bernoulli(kiln.full((4, 3), 0.5))

    eager, compiled, f = twice(fn, lambda i: (kiln.ones(4, 3),), calls=5)
    same(eager, compiled)


def test_writes_to_part_of_a_pending_tensor_and_views_of_it():
    def fn(x):
        y = x * 2
        y[0] = -1.0              # writes part of a pending tensor: runs eagerly after a flush
        y[:, 1].add_(10)         # and again through a view
        t = y.t()                # a view, returned with its base
        y.mul_(3)                # the whole tensor in place
        n = int((y > 0).sum().item())
        return y, t, y[1:] * n

    eager, compiled, f = twice(fn, lambda i: (kiln.arange(12.0).view(3, 4) + i,))
    same(eager, compiled)


def test_data_dependent_shapes_and_in_place_updates_of_inputs():
    w = kiln.zeros(6)

    def fn(x):
        idx = (x > 0).nonzero().flatten()  # its shape depends on the data: a break, left to eager
        w.add_(x)                          # an input written in place
        y = (x * 2).exp().add(1).log().mul(w).sin().cos().tanh()  # enough ops to compile
        v = x.index_select(0, idx) * w.sum()
        return v, w * 1, y

    eager = []
    xs = [kiln.randn(6) for _ in range(5)]
    for x in xs:
        eager.append(fn(x))
    w.zero_()
    f = kiln.compile(fn)
    compiled = [f(x) for x in xs]
    same(eager, compiled, rtol=1e-6)
    assert "cannot be recorded" in f.explain()[0][1] and f.num_segment_runs > 0, f.explain()


def test_an_error_inside_a_segment_is_raised_and_later_calls_still_work():
    emb = kiln.randn(10, 4)

    def fn(idx, n):
        h = emb[idx] * 2          # idx out of range is caught when the segment runs
        if h.sum().item() > 1e9:
            h = h * 0
        return h @ kiln.ones(4, n)

    f = kiln.compile(fn)
    ok = kiln.tensor([1, 2, 3])
    for _ in range(3):
        f(ok, 2)
    with pytest.raises(IndexError, match="out of range|out of bounds"):
        f(kiln.tensor([1, 2, 30]), 2)
    with pytest.raises(Exception, match="4"):  # a bad shape: the op's own error, at the op
        f(ok, 0).sum().item() + (kiln.ones(3, 3) @ kiln.ones(4, 4)).sum().item()
    same(f(ok, 2), fn(ok, 2))


def test_a_compiled_function_called_inside_a_segmented_one_joins_its_segments():
    inner = kiln.compile(lambda x: (x * 2).exp())

    def fn(x):
        y = inner(x) + 1
        y = (y * y).sin() - y.cos() * 0.5 + y.tanh() * y.sigmoid()  # enough ops to compile
        if y.mean().item() > 0:
            y = inner(y) * 3
        return y.clamp(-1e3, 1e3).log1p().neg().abs().sqrt()

    eager, compiled, f = twice(fn, lambda i: (kiln.randn(8) * 0.1,))
    same(eager, compiled, rtol=1e-6)
    assert f.num_segment_runs > 0, f.explain()


def test_a_checkpoint_written_inside_a_segmented_step_holds_the_updated_weights(tmp_path):
    import kiln.distributed.checkpoint as dcp

    def train(compiled, root):
        kiln.manual_seed(0)
        m = nn.Linear(4, 3)
        opt = kiln.optim.SGD(m.parameters(), lr=0.5)

        def step(x, i):
            opt.zero_grad()
            loss = (m(x) * m(x)).mean()
            if loss.item() > 1e6:
                raise RuntimeError("diverged")
            loss.backward()
            opt.step()  # pending until something reads the weights
            # DCP reads the tensors' memory itself (its CRCs and writes), not through an op
            dcp.save({"w": m.weight, "b": m.bias}, checkpoint_id=str(root / f"{i}"))
            return loss.detach()

        f = kiln.compile(step) if compiled else step
        for i in range(4):
            f(kiln.full((2, 4), float(i + 1)), i)
        out = []
        for i in range(4):
            state = {"w": kiln.zeros(3, 4), "b": kiln.zeros(3)}
            dcp.load(state, checkpoint_id=str(root / f"{i}"))
            out.append((state["w"], state["b"]))
        return out

    (tmp_path / "e").mkdir()
    (tmp_path / "c").mkdir()
    same(train(False, tmp_path / "e"), train(True, tmp_path / "c"))


DATA_PARALLEL = """
import sys, warnings
import kiln, kiln.distributed as dist, kiln.nn as nn
import kiln.nn.functional as F
from kiln.distributed.device_mesh import init_device_mesh
from kiln.distributed.fsdp import fully_shard
from kiln.distributed.tensor import DTensor
warnings.simplefilter("ignore")
dist.init_process_group("ucx")
rank = dist.get_rank()

def model(kind):
    kiln.manual_seed(0)
    m = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))
    if kind == "ddp":
        return nn.parallel.DistributedDataParallel(m)
    mesh = init_device_mesh("cpu", (2,))
    for i in (0, 2):
        fully_shard(m[i], mesh=mesh)
    return fully_shard(m, mesh=mesh)

def train(kind, compiled):
    m = model(kind)
    opt = kiln.optim.AdamW(m.parameters(), lr=1e-2)
    logged = []
    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(m(x), y)
        logged.append(loss.item())  # a graph break: the collectives run between segments
        loss.backward()
        opt.step()
        return loss.detach()
    f = kiln.compile(step) if compiled else step
    kiln.manual_seed(10 + rank)
    for _ in range(6):
        f(kiln.randn(8, 6), kiln.randint(0, 3, (8,)))
    state = [p.full_tensor() if isinstance(p, DTensor) else p for p in m.parameters()]
    return logged, [p.detach().clone() for p in state], f

for kind in sys.argv[1:]:
    want_log, want, _ = train(kind, False)
    got_log, got, f = train(kind, True)
    assert got_log == want_log, (kind, got_log, want_log)
    for a, b in zip(got, want):
        assert a.tolist() == b.tolist(), kind
    assert f.num_segment_runs > 0, (kind, f.explain())
print(f"rank {rank} ok")
"""


def test_data_parallel_and_fsdp_steps_with_a_graph_break_match_eager(tmp_path):
    from kiln_run import run_ranks
    run_ranks(tmp_path, "dp_segments", DATA_PARALLEL, 2, "ddp", "fsdp")


def test_a_segment_whose_constants_change_every_call_runs_op_by_op_and_stays_right():
    scale = [1.0]

    def fn(x):
        y = (x * scale[0]).exp().mul(2).add(1).sin().cos().tanh().neg().abs()
        if y.sum().item() > 0:  # a break; the constant above differs at every call
            y = y * 3
        return y

    f = kiln.compile(fn)
    for i in range(12):
        scale[0] = 1.0 + i
        x = kiln.linspace(-1, 1, 16)
        same(f(x), fn(x), rtol=1e-6)
    assert "segment" not in kinds(f), f.explain()  # no key was seen twice: nothing compiled
    assert f.num_segment_runs == 0


def test_a_compiled_module_whose_forward_reads_a_value_trains_as_eager():
    """The backward runs after the call, outside the segments, on the tensors they computed."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

        def forward(self, x):
            h = F.gelu(self.a(x)) * 2 + 1
            h = h.tanh() * h.sigmoid() - h * 0.1  # enough ops for the segment to compile
            if h.mean().item() > 10:
                h = h * 0
            return self.b(h)

    def train(compiled):
        kiln.manual_seed(0)
        m = Net()
        f = kiln.compile(m) if compiled else m
        opt = kiln.optim.SGD(m.parameters(), lr=0.1)
        losses = []
        for i in range(6):
            kiln.manual_seed(i)
            loss = F.cross_entropy(f(kiln.randn(4, 8)), kiln.randint(0, 4, (4,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, [p.detach().clone() for p in m.parameters()], f

    want, want_params, _ = train(False)
    got, got_params, f = train(True)
    same(got, want, rtol=1e-6)
    same(got_params, want_params, rtol=1e-6)
    assert f.num_segment_runs > 0, f.explain()


def test_an_exception_in_a_segmented_call_keeps_the_writes_made_before_it():
    w = kiln.zeros(4)

    def fn(x, fail):
        w.add_(x * 2)            # pending when the exception comes: applied, as in eager
        if w.sum().item() > 1e9:
            return x
        w.mul_(0.5)
        if fail:
            raise ValueError("the step gave up")
        return w * 1

    f = kiln.compile(fn)
    x = kiln.ones(4)
    for _ in range(3):
        f(x, False)
    want = (w + 2) * 0.5
    with pytest.raises(ValueError, match="gave up"):
        f(x, True)
    same(w, want)
    same(f(x, False), (want + 2) * 0.5)
