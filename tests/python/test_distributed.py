"""kiln.distributed, kiln.nn.parallel.DistributedDataParallel and kiln.utils.data.DistributedSampler:
one process in this interpreter (a world of one), and two ranks under `kiln run --nproc 2` (the
collectives against their expected values, DDP against one process on the doubled batch)."""
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kiln
import kiln.distributed as dist
from kiln import nn
from kiln.utils.data import DistributedSampler

KILN_CLI = Path(kiln._C.__file__).resolve().parent.parent.parent / "bin" / "kiln"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def world_of_one(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("ucx")
    yield
    dist.destroy_process_group()


def mlp():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def test_world_of_one_collectives(world_of_one):
    assert dist.is_initialized() and dist.get_rank() == 0 and dist.get_world_size() == 1
    t = kiln.arange(4.0)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    assert t.tolist() == [0.0, 1.0, 2.0, 3.0]
    work = dist.all_reduce(t, async_op=True)
    assert isinstance(work, dist.Work) and work.wait() and work.is_completed()
    out = kiln.zeros(4)
    dist.all_gather_into_tensor(out, t)
    assert out.tolist() == t.tolist()
    dist.broadcast(t, src=0)
    dist.barrier()
    with pytest.raises(ValueError, match="not a member"):
        dist.broadcast(t, src=1)


def test_init_with_a_store_and_subgroups():
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=10.0)
    store.set("k", b"v")
    assert store.get("k") == b"v" and store.add("n", 2) == 2
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)  # "gloo": the UCX backend
    try:
        t = kiln.tensor([1.0, 5.0])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        assert t.tolist() == [1.0, 5.0]
        g = dist.new_group([0])
        assert list(g.ranks) == [0] and dist.get_world_size(g) == 1 and dist.get_rank(g) == 0
        with pytest.raises(ValueError, match="store needs rank and world_size"):
            dist.init_process_group(store=store)
    finally:
        dist.destroy_process_group()


def test_not_initialized_and_bad_backend():
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="has not been initialized"):
        dist.get_rank()
    with pytest.raises(ValueError, match="backend 'nccl' is not available"):
        dist.init_process_group("nccl")


def test_ddp_one_process_matches_plain_training(world_of_one):
    kiln.manual_seed(0)
    plain = mlp()
    kiln.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(mlp())
    assert list(ddp.state_dict())[0] == "module.0.weight"
    opt_p = kiln.optim.AdamW(plain.parameters(), lr=1e-2)
    opt_d = kiln.optim.AdamW(ddp.parameters(), lr=1e-2)
    for _ in range(3):
        x, y = kiln.randn(5, 8), kiln.randint(0, 4, (5,))
        lp = nn.functional.cross_entropy(plain(x), y)
        ld = nn.functional.cross_entropy(ddp(x), y)
        opt_p.zero_grad()
        opt_d.zero_grad()
        lp.backward()
        ld.backward()
        assert lp.item() == ld.item()
        opt_p.step()
        opt_d.step()
    for a, b in zip(plain.parameters(), ddp.parameters()):
        assert (a == b).all().item()


