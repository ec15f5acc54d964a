"""kiln.save / kiln.load: safetensors files (interop with the `safetensors` package) and training
checkpoint directories; errors name the file."""
import json
import os

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import kiln


def arr(t):
    return t.numpy()


def state_dict():
    return {"fc.weight": kiln.randn(4, 3), "fc.bias": kiln.arange(4, dtype=kiln.int64),
            "half": kiln.ones(2, 2, dtype=kiln.float16), "flag": kiln.tensor([True, False])}


def test_state_dict_round_trip(tmp_path):
    sd = state_dict()
    sd["strided"] = kiln.randn(3, 5).transpose(0, 1)
    path = tmp_path / "model.safetensors"
    kiln.save(sd, path, metadata={"step": "7"})
    back = kiln.load(str(path))
    assert set(back) == set(sd)
    for k, v in sd.items():
        assert back[k].dtype is v.dtype and back[k].shape == v.shape
        np.testing.assert_array_equal(arr(back[k]), arr(v))


def test_interop_with_safetensors_package(tmp_path):
    sd = state_dict()
    path = str(tmp_path / "a.safetensors")
    kiln.save(sd, path)
    theirs = load_file(path)
    for k, v in sd.items():
        np.testing.assert_array_equal(theirs[k], arr(v))
    mine = {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "y": np.array([1, 2], dtype=np.int32)}
    path2 = str(tmp_path / "b.safetensors")
    save_file(mine, path2)
    back = kiln.load(path2)
    np.testing.assert_array_equal(arr(back["x"]), mine["x"])
    assert back["y"].dtype is kiln.int32


def test_bfloat16_round_trip(tmp_path):
    t = kiln.randn(3).to(kiln.bfloat16)
    kiln.save({"t": t}, tmp_path / "bf.safetensors")
    back = kiln.load(tmp_path / "bf.safetensors")["t"]
    assert back.dtype is kiln.bfloat16
    np.testing.assert_array_equal(arr(back.float()), arr(t.float()))


def test_training_checkpoint_round_trip(tmp_path):
    ckpt = {"model": {"w": kiln.randn(3, 3), "b": kiln.zeros(3)},
            "optimizer": {"0.exp_avg": kiln.ones(3)},
            "step": 100, "lr": 1e-3, "loader": {"epoch": 2, "index": 17}, "name": "run", "ok": True,
            "history": [1.5, 0.5], "empty": {}}
    d = tmp_path / "ckpt"
    kiln.save(ckpt, d)
    assert os.path.isfile(d / "manifest.json")
    back = kiln.load(d)
    assert set(back) == set(ckpt)
    for g in ("model", "optimizer"):
        for k, v in ckpt[g].items():
            np.testing.assert_array_equal(arr(back[g][k]), arr(v))
    for k in ("step", "lr", "loader", "name", "ok", "history", "empty"):
        assert back[k] == ckpt[k]
    # a second save replaces the first atomically
    ckpt["step"] = 101
    ckpt["model"]["w"] = kiln.zeros(3, 3)
    kiln.save(ckpt, d)
    back = kiln.load(d)
    assert back["step"] == 101
    np.testing.assert_array_equal(arr(back["model"]["w"]), np.zeros((3, 3), np.float32))


def test_map_location(tmp_path):
    kiln.save({"a": kiln.ones(2)}, tmp_path / "a.safetensors")
    back = kiln.load(tmp_path / "a.safetensors", map_location="cpu")
    assert back["a"].device == "cpu"


def test_wrong_types(tmp_path):
    p = tmp_path / "x.safetensors"
    with pytest.raises(TypeError, match="expected a dict"):
        kiln.save(kiln.ones(2), p)
    with pytest.raises(TypeError, match="not in a group"):
        kiln.save({"model": {"w": kiln.ones(1)}, "extra": [kiln.ones(1)]}, p)
    with pytest.raises(TypeError, match="JSON"):
        kiln.save({"model": {"w": kiln.ones(1)}, "fn": print}, p)
    with pytest.raises(TypeError, match="keys must be str"):
        kiln.save({1: 2}, p)
    with pytest.raises(TypeError, match="path"):
        kiln.save({"a": kiln.ones(1)}, open(os.devnull, "wb"))
    with pytest.raises(TypeError, match="metadata"):
        kiln.save({"a": kiln.ones(1)}, p, metadata={"step": 3})


def test_bad_files_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.safetensors"):
        kiln.load(tmp_path / "missing.safetensors")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    with pytest.raises(ValueError, match="bad.safetensors"):
        kiln.load(bad)
    truncated = tmp_path / "trunc.safetensors"
    kiln.save({"a": kiln.ones(100)}, truncated)
    truncated.write_bytes(truncated.read_bytes()[:-10])
    with pytest.raises(ValueError, match="trunc.safetensors"):
        kiln.load(truncated)
    d = tmp_path / "notackpt"
    d.mkdir()
    with pytest.raises(ValueError, match="notackpt"):
        kiln.load(d)
    ck = tmp_path / "ck"
    kiln.save({"model": {"w": kiln.ones(4)}, "step": 1}, ck)
    manifest = json.loads((ck / "manifest.json").read_text())
    group_file = next(f for f in os.listdir(ck) if f.startswith("model."))
    (ck / group_file).write_bytes(b"")
    with pytest.raises(ValueError, match="model"):
        kiln.load(ck)
    assert manifest  # the manifest itself was valid
