"""Running one test script in N ranks under `kiln run`, for the tests of kiln.distributed (DTensor,
FSDP, tensor parallel, pipelining, distributed checkpoints).

    from kiln_run import EXPECT, run_ranks
    run_ranks(tmp_path, "train", EXPECT + script, 2, "arg")   # each rank prints "rank R ok"

EXPECT defines expect(fn, kind, needle) inside a script: fn() must raise `kind` with `needle` in
its message."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kiln

KILN_CLI = Path(kiln._C.__file__).resolve().parent.parent.parent / "bin" / "kiln"

EXPECT = textwrap.dedent("""
    def expect(fn, kind, needle):
        try:
            fn()
        except kind as e:
            assert needle in str(e), str(e)
        else:
            raise AssertionError(f"expected {kind.__name__} with {needle!r}")
""")


def run_ranks(tmp_path, name, script, nproc, *args, timeout=120, env=None):
    """Writes `script` to tmp_path/name.py and runs it in `nproc` ranks (`kiln run --timeout
    timeout`, collectives bounded by 30 s); every rank must exit 0 and print "rank R ok".
    Returns the run's output."""
    if not KILN_CLI.exists():
        pytest.skip(f"{KILN_CLI} is not built")
    path = tmp_path / f"{name}.py"
    path.write_text(script)
    env = dict(os.environ, KILN_COMM_TIMEOUT_S="30", **(env or {}))
    r = subprocess.run([str(KILN_CLI), "run", "--nproc", str(nproc), "--timeout", str(timeout),
                        sys.executable, str(path), *map(str, args)], capture_output=True,
                       text=True, env=env, timeout=timeout + 60)
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in range(nproc):
        assert f"[rank {rank}] rank {rank} ok" in r.stdout, r.stdout + r.stderr
    return r.stdout
