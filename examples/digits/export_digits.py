"""Exports scikit-learn's bundled 8x8 handwritten digits (1,797 images) for examples/digits.

    .venv/bin/python examples/digits/export_digits.py [DIR]    # DIR: build/data/digits

Writes DIR/X.npy (float32, N x 64, pixels scaled to [0, 1]) and DIR/y.npy (int64, N labels).
"""

import os
import sys

import numpy as np
from sklearn.datasets import load_digits


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "build/data/digits"
    os.makedirs(out, exist_ok=True)
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    np.save(os.path.join(out, "X.npy"), x)
    np.save(os.path.join(out, "y.npy"), y)
    print(f"export_digits: {x.shape[0]} images -> {out}/X.npy, {out}/y.npy")


if __name__ == "__main__":
    main()
