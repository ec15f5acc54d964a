"""kiln.ao.nn.quantized: eager int8 modules (what kiln.ao.quantization.convert produces).

Kiln has no quantized tensor dtype: between these modules a QTensor carries the uint8 codes
with their scale and zero point (torch's quantized-tensor accessors: int_repr(), q_scale(),
q_zero_point(), dequantize()). Quantize starts a quantized region, DeQuantize ends it; Linear and
Conv2d run linear_int8 / conv2d_int8 (tensor/ops/quantized.toml) and return QTensors; a float
module inside a quantized region is wrapped in `DeQuantizeInput` (it runs on
dequantized floats), or in `Requantize` when it only moves or selects values (ReLU, MaxPool2d,
Flatten, Identity, Dropout: their float output has the input's scale and zero point exactly).
"""
from kiln import _C
from kiln.nn.module import Module

from kiln.ao.nn.quantized import dynamic  # noqa: F401

__all__ = ["QTensor", "Quantize", "DeQuantize", "Linear", "Conv2d", "DeQuantizeInput",
           "Requantize", "dynamic"]


class QTensor:
    """uint8 codes with their per-tensor affine parameters: real = (code - zero_point) * scale."""

    __slots__ = ("codes", "scale", "zero_point")

    def __init__(self, codes, scale, zero_point):
        self.codes, self.scale, self.zero_point = codes, float(scale), int(zero_point)

    @classmethod
    def quantize(cls, x, scale, zero_point):
        return cls(_C.quantize_per_tensor(x.float(), float(scale), int(zero_point)), scale,
                   zero_point)

    def dequantize(self):
        return _C.dequantize_per_tensor(self.codes, self.scale, self.zero_point)

    def int_repr(self):
        return self.codes

    def q_scale(self):
        return self.scale

    def q_zero_point(self):
        return self.zero_point

    @property
    def shape(self):
        return self.codes.shape

    def size(self, *dim):
        return self.codes.size(*dim)

    def __repr__(self):
        return (f"QTensor(shape={list(self.codes.shape)}, scale={self.scale}, "
                f"zero_point={self.zero_point})")


def _as_qtensor(x, scale, zero_point, who):
    if isinstance(x, QTensor):
        return x
    if scale is None:
        raise RuntimeError(f"{who}: got a float input but has no input quantization parameters "
                           "(put a QuantStub before it, or let prepare_qat observe its input)")
    return QTensor.quantize(x, scale, zero_point)


class Quantize(Module):
    """float -> QTensor with fixed parameters (torch.ao.nn.quantized.Quantize)."""

    def __init__(self, scale, zero_point, dtype=None):
        super().__init__()
        self.scale, self.zero_point = float(scale), int(zero_point)

    def forward(self, x):
        return x if isinstance(x, QTensor) else QTensor.quantize(x, self.scale, self.zero_point)

    def extra_repr(self):
        return f"scale={self.scale}, zero_point={self.zero_point}"


class DeQuantize(Module):
    """QTensor -> float32 (a float input passes through)."""

    def forward(self, x):
        return x.dequantize() if isinstance(x, QTensor) else x


class DeQuantizeInput(Module):
    """Runs a float module on the dequantized input (its output is float)."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        return self.module(x.dequantize() if isinstance(x, QTensor) else x)


class Requantize(Module):
    """Runs a value-preserving float module (ReLU, MaxPool2d, Flatten, ...) on the dequantized
    input and quantizes its output with the input's parameters: exact, since every output value
    is an input value (or 0, which the zero point represents exactly)."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        if not isinstance(x, QTensor):
            return self.module(x)
        return QTensor.quantize(self.module(x.dequantize()), x.scale, x.zero_point)


class _QuantizedWeighted(Module):
    def _set(self, weight, bias, output_scale, output_zero_point, input_qparams, relu):
        q, scale = _C.quantize_weight_per_channel(weight.detach().float(), 0)
        self.register_buffer("_packed_weight", q)
        self.register_buffer("_weight_scale", scale)
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())
        self.scale, self.zero_point = float(output_scale), int(output_zero_point)
        self.input_scale, self.input_zero_point = input_qparams or (None, None)
        self.relu = relu

    def weight(self):
        shape = [-1] + [1] * (self._packed_weight.dim() - 1)
        return self._packed_weight.float() * self._weight_scale.reshape(shape)


class Linear(_QuantizedWeighted):
    """uint8 in, uint8 out: linear_int8 with int8 weights per output channel, float bias and
    optionally relu fused; output scale/zero point from QAT's observer."""

    def __init__(self, weight, bias, scale, zero_point, input_qparams=None, relu=False):
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self._set(weight, bias, scale, zero_point, input_qparams, relu)

    def forward(self, x):
        x = _as_qtensor(x, self.input_scale, self.input_zero_point, "quantized.Linear")
        y = _C.linear_int8(x.codes, x.scale, x.zero_point, self._packed_weight,
                           self._weight_scale, self.bias, self.scale, self.zero_point, self.relu)
        return QTensor(y, self.scale, self.zero_point)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"scale={self.scale}, zero_point={self.zero_point}"
                + (", relu=True" if self.relu else ""))


class Conv2d(_QuantizedWeighted):
    """NCHW uint8 in and out: conv2d_int8 (oneDNN), weights int8 per output channel."""

    def __init__(self, weight, bias, stride, padding, dilation, groups, scale, zero_point,
                 input_qparams=None, relu=False):
        super().__init__()
        self.stride, self.padding = list(stride), list(padding)
        self.dilation, self.groups = list(dilation), int(groups)
        self._set(weight, bias, scale, zero_point, input_qparams, relu)

    def forward(self, x):
        x = _as_qtensor(x, self.input_scale, self.input_zero_point, "quantized.Conv2d")
        y = _C.conv2d_int8(x.codes, x.scale, x.zero_point, self._packed_weight,
                           self._weight_scale, self.bias, self.stride, self.padding,
                           self.dilation, self.groups, self.scale, self.zero_point, self.relu)
        return QTensor(y, self.scale, self.zero_point)

    def extra_repr(self):
        w = self._packed_weight.shape
        return (f"{w[1] * self.groups}, {w[0]}, kernel_size={tuple(w[2:])}, stride={self.stride}, "
                f"padding={self.padding}, scale={self.scale}, zero_point={self.zero_point}"
                + (", relu=True" if self.relu else ""))
