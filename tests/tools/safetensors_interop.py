#!/usr/bin/env python3
"""safetensors interop: a file Kiln writes loads in the Python `safetensors` package, and a file
the package writes loads in Kiln, with every value bit for bit.

    tests/tools/safetensors_interop.py build/bin/kiln_tests     # ctest: SafetensorsInterop.Python

The Kiln halves are the DISABLED_ helpers of SafetensorsInterop in
tests/tensor/safetensors_test.cpp, whose interop_tensors() builds the same tensors as expected()
here. Exits 77 (ctest: skipped) when numpy or safetensors is missing; scripts/bootstrap installs
both.
"""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import safetensors
    from safetensors.numpy import save_file
except ImportError as e:
    print(f"skipped: {e} (scripts/bootstrap installs numpy and safetensors)")
    sys.exit(77)

NUMPY_DTYPES = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16,
                "I32": np.int32, "I64": np.int64, "F16": np.float16, "F32": np.float32,
                "F64": np.float64, "BF16": np.uint16}  # bfloat16 compared as its bits


def expected():
    """The tensors of interop_tensors() in tests/tensor/safetensors_test.cpp, except bf16."""
    return {
        "f32": (np.arange(12, dtype=np.float32) * np.float32(0.5) - np.float32(2)).reshape(3, 4),
        "f64": (np.arange(6) / 3.0).reshape(2, 3),
        "f16": np.array([0, 0.25, -1.5, 65504, 1e-3], dtype=np.float32).astype(np.float16),
        "i64": np.array([-(1 << 40), -1, 0, (1 << 40) + 3], dtype=np.int64),
        "i32": np.array([[-7], [0], [2147483647]], dtype=np.int32),
        "i16": np.array([-32768, 5], dtype=np.int16),
        "i8": np.array([-128, 127, 3], dtype=np.int8),
        "u8": np.array([[0, 200, 255]], dtype=np.uint8),
        "bool": np.array([True, False, True]),
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 3), dtype=np.float32),
    }


def bf16_bits():
    f = np.array([[-1.5, -0.5], [0.5, 1.5]], dtype=np.float32)
    return (f.view(np.uint32) >> 16).astype(np.uint16)


def run_kiln(kiln_tests, test, directory):
    r = subprocess.run([kiln_tests, f"--gtest_filter=SafetensorsInterop.DISABLED_{test}",
                        "--gtest_also_run_disabled_tests"],
                       env=dict(os.environ, KILN_INTEROP_DIR=directory),
                       capture_output=True, text=True)
    if r.returncode != 0 or "[       OK ]" not in r.stdout:
        sys.exit(f"kiln_tests {test} failed:\n{r.stdout}\n{r.stderr}")


def check_equal(name, got, want):
    if got.dtype != want.dtype or got.shape != want.shape or got.tobytes() != want.tobytes():
        sys.exit(f"{name}: got {got.dtype} {got.shape} {got!r}, want {want.dtype} {want.shape} "
                 f"{want!r}")


def main():
    kiln_tests = sys.argv[1]
    with tempfile.TemporaryDirectory() as d:
        # Kiln -> Python: the raw deserializer (every dtype) and the numpy loader.
        run_kiln(kiln_tests, "WriteForPython", d)
        path = os.path.join(d, "from_kiln.safetensors")
        with open(path, "rb") as f:
            raw = dict(safetensors.deserialize(f.read()))
        want = dict(expected(), bf16=bf16_bits())
        if set(raw) != set(want):
            sys.exit(f"names: got {sorted(raw)}, want {sorted(want)}")
        for name, info in raw.items():
            got = np.frombuffer(bytes(info["data"]), NUMPY_DTYPES[info["dtype"]])
            check_equal(name, got.reshape(info["shape"]), want[name])
        with safetensors.safe_open(path, framework="numpy") as f:
            if f.metadata() != {"writer": "kiln", "format": "np"}:
                sys.exit(f"metadata: got {f.metadata()}")
            for name, w in expected().items():
                check_equal(name, f.get_tensor(name), w)

        # Python -> Kiln.
        save_file(expected(), os.path.join(d, "from_python.safetensors"),
                  metadata={"writer": "python"})
        run_kiln(kiln_tests, "ReadFromPython", d)
    print(f"ok: safetensors {safetensors.__version__} reads Kiln's file and Kiln reads its file")


if __name__ == "__main__":
    main()
