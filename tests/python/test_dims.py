"""Tensors have at most 64 dimensions, as NumPy interop allows (See Note [Dimension cap] in
kiln/tensor_impl.h). Every path up to the cap is correct (numpy(), tolist()); past it a clear
ValueError, never a crash: the outside probe aborted the interpreter with 129 dimensions and got a
wrong 0-d object array with 65-128, and a crafted safetensors file with a 100,000-dimension shape
loaded and then aborted."""
import json
import struct

import numpy as np
import pytest

import kiln


def test_sixty_four_dimensions_round_trip():
    shape = [1] * 64
    shape[0], shape[-1] = 2, 3
    t = kiln.ones(*shape)
    a = t.numpy()
    assert a.shape == tuple(shape) and a.dtype == np.float32 and a.sum() == 6
    nested = t.tolist()
    depth = 0
    while isinstance(nested, list):
        depth += 1
        nested = nested[0]
    assert depth == 64 and nested == 1.0
    assert kiln.tensor(a).shape == tuple(shape)


@pytest.mark.parametrize("ndim", [65, 129, 1000])
def test_past_the_cap_is_a_value_error(ndim):
    with pytest.raises(ValueError, match=f"has {ndim} dimensions; Kiln supports at most 64"):
        kiln.ones(*[1] * ndim)
    with pytest.raises(ValueError, match="at most 64"):
        kiln.ones(1).view(*[1] * ndim)


def test_numpy_array_past_the_cap_is_refused():
    a = np.ones([1] * 64, dtype=np.float32)
    assert kiln.tensor(a).dim() == 64
    with pytest.raises(ValueError, match="at most 64"):
        kiln.ones(*[1] * 64).unsqueeze(0)


def test_crafted_safetensors_with_huge_rank_is_refused(tmp_path):
    header = json.dumps({"x": {"dtype": "F32", "shape": [1] * 100_000, "data_offsets": [0, 4]}})
    path = tmp_path / "crafted.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header.encode() + b"\0" * 4)
    with pytest.raises(ValueError, match="has 100000 dimensions; Kiln supports at most 64"):
        kiln.load(str(path))
