"""The example trainers, examples/chargpt.py and build/bin/chargpt (examples/chargpt/chargpt.cpp),
under `kiln run` with --fsdp 4, with --tp 2 and with both (--fsdp 2 --tp 2: 2-D FSDP x TP), and
the Python one with --pp 2 (pipeline stages), train the chargpt GPT as one process does: over 20 steps every step's loss (the mean over the whole
batch of 16) matches the single-process run of the same program to 1e-5 relative, in float32.
The ranks differ from one process only in the order of float sums (reduce-scatter and
all-reduce, and each rank's share of the batch), so the runs agree to rounding. With --bf16
(FSDP's bfloat16 mixed precision) the losses agree to 5e-3 (see test_fsdp_bf16_four_ranks). Bad
--fsdp / --tp / --bf16 flags exit with status 2 and the same messages."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import kiln

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(kiln._C.__file__).resolve().parent.parent.parent / "bin"
CHARGPT, KILN_CLI = BIN / "chargpt", BIN / "kiln"
PROGRAMS = {"python": [sys.executable, str(ROOT / "examples" / "chargpt.py")],
            "cpp": [str(CHARGPT)]}
DATA = "/usr/share/games/fortunes"
STEPS = 20
ARGS = ["--steps", str(STEPS), "--eval-every", str(STEPS), "--sample-bytes", "0",
        "--print-losses"]
needs_data = pytest.mark.skipif(not os.path.isdir(DATA), reason="needs Debian's fortunes package")
NO_WORLD = {k: v for k, v in os.environ.items() if k != "WORLD_SIZE"}


@pytest.fixture(scope="module", params=sorted(PROGRAMS))
def program(request):
    if request.param == "cpp" and not CHARGPT.exists():
        pytest.skip(f"{CHARGPT} not built")
    return PROGRAMS[request.param]


def run(program, nproc, *extra):
    cmd = [*program, *ARGS, *extra]
    if nproc > 1:
        cmd = [str(KILN_CLI), "run", "--nproc", str(nproc), "--timeout", "600", *cmd]
    r = subprocess.run(cmd, capture_output=True, text=True, env=os.environ, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    # One rank prints (kiln run may prefix its lines with the rank).
    assert not re.search(r"^\[rank [1-9]\d*\] step ", r.stdout, re.M), r.stdout
    losses = [float(m[1]) for m in re.finditer(r"^(?:\[rank 0\] )?step \d+ loss (\S+)$",
                                               r.stdout, re.M)]
    assert len(losses) == STEPS, r.stdout
    return losses


@pytest.fixture(scope="module")
def single(program):
    losses = run(program, 1)
    assert losses[-1] < losses[0] - 0.5, losses  # it trains: 20 steps take off well over 0.5 nats
    return losses


def expect_parity(got, want, tol=1e-5):
    worst = max(abs(g - w) / abs(w) for g, w in zip(got, want))
    print(f"worst relative loss difference over {STEPS} steps: {worst:.3g}")
    for step, (g, w) in enumerate(zip(got, want), 1):
        assert abs(g - w) <= tol * abs(w), f"step {step}: {g} vs one process {w}"
    return worst


@needs_data
def test_fsdp_four_ranks(program, single):
    expect_parity(run(program, 4, "--fsdp", "4"), single)


@needs_data
def test_tp_two_ranks(program, single):
    expect_parity(run(program, 2, "--tp", "2"), single)


@needs_data
def test_fsdp_tp_two_by_two(program, single):
    expect_parity(run(program, 4, "--fsdp", "2", "--tp", "2"), single)


@needs_data
def test_fsdp_bf16_four_ranks(program, single):
    # bfloat16 keeps 8 bits of mantissa (unit roundoff 2^-9, about 2e-3) in every product and
    # activation; each step's loss is a mean over 2,048 tokens, whose independent rounding errors
    # mostly cancel, and float32 reduction and AdamW keep the trajectory from drifting. Measured
    # here: at most 5e-4 relative over 20 steps. 5e-3 leaves a 10x margin and still catches a
    # lost gradient reduction (that moves the loss by several 1e-2 within 20 steps). The run must
    # also differ from float32 by more than its 1e-5 rounding: bfloat16 really is in use.
    worst = expect_parity(run(program, 4, "--fsdp", "4", "--bf16"), single, tol=5e-3)
    assert worst > 1e-5, worst


def test_bad_flags(program):
    for extra, needle in [(["--fsdp", "2", "--tp", "2"], "needs 4 ranks"),
                          (["--fsdp", "3"], "must divide the batch of 16"),
                          (["--bf16"], "--bf16 is FSDP's mixed precision: it needs --fsdp N"),
                          (["--tp", "0"], "must be >= 1"),
                          (["--fsdp", "2"], "needs 2 ranks")]:
        r = subprocess.run([*program, *extra], capture_output=True, text=True, env=NO_WORLD)
        assert r.returncode == 2 and needle in r.stderr, (extra, r.returncode, r.stderr)
    # A gang is driven by one process, not by every rank of kiln run.
    r = subprocess.run([*program, "--fsdp", "2", "--remote", "127.0.0.1:1"], capture_output=True,
                       text=True, env={**NO_WORLD, "WORLD_SIZE": "2"})
    assert r.returncode == 2 and "drives a gang from one process" in r.stderr, r.stderr


@needs_data
def test_pp_two_stages(program, single):
    """examples/chargpt.py --pp 2: the GPT in 2 pipeline stages (1F1B over 4 microbatches)."""
    if program != PROGRAMS["python"]:
        pytest.skip("--pp is the Python trainer's (kiln.distributed.pipelining)")
    expect_parity(run(program, 2, "--pp", "2"), single)


def test_pp_bad_flags():
    program = PROGRAMS["python"]
    for extra, needle, world in [(["--pp", "3"], "cut into 2 or 4 stages", "3"),
                                 (["--pp", "2"], "--pp 2 needs 2 ranks", "1"),
                                 (["--pp", "2", "--fsdp", "2"], "--pp runs alone", "2")]:
        r = subprocess.run([*program, *extra], capture_output=True, text=True,
                           env={**NO_WORLD, "WORLD_SIZE": world})
        assert r.returncode == 2 and needle in r.stderr, (extra, r.returncode, r.stderr)


def test_bad_flags_cpp():
    """The C++ program's own cases: its messages in full, and its number parsing."""
    if not CHARGPT.exists():
        pytest.skip(f"{CHARGPT} not built")
    for extra, needle in [(["--fsdp", "2"], "needs 2 ranks: run it as `kiln run --nproc 2 ...` "
                                            "(WORLD_SIZE is 1)"),
                          (["--tp", "2", "--ckpt", "/tmp/x"], "needs 2 ranks"),
                          (["--fsdp", "x"], "--fsdp expects a number, got 'x'"),
                          (["--tp"], "--tp needs a value")]:
        r = subprocess.run([str(CHARGPT), *extra], capture_output=True, text=True, env=NO_WORLD)
        assert r.returncode == 2 and needle in r.stderr, (extra, r.returncode, r.stderr)
    # --ckpt is refused with sharding (the rank count is right here, so that check is reached).
    r = subprocess.run([str(CHARGPT), "--tp", "2", "--ckpt", "/tmp/x"], capture_output=True,
                       text=True, env={**NO_WORLD, "WORLD_SIZE": "2"})
    assert r.returncode == 2 and "--ckpt with --fsdp, --tp or --remote" in r.stderr, r.stderr


