#!/usr/bin/env bash
# Regenerates tests/golden/optim_golden.bin with PyTorch's C++ API (libtorch; Debian's
# libtorch-dev). CI never runs this: the test reads the committed file.
#   tests/golden/make_optim_golden.sh
set -euo pipefail
cd "$(dirname "$0")"
TORCH_INC=${TORCH_INC:-/usr/include/torch/csrc/api/include}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
g++ -std=c++17 -O1 -I"$TORCH_INC" optim_golden_gen.cpp -o "$tmp/gen" -ltorch -ltorch_cpu -lc10
"$tmp/gen" optim_golden.bin
