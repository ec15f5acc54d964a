#!/usr/bin/env python3
"""Reads benchmark JSON lines on stdin and prints each Kiln figure as a ratio against the
references measured in the same run (higher is better for Kiln; for time units the ratio is
inverted so that > 1 still means Kiln is faster), then the Python API's targets (issue 6):
kiln-py's dispatch against PyTorch's Python API, and kiln-py's training steps against kiln-cpp;
and the remote figures against issue 8's targets."""
import json
import sys

TIME_UNITS = {"ns/op", "ms", "ms/step", "µs", "us"}
REFS = ["onednn-direct", "openmp-loop"]
# (workload, metric, reference impl or None for PyTorch's Python API, target time ratio)
PY_TARGETS = [("dispatch", "add_1elem", None, 0.5),
              ("dispatch", "mul_1elem_requires_grad", None, None),
              ("mlp_train", "step_b512", "kiln-cpp", 1.1),
              ("cnn_train", "step_b64", "kiln-cpp", 1.1),
              ("gpt_train", "step_b16_t128", "kiln-cpp", 1.1)]
# Issues 4 and 5: kiln-cpp against PyTorch's Python API (torch_reference.py): (workload, metric,
# minimum speed-up; for time units the speed-up is ref/kiln, for bandwidth kiln/ref).
KERNEL_TARGETS = [("kernels", "conv2d_fwd_bwd_b32_c32_16x16", 1.0),
                  ("kernels", "layer_norm_fwd_bwd_4096x1024", 1.0),
                  ("kernels", "cross_entropy_fwd_bwd_4096x1000", 1.0),
                  ("reduction", "softmax_4096x1024", 2.0),
                  ("kernels", "attention_fwd_bwd_b8_h8_t128_d64", 2.0),
                  ("kernels", "attention_fwd_bwd_b8_h8_t512_d64", 2.0),
                  # Issue 5: training steps at most 0.7 / 0.8 / 0.7 of PyTorch's time.
                  ("mlp_train", "step_b512", 1 / 0.7),
                  ("cnn_train", "step_b64", 1 / 0.8),
                  ("gpt_train", "step_b16_t128", 1 / 0.7)]
# Issue 7: (workload, kiln metric, PyTorch metric, target, higher is better)
DIST_TARGETS = [("allreduce", "ucx_2ranks_64MiB_algbw", "gloo_2ranks_64MiB_algbw", 4.0, True),
                ("ddp_train", "mlp_step_2ranks_b256", "mlp_step_2ranks_b256", 0.7, False)]


def torch_python(impls):
    """The impl name of PyTorch's Python API figure (torch-X.Y, not torch-X.Y-cpp), or None."""
    return next((k for k in impls if k.startswith("torch-") and not k.endswith("-cpp")), None)


