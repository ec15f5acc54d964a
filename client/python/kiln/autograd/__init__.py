"""kiln.autograd: reverse-mode differentiation (PyTorch's torch.autograd).

    x = kiln.randn(3, requires_grad=True)
    (gx,) = kiln.autograd.grad((x * x).sum(), x)     # 2 * x
    with kiln.no_grad(): ...
    class Square(kiln.autograd.Function): ...        # custom forward/backward
"""
from kiln import _C
from kiln._C import Tensor
from kiln.autograd.function import Function, FunctionCtx  # noqa: F401
from kiln.autograd.grad_mode import enable_grad, inference_mode, no_grad, set_grad_enabled  # noqa: F401


def _tensors(x):
    if x is None:
        return ()
    return (x,) if isinstance(x, Tensor) else tuple(x)


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, allow_unused=False):
    """The gradients of `outputs` with respect to `inputs`, as a tuple (nothing is accumulated
    into .grad)."""
    return _C._autograd_grad(_tensors(outputs), _tensors(inputs), _tensors(grad_outputs),
                             retain_graph, create_graph, allow_unused)


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False):
    """Accumulates the gradients of `tensors` into the .grad of the leaves they depend on."""
    _C._autograd_backward(_tensors(tensors), _tensors(grad_tensors), retain_graph, create_graph)
