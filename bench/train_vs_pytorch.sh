#!/usr/bin/env bash
# Benchmark (not a test): train the same GPT (4 layers, C=256, T=256, B=8, vocab 256, tied
# head) from the same weights on the same byte-level text with tokpipec's generated trainer
# and with PyTorch eager, on the CPU with the same thread count, one after the other, and
# print the tokens/s of both and their ratio.
#
#   bash bench/train_vs_pytorch.sh [STEPS]       (default 20; the first 3 are not timed)
#   env: TOKPIPE_BUILD (build folder, default build), BENCH_THREADS (default 2)
#
# Needs a built tree (cmake -S . -B build && cmake --build build) and Debian's python3-torch
# for the export and the PyTorch side; everything it writes goes to $TOKPIPE_BUILD/bench/.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${TOKPIPE_BUILD:-build}
steps=${1:-20}
threads=${BENCH_THREADS:-2}
work=$build/bench
py=/usr/bin/python3

[ -x "$build/bin/tokpipec" ] || { echo "bench: no $build/bin/tokpipec; build the tree first" >&2; exit 2; }
mkdir -p "$work"
echo "== export the benchmark GPT and its token file ($work)"
$py bench/train_pytorch.py export "$work"
echo "== compile the trainer"
"$build/bin/tokpipec" "$work/model.onnx" --exe "$work/trainer" --batch 8 --seq 256

# One thread count for everything: OpenMP regions, OpenBLAS, PyTorch's intra-op pool.
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
# Both sides multiply with Debian's OpenBLAS: the same core for both.
. bench/openblas_core.sh
openblas_core "$work/trainer" --version
echo "== tokpipe trainer, $steps steps, $threads threads"
"$work/trainer" --init "$work/model.onnx" --data "$work/train.bin" --steps "$steps" \
  --log "$work/tokpipe.jsonl"
echo "== pytorch eager, $steps steps, $threads threads"
$py bench/train_pytorch.py train "$work" --steps "$steps" --threads "$threads" \
  --log "$work/pytorch.jsonl"
echo "== result"
$py bench/train_pytorch.py report "$work/tokpipe.jsonl" "$work/pytorch.jsonl"
