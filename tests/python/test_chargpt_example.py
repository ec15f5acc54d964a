"""examples/chargpt.py computes what the C++ example computes: the same losses, step for step, and
a run resumed from its checkpoint continues exactly as an uninterrupted one. The reference lines
are build/bin/chargpt's (examples/chargpt/chargpt.cpp) for `--steps 6 --eval-every 3`:
    step 3 train loss 5.6514 val loss 5.3670
    step 6 train loss 5.1990 val loss 4.8260
The warm-up lasts 50 steps, so a 3-step run follows the same learning rates as a 6-step one."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = "/usr/share/games/fortunes"
CPP = {3: (5.6514, 5.3670), 6: (5.1990, 4.8260)}
TOL = 2e-3  # printed to 4 decimals; the runs agree to float rounding


def run(*args):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "chargpt.py"),
                        "--sample-bytes", "20", *args], capture_output=True, text=True,
                       env=os.environ)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def losses(out):
    return {int(m[1]): (float(m[2]), float(m[3]))
            for m in re.finditer(r"^step (\d+) train loss ([\d.]+) val loss ([\d.]+)", out, re.M)}


@pytest.mark.skipif(not os.path.isdir(DATA), reason="needs Debian's fortunes package")
def test_chargpt_matches_cpp_and_resumes(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    first = run("--steps", "3", "--eval-every", "3", "--ckpt", ckpt)
    assert losses(first).keys() == {3}
    assert losses(first)[3] == pytest.approx(CPP[3], abs=TOL)
    resumed = run("--steps", "6", "--eval-every", "3", "--ckpt", ckpt, "--resume")
    assert f"resumed from {ckpt} at step 3" in resumed
    assert losses(resumed).keys() == {6}
    assert losses(resumed)[6] == pytest.approx(CPP[6], abs=TOL)
    assert "--- sample" in resumed
