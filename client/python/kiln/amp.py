"""kiln.autocast: automatic mixed precision (torch.autocast) over kiln::AutocastGuard
(kiln/autocast.h, Note [Autocast]), as a context manager or a decorator.

    with kiln.autocast("cpu", dtype=kiln.bfloat16):
        y = model(x)              # matmuls in bfloat16, losses in float32
    loss.backward()               # gradients reach float32 parameters as float32

    @kiln.autocast("cpu")
    def forward(x): ...
"""
import functools

from kiln import _C

__all__ = ["autocast", "is_autocast_enabled", "get_autocast_dtype"]

is_autocast_enabled = _C.is_autocast_enabled
get_autocast_dtype = _C.get_autocast_dtype


class autocast:
    """Enables (or with enabled=False disables) autocast for device_type on this thread; the state
    before is restored on exit, and blocks nest. dtype is bfloat16 (the default) or float16."""

    def __init__(self, device_type="cpu", dtype=None, enabled=True, cache_enabled=None):
        if not isinstance(device_type, str):
            raise TypeError(f"autocast: device_type must be a str such as 'cpu', got "
                            f"{type(device_type).__name__}")
        self.device_type, self.dtype, self.enabled = device_type, dtype, bool(enabled)
        self._guards = []

    def __enter__(self):
        self._guards.append(_C._Autocast(self.device_type, self.dtype, self.enabled))
        return self

    def __exit__(self, *exc):
        self._guards.pop().exit()
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with autocast(self.device_type, self.dtype, self.enabled):
                return fn(*args, **kwargs)
        return wrapper
