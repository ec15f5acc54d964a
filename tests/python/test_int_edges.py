"""Integer edge values from Python (See Note [Integer edge values] in kiln/scalar_math.h): the
outside probe's reproductions of INT_MIN // -1 and friends, which aborted the process with
SIGFPE, must give PyTorch's wrapped answers; division by zero keeps its error; an integer
tensor to a negative scalar power is refused."""
import math
import os

import pytest

import kiln

I64_MIN, I64_MAX = -2**63, 2**63 - 1
I32_MIN, I32_MAX = -2**31, 2**31 - 1


@pytest.mark.parametrize("dtype,lo", [(kiln.int64, I64_MIN), (kiln.int32, I32_MIN)])
def test_min_by_minus_one_wraps(dtype, lo):
    x = kiln.tensor([lo, lo]).to(dtype)
    assert (x // -1).tolist() == [lo, lo]
    assert (x // kiln.tensor([-1, -1]).to(dtype)).tolist() == [lo, lo]
    assert (x % -1).tolist() == [0, 0]
    assert (x % kiln.tensor([-1, -1]).to(dtype)).tolist() == [0, 0]
    assert kiln.fmod(x, -1).tolist() == [0, 0]
    assert kiln.div(x, -1, rounding_mode="trunc").tolist() == [lo, lo]
    assert kiln.div(x, -1, rounding_mode="floor").tolist() == [lo, lo]
    assert (-x).tolist() == [lo, lo]
    assert x.abs().tolist() == [lo, lo]


def test_overflow_wraps():
    x = kiln.tensor([I64_MAX])
    assert (x + 1).tolist() == [I64_MIN]
    assert (x * 2).tolist() == [-2]
    assert (kiln.tensor([I64_MIN]) - 1).tolist() == [I64_MAX]
    assert kiln.tensor([I64_MAX, 1]).sum().item() == I64_MIN


@pytest.mark.parametrize("op", [lambda x, y: x // y, lambda x, y: x % y,
                                lambda x, y: kiln.fmod(x, y),
                                lambda x, y: kiln.div(x, y, rounding_mode="trunc")])
def test_division_by_zero_raises(op):
    x = kiln.tensor([5, -5])
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        op(x, 0)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        op(x, kiln.tensor([1, 0]))


def test_negative_integer_scalar_power_is_refused():
    with pytest.raises(ValueError, match="negative integer powers"):
        kiln.tensor([2, 3]) ** -1
    assert (kiln.tensor([2, 3]) ** kiln.tensor([-1, -1])).tolist() == [0, 0]
    assert (kiln.tensor([2.0, 4.0]) ** -1).tolist() == [0.5, 0.25]
    assert (kiln.tensor([2, 3]) ** 2).tolist() == [4, 9]


def test_float_to_int_casts_saturate():
    x = kiln.tensor([math.nan, math.inf, -math.inf, 1e30, -1e30, 300.7, -2.9])
    assert x.to(kiln.int64).tolist() == [0, I64_MAX, I64_MIN, I64_MAX, I64_MIN, 300, -2]
    assert x.to(kiln.int32).tolist() == [0, I32_MAX, I32_MIN, I32_MAX, I32_MIN, 300, -2]
    assert x.to(kiln.uint8).tolist() == [0, 255, 0, 255, 0, 255, 0]
    # A scalar that does not fit is refused, as in PyTorch.
    with pytest.raises(RuntimeError, match="without overflow"):
        kiln.full((2,), 1e30, dtype=kiln.int32)
    with pytest.raises(RuntimeError, match="without overflow"):
        kiln.zeros(2, dtype=kiln.int64).fill_(math.nan)


def _remote_min_by_minus_one(device):
    x = kiln.tensor([I64_MIN, 7]).to(device)
    assert (x // -1).tolist() == [I64_MIN, -7]
    assert (x % -1).tolist() == [0, 0]
    assert kiln.fmod(x.to(kiln.int32), -1).tolist() == [0, 0]
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        (x // 0).tolist()
    assert (x + 1).tolist() == [I64_MIN + 1, 8]  # the session survives the error


def test_embedded_worker_min_by_minus_one():
    with kiln.connect("inproc") as s:
        _remote_min_by_minus_one(s.device)


def test_worker_process_survives_min_by_minus_one(tmp_path):
    """The probe's reproduction: this killed a kiln-worker with SIGFPE."""
    from test_remote_worker import WORKER, start_worker, stop
    if not os.access(WORKER, os.X_OK):
        pytest.skip(f"kiln-worker not built ({WORKER})")
    p, address = start_worker(tmp_path)
    try:
        with kiln.connect(address) as s:
            _remote_min_by_minus_one(s.device)
        assert p.poll() is None, "the worker died"
    finally:
        stop(p)
