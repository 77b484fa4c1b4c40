#!/usr/bin/env bash
# The main job on a bundled model: install dependencies, build, import a small GPT exported
# by PyTorch (opset 17, tied head), print its IR, then run it forward with the reference
# interpreter and compare the logits with PyTorch's.
set -euo pipefail
cd "$(dirname "$0")/.."
model=tests/fixtures/gpt_o17_erf_tied_bias_static

bash tools/install-deps.sh
cmake -S . -B build
cmake --build build -j"${TOKPIPE_JOBS:-$(nproc)}"

build/bin/tokpipec "$model/model.onnx" --emit=ir -o build/gpt.tir
echo "== IR of $model/model.onnx (full dump: build/gpt.tir)"
head -n 40 build/gpt.tir
echo "== forward pass vs PyTorch"
build/bin/tokpipe-run "$model/model.onnx" --test-dir "$model" --atol 1e-4 --rtol 1e-4
