#!/usr/bin/env bash
# Benchmark (not a test): train the same model from the same weights on the same byte-level
# text with tokpipec's generated trainer and with PyTorch eager, on the CPU with the same
# thread count and OpenBLAS core, one after the other, and print the tokens/s of both and
# their ratio; for two models of the same size (4 layers, C=256, T=256, B=8, vocab 256):
#   gpt    GPT-2 style: LayerNorm, GELU, learned positions, tied head
#   llama  Llama style: RMSNorm, rotary, SwiGLU, 4 query heads on 2 K/V heads, untied head
# (bench/train_pytorch.py defines both, in plain PyTorch).
#
#   bash bench/train_vs_pytorch.sh [STEPS] [MODEL...]   (default 20 steps, the first 3 not
#                                                      timed; models: gpt llama)
#   env: TOKPIPE_BUILD (build folder, default build), BENCH_THREADS (default 2)
#
# Needs a built tree (cmake -S . -B build && cmake --build build) and Debian's python3-torch
# for the export and the PyTorch side; everything it writes goes to $TOKPIPE_BUILD/bench/.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${TOKPIPE_BUILD:-build}
steps=${1:-20}
shift || true
models=("${@:-gpt llama}")
read -r -a models <<<"${models[*]}"
threads=${BENCH_THREADS:-2}
py=/usr/bin/python3

[ -x "$build/bin/tokpipec" ] || { echo "bench: no $build/bin/tokpipec; build the tree first" >&2; exit 2; }
# One thread count for everything: OpenMP regions, OpenBLAS, PyTorch's intra-op pool.
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
. bench/openblas_core.sh

for model in "${models[@]}"; do
  work=$build/bench/$model
  mkdir -p "$work"
  echo "== $model: export the benchmark model and its token file ($work)"
  $py bench/train_pytorch.py export "$work" --model "$model"
  echo "== $model: compile the trainer"
  "$build/bin/tokpipec" "$work/model.onnx" --exe "$work/trainer" --batch 8 --seq 256
  # Both sides multiply with Debian's OpenBLAS: the same core for both.
  openblas_core "$work/trainer" --version
  echo "== $model: tokpipe trainer, $steps steps, $threads threads"
  "$work/trainer" --init "$work/model.onnx" --data "$work/train.bin" --steps "$steps" \
    --log "$work/tokpipe.jsonl"
  echo "== $model: pytorch eager, $steps steps, $threads threads"
  $py bench/train_pytorch.py train "$work" --steps "$steps" --threads "$threads" \
    --log "$work/pytorch.jsonl" --model "$model"
done
echo "== result"
for model in "${models[@]}"; do
  $py bench/train_pytorch.py report "$build/bench/$model/tokpipe.jsonl" \
    "$build/bench/$model/pytorch.jsonl" --model "$model"
done
