"""kiln.nn.init: in-place initialisers (torch.nn.init), run under no_grad.

    kiln.nn.init.kaiming_uniform_(w, a=math.sqrt(5))
    kiln.nn.init.zeros_(b)
"""
import math

import numpy as _np

from kiln import _C
from kiln.autograd.grad_mode import no_grad

__all__ = ["calculate_gain", "uniform_", "normal_", "trunc_normal_", "constant_", "zeros_",
           "ones_", "eye_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
           "kaiming_normal_", "orthogonal_"]


def calculate_gain(nonlinearity, param=None):
    if nonlinearity in ("linear", "sigmoid") or nonlinearity.startswith("conv"):
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "selu":
        return 0.75
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else param
        return math.sqrt(2.0 / (1 + slope * slope))
    raise ValueError(f"Unsupported nonlinearity {nonlinearity}")


def _calculate_fan_in_and_fan_out(tensor):
    if tensor.ndim < 2:
        raise ValueError("Fan in and fan out can not be computed for tensor with fewer than 2 "
                         f"dimensions (got shape {tuple(tensor.shape)})")
    receptive = math.prod(tensor.shape[2:])
    return tensor.shape[1] * receptive, tensor.shape[0] * receptive


def uniform_(tensor, a=0.0, b=1.0, generator=None):
    with no_grad():
        return tensor.uniform_(a, b, generator=generator)


def normal_(tensor, mean=0.0, std=1.0, generator=None):
    with no_grad():
        return tensor.normal_(mean, std, generator=generator)


def constant_(tensor, val):
    with no_grad():
        return tensor.fill_(val)


def zeros_(tensor):
    return constant_(tensor, 0)


def ones_(tensor):
    return constant_(tensor, 1)


def eye_(tensor):
    if tensor.ndim != 2:
        raise ValueError(f"Only tensors with 2 dimensions are supported (got shape {tuple(tensor.shape)})")
    with no_grad():
        return tensor.copy_(_C.eye(tensor.shape[0], tensor.shape[1], dtype=tensor.dtype))


def _erfinv(y):
    """erf⁻¹ of a float64 tensor in (-1, 1): Giles' approximation, then two Newton steps."""
    w = -((1 - y) * (1 + y)).log()
    lo, hi = w - 2.5, w.clamp(min=0).sqrt() - 3
    p_lo, p_hi = _C.full_like(w, 2.81022636e-08), _C.full_like(w, -0.000200214257)
    for c in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
              -0.00417768164, 0.246640727, 1.50140941):
        p_lo = p_lo * lo + c
    for c in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
              0.00943887047, 1.00167406, 2.83297682):
        p_hi = p_hi * hi + c
    x = _C.where(w < 5, p_lo, p_hi) * y
    for _ in range(2):
        x = x - (x.erf() - y) / ((-x * x).exp() * (2 / math.sqrt(math.pi)))
    return x


def trunc_normal_(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=None):
    """N(mean, std²) truncated to [a, b], by inverting the normal CDF of uniform draws."""
    if not (a < b and std > 0):
        raise ValueError(f"trunc_normal_: need a < b and std > 0, got a={a}, b={b}, std={std}")

    def cdf(x):
        return 0.5 * (1 + math.erf(x / math.sqrt(2)))
    with no_grad():
        u = _C.empty(tensor.shape, dtype=_C.float64).uniform_(
            2 * cdf((a - mean) / std) - 1, 2 * cdf((b - mean) / std) - 1, generator=generator)
        return tensor.copy_((_erfinv(u) * (std * math.sqrt(2)) + mean).clamp(a, b))


def xavier_uniform_(tensor, gain=1.0, generator=None):
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    bound = math.sqrt(3.0) * gain * math.sqrt(2.0 / (fan_in + fan_out))
    return uniform_(tensor, -bound, bound, generator)


def xavier_normal_(tensor, gain=1.0, generator=None):
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)), generator)


def _kaiming_std(tensor, a, mode, nonlinearity):
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"Mode {mode} not supported, please use one of fan_in, fan_out")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    fan = fan_in if mode == "fan_in" else fan_out
    if fan == 0:
        raise ValueError(f"kaiming init of a zero-element tensor of shape {tuple(tensor.shape)}")
    return calculate_gain(nonlinearity, a) / math.sqrt(fan)


def kaiming_uniform_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    bound = math.sqrt(3.0) * _kaiming_std(tensor, a, mode, nonlinearity)
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    return normal_(tensor, 0.0, _kaiming_std(tensor, a, mode, nonlinearity), generator)


def orthogonal_(tensor, gain=1.0, generator=None):
    """A (semi-)orthogonal matrix over the flattened trailing dims: Q of the QR of a normal draw,
    signs fixed so that R's diagonal is positive."""
    if tensor.ndim < 2:
        raise ValueError("Only tensors with 2 or more dimensions are supported (got shape "
                         f"{tuple(tensor.shape)})")
    if tensor.numel() == 0:
        return tensor
    rows = tensor.shape[0]
    cols = tensor.numel() // rows
    wide = rows < cols
    draw = _C.empty([cols, rows] if wide else [rows, cols], dtype=_C.float64).normal_(
        0, 1, generator=generator).numpy()
    q, r = _np.linalg.qr(draw)
    q = q * _np.sign(_np.diag(r))
    if wide:
        q = q.T
    with no_grad():
        return tensor.copy_(_C.from_numpy(_np.ascontiguousarray(q * gain)).reshape(tensor.shape))