def test_ddp_no_sync_and_unused_parameters(world_of_one):
    kiln.manual_seed(1)
    ddp = nn.parallel.DistributedDataParallel(mlp())
    x = kiln.randn(3, 8)
    with ddp.no_sync():
        assert not ddp.require_backward_grad_sync
        ddp(x).sum().backward()
    assert ddp.require_backward_grad_sync
    g1 = [p.grad.clone() for p in ddp.parameters()]
    ddp(x).sum().backward()
    for g, p in zip(g1, ddp.parameters()):
        assert (p.grad - 2 * g).abs().max().item() <= 1e-6

    class Partly(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = nn.Linear(3, 2), nn.Linear(3, 2)

        def forward(self, x):
            return self.used(x)

    strict = nn.parallel.DistributedDataParallel(Partly())
    with pytest.raises(RuntimeError, match="received no gradient.*unused.bias, unused.weight"):
        strict(kiln.randn(2, 3)).sum().backward()
    model = Partly()
    lenient = nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
    lenient(kiln.randn(2, 3)).sum().backward()
    assert model.unused.weight.grad.abs().sum().item() == 0


def test_distributed_sampler_shares():
    data = list(range(10))
    shares = [list(DistributedSampler(data, num_replicas=3, rank=r, shuffle=False)) for r in range(3)]
    assert shares == [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]  # PyTorch's padding
    dropped = [list(DistributedSampler(data, 3, r, shuffle=False, drop_last=True)) for r in range(3)]
    assert dropped == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    s = [DistributedSampler(data, 2, r, seed=5) for r in range(2)]
    e0 = list(s[0]) + list(s[1])
    assert sorted(e0) == data and len(s[0]) == 5
    for x in s:
        x.set_epoch(1)
    assert sorted(list(s[0]) + list(s[1])) == data and list(s[0]) + list(s[1]) != e0
    with pytest.raises(ValueError, match="Invalid rank 2"):
        DistributedSampler(data, num_replicas=2, rank=2)


WORKER = textwrap.dedent("""
    import kiln, kiln.distributed as dist
    from kiln import nn
    from kiln.utils.data import DistributedSampler

    dist.init_process_group("ucx")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 2
    t = kiln.full((5,), float(rank + 1))
    dist.all_reduce(t)
    assert t.tolist() == [3.0] * 5, t
    out = kiln.zeros(4)
    dist.all_gather_into_tensor(out, kiln.full((2,), float(rank)))
    assert out.tolist() == [0.0, 0.0, 1.0, 1.0], out
    rs = kiln.zeros(2)
    dist.reduce_scatter_tensor(rs, kiln.arange(4.0), op=dist.ReduceOp.AVG)
    assert rs.tolist() == [2.0 * rank, 2.0 * rank + 1], rs
    a2a = kiln.zeros(2)
    dist.all_to_all_single(a2a, kiln.tensor([10.0 * rank, 10.0 * rank + 1]))
    assert a2a.tolist() == [rank, 10.0 + rank], a2a
    b = kiln.full((3,), float(rank))
    dist.broadcast(b, src=1)
    assert b.tolist() == [1.0] * 3
    if rank == 0:
        dist.send(kiln.tensor([7.0]), dst=1)
    else:
        r = kiln.zeros(1)
        dist.recv(r, src=0)
        assert r.tolist() == [7.0]
    dist.barrier()
    assert list(DistributedSampler(range(7), shuffle=False)) == [[0, 2, 4, 6], [1, 3, 5, 0]][rank]

    def mlp():
        return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

    kiln.manual_seed(10)
    ref = mlp()                       # rank 0's initial weights, trained on the whole batch
    kiln.manual_seed(10 + rank)       # different weights per rank: DDP broadcasts rank 0's
    ddp = nn.parallel.DistributedDataParallel(mlp(), bucket_cap_mb=200 / 2**20)
    for a, b in zip(ref.parameters(), ddp.parameters()):
        assert (a == b).all().item()
    opt_r = kiln.optim.AdamW(ref.parameters(), lr=1e-2)
    opt_d = kiln.optim.AdamW(ddp.parameters(), lr=1e-2)
    g = kiln.Generator()
    g.manual_seed(3)
    for step in range(4):
        x, y = kiln.randn(12, 8, generator=g), kiln.randint(0, 4, (12,), generator=g)
        lr_ = nn.functional.cross_entropy(ref(x), y)
        ld = nn.functional.cross_entropy(ddp(x[6 * rank:6 * rank + 6]), y[6 * rank:6 * rank + 6])
        opt_r.zero_grad(); opt_d.zero_grad()
        lr_.backward(); ld.backward()
        mean = ld.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        assert abs(mean.item() - lr_.item()) < 1e-5, (step, mean.item(), lr_.item())
        opt_r.step(); opt_d.step()
    for a, b in zip(ref.parameters(), ddp.parameters()):
        assert ((a - b).abs() - 1e-4 * b.abs()).max().item() <= 1e-5
    dist.destroy_process_group()
    print("rank", rank, "ok")
""")


def test_two_ranks_under_kiln_run(tmp_path):
    if not KILN_CLI.exists():
        pytest.skip(f"{KILN_CLI} is not built")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ, KILN_COMM_TIMEOUT_S="30")
    r = subprocess.run([str(KILN_CLI), "run", "--nproc", "2", "--timeout", "120", sys.executable,
                        str(script)], capture_output=True, text=True, env=env, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[rank 0] rank 0 ok" in r.stdout and "[rank 1] rank 1 ok" in r.stdout, r.stdout


def digits_losses(nproc, batch_size, data):
    root = Path(__file__).resolve().parent.parent.parent
    r = subprocess.run([str(KILN_CLI), "run", "--nproc", str(nproc), "--timeout", "300",
                        sys.executable, str(root / "examples" / "digits.py"), data, "--mlp-only",
                        "--epochs", "3", "--batch-size", str(batch_size)],
                       capture_output=True, text=True, timeout=400)
    losses = [float(line.split("train loss ")[1].split()[0]) for line in r.stdout.splitlines()
              if "train loss " in line]
    assert len(losses) == 3, r.stdout + r.stderr
    return losses


def test_digits_example_two_ranks_match_one_on_the_doubled_batch(tmp_path):
    """examples/digits.py under kiln run: 2 ranks of batch 32 print the losses of 1 rank of 64."""
    if not KILN_CLI.exists():
        pytest.skip(f"{KILN_CLI} is not built")
    root = Path(__file__).resolve().parent.parent.parent
    data = root / "build" / "data" / "digits"
    if not (data / "y.npy").exists():
        data = tmp_path / "digits"
        subprocess.run([sys.executable, str(root / "examples" / "digits" / "export_digits.py"),
                        str(data)], check=True)
    one, two = digits_losses(1, 64, str(data)), digits_losses(2, 32, str(data))
    assert two == pytest.approx(one, rel=1e-5, abs=2e-6)
