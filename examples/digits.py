"""examples/digits in Python: trains the MLP and the small CNN of examples/digits/models.h on
scikit-learn's 8x8 digits (same data, split, models and AdamW settings as digits.cpp) and
reports held-out accuracy. Exits with status 1 if a model scores below 95%.

    .venv/bin/python examples/digits/export_digits.py build/data/digits
    PYTHONPATH=build/python .venv/bin/python examples/digits.py build/data/digits
"""
import os
import sys
import time

import numpy as np

import kiln
import kiln.nn as nn
from kiln.utils.data import DataLoader, TensorDataset

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


def fit(name, model, data, shape, epochs, lr):
    x_train, y_train, x_test, y_test = data
    x_train, x_test = x_train.reshape([-1, *shape]), x_test.reshape([-1, *shape])
    loader = DataLoader(TensorDataset(x_train, y_train), batch_size=BATCH_SIZE, shuffle=True,
                        generator=kiln.Generator().manual_seed(SEED))
    opt = kiln.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    start = time.perf_counter()
    acc = 0.0
    for epoch in range(1, epochs + 1):
        loss_sum, batches = 0.0, 0
        for xb, yb in loader:
            loss = nn.functional.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss_sum += loss.item()
            batches += 1
        acc = accuracy(model, x_test, y_test)
        print(f"{name:<3} epoch {epoch:2d}  train loss {loss_sum / batches:.4f}  "
              f"held-out accuracy {100 * acc:.2f}%")
    print(f"{name}: held-out accuracy {100 * acc:.2f}% ({y_test.shape[0]} images) after {epochs} "
          f"epochs, {time.perf_counter() - start:.1f} s")
    return acc


def main(argv):
    data_dir = argv[1] if len(argv) > 1 else "build/data/digits"
    try:
        x = kiln.from_numpy(np.load(os.path.join(data_dir, "X.npy")))  # (1797, 64) float32
        y = kiln.from_numpy(np.load(os.path.join(data_dir, "y.npy")))  # (1797) int64
    except OSError as e:
        print(f"digits: {e}\n(export the data first: .venv/bin/python "
              f"examples/digits/export_digits.py {data_dir})", file=sys.stderr)
        return 2
    data = split(x, y)
    print(f"digits: {x.shape[0]} images, {data[1].shape[0]} train / {data[3].shape[0]} held out")
    kiln.manual_seed(SEED)
    mlp, cnn = make_mlp(), make_cnn()
    ok = True
    for name, model, shape, epochs, lr in (("mlp", mlp, (64,), 30, MLP_LR),
                                           ("cnn", cnn, (1, 8, 8), 20, CNN_LR)):
        if fit(name, model, data, shape, epochs, lr) < 0.95:
            print(f"{name}: FAILED, held-out accuracy below 95%")
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
