"""kiln.ao.nn.qat: Linear and Conv2d for quantization-aware training (what prepare_qat swaps in).

Each fake-quantizes its weight per output channel (symmetric int8, the scales of
quantize_weight_per_channel: the formula convert() uses), optionally applies a fused relu, and
fake-quantizes its output per tensor (uint8, moving-average min/max: FakeQuantize). Gradients
pass straight through the rounding (fake_quantize_*'s derivative), so the model trains as usual.
"""
from kiln import _C
from kiln import nn
from kiln.nn import functional as F

__all__ = ["FakeQuantize", "Linear", "Conv2d"]


def choose_qparams(lo, hi):
    """Asymmetric uint8 (scale, zero_point) covering [lo, hi] widened to contain 0: kiln/qparams.h,
    the rule linear_int8_dynamic's activations and static quantization's observers use too."""
    return _C._choose_qparams_u8(lo, hi)


class FakeQuantize(nn.Module):
    """Per-tensor uint8 fake quantization whose range is a moving average of the observed
    min/max (torch.ao.quantization.FakeQuantize with MovingAverageMinMaxObserver): observed in
    training mode only; before anything is observed it passes values through."""

    def __init__(self, averaging_constant=0.01, quant_min=0, quant_max=255):
        super().__init__()
        self.averaging_constant = averaging_constant
        self.quant_min, self.quant_max = quant_min, quant_max
        self.min_val = self.max_val = None
        self.observer_enabled = self.fake_quant_enabled = True

    def observe(self, x):
        d = x.detach()
        lo, hi = float(d.min()), float(d.max())
        if self.min_val is None:
            self.min_val, self.max_val = lo, hi
        else:
            c = self.averaging_constant
            self.min_val += c * (lo - self.min_val)
            self.max_val += c * (hi - self.max_val)

    def calculate_qparams(self):
        if self.min_val is None:
            raise RuntimeError("FakeQuantize: nothing observed yet (run the model in training "
                               "mode on some data before convert)")
        return choose_qparams(self.min_val, self.max_val)

    def forward(self, x):
        if self.training and self.observer_enabled and x.numel():
            self.observe(x)
        if not self.fake_quant_enabled or self.min_val is None:
            return x
        scale, zp = self.calculate_qparams()
        return _C.fake_quantize_per_tensor_affine(x, scale, zp, self.quant_min, self.quant_max)

    def extra_repr(self):
        return f"min_val={self.min_val}, max_val={self.max_val}"


class _WeightFakeQuant:
    def fake_quant_weight(self):
        w = self.weight
        scale = _C.quantize_weight_per_channel(w.detach(), 0)[1].to(w.dtype)
        zp = self.__dict__.get("_zero_points")
        if zp is None or zp.numel() != scale.numel():
            zp = _C.zeros([scale.numel()], dtype=_C.int64)
            self.__dict__["_zero_points"] = zp
        return _C.fake_quantize_per_channel_affine(w, scale, zp, 0, -127, 127)

    def _init_qat(self, relu, quant_input):
        self.relu = relu
        self.input_fake_quant = FakeQuantize() if quant_input else None
        self.activation_post_process = FakeQuantize()

    def _adopt(self, mod):
        """Takes the float module's parameters and mode (from_float)."""
        self.weight, self.bias = mod.weight, mod.bias
        self.train(mod.training)
        return self

    def _quantize_input(self, x):
        return x if self.input_fake_quant is None else self.input_fake_quant(x)

    def _finish(self, y):
        if self.relu:
            y = F.relu(y)
        return self.activation_post_process(y)


class Linear(_WeightFakeQuant, nn.Linear):
    def __init__(self, in_features, out_features, bias=True, relu=False, quant_input=False):
        nn.Linear.__init__(self, in_features, out_features, bias)
        self._init_qat(relu, quant_input)

    @classmethod
    def from_float(cls, mod, relu=False, quant_input=False):
        m = cls(mod.in_features, mod.out_features, mod.bias is not None, relu, quant_input)
        return m._adopt(mod)

    def forward(self, x):
        x = self._quantize_input(x)
        return self._finish(F.linear(x, self.fake_quant_weight(), self.bias))


class Conv2d(_WeightFakeQuant, nn.Conv2d):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, relu=False, quant_input=False):
        nn.Conv2d.__init__(self, in_channels, out_channels, kernel_size, stride, padding, dilation,
                           groups, bias)
        if isinstance(self.padding, str):
            raise NotImplementedError("qat.Conv2d: string padding is not supported")
        self._init_qat(relu, quant_input)

    @classmethod
    def from_float(cls, mod, relu=False, quant_input=False):
        m = cls(mod.in_channels, mod.out_channels, mod.kernel_size, mod.stride, mod.padding,
                mod.dilation, mod.groups, mod.bias is not None, relu, quant_input)
        return m._adopt(mod)

    def forward(self, x):
        x = self._quantize_input(x)
        y = _C.conv2d(x, self.fake_quant_weight(), self.bias, self.stride, self.padding,
                      self.dilation, self.groups)
        return self._finish(y)
