#!/usr/bin/env bash
# Benchmark (not a test): the fused ops of modern blocks (RMSNorm, Rotary, SwiGLU) against
# the primitive chains they replace, on a Llama-shaped model (bench/fused_ops.py: 4 layers,
# 256 wide, T = 256): two trainers compiled by tokpipec --exe from the same export, one
# with --no-fuse, trained from the same weights on the same tokens, alternately, ROUNDS
# times each; prints each trainer's median wall ms per step (the first step of a run is
# not counted), its median CPU ms per step (the CPU time of a STEPS-step run less that of
# a 1-step run, over STEPS - 1: steadier than the wall clock on a shared machine) and the
# speedups.
#
#   bash bench/fused_ops.sh [STEPS] [ROUNDS]       (default 6 steps, 3 rounds)
#   env: TOKPIPE_BUILD (default build), BENCH_THREADS (default 2), BENCH_BATCH (default 4),
#        BENCH_PYTHON (a python with transformers, default /work/hfvenv/bin/python),
#        BENCH_MODEL (an export to use instead of making one)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${TOKPIPE_BUILD:-build}
steps=${1:-6}
rounds=${2:-3}
threads=${BENCH_THREADS:-2}
B=${BENCH_BATCH:-4} T=256
work=$build/bench-fused
model=${BENCH_MODEL:-$work/llama.onnx}

[ -x "$build/bin/tokpipec" ] || { echo "bench: no $build/bin/tokpipec; build the tree first" >&2; exit 2; }
mkdir -p "$work"
if [ ! -e "$model" ]; then
  echo "== export the Llama-shaped model ($model)"
  "${BENCH_PYTHON:-/work/hfvenv/bin/python}" bench/fused_ops.py "$model" "$B" "$T"
fi
head -c 200000 /dev/urandom >"$work/text.bin" # byte tokens: the vocabulary is 256
"$build/bin/tokpipe-tokens" "$work/text.bin" -o "$work/train.bin" 2>/dev/null
echo "== compile both trainers (batch $B, seq $T)"
"$build/bin/tokpipec" "$model" --batch "$B" --seq "$T" --exe "$work/fused"
"$build/bin/tokpipec" "$model" --batch "$B" --seq "$T" --no-fuse --exe "$work/primitive"

export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
cpu() { # cpu SECONDS_FILE CMD...: runs CMD, appends its user + system seconds
  local f=$1
  shift
  /usr/bin/time -f "%U %S" -o "$f.t" "$@" >/dev/null 2>&1
  awk '{print $1 + $2}' "$f.t" >>"$f"
}
rm -f "$work"/*.jsonl "$work"/*.cpu*
for r in $(seq "$rounds"); do
  for k in fused primitive; do
    cpu "$work/$k.cpu1" "$work/$k" --init "$model" --data "$work/train.bin" --steps 1
    cpu "$work/$k.cpuN" "$work/$k" --init "$model" --data "$work/train.bin" --steps "$steps" --log "$work/$k.$r.jsonl"
  done
done
median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2)}'; }
wall() { for f in "$work/$1".*.jsonl; do tail -n +2 "$f"; done | sed -E 's/.*"ms": ([0-9.]+).*/\1/' | median; }
cpu_ms() { paste "$work/$1.cpu1" "$work/$1.cpuN" | awk -v n="$steps" '{print ($2 - $1) * 1000 / (n - 1)}' | median; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", a / b}'; }
fw=$(wall fused) pw=$(wall primitive) fc=$(cpu_ms fused) pc=$(cpu_ms primitive)
echo "== $threads threads, $rounds x $steps steps, ms per step (median): wall fused $fw, primitive $pw," \
  "speedup $(ratio "$pw" "$fw"); CPU fused $fc, primitive $pc, speedup $(ratio "$pc" "$fc")"
