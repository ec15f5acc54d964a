"""kiln.ao.nn.quantized.dynamic: Linear with int8 weights whose input is quantized per call."""
from kiln import _C
from kiln.nn.module import Module

__all__ = ["Linear"]


class Linear(Module):
    """y = x Wᵀ + b with W int8 per output channel (prepacked once by
    quantize_weight_per_channel) and x quantized to uint8 per call, per tensor, from its min and
    max (linear_int8_dynamic: oneDNN's u8 x s8 matmul, float32 out, bias and relu fused)."""

    def __init__(self, in_features, out_features, bias=True, dtype=None, relu=False):
        super().__init__()
        self.in_features, self.out_features, self.relu = in_features, out_features, relu
        w = _C.zeros([out_features, in_features])
        self.set_weight_bias(w, _C.zeros([out_features]) if bias else None)

    def set_weight_bias(self, weight, bias):
        """Quantizes a float weight (out, in) per output channel; keeps bias in float32."""
        q, scale = _C.quantize_weight_per_channel(weight.detach().float(), 0)
        self.register_buffer("_packed_weight", q)
        self.register_buffer("_weight_scale", scale)
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())

    def weight(self):
        """The dequantized weight (float32), as torch's dynamic Linear.weight() returns."""
        return self._packed_weight.float() * self._weight_scale.unsqueeze(1)

    @classmethod
    def from_float(cls, mod, relu=False):
        m = cls(mod.in_features, mod.out_features, bias=mod.bias is not None, relu=relu)
        m.set_weight_bias(mod.weight, mod.bias)
        return m

    def forward(self, input):
        if input.dtype != _C.float32:
            input = input.float()
        return _C.linear_int8_dynamic(input, self._packed_weight, self._weight_scale, self.bias,
                                      self.relu)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"dtype=kiln.qint8, qscheme=per_channel_symmetric"
                + (", relu=True" if self.relu else ""))
