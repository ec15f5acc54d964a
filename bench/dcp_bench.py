"""Distributed-checkpoint throughput (issue 21's benchmark): kiln.distributed.checkpoint save and
load of a 256 MiB state in one process, against this disk's sequential write and read bandwidth
measured in the same run by dd with O_DIRECT. Prints WORKLOADS.md-style JSON lines, then the
ratios. Save includes the CRC-32s and the fsyncs of a durable commit; load checks every CRC-32.
    PYTHONPATH=build/python .venv/bin/python bench/dcp_bench.py [--quick] [--dir DIR]"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import kiln
import kiln.distributed.checkpoint as dcp


def emit(metric, value, unit, impl):
    print(json.dumps({"workload": "dcp", "metric": metric, "value": round(value, 1), "unit": unit,
                      "impl": impl}), flush=True)


def dd_mb_s(args):
    r = subprocess.run(["dd", *args], capture_output=True, text=True, check=True)
    m = re.search(r"copied, ([0-9.]+) s", r.stderr)
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dir", default="build")
    a = ap.parse_args()
    mib = 64 if a.quick else 256
    work = tempfile.mkdtemp(dir=a.dir, prefix="dcp_bench_")
    try:
        probe = os.path.join(work, "dd.bin")
        w = min(dd_mb_s(["if=/dev/zero", f"of={probe}", "bs=4M", f"count={mib // 4}",
                         "oflag=direct", "conv=fsync"]) for _ in range(2))
        r = min(dd_mb_s([f"if={probe}", "of=/dev/null", "bs=4M", "iflag=direct"]) for _ in range(2))
        os.remove(probe)
        state = {f"layer{i}.weight": kiln.randn(1024, 1024) for i in range(mib // 4)}
        ckpt = os.path.join(work, "ckpt")
        saves, loads = [], []
        for _ in range(3):
            t0 = time.perf_counter()
            dcp.save(state, checkpoint_id=ckpt)
            saves.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            dcp.load(state, checkpoint_id=ckpt)
            loads.append(time.perf_counter() - t0)
        emit("disk_write_dd", mib / w, "MiB/s", "dd")
        emit("disk_read_dd", mib / r, "MiB/s", "dd")
        emit("save_256mib", mib / min(saves), "MiB/s", "kiln-py")
        emit("load_256mib", mib / min(loads), "MiB/s", "kiln-py")
        print(f"dcp: save {w / min(saves):.2f}x dd's write bandwidth, load "
              f"{r / min(loads):.2f}x dd's read bandwidth (goal >= 0.8x; load reads through the "
              f"page cache, dd does not)", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
