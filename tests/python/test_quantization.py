"""kiln.ao.quantization (issue 25): the ops from Python, quantize_dynamic as
bench/kiln_reference.py's `quantized` workload calls it, QAT (prepare_qat / convert), and the
accuracy of the int8 digits models against float32 (within 1 percentage point, held out)."""
import numpy as np
import pytest

import kiln
import kiln as torch
import kiln.nn as nn

import examples_util


def test_quantize_dequantize_round_trip():
    x = kiln.tensor([0.5, 1.5, 2.5, -0.5, 300.0, -300.0])
    q = kiln.quantize_per_tensor(x, 1.0, 10)
    assert q.dtype == kiln.uint8
    assert q.tolist() == [10, 12, 12, 10, 255, 0]
    assert kiln.dequantize_per_tensor(q, 1.0, 10).tolist() == [0.0, 2.0, 2.0, 0.0, 245.0, -10.0]
    with pytest.raises(ValueError, match="scale"):
        kiln.quantize_per_tensor(x, 0.0, 0)
    with pytest.raises(ValueError, match="zero_point"):
        kiln.quantize_per_tensor(x, 1.0, 256)


def test_quantize_weight_per_channel():
    w = kiln.tensor([[1.0, -2.0], [0.0, 0.0], [0.5, 0.25]])
    q, s = kiln.quantize_weight_per_channel(w)
    assert q.dtype == kiln.int8 and s.dtype == kiln.float32
    assert np.allclose(s.numpy(), [2 / 127, 1.0, 0.5 / 127])
    assert q.tolist() == [[64, -127], [0, 0], [127, 64]]


def test_dynamic_linear_matches_float():
    kiln.manual_seed(0)
    m = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).eval()
    q = torch.ao.quantization.quantize_dynamic(m, {nn.Linear}, dtype=torch.qint8)
    assert isinstance(q[0], kiln.ao.nn.quantized.dynamic.Linear) and q[0].relu
    assert isinstance(m[0], nn.Linear)  # not in place
    x = kiln.randn(16, 32)
    with kiln.no_grad():
        want, got = m(x).numpy(), q(x).numpy()
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()
    assert "qint8" in repr(q)


def test_fake_quantize_straight_through():
    x = kiln.tensor([-1.0, 0.04, 0.3, 5.0], requires_grad=True)
    y = kiln.fake_quantize_per_tensor_affine(x, 0.1, 10, 0, 30)
    assert np.allclose(y.detach().numpy(), [-1.0, 0.0, 0.3, 2.0])
    y.sum().backward()
    assert x.grad.tolist() == [1.0, 1.0, 1.0, 0.0]


def test_qat_small_model_converts():
    kiln.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                      nn.Linear(4 * 4 * 4, 8), nn.Sigmoid(), nn.Linear(8, 3))
    p = torch.ao.quantization.prepare_qat(m)
    assert isinstance(p.module[0], kiln.ao.nn.qat.Conv2d) and p.module[0].relu
    assert p.module[6].input_fake_quant is not None  # after a float Sigmoid
    assert p.module[4].input_fake_quant is None  # quantized stream through MaxPool2d/Flatten
    x = kiln.randn(5, 1, 8, 8)
    p(x).sum().backward()
    assert p.module[0].weight.grad is not None
    c = torch.ao.quantization.convert(p.eval())
    assert isinstance(c.module[0], kiln.ao.nn.quantized.Conv2d)
    with kiln.no_grad():
        want, got = p(x).numpy(), c(x).numpy()
    assert got.shape == (5, 3)
    assert np.abs(got - want).max() < 0.1


def _train(model, x, y, epochs, lr=2e-3, seed=0):
    loader = kiln.utils.data.DataLoader(kiln.utils.data.TensorDataset(x, y), batch_size=32,
                                        shuffle=True, generator=kiln.Generator().manual_seed(seed))
    opt = kiln.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    model.train()
    for _ in range(epochs):
        for xb, yb in loader:
            loss = nn.functional.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model


@kiln.no_grad()
def _acc(model, x, y):
    model.eval()
    return (model(x).argmax(1) == y).float().mean().item()


def test_digits_int8_accuracy_within_one_point():
    digits, (x_tr, y_tr, x_te, y_te) = examples_util.digits()
    report = []
    for name, make, shape, epochs in (("mlp", digits.make_mlp, (64,), 30),
                                      ("cnn", digits.make_cnn, (1, 8, 8), 20)):
        xtr, xte = x_tr.reshape([-1, *shape]), x_te.reshape([-1, *shape])
        kiln.manual_seed(0)
        model = _train(make(), xtr, y_tr, epochs)
        fp32 = _acc(model, xte, y_te)
        if name == "mlp":
            dq = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
            dyn = _acc(dq, xte, y_te)
            report.append(f"mlp dynamic int8 {dyn:.4f} vs fp32 {fp32:.4f}")
            assert dyn >= fp32 - 0.01, report
            layers = torch.ao.quantization.error_report(model, dq, xte)
            assert [(r[0], r[1]) for r in layers] == [("0", "dynamic.Linear"),
                                                      ("2", "dynamic.Linear")], layers
            assert all(r[4] > 20 for r in layers), layers.table()
        # QAT: fine-tune the trained float model with fake quantization, then convert.
        qat = torch.ao.quantization.prepare_qat(model)
        _train(qat, xtr, y_tr, 3, lr=5e-4, seed=1)
        qmodel = torch.ao.quantization.convert(qat.eval())
        int8 = _acc(qmodel, xte, y_te)
        report.append(f"{name} QAT int8 {int8:.4f} vs fp32 {fp32:.4f}")
        assert int8 >= fp32 - 0.01, report
        # Per layer, against the float model the QAT run started from.
        layers = torch.ao.quantization.error_report(model, qmodel, xte)
        assert len(layers) == (2 if name == "mlp" else 3), layers
        assert "SQNR dB" in str(layers) and all(r[3] <= r[2] for r in layers), layers.table()
        report.append(layers.table())
    print("\n".join(report))
