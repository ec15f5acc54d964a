"""kiln.onnx.export (kiln/onnx.py over _C._program_graph): the MLP, CNN and GPT of
test_compile.py exported by kiln.export with a dynamic batch (and sequence length for the GPT),
written as ONNX (opset 17), passed through onnx.checker and run by onnxruntime at sizes other
than the example's against Kiln's own outputs (max-abs 1e-4); an op with no ONNX mapping is
refused with every such op named and no file left behind.
"""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import kiln
import kiln.onnx
from test_export import example, make


def _session(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("kind", ["mlp", "cnn", "gpt"])
def test_onnx_matches_kiln_at_other_sizes(kind, tmp_path):
    model, shape, dims = make(kind)
    model.eval()
    prog = kiln.export(model, (example(kind, shape, 0),), dynamic_shapes=(dims,))
    path = tmp_path / f"{kind}.onnx"
    kiln.onnx.export(prog, path)
    m = onnx.load(str(path))
    onnx.checker.check_model(m, full_check=True)
    assert m.opset_import[0].version >= 17
    dims0 = [d.dim_param or d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    assert dims0[0] == "batch"
    if kind == "gpt":
        assert dims0 == ["batch", "seq"]
    sess = _session(path)
    name = sess.get_inputs()[0].name
    sizes = [(shape[0] + 5,) + shape[1:], (2,) + shape[1:]]
    if kind == "gpt":
        sizes += [(3, 16), (5, 2)]
    for k, s in enumerate(sizes):
        x = example(kind, s, 20 + k)
        with kiln.no_grad():
            want = model(x).numpy()
        got = sess.run(None, {name: x.numpy()})[0]
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= 1e-4


def test_onnx_names_every_unsupported_op_and_writes_nothing(tmp_path):
    prog = kiln.export(lambda x: x.cumsum(0).flip(0) + x.sin(), (kiln.randn(4, 3),),
                       dynamic_shapes=({0: "b"},))
    path = tmp_path / "f.onnx"
    with pytest.raises(NotImplementedError) as e:
        kiln.onnx.export(prog, path)
    for op in ("cumsum", "flip", "sin"):
        assert f"'{op}'" in str(e.value)
    assert list(tmp_path.iterdir()) == []


def test_onnx_from_a_program_file(tmp_path):
    model, shape, dims = make("mlp")
    model.eval()
    kiln.export(model, (example("mlp", shape, 0),), tmp_path / "mlp.kprog",
                dynamic_shapes=(dims,))
    kiln.onnx.export(tmp_path / "mlp.kprog", tmp_path / "mlp.onnx")
    x = example("mlp", (3, 32), 5)
    with kiln.no_grad():
        want = model(x).numpy()
    got = _session(tmp_path / "mlp.onnx").run(None, {"input": x.numpy()})[0]
    assert np.abs(got - want).max() <= 1e-4


def test_onnx_slices_sums_numbers_and_a_weight_view(tmp_path):
    w = kiln.randn(6, 4)  # read as the view w[1:5] (stored as its whole storage)

    def f(x):
        y = (x.view(-1, 4) @ w[1:5].t()) * 2.5 - 1.0 + x[:, ::2].sum()
        return y[1:].sum(1, keepdim=True) * y[:-1]

    prog = kiln.export(f, (kiln.randn(3, 4),), dynamic_shapes=({0: "b"},))
    kiln.onnx.export(prog, tmp_path / "f.onnx")
    sess = _session(tmp_path / "f.onnx")
    for rows in (2, 9):
        x = kiln.randn(rows, 4)
        got = sess.run(None, {"x": x.numpy()})[0]
        assert got.shape == (rows - 1, 4)
        assert np.abs(got - f(x).numpy()).max() <= 1e-4


def test_onnx_lists_every_refusal_at_once(tmp_path):
    w = kiln.randn(3, 2, 3, 3)
    prog = kiln.export(lambda x: kiln.conv_transpose2d(x, w).cumsum(0), (kiln.randn(1, 3, 5, 5),))
    path = tmp_path / "f.onnx"
    with pytest.raises(NotImplementedError) as e:
        kiln.onnx.export(prog, path)
    assert "'cumsum'" in str(e.value) and "transposed convolution" in str(e.value)
    assert list(tmp_path.iterdir()) == []
