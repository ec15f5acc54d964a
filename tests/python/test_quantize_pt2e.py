"""Static post-training int8 quantization of exported programs (kiln.ao.quantization.quantize_pt2e
over kiln/quantization.h): a digits CNN with conv + batch norm + relu and the digits MLP, trained
in float32, exported, calibrated on training images and converted, score within 1 point of float
on the held-out images, from the saved file too (in-process and through kiln-run-program); the
per-layer error report; refusals.
"""
import os
import subprocess

import pytest

import kiln
import kiln.nn as nn
from kiln import _C
from kiln.ao.quantization.quantize_pt2e import convert_pt2e, error_report, prepare_pt2e

import examples_util

BUILD = os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__)))
RUNNER = os.path.join(os.path.dirname(BUILD), "bin", "kiln-run-program")


@pytest.fixture(scope="module")
def digits():
    return examples_util.digits()


def cnn_bn():
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(32 * 4 * 4, 10))


def accuracy(fn, x, y):
    with kiln.no_grad():
        return (fn(x).argmax(1) == y).float().mean().item()


def quantize(model, x_train, shape):
    model.eval()
    xs = x_train.reshape([-1, *shape])
    prog = kiln.export(model, (xs[:8],), dynamic_shapes=({0: kiln.Dim("batch")},))
    prepared = prepare_pt2e(prog)
    for i in range(0, 512, 64):  # calibration: 8 batches of training images
        prepared(xs[i:i + 64])
    return prog, prepared, convert_pt2e(prepared)


@pytest.mark.parametrize("kind", ["cnn_bn", "mlp"])
def test_static_int8_digits_within_one_point_of_float(digits, kind, tmp_path):
    mod, (x_train, y_train, x_test, y_test) = digits
    kiln.manual_seed(mod.SEED)
    if kind == "mlp":
        model, shape, epochs = mod.make_mlp(), (64,), 30
    else:
        model, shape, epochs = cnn_bn(), (1, 8, 8), 12
    mod.fit(kind, model, (x_train, y_train, x_test, y_test), shape, epochs, 2e-3)
    prog, prepared, qprog = quantize(model, x_train, shape)
    xt = x_test.reshape([-1, *shape])
    float_acc = accuracy(model, xt, y_test)
    assert float_acc >= 0.95
    q_acc = accuracy(qprog, xt, y_test)
    print(f"{kind}: float32 {100 * float_acc:.2f}%, static int8 {100 * q_acc:.2f}%")
    assert abs(q_acc - float_acc) <= 0.01, (float_acc, q_acc)
    ops = qprog.describe()
    if kind == "cnn_bn":
        assert "conv2d_int8 x2" in ops and "linear_int8 x1" in ops and "convolution" not in ops
        assert prepared.layers[0].startswith("conv2d 0: convolution + add")  # bias, batch norm
        assert prepared.layers[0].endswith("+ relu")
        assert "1.running_mean" not in qprog.weights  # folded into layer 0
    else:
        assert prepared.layers == ["linear 0: addmm + relu", "linear 2: addmm"]
    assert qprog.weights["0.weight_int8"].dtype == kiln.int8
    # The saved file runs the same, here and without Python.
    path = tmp_path / f"{kind}.int8.kprog"
    qprog.save(path)
    again = kiln.load_program(path)
    assert bool((again(xt[:50]) == qprog(xt[:50])).all())
    if os.path.exists(RUNNER):
        inputs, outputs = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
        name = qprog.input_names[0]
        _C._save_safetensors(str(inputs), {name: xt[:50]}, {})
        r = subprocess.run([RUNNER, str(path), "--inputs", str(inputs), "--outputs", str(outputs)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        got, _ = _C._load_safetensors(str(outputs))
        assert bool((got["output0"] == qprog(xt[:50])).all())
    # The report: one row per layer, the first layers closest to float.
    report = error_report(prepared, xt[:200])
    assert [r[0] for r in report] == (["0", "4", "7"] if kind == "cnn_bn" else ["0", "2"])
    assert all(r[4] > 15 for r in report), report.table()
    assert "SQNR dB" in str(report)


def test_refusals():
    lin = nn.Linear(4, 3).eval()
    prog = kiln.export(lin, (kiln.randn(2, 4),))
    prepared = prepare_pt2e(prog)
    with pytest.raises(ValueError, match="convert before any calibration"):
        convert_pt2e(prepared)
    with pytest.raises(ValueError, match="NaN or infinite"):
        prepared(kiln.randn(2, 4) / kiln.zeros(2, 4))
    assert prepared.batches_observed == 0
    with pytest.raises(TypeError, match="prepare_pt2e's result"):
        convert_pt2e(prog)
    plain = kiln.export(lambda x: x * 2 + 1, (kiln.randn(3),))
    with pytest.raises(ValueError, match="no layer to quantize"):
        prepare_pt2e(plain)
