"""kiln.ao.quantization: torch.ao.quantization's eager-mode entry points, for the models Kiln's
examples use (Sequential MLPs and CNNs of Linear, Conv2d, ReLU, MaxPool2d, Flatten).

- quantize_dynamic(model, {nn.Linear}, dtype=kiln.qint8): Linear -> ao.nn.quantized.dynamic.Linear
  (int8 weights prepacked once; activations quantized per call). A Linear followed by a ReLU in a
  Sequential takes the relu into its kernel (the ReLU becomes an Identity).
- prepare_qat(model): wraps the model in QuantWrapper (QuantStub observing the input, DeQuantStub
  at the output) and swaps Linear/Conv2d inside Sequentials for ao.nn.qat modules (a following
  ReLU fused likewise). A Linear/Conv2d whose input does not come from a quantized module (or
  only through value-preserving ones: ReLU, MaxPool2d, Flatten, Identity, Dropout) observes its
  own input. Modules other than Sequential are left in float.
- convert(model): the trained QAT model as eager int8 modules (ao.nn.quantized), QTensors flowing
  between them; other modules run on dequantized floats.
- error_report(float_model, quantized_model, x): per quantized layer, its output against the
  float model's (quantize_pt2e.error_report is the same for exported programs).

Both prepare_qat and convert copy the model unless inplace=True; use their return values.
"""
import copy

from kiln import Tensor, nn
from kiln.autograd.grad_mode import no_grad
from kiln.ao.nn import qat
from kiln.ao.nn import quantized as nnq
from kiln.ao.nn.quantized import dynamic as nnqd

__all__ = ["qint8", "quint8", "quantize_dynamic", "prepare_qat", "convert", "QuantStub",
           "DeQuantStub", "QuantWrapper", "FakeQuantize", "error_report", "ErrorReport"]

FakeQuantize = qat.FakeQuantize


class _QDtype:
    """A quantized dtype marker (kiln.qint8, kiln.quint8): Kiln stores codes as int8/uint8."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"kiln.{self.name}"


qint8 = _QDtype("qint8")
quint8 = _QDtype("quint8")

# Modules whose output values are input values (or 0): a quantized stream passes through them.
_VALUE_PRESERVING = (nn.ReLU, nn.MaxPool2d, nn.Flatten, nn.Identity, nn.Dropout)


class QuantStub(nn.Module):
    """Marks where floats enter the quantized region; observes them once prepared."""

    def __init__(self):
        super().__init__()
        self.activation_post_process = None

    def forward(self, x):
        return x if self.activation_post_process is None else self.activation_post_process(x)


class DeQuantStub(nn.Module):
    def forward(self, x):
        return x


class QuantWrapper(nn.Module):
    """quant -> module -> dequant."""

    def __init__(self, module):
        super().__init__()
        self.quant, self.module, self.dequant = QuantStub(), module, DeQuantStub()
        self.train(module.training)

    def forward(self, x):
        return self.dequant(self.module(self.quant(x)))


def _copy(model):
    """copy.deepcopy for a model: its plain tensors (buffers, prepacked weights), which are not
    picklable, are cloned through deepcopy's memo (Parameters copy themselves)."""
    memo = {}
    for m in model.modules():
        for v in list(m.__dict__.values()) + list(m._buffers.values()):
            if isinstance(v, Tensor) and not isinstance(v, nn.Parameter):
                memo[id(v)] = v.detach().clone()
    return copy.deepcopy(model, memo)


def _is_float(m, cls):
    return type(m) is cls  # not the qat / quantized subclasses


def _relu_follows(mods, i):
    return isinstance(mods, nn.Sequential) and i + 1 < len(mods) and type(mods[i + 1]) is nn.ReLU


# ---- dynamic -----------------------------------------------------------------------------------

def _swap_dynamic(module, types):
    names = list(module._modules)
    for i, name in enumerate(names):
        child = module._modules[name]
        if child is None:
            continue
        if type(child) in types and type(child) is nn.Linear:
            relu = _relu_follows(module, i)
            module._modules[name] = nnqd.Linear.from_float(child, relu=relu)
            if relu:
                module._modules[names[i + 1]] = nn.Identity()
        else:
            _swap_dynamic(child, types)


def quantize_dynamic(model, qconfig_spec=None, dtype=qint8, mapping=None, inplace=False):
    """A copy of `model` (the model itself with inplace=True) whose Linear layers run int8
    (kiln.ao.nn.quantized.dynamic.Linear)."""
    if dtype is not qint8:
        raise NotImplementedError(f"quantize_dynamic: only dtype=kiln.qint8 is supported, got "
                                  f"{dtype}")
    types = {nn.Linear} if qconfig_spec is None else set(qconfig_spec)
    unsupported = [t for t in types if t is not nn.Linear]
    if unsupported:
        raise NotImplementedError(f"quantize_dynamic: only nn.Linear can be quantized "
                                  f"dynamically, got {unsupported}")
    if not inplace:
        model = _copy(model)
    if type(model) is nn.Linear:
        return nnqd.Linear.from_float(model)
    _swap_dynamic(model, types)
    return model


# ---- QAT ---------------------------------------------------------------------------------------