def quantized_lines(by_key):
    """Issue 25: per impl, int8 dynamic over float32 MLP inference time (target <= 0.5), and Kiln's
    int8 against PyTorch's (its Python API, torch_reference.py's quantize_dynamic; target <= 0.8)."""
    fp32 = by_key.get(("quantized", "mlp_infer_b512_fp32"), {})
    int8 = by_key.get(("quantized", "mlp_infer_b512_int8_dynamic"), {})
    out = []
    for impl in sorted(int8):
        if impl in fp32:
            r = int8[impl]["value"] / fp32[impl]["value"]
            out.append(f"  {impl}: int8 {int8[impl]['value']:.4g} ms / fp32 "
                       f"{fp32[impl]['value']:.4g} ms -> {r:.3f}" +
                       ("" if impl.startswith("torch-") else
                        f" (target <= 0.5: {'met' if r <= 0.5 else 'MISSED'})"))
    ref = torch_python(int8)
    for impl in ("kiln-cpp", "kiln-py"):
        if ref and impl in int8:
            r = int8[impl]["value"] / int8[ref]["value"]
            out.append(f"  {impl} int8 vs {ref} int8: {int8[impl]['value']:.4g} ms vs "
                       f"{int8[ref]['value']:.4g} ms -> {r:.3f} (target <= 0.8: "
                       f"{'met' if r <= 0.8 else 'MISSED'})")
    return out


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
        # C++ against C++ references, Python against PyTorch's Python API.
        cpp = ours["impl"] == "kiln-cpp"
        refs = [k for k in impls
                if k in REFS or (k.startswith("torch-") and k.endswith("-cpp") == cpp)]
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
    lines = []
    for w, m, ref, target in PY_TARGETS:
        impls = by_key.get((w, m), {})
        ref = ref or torch_python(impls)
        if "kiln-py" not in impls or ref not in impls:
            continue
        a, b = impls["kiln-py"]["value"], impls[ref]["value"]
        verdict = "" if target is None else \
            f" (target <= {target}: {'met' if a / b <= target else 'MISSED'})"
        lines.append(f"  {w}/{m}: kiln-py {a:.4g} {impls['kiln-py']['unit']} vs {ref} {b:.4g}"
                     f" -> time {a / b:.3f}x{verdict}")
    kern = []
    for w, m, target in KERNEL_TARGETS:
        impls = by_key.get((w, m), {})
        ref = torch_python(impls)
        if "kiln-cpp" not in impls or not ref:
            continue
        a, b = impls["kiln-cpp"]["value"], impls[ref]["value"]
        speedup = (b / a) if impls["kiln-cpp"]["unit"] in TIME_UNITS else (a / b)
        kern.append(f"  {w}/{m}: kiln-cpp {a:.4g} vs {ref} {b:.4g} -> {speedup:.3f}x"
                    f" (target >= {target:.3g}: {'met' if speedup >= target else 'MISSED'})")
    if kern:
        print("\nKiln C++ against PyTorch's Python API (same run; > 1 means Kiln is faster):")
        print("\n".join(kern))
    dist = []
    for w, m, ref_m, target, higher in DIST_TARGETS:
        ours = by_key.get((w, m), {}).get("kiln-cpp")
        refs = by_key.get((w, ref_m), {})
        ref = torch_python(refs)
        if not ours or not ref:
            continue
        a, b = ours["value"], refs[ref]["value"]
        met = a / b >= target if higher else a / b <= target
        what = "kiln/ref" if higher else "time kiln/ref"
        dist.append(f"  {w}/{m}: kiln-cpp {a:.4g} {ours['unit']} vs {ref} {ref_m} {b:.4g}"
                    f" -> {what} {a / b:.3f} (target {'>=' if higher else '<='} {target}:"
                    f" {'met' if met else 'MISSED'})")
    if dist:
        print("\nDistributed (same run):")
        print("\n".join(dist))
    remote = {m: r["value"] for (w, m), impls in by_key.items() if w == "remote"
              for r in [impls.get("kiln-cpp")] if r}
    if remote:
        # Issue 8: absolute targets for the first two (the issue's own figures), a same-run ratio
        # for the step.
        out = []
        if "tiny_ops_per_s" in remote:
            v = remote["tiny_ops_per_s"]
            out.append(f"  remote/tiny_ops_per_s: {v:.4g} ops/s (target >= 100000: "
                       f"{'met' if v >= 1e5 else 'MISSED'})")
        if "fetch_roundtrip" in remote:
            v = remote["fetch_roundtrip"]
            # The issue sets 100 us where a bare gRPC stream ping-pong takes about 75 us; on a
            # shared machine the same-run form of that target is 100/75 of the ping-pong.
            ping = by_key.get(("remote", "fetch_roundtrip"), {}).get("grpc-pingpong")
            ref = ""
            if ping:
                r = v / ping["value"]
                ref = (f"; a bare gRPC stream ping-pong {ping['value']:.4g} us in the same run -> "
                       f"{r:.3f}x (same-run target <= {100 / 75:.2f}x: "
                       f"{'met' if r <= 100 / 75 else 'MISSED'})")
            out.append(f"  remote/fetch_roundtrip: {v:.4g} us (target <= 100: "
                       f"{'met' if v <= 100 else 'MISSED'}{ref})")
        if "mlp_step_remote" in remote and "mlp_step_local" in remote:
            r = remote["mlp_step_remote"] / remote["mlp_step_local"]
            out.append(f"  remote/mlp_step_remote: {remote['mlp_step_remote']:.4g} ms vs embedded "
                       f"{remote['mlp_step_local']:.4g} ms -> time {r:.3f}x (target <= 1.2: "
                       f"{'met' if r <= 1.2 else 'MISSED'})")
        print("\nRemote (client and kiln-worker on loopback, same run):")
        print("\n".join(out))
    quant = quantized_lines(by_key)
    if quant:
        print("\nQuantized inference (issue 25, same run; time ratios, < 1 means faster):")
        print("\n".join(quant))
    if lines:
        print("\nPython API (time kiln-py/ref, same run; < 1 means kiln-py is faster):")
        print("\n".join(lines))


if __name__ == "__main__":
    main()
