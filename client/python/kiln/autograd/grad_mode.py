"""Grad modes as context managers and decorators (torch.no_grad, enable_grad, set_grad_enabled,
inference_mode).

    with kiln.no_grad():
        w -= lr * w.grad
    @kiln.inference_mode()
    def predict(x): ...
"""
import functools

from kiln import _C


class _DecoratorContextManager:
    """A context manager that also decorates functions (a fresh instance per call)."""

    def __call__(self, func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            with self.clone():
                return func(*args, **kwargs)
        return wrapper

    def clone(self):
        return self.__class__()


class _GradMode(_DecoratorContextManager):
    _mode = None

    def __new__(cls, func=None):
        self = super().__new__(cls)
        return self(func) if callable(func) else self  # @kiln.no_grad without parentheses

    def __enter__(self):
        self.prev = _C.is_grad_enabled()
        _C._set_grad_enabled(self._mode)

    def __exit__(self, *exc):
        _C._set_grad_enabled(self.prev)


class no_grad(_GradMode):
    """Nothing computed inside records a graph."""
    _mode = False


class enable_grad(_GradMode):
    """Graphs are recorded inside, even within no_grad."""
    _mode = True


class set_grad_enabled(_DecoratorContextManager):
    """Sets grad mode on construction (usable as a function) and restores it on exit."""

    def __init__(self, mode):
        self.prev = _C.is_grad_enabled()
        self.mode = mode
        _C._set_grad_enabled(mode)

    def __enter__(self):
        pass

    def __exit__(self, *exc):
        _C._set_grad_enabled(self.prev)

    def clone(self):
        return self.__class__(self.mode)


class inference_mode(_DecoratorContextManager):
    """Like no_grad, and tensors created inside never enter autograd (faster)."""

    def __new__(cls, mode=True):
        self = super().__new__(cls)
        if callable(mode):  # @kiln.inference_mode without parentheses
            self.mode = True
            return self(mode)
        return self

    def __init__(self, mode=True):
        if not callable(mode):
            self.mode = mode

    def __enter__(self):
        self._guard = _C._InferenceMode(self.mode)

    def __exit__(self, *exc):
        self._guard.exit()

    def clone(self):
        return self.__class__(self.mode)
