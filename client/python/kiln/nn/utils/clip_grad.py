"""clip_grad_norm_ and clip_grad_value_ (torch.nn.utils), in place on the gradients."""
import math

from kiln import _C
from kiln._C import Tensor
from kiln.autograd.grad_mode import no_grad


def _grads(parameters):
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    return [p.grad for p in parameters if p.grad is not None]


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """Scales the gradients so that their joint norm is at most max_norm; returns the total norm
    (before clipping) as a 0-d tensor. DTensor gradients (FSDP's) count whole: their norms are
    reduced over their meshes, so every rank gets the same total and scale."""
    grads = _grads(parameters)
    if not grads:
        return _C.zeros([])
    norm_type = float(norm_type)

    def whole(t):  # a DTensor gradient's norm (FSDP's shards) is reduced over its mesh
        return t.full_tensor() if _C._is_dtensor(t) else t
    with no_grad():
        if norm_type == math.inf:
            total = _C.stack([whole(g.abs().max()) for g in grads]).max()
        else:
            total = _C.stack([whole(_C.norm(g, norm_type)) for g in grads]).norm(norm_type)
        if error_if_nonfinite and not math.isfinite(total.item()):
            raise RuntimeError(f"The total norm of order {norm_type} for gradients from "
                               "`parameters` is non-finite, so it cannot be clipped.")
        coef = (total + 1e-6).reciprocal() * max_norm
        coef = coef.clamp(max=1.0)
        for g in grads:
            g.mul_(coef.to(g.dtype))
    return total


def clip_grad_value_(parameters, clip_value, foreach=None):
    with no_grad():
        for g in _grads(parameters):
            g.clamp_(-clip_value, clip_value)
