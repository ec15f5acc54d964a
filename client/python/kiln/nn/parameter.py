"""kiln.nn.Parameter: a Tensor that a Module registers when assigned as an attribute.

    w = kiln.nn.Parameter(kiln.randn(3, 4))   # requires_grad=True, a leaf
    isinstance(w, kiln.Tensor)                # True; every op takes it as a tensor

A Parameter is the tensor itself (the same object, retyped), not a copy, so `p.grad`, identity
(`p is model.weight`) and the optimizer's references all see one object, as in PyTorch."""
from kiln import _C
from kiln._C import Tensor


class Parameter(Tensor):
    __slots__ = ()  # Tensor's layout exactly, so an existing tensor object can become one

    def __new__(cls, data=None, requires_grad=True):
        t = _C.empty([0]) if data is None else data.detach()
        if requires_grad:
            t.requires_grad_()
        t.__class__ = cls
        return t

    def __init__(self, data=None, requires_grad=True):
        pass

    def __repr__(self):
        return "Parameter containing:\n" + Tensor.__repr__(self)

    def __deepcopy__(self, memo):
        return Parameter(self.detach().clone(), self.requires_grad)

