"""The profiler's overhead on the chargpt GPT training step (4 layers, width 256, batch 16 x 128,
AdamW): the step time with no profiler, under profile() and under profile(record_shapes=True,
profile_memory=True, with_flops=True), interleaved in rounds so that drift hits every mode alike.
Not a test: prints one line per mode (median ms/step and the ratio to "off"), the cost of one
event (a 1-element add from Python, best of the rounds) and the size of a 10-step trace.

    PYTHONPATH=build/python .venv/bin/python bench/profiler_overhead.py [--rounds 5] [--steps 5]
"""
import argparse
import importlib.util
import os
import statistics
import tempfile
import time

import kiln
import kiln.nn.functional as F
from kiln.profiler import profile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def gpt():
    spec = importlib.util.spec_from_file_location("chargpt", os.path.join(ROOT, "examples", "chargpt.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    kiln.manual_seed(0)
    return mod.GPT()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=5, help="steps per mode per round")
    args = ap.parse_args()
    model = gpt()
    opt = kiln.optim.AdamW(model.parameters(), lr=1e-3)
    g = kiln.Generator()
    g.manual_seed(0)

    def step():
        idx = kiln.randint(0, 256, (16, 129), generator=g)
        x, y = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()
        loss = F.cross_entropy(model(x).view(-1, 256), y.view(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    modes = {
        "off": None,
        "on": dict(),
        "on_shapes_memory_flops": dict(record_shapes=True, profile_memory=True, with_flops=True),
    }
    for _ in range(3):  # warm up the allocator's cache and the kernels
        step().item()
    times = {m: [] for m in modes}
    for _ in range(args.rounds):
        for mode, opts in modes.items():
            prof = profile(**opts) if opts is not None else None
            if prof:
                prof.start()
            for _ in range(args.steps):
                t0 = time.perf_counter()
                step().item()
                times[mode].append(time.perf_counter() - t0)
                if prof:
                    prof.step()
            if prof:
                prof.stop()
    base = statistics.median(times["off"])
    for mode in modes:
        med = statistics.median(times[mode])
        print(f"{mode:24s} {med * 1e3:8.2f} ms/step  ratio {med / base:.3f}  "
              f"(n={len(times[mode])}, min {min(times[mode]) * 1e3:.2f} ms)")

    # The cost of one event: a 1-element add (its dispatch dominates) off and on.
    a, b = kiln.ones(1), kiln.ones(1)
    n = 20000
    per_op = {}
    for mode, opts in modes.items():
        best = float("inf")
        for _ in range(args.rounds):
            prof = profile(**opts) if opts is not None else None
            if prof:
                prof.start()
            t0 = time.perf_counter()
            for _ in range(n):
                a + b
            best = min(best, time.perf_counter() - t0)
            if prof:
                prof.stop()
        per_op[mode] = best / n * 1e9
    for mode, ns in per_op.items():
        print(f"1-element add, {mode:24s} {ns:8.1f} ns/op (+{ns - per_op['off']:.1f} ns)")

    with profile(record_shapes=True, profile_memory=True, with_flops=True) as prof:
        for _ in range(10):
            step()
            prof.step()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "gpt.json")
        t0 = time.perf_counter()
        prof.export_chrome_trace(path)
        print(f"10-step trace (shapes, memory, flops): {os.path.getsize(path) / 1e6:.2f} MB, "
              f"export {time.perf_counter() - t0:.2f} s")


if __name__ == "__main__":
    main()
