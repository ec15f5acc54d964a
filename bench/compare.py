#!/usr/bin/env python3
"""Reads benchmark JSON lines on stdin and prints each Kiln figure as a ratio against the
references measured in the same run (higher is better for Kiln; for time units the ratio is
inverted so that > 1 still means Kiln is faster)."""
import json
import sys

TIME_UNITS = {"ns/op", "ms", "ms/step", "µs", "us"}
REFS = ["onednn-direct", "openmp-loop"]


def main():
    rows = [json.loads(line) for line in sys.stdin if line.strip().startswith("{")]
    by_key = {}
    for r in rows:
        by_key.setdefault((r["workload"], r["metric"]), {})[r["impl"]] = r
    print("\nratios (Kiln vs reference, same run; > 1 means Kiln is faster):")
    for (w, m), impls in by_key.items():
        ours = impls.get("kiln-cpp") or impls.get("kiln-py")
        if not ours:
            continue
        refs = [k for k in impls if k in REFS or k.startswith("torch-")]
        for ref in refs:
            a, b = ours["value"], impls[ref]["value"]
            ratio = (b / a) if ours["unit"] in TIME_UNITS else (a / b)
            time_ratio = f" (time kiln/ref {a / b:.3f})" if ours["unit"] in TIME_UNITS else ""
            print(f"  {w}/{m}: {ours['value']:.4g} {ours['unit']} vs {ref} {b:.4g} -> {ratio:.3f}x"
                  f"{time_ratio}")
        if m == "gelu_16M":
            add = by_key.get(("elementwise", "add_16M"), {}).get(ours["impl"])
            if add:
                print(f"  {w}/{m}: {ours['value']:.4g} GB/s vs kiln add_16M {add['value']:.4g} GB/s"
                      f" -> {ours['value'] / add['value']:.3f}x")


if __name__ == "__main__":
    main()
