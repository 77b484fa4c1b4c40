#!/usr/bin/env bash
# Micro-benchmark (not a test): the runtime's forward kernels and PyTorch's forward ops at the
# sizes of bench/train_vs_pytorch.sh's GPT, same thread count, side by side in one run.
#
#   bash bench/kernels_forward.sh [REPS]          (default 30 per op, after 3 untimed)
#   env: TOKPIPE_BUILD (build folder, default build), BENCH_THREADS (default 2);
#        OPENBLAS_CORETYPE, set or chosen as below, applies to both sides alike.
#
# Compiles bench/kernels_forward.c against $TOKPIPE_BUILD's runtime library; writes to
# $TOKPIPE_BUILD/bench/. Needs Debian's python3-torch for the PyTorch side.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${TOKPIPE_BUILD:-build}
reps=${1:-30}
threads=${BENCH_THREADS:-2}
work=$build/bench
py=/usr/bin/python3

[ -f "$build/lib/libtokpipe_runtime.a" ] || { echo "bench: no $build/lib/libtokpipe_runtime.a; build the tree first" >&2; exit 2; }
mkdir -p "$work"
${CC:-cc} -O2 -fopenmp -Iruntime bench/kernels_forward.c "$build/lib/libtokpipe_runtime.a" \
  -lopenblas -lm -o "$work/kernels_forward"

export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
# Both sides multiply with Debian's OpenBLAS: the same core for both.
. bench/openblas_core.sh
openblas_core "$work/kernels_forward" 1
echo "== $threads threads"
"$work/kernels_forward" "$reps" | tee "$work/kernels_tokpipe.txt"
$py bench/kernels_forward.py --threads "$threads" --reps "$reps" | tee "$work/kernels_pytorch.txt"
echo "== result"
$py bench/kernels_forward.py table "$work/kernels_tokpipe.txt" "$work/kernels_pytorch.txt"
