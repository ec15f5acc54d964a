#!/usr/bin/env python3
"""Regenerates tests/golden/quantized_golden.bin with PyTorch's Python API (pip's torch in .venv;
its quantized CPU ops: fbgemm): quantize_per_tensor codes, fake quantization and its
straight-through gradient, and fbgemm's int8 linear / conv2d with per-channel weights. The
format is golden_file.h's. CI never runs this: QuantizedGolden.* reads the committed file.

    .venv/bin/python tests/golden/make_quantized_golden.py
"""
import os
import struct

import torch


def write(path, tensors):
    with open(path, "wb") as f:
        f.write(b"KILNGLD1" + struct.pack("<I", len(tensors)))
        for name, t in tensors.items():
            t = t.detach().double().contiguous()
            f.write(struct.pack("<I", len(name)) + name.encode())
            f.write(struct.pack("<I", t.dim()) + struct.pack(f"<{t.dim()}q", *t.shape))
            f.write(struct.pack(f"<{t.numel()}d", *t.flatten().tolist()))


def main():
    torch.manual_seed(0)
    torch.backends.quantized.engine = "fbgemm"
    g = {}
    # quantize_per_tensor (uint8): codes, ties included (x / 0.05 = k + 1/2).
    x = torch.cat([torch.randn(40) * 4, torch.arange(-6, 6) * 0.05 + 0.025])
    g["quantize.x"] = x
    g["quantize.codes"] = torch.quantize_per_tensor(x, 0.05, 120, torch.quint8).int_repr()
    # fake quantization, per tensor and per channel, with the straight-through gradient of sum.
    x = (torch.randn(6, 5) * 3).requires_grad_()
    y = torch.fake_quantize_per_tensor_affine(x, 0.1, 10, 0, 63)
    y.sum().backward()
    g["fake.x"], g["fake.y"], g["fake.grad"] = x, y, x.grad
    x = (torch.randn(4, 3) * 3).requires_grad_()
    s, z = torch.tensor([0.1, 0.02, 0.05]), torch.tensor([0, 10, -3], dtype=torch.int32)
    y = torch.fake_quantize_per_channel_affine(x, s, z, 1, -64, 63)
    y.sum().backward()
    g["fake_pc.x"], g["fake_pc.scale"], g["fake_pc.zero_point"] = x, s, z
    g["fake_pc.y"], g["fake_pc.grad"] = y, x.grad
    # int8 linear: uint8 input (scale 0.03, zero point 117), int8 weight per channel, float bias,
    # output scale 0.05, zero point 100; with and without relu.
    xq = torch.quantize_per_tensor(torch.randn(7, 24) * 2, 0.03, 117, torch.quint8)
    w = torch.randn(9, 24) * 0.3
    ws = w.abs().amax(1) / 127
    wq = torch.quantize_per_channel(w, ws, torch.zeros(9, dtype=torch.long), 0, torch.qint8)
    b = torch.randn(9)
    pp = torch.ops.quantized.linear_prepack(wq, b)
    g["linear.x"], g["linear.w"], g["linear.w_scale"], g["linear.b"] = (
        xq.int_repr(), wq.int_repr(), ws, b)
    g["linear.y"] = torch.ops.quantized.linear(xq, pp, 0.05, 100).int_repr()
    g["linear.y_relu"] = torch.ops.quantized.linear_relu(xq, pp, 0.05, 100).int_repr()
    # int8 conv2d: (2, 4, 7, 6) uint8 (0.02, 128), weight (6, 2, 3, 3) per channel, groups 2,
    # stride 1, padding 1; output (0.04, 64).
    xq = torch.quantize_per_tensor(torch.randn(2, 4, 7, 6) * 2, 0.02, 128, torch.quint8)
    w = torch.randn(6, 2, 3, 3) * 0.3
    ws = w.flatten(1).abs().amax(1) / 127
    wq = torch.quantize_per_channel(w, ws, torch.zeros(6, dtype=torch.long), 0, torch.qint8)
    b = torch.randn(6)
    cp = torch.ops.quantized.conv2d_prepack(wq, b, [1, 1], [1, 1], [1, 1], 2)
    g["conv.x"], g["conv.w"], g["conv.w_scale"], g["conv.b"] = (
        xq.int_repr(), wq.int_repr(), ws, b)
    g["conv.y"] = torch.ops.quantized.conv2d(xq, cp, 0.04, 64).int_repr()
    write(os.path.join(os.path.dirname(os.path.abspath(__file__)), "quantized_golden.bin"), g)


if __name__ == "__main__":
    main()
