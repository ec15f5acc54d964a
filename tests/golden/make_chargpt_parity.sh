#!/usr/bin/env bash
# Regenerates the chargpt parity files (chargpt_parity_text.bin, chargpt_parity_init.safetensors,
# chargpt_parity.bin) with PyTorch's C++ API (libtorch; Debian's libtorch-dev) from the fortunes
# package's text (Debian's fortunes). CI never runs this: tests/nn/chargpt_parity_test.cpp reads
# the committed files.   tests/golden/make_chargpt_parity.sh [FORTUNES_DIR]
set -euo pipefail
cd "$(dirname "$0")"
TORCH_INC=${TORCH_INC:-/usr/include/torch/csrc/api/include}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
g++ -std=c++17 -O1 -I"$TORCH_INC" chargpt_parity_gen.cpp -o "$tmp/gen" -ltorch -ltorch_cpu -lc10
"$tmp/gen" "${1:-/usr/share/games/fortunes}"
