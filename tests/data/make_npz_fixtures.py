"""Writes tests/data/fixtures/*.npz the way np.savez / np.savez_compressed do (zipfile members
opened with force_zip64=True, NEP 1 headers padded to 64 bytes), with the standard library only,
so it runs without NumPy. Run: python3 tests/data/make_npz_fixtures.py"""
import pathlib
import struct
import zipfile

OUT = pathlib.Path(__file__).parent / "fixtures"


def npy(descr, shape, data):
    shape_s = "(" + "".join(f"{d}, " for d in shape).rstrip(" ")
    shape_s = shape_s[:-1] + ",)" if len(shape) == 1 else shape_s.rstrip(",") + ")"
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_s}, }}"
    pad = 64 - (10 + len(header) + 1) % 64
    header = header + " " * pad + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data


def savez(path, arrays, compression):
    with zipfile.ZipFile(path, "w", compression=compression) as z:
        for name, blob in arrays.items():
            with z.open(name + ".npy", "w", force_zip64=True) as f:
                f.write(blob)


arrays = {
    "x": npy("<f4", (2, 3), struct.pack("<6f", 0, 1, 2, 3, 4, 5)),
    "labels": npy("<i8", (3,), struct.pack("<3q", 7, -1, 9)),
    "empty": npy("<f8", (0, 4), b""),
    "scalar": npy("|u1", (), b"\x2a"),
}
OUT.mkdir(exist_ok=True)
savez(OUT / "savez.npz", arrays, zipfile.ZIP_STORED)
savez(OUT / "savez_compressed.npz", arrays, zipfile.ZIP_DEFLATED)
