#!/usr/bin/env bash
# Regenerates tests/golden/digits_parity_{data,mlp,cnn}.safetensors and digits_parity.bin with
# PyTorch's C++ API (libtorch; Debian's libtorch-dev installs it under /usr/include/torch) from
# scikit-learn's digits (the venv of scripts/bootstrap). CI never runs this: the test reads the
# committed files.   tests/golden/make_digits_parity.sh
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-../../.venv/bin/python}
TORCH_INC=${TORCH_INC:-/usr/include/torch/csrc/api/include}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PYTHON" - "$tmp" <<'PY'
import sys
from sklearn.datasets import load_digits
d = load_digits()
open(sys.argv[1] + "/pixels.u8", "wb").write(d.data.astype("uint8").tobytes())
open(sys.argv[1] + "/labels.u8", "wb").write(d.target.astype("uint8").tobytes())
PY
g++ -std=c++17 -O1 -I"$TORCH_INC" digits_parity_gen.cpp -o "$tmp/gen" -ltorch -ltorch_cpu -lc10
"$tmp/gen" "$tmp/pixels.u8" "$tmp/labels.u8" .
