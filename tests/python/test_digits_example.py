"""examples/digits.py trains both models to >= 95% held-out accuracy (exporting the data first
if needed, via scikit-learn)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_digits_example(tmp_path):
    data = os.path.join(ROOT, "build", "data", "digits")
    if not os.path.exists(os.path.join(data, "y.npy")):
        data = str(tmp_path / "digits")
        subprocess.run([sys.executable, os.path.join(ROOT, "examples", "digits", "export_digits.py"),
                        data], check=True)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "digits.py"), data],
                       capture_output=True, text=True, env=os.environ)
    assert r.returncode == 0, r.stdout + r.stderr
    for name in ("mlp", "cnn"):
        line = next(l for l in r.stdout.splitlines() if l.startswith(f"{name}: held-out accuracy"))
        assert float(line.split()[3].rstrip("%")) >= 95.0, line
