"""examples/chargpt.py under `kiln run` with --fsdp 4 and with --tp 2 trains the chargpt GPT as
one process does: over 20 steps every step's loss (the mean over the whole batch of 16) matches
the single-process run to 1e-5 relative, in float32. The ranks differ from one process only in
the order of float sums (reduce-scatter and all-reduce, and each rank's share of the batch), so
the runs agree to rounding."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import kiln

ROOT = Path(__file__).resolve().parents[2]
KILN_CLI = Path(kiln._C.__file__).resolve().parent.parent.parent / "bin" / "kiln"
DATA = "/usr/share/games/fortunes"
STEPS = 20
ARGS = ["--steps", str(STEPS), "--eval-every", str(STEPS), "--sample-bytes", "0",
        "--print-losses"]


def run(nproc, *extra):
    cmd = [sys.executable, str(ROOT / "examples" / "chargpt.py"), *ARGS, *extra]
    if nproc > 1:
        cmd = [str(KILN_CLI), "run", "--nproc", str(nproc), "--timeout", "600", *cmd]
    r = subprocess.run(cmd, capture_output=True, text=True, env=os.environ, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    losses = [float(m[1]) for m in re.finditer(r"^(?:\[rank 0\] )?step \d+ loss (\S+)$",
                                               r.stdout, re.M)]
    assert len(losses) == STEPS, r.stdout
    return losses


@pytest.fixture(scope="module")
def single():
    return run(1)


def expect_parity(got, want):
    for step, (g, w) in enumerate(zip(got, want), 1):
        assert abs(g - w) <= 1e-5 * abs(w), f"step {step}: {g} vs one process {w}"


@pytest.mark.skipif(not os.path.isdir(DATA), reason="needs Debian's fortunes package")
def test_fsdp_four_ranks(single):
    expect_parity(run(4, "--fsdp", "4"), single)


@pytest.mark.skipif(not os.path.isdir(DATA), reason="needs Debian's fortunes package")
def test_tp_two_ranks(single):
    expect_parity(run(2, "--tp", "2"), single)


def test_bad_flags():
    for extra, needle in [(["--fsdp", "2", "--tp", "2"], "not supported yet"),
                          (["--fsdp", "3"], "must divide the batch of 16"),
                          (["--tp", "0"], "must be >= 1"),
                          (["--fsdp", "2"], "needs 2 ranks")]:
        r = subprocess.run([sys.executable, str(ROOT / "examples" / "chargpt.py"), *extra],
                           capture_output=True, text=True,
                           env={k: v for k, v in os.environ.items() if k != "WORLD_SIZE"})
        assert r.returncode == 2 and needle in r.stderr, r.stderr