# ---- On a coordinator's gang: one process records for every worker (Note [Remote DTensor]) ---

def run_on_gang(tmp_path, program, n, *extra, submit=False):
    """The program with --remote COORDINATOR on a gang of n workers (or, with submit, as the
    driver of `kiln submit --workers n`); its losses."""
    from test_dtensor import gang_of
    from test_remote_worker import stop
    procs, address = gang_of(tmp_path, n)
    try:
        cmd = [*program, *ARGS, *extra]
        cmd = ([str(KILN_CLI), "submit", "--coordinator", address, "--workers", str(n), "--", *cmd]
               if submit else [*cmd, "--remote", address])
        r = subprocess.run(cmd, capture_output=True, text=True, env=NO_WORLD, timeout=900)
    finally:
        for p in reversed(procs):
            stop(p)
    assert r.returncode == 0, r.stdout + r.stderr
    losses = [float(m[1]) for m in re.finditer(r"^step \d+ loss (\S+)$", r.stdout, re.M)]
    assert len(losses) == STEPS, r.stdout + r.stderr
    return losses


@needs_data
def test_fsdp_tp_two_by_two_on_a_gang(program, single, tmp_path):
    expect_parity(run_on_gang(tmp_path, program, 4, "--fsdp", "2", "--tp", "2"), single)


@needs_data
def test_kiln_submit_fsdp_on_a_gang(program, single, tmp_path):
    expect_parity(run_on_gang(tmp_path, program, 2, "--fsdp", "2", submit=True), single)
