"""kiln.export (kiln/_export.py over client/export, kiln/exported_program.h) and kiln-run-program:
the MLP, CNN and GPT of test_compile.py exported with a dynamic batch (and a dynamic sequence
length for the GPT), run from the file against eager at other sizes, in-process and through the
binary; files refused at load (truncated, altered, an op this build lacks); inputs refused at run,
naming the input and dim.
"""
import hashlib
import os
import struct
import subprocess

import pytest

import kiln
import kiln.nn as nn
from kiln import _C

from test_compile import CNN, _chargpt, mlp

BUILD = os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__)))  # build/python -> build
RUNNER = os.path.join(os.path.dirname(BUILD), "bin", "kiln-run-program")


def make(kind):
    kiln.manual_seed(1)
    if kind == "mlp":
        return mlp(), (16, 32), {0: kiln.Dim("batch")}
    if kind == "cnn":
        model = CNN()
        with kiln.no_grad():  # running statistics that are not the defaults
            model(kiln.randn(8, 1, 16, 16))
        return model, (8, 1, 16, 16), {0: kiln.Dim("batch")}
    model = _chargpt().GPT(vocab=64, block=16, layers=2, heads=2, width=32)
    return model, (4, 12), {0: kiln.Dim("batch"), 1: kiln.Dim("seq", max=16)}


def example(kind, shape, seed):
    g = kiln.Generator()
    g.manual_seed(seed)
    if kind == "gpt":
        return kiln.randint(0, 64, shape, generator=g)
    return kiln.randn(*shape, generator=g)


def eager(model, x):
    with kiln.no_grad():
        return model(x)


def assert_close(got, want, tol=1e-5):
    assert list(got.shape) == list(want.shape)
    assert (got - want).abs().max().item() <= tol * (1 + want.abs().max().item())


@pytest.mark.parametrize("kind", ["mlp", "cnn", "gpt"])
def test_exported_program_matches_eager_at_other_sizes(kind, tmp_path):
    model, shape, dims = make(kind)
    model.eval()
    path = tmp_path / f"{kind}.kprog"
    ep = kiln.export(model, (example(kind, shape, 0),), path, dynamic_shapes=({**dims},))
    prog = kiln.load_program(path)
    assert prog.input_names == [ep.input_names[0]]
    name = prog.input_names[0]
    assert prog.inputs[0][2][0] == "batch"
    # Parameters and the buffers read (not num_batches_tracked), by their state_dict names.
    assert {n for n, _ in model.named_parameters()} <= set(prog.weights) <= set(model.state_dict())
    sizes = [shape, (shape[0] + 5,) + shape[1:], (2,) + shape[1:]]
    if kind == "gpt":
        assert prog.inputs[0][2] == ["batch", "seq"]
        assert prog.outputs[0][2] == ["batch", "seq", "64"]
        sizes += [(3, 16), (5, 2), (1, 7)]
    for k, s in enumerate(sizes):
        x = example(kind, s, 10 + k)
        want = eager(model, x)
        assert_close(prog(x), want)
        assert_close(prog(**{name: x}), want)


def test_a_wrong_static_dim_names_the_input_and_dim():
    model, shape, dims = make("cnn")
    model.eval()
    prog = kiln.export(model, (example("cnn", shape, 0),), dynamic_shapes={"x": dims})
    with pytest.raises(ValueError, match=r"input 'x' dim 3 is 15; the program was exported with "
                                         r"the static size 16"):
        prog(kiln.randn(3, 1, 16, 15))
    with pytest.raises(ValueError, match=r"input 'x' is float64"):
        prog(kiln.randn(3, 1, 16, 16, dtype=kiln.float64))
    gpt, shape, dims = make("gpt")
    gpt.eval()
    prog = kiln.export(gpt, (example("gpt", shape, 0),), dynamic_shapes=(dims,))
    with pytest.raises(ValueError, match=r"input 'idx' dim 1 \('seq'\) is 17, outside the range "
                                         r"\[1, 16\]"):
        prog(kiln.zeros(2, 17, dtype=kiln.int64))
    static = kiln.export(gpt, (example("gpt", shape, 0),))  # nothing dynamic
    assert static.inputs[0][2] == ["4", "12"]
    with pytest.raises(ValueError, match=r"input 'idx' dim 0 is 5; the program was exported with "
                                         r"the static size 4 there"):
        static(kiln.zeros(5, 12, dtype=kiln.int64))