def _prepare_seq(seq, stream):
    """Swaps seq's Linear/Conv2d for QAT modules; `stream`: whether seq's input is quantized.
    Returns whether its output is."""
    names = list(seq._modules)
    for i, name in enumerate(names):
        child = seq._modules[name]
        if _is_float(child, nn.Linear) or _is_float(child, nn.Conv2d):
            cls = qat.Linear if type(child) is nn.Linear else qat.Conv2d
            relu = _relu_follows(seq, i)
            seq._modules[name] = cls.from_float(child, relu=relu, quant_input=not stream)
            if relu:
                seq._modules[names[i + 1]] = nn.Identity()
            stream = True
        elif isinstance(child, nn.Sequential):
            stream = _prepare_seq(child, stream)
        elif not isinstance(child, _VALUE_PRESERVING):
            stream = False
    return stream


def prepare_qat(model, mapping=None, inplace=False):
    """A QAT copy of `model` (see the module docstring); train it, then convert(model.eval())."""
    if not inplace:
        model = _copy(model)
    if not isinstance(model, QuantWrapper):
        model = QuantWrapper(model)
    model.quant.activation_post_process = FakeQuantize()
    model.quant.activation_post_process.train(model.training)
    inner = model.module
    if _is_float(inner, nn.Linear) or _is_float(inner, nn.Conv2d):
        cls = qat.Linear if type(inner) is nn.Linear else qat.Conv2d
        model.module = cls.from_float(inner)
    elif isinstance(inner, nn.Sequential):
        _prepare_seq(inner, True)
    return model


def _convert_module(m):
    if isinstance(m, qat.Linear) or isinstance(m, qat.Conv2d):
        scale, zp = m.activation_post_process.calculate_qparams()
        inq = m.input_fake_quant.calculate_qparams() if m.input_fake_quant is not None else None
        if isinstance(m, qat.Linear):
            return nnq.Linear(m.weight, m.bias, scale, zp, inq, m.relu)
        return nnq.Conv2d(m.weight, m.bias, m.stride, m.padding, m.dilation, m.groups, scale, zp,
                          inq, m.relu)
    if isinstance(m, QuantStub):
        if m.activation_post_process is None:
            return nnq.DeQuantize()  # never observed: stay in float
        return nnq.Quantize(*m.activation_post_process.calculate_qparams())
    if isinstance(m, DeQuantStub):
        return nnq.DeQuantize()
    if isinstance(m, (nn.Sequential, QuantWrapper)):
        for name, child in list(m._modules.items()):
            if child is not None:
                m._modules[name] = _convert_module(child)
        return m
    if type(m) is nn.Identity:
        return m  # passes a QTensor through as it is
    if isinstance(m, _VALUE_PRESERVING):
        return nnq.Requantize(m)
    return nnq.DeQuantizeInput(m)


def convert(module, mapping=None, inplace=False, remove_qconfig=True):
    """The eager int8 form of a model from prepare_qat (see the module docstring); eval mode."""
    if not inplace:
        module = _copy(module)
    module = _convert_module(module)
    module.eval()
    return module


class ErrorReport(list):
    """Per quantized layer (layer, op, max_abs, mean_abs, sqnr_db): the quantized output against
    the float one; str() is a table."""

    def table(self):
        lines = [f"{'layer':<24} {'op':<20} {'max abs err':>12} {'mean abs err':>12} "
                 f"{'SQNR dB':>8}"]
        for layer, op, mx, mean, sqnr in self:
            lines.append(f"{layer:<24} {op:<20} {mx:>12.5f} {mean:>12.5f} {sqnr:>8.1f}")
        return "\n".join(lines)

    __str__ = table


def layer_error(ref, got):
    """(max_abs, mean_abs, sqnr_db) of `got` against `ref` (float64; SQNR 300 for no error)."""
    import math
    ref, got = ref.double(), got.double().reshape(ref.shape)
    err = got - ref
    if err.numel() == 0:
        return 0.0, 0.0, 300.0
    noise, signal = float((err * err).sum()), float((ref * ref).sum())
    return (float(err.abs().max()), float(err.abs().mean()),
            10 * math.log10(signal / noise) if noise > 0 else 300.0)


def _children(model):
    """(before, Sequential, after) of a Sequential model or a QuantWrapper around one."""
    if isinstance(model, QuantWrapper):
        return model.quant, model.module, model.dequant
    return None, model, None


def error_report(float_model, quantized_model, x):
    """Per quantized layer of a Sequential model (quantize_dynamic's or convert's result) its
    output, dequantized, against the float model's child of the same name, each model running on
    its own stream from `x` (so errors accumulate as in use): an ErrorReport."""
    qpre, qseq, qpost = _children(quantized_model)
    _, fseq, _ = _children(float_model)
    if not isinstance(qseq, nn.Sequential) or not isinstance(fseq, nn.Sequential):
        raise TypeError("error_report: expects Sequential models (or a QuantWrapper around one)")
    fchildren = dict(fseq.named_children())
    report = ErrorReport()
    with no_grad():
        y = x
        if qpre is not None:
            y = qpre(y)
        for name, q in qseq.named_children():
            if name not in fchildren:
                raise ValueError(f"error_report: the float model has no child {name!r}")
            x, y = fchildren[name](x), q(y)
            if isinstance(q, (nnqd.Linear, nnq.Linear, nnq.Conv2d)):
                got = y.dequantize() if isinstance(y, nnq.QTensor) else y
                ref = x.relu() if getattr(q, "relu", False) else x  # a ReLU it took in (fused)
                report.append((name, f"{type(q).__module__.rsplit('.', 1)[-1]}.{type(q).__name__}",
                               *layer_error(ref, got)))
    return report
