#!/usr/bin/env bash
# Benchmark (not a test): the planner's tensor-parallel terms against measured steps on
# this CPU. The model is bench/train_pytorch.py's GPT (4 layers, C=256, 4 heads, T=256,
# vocabulary 256, tied head). Plans, each --batch 8 --microbatches 2 --slices 4, gpipe:
#   S=1 N=1 (one process), S=1 N=2 (tensor ranks), S=2 N=1 (pipeline stages)
# compiled with tokpipec (--tensor) and trained STEPS steps under mpirun (--log: the median
# "ms", step 1 left out), in ROUNDS interleaved rounds; predicted by tokpipe-plan --hardware
# cpu (the analytic model, uncalibrated: tools/profiles/cpu.json) for the same flags.
# Printed side by side: predicted and measured step, and each plan's ratio to the
# one-process plan (the ratio isolates the layout's terms: compute / N plus the 4
# all-reduces of b*l*C per layer and slice for N=2), with the all-reduce calls per unit
# the compiled plan makes (its .forward_reduces / .backward_reduces) next to the model's 2 + 2
# per layer (+ 4 on the edges, priced vocab-parallel as in the paper's Megatron).
#   bash bench/tensor_step.sh [STEPS]          (default 10)
#   env: TOKPIPE_BUILD (default build), BENCH_THREADS (OpenMP threads per rank, default 1),
#        BENCH_ROUNDS (default 3)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${TOKPIPE_BUILD:-build}
steps=${1:-10}
rounds=${BENCH_ROUNDS:-3}
work=$build/bench/tensor_step
shape=(--batch 8 --seq 256 --microbatches 2 --slices 4 --schedule gpipe)
plans=("1 1" "1 2" "2 1") # stages tensor

for tool in tokpipec tokpipe-plan; do
  [ -x "$build/bin/$tool" ] || { echo "bench: no $build/bin/$tool; build the tree first" >&2; exit 2; }
done
[[ $("$build/bin/tokpipec" --help) == *--tensor* ]] || { echo "bench: this tokpipec has no --tensor" >&2; exit 2; }
mkdir -p "$work"
. bench/bench_gpt.sh
export_bench_gpt "$work"

export OMP_NUM_THREADS=${BENCH_THREADS:-1}
export OPENBLAS_NUM_THREADS=$OMP_NUM_THREADS
echo "== compile and predict: ${shape[*]} x {S N: ${plans[*]}}"
for i in "${!plans[@]}"; do
  read -r S N <<<"${plans[$i]}"
  "$build/bin/tokpipec" "$work/model.onnx" -o "$work/plan$i.c" --exe "$work/plan$i" "${shape[@]}" --stages "$S" \
    --tensor "$N" 2>"$work/tokpipec$i.err" || { echo "bench: tokpipec: $(cat "$work/tokpipec$i.err")" >&2; exit 1; }
  "$build/bin/tokpipe-plan" "$work/model.onnx" --seq 256 --hardware cpu --gpus $((S * N)) --pipeline "$S" \
    --tensor "$N" --data 1 --batch 8 --microbatches 2 --slices 4 --schedule gpipe --json \
    >"$work/pred$i.json" 2>"$work/pred$i.err" || { echo "bench: tokpipe-plan: $(cat "$work/pred$i.err")" >&2; exit 1; }
done
. bench/openblas_core.sh
openblas_core "$work/plan0" --version
echo "$OMP_NUM_THREADS thread(s) per rank; load: $(cut -d' ' -f1-3 /proc/loadavg)"

for round in $(seq "$rounds"); do
  for i in "${!plans[@]}"; do
    read -r S N <<<"${plans[$i]}"
    tag=$i.$round
    timeout -k 5 900 mpirun --allow-run-as-root --oversubscribe -np $((S * N)) "$work/plan$i" --init "$work/model.onnx" \
      --data "$work/train.bin" --steps "$steps" --log "$work/plan$tag.jsonl" 2>"$work/plan$tag.err" ||
      { echo "bench: plan$i failed: $(tail -3 "$work/plan$tag.err")" >&2; exit 1; }
    median_step_ms "$work/plan$tag.jsonl" >>"$work/meas$i.txt.$$"
  done
  echo "round $round done; load: $(cut -d' ' -f1-3 /proc/loadavg)"
done

printf '\n%-10s %12s %12s %8s | %10s %10s | %s\n' "S x N" "predicted ms" "measured ms" "error" "pred / 1x1" \
  "meas / 1x1" "all-reduces per unit (fwd+bwd): compiled / model"
p0= m0=
for i in "${!plans[@]}"; do
  read -r S N <<<"${plans[$i]}"
  pred=$(jq '.iteration_time_s * 1000' "$work/pred$i.json") meas=$(median <"$work/meas$i.txt.$$")
  rm -f "$work/meas$i.txt.$$"
  [ -z "$p0" ] && p0=$pred m0=$meas
  # the compiled plan's reduce calls per unit, each stage: its tables' first entries
  compiled=$(sed -n 's/^static const int stage\([0-9]*\)_\(forward\|backward\)_reduces\[\] = {\([0-9]*\).*/\3/p' \
    "$work/plan$i.c" | awk '{ n += $1 } END { print n + 0 }')
  # the model's: 4 layers x (2 forward + 2 backward), and the vocab-parallel edges it prices (embedding
  # forward and backward, the loss's sums, the head's input gradient), which tokpipec does not split yet
  model=$([ "$N" -gt 1 ] && echo "$((4 * 4))+4" || echo 0)
  awk -v s="${S}x${N}" -v p="$pred" -v m="$meas" -v p0="$p0" -v m0="$m0" -v c="$compiled" -v mo="$model" 'BEGIN {
    printf "%-10s %12.1f %12.1f %+7.1f%% | %10.2f %10.2f | %s / %s\n", s, p, m, 100 * (p - m) / m, p / p0, m / m0, c, mo }'
done
echo "(predicted: tokpipe-plan MODEL --seq 256 --hardware cpu --pipeline S --tensor N --batch 8 --microbatches 2"
echo " --slices 4 --schedule gpipe; measured: median step ms of $steps steps, step 1 left out, median over $rounds rounds)"
