"""Nested (jagged) vs padded batches (issue 25's speed item): one transformer block of
examples/chargpt.py (width 256, 4 heads, causal), forward and backward, on B sequences whose
lengths follow the fortunes' distribution (chargpt's data: fortunes of up to MAX bytes; random
lengths where Debian's fortunes package is missing). The padded batch pads to the longest
sequence, as a padded loader would; the nested batch packs the tokens (kiln.nested, the fused
_jagged_attention kernel). Prints one JSON line per layout (median seconds per step) and the
ratio nested / padded (below 1: nested is faster). On the 2-core development machine, idle:
nested 0.089 s, padded 0.426 s, ratio 0.209 (3273 tokens packed, 14528 padded; the attention
alone, _jagged_attention against the padded fused kernel, runs 7x faster).
    PYTHONPATH=build/python .venv/bin/python bench/nested_bench.py [--quick]"""
import json
import os
import sys
import time

import numpy as np

import kiln

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from chargpt import Block, read_fortunes  # noqa: E402  the example's transformer block

WIDTH, HEADS, BATCH, MAX = 256, 4, 32, 512
FORTUNES = "/usr/share/games/fortunes"


def lengths(n, seed=0):
    rng = np.random.default_rng(seed)
    if os.path.isdir(FORTUNES):
        text, _ = read_fortunes(FORTUNES)
        lens = np.array([len(f) for f in bytes(text).split(b"\n%\n") if 0 < len(f) <= MAX])
        return [int(x) for x in rng.choice(lens, n)], "fortunes"
    return [int(x) for x in rng.integers(8, MAX + 1, n)], "uniform"


def median_time(fn, reps):
    fn()  # warm-up
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def main():
    reps = 2 if "--quick" in sys.argv else 5
    kiln.manual_seed(0)
    block = Block(WIDTH, HEADS)
    lens, source = lengths(BATCH)
    parts = [kiln.randn(n, WIDTH) for n in lens]
    nested = kiln.nested.as_nested_tensor(parts).requires_grad_()
    padded = nested.to_padded_tensor(0.0).detach().requires_grad_()

    def step(x):
        block.zero_grad()
        y = block(x)
        (y.values() if isinstance(y, kiln.nested.NestedTensor) else y).sum().backward()

    t_nested = median_time(lambda: step(nested), reps)
    t_padded = median_time(lambda: step(padded), reps)
    for impl, t in (("nested", t_nested), ("padded", t_padded)):
        print(json.dumps({"workload": "nested_block", "metric": "step_s", "value": round(t, 4),
                          "unit": "s", "impl": impl, "lengths": source, "batch": BATCH,
                          "tokens": sum(lens), "padded_tokens": BATCH * max(lens)}), flush=True)
    print(json.dumps({"workload": "nested_block", "metric": "nested_over_padded",
                      "value": round(t_nested / t_padded, 3), "unit": "ratio"}), flush=True)


if __name__ == "__main__":
    main()
