"""Custom differentiable functions written in Python (torch.autograd.Function).

    class Exp(kiln.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = x.exp()
            ctx.save_for_backward(y)
            return y
        @staticmethod
        def backward(ctx, grad):
            (y,) = ctx.saved_tensors
            return grad * y
    y = Exp.apply(x)          # y.grad_fn.name() == "ExpBackward"

forward runs with grad mode off; backward returns one gradient (or None) per forward argument.
ctx: save_for_backward, saved_tensors, needs_input_grad, mark_dirty, mark_non_differentiable,
and any attribute forward sets on it.
"""
from kiln import _C
from kiln._C import FunctionCtx  # noqa: F401


class Function:
    @staticmethod
    def forward(ctx, *args):
        raise NotImplementedError("a kiln.autograd.Function subclass must define forward")

    @staticmethod
    def backward(ctx, *grad_outputs):
        raise NotImplementedError("a kiln.autograd.Function subclass must define backward")

    @classmethod
    def apply(cls, *args, **kwargs):
        if kwargs:
            raise TypeError(f"{cls.__name__}.apply takes positional arguments only")
        return _C._function_apply(cls, *args)
