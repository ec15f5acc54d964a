"""examples/digits in Python: trains the MLP and the small CNN of examples/digits/models.h on
scikit-learn's 8x8 digits (same data, split, models and AdamW settings as digits.cpp) and
reports held-out accuracy. Exits with status 1 if a model scores below 95%.

    .venv/bin/python examples/digits/export_digits.py build/data/digits
    PYTHONPATH=build/python .venv/bin/python examples/digits.py build/data/digits

Data-parallel under `kiln run --nproc N` (WORLD_SIZE set): each rank trains a
DistributedDataParallel replica on its DistributedSampler share, --batch-size images per rank, so
N ranks of batch B print the losses of `kiln run --nproc 1 ... --batch-size N*B` within float32
tolerance. Rank 0 prints and sets the exit status. Flags: --epochs E, --batch-size B, --mlp-only.

Remote: `--remote ADDR` (a kiln-worker or coordinator; "inproc": an embedded worker) trains on
a worker: the client records every op, the worker runs them, same accuracy. `--remote
COORDINATOR --workers N` trains data-parallel on a gang of N workers: one recorded program, each
worker a 1/N share of every batch (kiln.Session.scatter), gradients averaged over the gang.
"""
import os
import sys
import time

import numpy as np

import kiln
import kiln.distributed as dist
import kiln.nn as nn
from kiln.utils.data import DataLoader, DistributedSampler, TensorDataset

SEED = 0
BATCH_SIZE = 32
MLP_LR = CNN_LR = 2e-3
MASK = (1 << 64) - 1


def _mix(x):
    """splitmix64's finalizer, as kiln::data::RandomSampler seeds each epoch."""
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def epoch_generator(seed, epoch):
    """The generator of the C++ RandomSampler(n, seed) for `epoch`."""
    return kiln.Generator().manual_seed(_mix(seed ^ _mix(epoch)))


def split(x, y):
    """The C++ example's split: a seeded shuffle, the last 20% held out."""
    n = x.shape[0]
    order = kiln.randperm(n, generator=epoch_generator(SEED, 0))
    n_train = n - n // 5
    train, test = order[:n_train], order[n_train:]
    return x[train], y[train], x[test], y[test]


def make_mlp():
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def make_cnn():
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(32 * 4 * 4, 10))


@kiln.no_grad()
def accuracy(model, x, y):
    model.eval()
    correct = (model(x).argmax(1) == y).float().sum().item()
    model.train()
    return correct / y.shape[0]


def fit(name, model, data, shape, epochs, lr, batch_size=BATCH_SIZE, session=None):
    x_train, y_train, x_test, y_test = data
    x_train, x_test = x_train.reshape([-1, *shape]), x_test.reshape([-1, *shape])
    if session is not None:
        x_test, y_test = x_test.to(session.device), y_test.to(session.device)
    dataset = TensorDataset(x_train, y_train)
    distributed = dist.is_initialized()
    if distributed:
        sampler = DistributedSampler(dataset, seed=SEED)
        loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
        trained = nn.parallel.DistributedDataParallel(model)
    else:
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=True,
                            generator=kiln.Generator().manual_seed(SEED))
        trained = model
    if session is not None:
        model.to(session.device)
    rank0 = not distributed or dist.get_rank() == 0
    opt = kiln.optim.AdamW(trained.parameters(), lr=lr, weight_decay=1e-4)
    start = time.perf_counter()
    acc = 0.0
    for epoch in range(1, epochs + 1):
        if distributed:
            sampler.set_epoch(epoch - 1)
        loss_sum, batches = kiln.zeros((), device=x_test.device), 0
        for xb, yb in loader:
            # On a gang, each worker takes its share of a batch that splits evenly (else all of it).
            n = session.world_size if session is not None else 1
            gang = n > 1 and xb.shape[0] % n == 0
            if session is not None:
                xb, yb = (session.scatter(xb), session.scatter(yb)) if gang else \
                    (xb.to(session.device), yb.to(session.device))
            loss = nn.functional.cross_entropy(trained(xb), yb)
            opt.zero_grad()
            loss.backward()
            if gang:
                session.all_reduce_gradients(trained)
            opt.step()
            loss_sum += loss.detach()
            batches += 1
        if distributed:
            dist.all_reduce(loss_sum, op=dist.ReduceOp.AVG)
        acc = accuracy(model, x_test, y_test)
        if rank0:
            print(f"{name:<3} epoch {epoch:2d}  train loss {loss_sum.item() / batches:.6f}  "
                  f"held-out accuracy {100 * acc:.2f}%")
    if rank0:
        print(f"{name}: held-out accuracy {100 * acc:.2f}% ({y_test.shape[0]} images) after "
              f"{epochs} epochs, {time.perf_counter() - start:.1f} s")
    return acc


def main(argv):
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("data_dir", nargs="?", default="build/data/digits")
    ap.add_argument("--epochs", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    ap.add_argument("--mlp-only", action="store_true")
    ap.add_argument("--remote", metavar="ADDR", help="a kiln-worker or coordinator; inproc: embedded")
    ap.add_argument("--workers", type=int, default=1, help="remote workers (data-parallel)")
    args = ap.parse_args(argv[1:])
    data_dir = args.data_dir
    try:
        x = kiln.from_numpy(np.load(os.path.join(data_dir, "X.npy")))  # (1797, 64) float32
        y = kiln.from_numpy(np.load(os.path.join(data_dir, "y.npy")))  # (1797) int64
    except OSError as e:
        print(f"digits: {e}\n(export the data first: .venv/bin/python "
              f"examples/digits/export_digits.py {data_dir})", file=sys.stderr)
        return 2
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("ucx")
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    # A job's driver (`kiln submit`) trains on the job's workers.
    remote = args.remote or os.environ.get("KILN_JOB_ID")
    session = kiln.connect(args.remote, workers=args.workers) if remote else None
    data = split(x, y)
    if rank0:
        print(f"digits: {x.shape[0]} images, {data[1].shape[0]} train / {data[3].shape[0]} held out")
    kiln.manual_seed(SEED)
    mlp, cnn = make_mlp(), make_cnn()
    ok = True
    for name, model, shape, epochs, lr in (("mlp", mlp, (64,), 30, MLP_LR),
                                           ("cnn", cnn, (1, 8, 8), 20, CNN_LR)):
        if args.mlp_only and name != "mlp":
            continue
        if fit(name, model, data, shape, args.epochs or epochs, lr, args.batch_size, session) < 0.95:
            if rank0:
                print(f"{name}: FAILED, held-out accuracy below 95%")
            ok = False
    if dist.is_initialized():
        dist.destroy_process_group()
    if session is not None:
        session.close()
    return 0 if ok or not rank0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