def test_export_refuses_what_it_cannot_keep():
    model = mlp()  # a BatchNorm in training mode writes its running statistics
    with pytest.raises(TypeError, match="output 0 is a int"):
        kiln.export(lambda x: 3, (kiln.randn(4, 32),))
    with pytest.raises(ValueError, match="records a different program"):
        kiln.export(lambda x: x.exp() if x.shape[0] > 4 else x.sin(), (kiln.randn(4, 3),),
                    dynamic_shapes=({0: "b"},))
    cnn = CNN()
    with pytest.raises(ValueError, match=r"call eval\(\) first"):
        kiln.export(cnn, (kiln.randn(4, 1, 16, 16),))
    with pytest.raises(ValueError, match="dynamic_shapes names 'y'"):
        kiln.export(model, (kiln.randn(4, 32),), dynamic_shapes={"y": {0: "b"}})


def _file(tmp_path):
    model, shape, dims = make("mlp")
    model.eval()
    path = tmp_path / "mlp.kprog"
    kiln.export(model, (example("mlp", shape, 0),), path, dynamic_shapes=(dims,))
    return model, path, path.read_bytes()


def _repack(data, program, weights):
    """A file with this program and these weights, with a valid header and checksum."""
    digest = hashlib.sha256(program + weights).digest()
    return data[:16] + struct.pack("<QQ", len(program), len(weights)) + digest + program + weights


def test_truncated_altered_and_future_files_are_refused_at_load(tmp_path):
    _, path, data = _file(tmp_path)
    bad = tmp_path / "bad.kprog"
    bad.write_bytes(data[:-100])
    with pytest.raises(ValueError, match="bad.kprog: truncated: the header declares"):
        kiln.load_program(bad)
    altered = bytearray(data)
    altered[len(data) // 2] ^= 0x40
    bad.write_bytes(bytes(altered))
    with pytest.raises(ValueError, match=r"checksum \(SHA-256\) .* does not match the header: the "
                                         r"file was altered or corrupted"):
        kiln.load_program(bad)
    # A program naming an op this build lacks: refused at load, naming it.
    p_len, w_len = struct.unpack("<QQ", data[16:32])
    program, weights = data[64:64 + p_len], data[64 + p_len:]
    assert b"\x12\x04gelu" in program  # Instruction.op = "gelu"
    bad.write_bytes(_repack(data, program.replace(b"\x12\x04gelu", b"\x12\x04gelx"), weights))
    with pytest.raises(ValueError, match="uses ops this build of Kiln lacks: 'gelx'"):
        kiln.load_program(bad)


@pytest.mark.skipif(not os.path.exists(RUNNER), reason="kiln-run-program is not built")
def test_kiln_run_program_runs_the_file_without_python(tmp_path):
    model, path, data = _file(tmp_path)
    out = subprocess.run([RUNNER, str(path), "--describe"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "input: float32[batch, 32]" in out.stdout  # Sequential.forward(self, input)
    assert "output0: float32[batch, 10]" in out.stdout
    assert "batch: dim 0 of input" in out.stdout
    assert "gelu x1" in out.stdout
    x = kiln.randn(7, 32)
    inputs, outputs = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    _C._save_safetensors(str(inputs), {"input": x}, {})
    out = subprocess.run([RUNNER, str(path), "--inputs", str(inputs), "--outputs", str(outputs)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got, _ = _C._load_safetensors(str(outputs))
    assert_close(got["output0"], eager(model, x))
    # Refusals: a wrong shape, a truncated file; the reason on stderr, status 1.
    _C._save_safetensors(str(inputs), {"input": kiln.randn(7, 31)}, {})
    out = subprocess.run([RUNNER, str(path), "--inputs", str(inputs)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 1
    assert "input 'input' dim 1 is 31" in out.stderr
    path.write_bytes(data[:200])
    out = subprocess.run([RUNNER, str(path), "--describe"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1 and "truncated" in out.stderr, out.stderr
    out = subprocess.run([RUNNER], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "usage" in out.stderr


def test_random_ops_are_refused_at_export():
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))  # training mode: dropout draws
    with pytest.raises(NotImplementedError, match="op '.*' draws random numbers.*call eval"):
        kiln.export(model, (kiln.randn(2, 4),))
    kiln.export(model.eval(), (kiln.randn(2, 4),))  # eval mode draws nothing
