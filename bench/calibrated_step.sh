#!/usr/bin/env bash
# Benchmark (not a test): the calibrated planner's predicted step time of pipelined
# training against the measured one, on this CPU, in one run.
#
# The model is bench/train_pytorch.py's GPT (4 layers, C=256, T=256, vocabulary 256, tied
# head), exported with symbolic batch and sequence dims. Every plan is 2 stages x 2
# microbatches of 4 rows (--batch 8), under mpirun -np 2, with the slicings and schedules
# below, compiled with --profile-grid auto. The machine is shared and its speed drifts by
# up to 2x within minutes, so the plans run in ROUNDS interleaved rounds; in each, every
# plan's trainer profiles its stages (mpirun -np 2 trainer --profile: every rank times its
# own stage at once), tokpipe-plan --calibrate predicts the plan from that profile, and the
# trainer trains STEPS steps with --log (its median "ms", step 1 left out, is that round's
# measurement). A plan's prediction and measurement are the medians over the rounds. Each
# round also shows how far the profile's passes over the grid spread (the same work timed
# again and again: the machine's own drift while profiling).
#
#   bash bench/calibrated_step.sh [STEPS]          (default 20)
#   env: TOKPIPE_BUILD (build folder, default build), BENCH_THREADS (OpenMP threads per
#        rank, default 1: 2 ranks on 2 cores), BENCH_ROUNDS (default 3), BENCH_TOL
#        (percent, default 15)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${TOKPIPE_BUILD:-build}
steps=${1:-20}
rounds=${BENCH_ROUNDS:-3}
tol=${BENCH_TOL:-15}
work=$build/bench/calibrated
mpi=(timeout -k 5 900 mpirun --allow-run-as-root --oversubscribe -np 2)
shape=(--batch 8 --seq 256 --stages 2 --microbatches 2)
plans=("4 1f1b" "4 gpipe" "96,64,48,48 1f1b" "96,64,48,48 gpipe" "1 gpipe" "8 1f1b")

for tool in tokpipec tokpipe-plan; do
  [ -x "$build/bin/$tool" ] || { echo "bench: no $build/bin/$tool; build the tree first" >&2; exit 2; }
done
mkdir -p "$work"
. bench/bench_gpt.sh
export_bench_gpt "$work"

export OMP_NUM_THREADS=${BENCH_THREADS:-1}
export OPENBLAS_NUM_THREADS=$OMP_NUM_THREADS
echo "== compile: ${shape[*]} x {${plans[*]}} (slices schedule)"
for i in "${!plans[@]}"; do
  read -r slices schedule <<<"${plans[$i]}"
  "$build/bin/tokpipec" "$work/model.onnx" --exe "$work/plan$i" "${shape[@]}" --slices "$slices" \
    --schedule "$schedule" --profile-grid auto
done
. bench/openblas_core.sh
openblas_core "$work/plan0" --version
echo "$OMP_NUM_THREADS thread(s) per rank; load: $(cut -d' ' -f1-3 /proc/loadavg)"

echo "== $rounds rounds of, per plan: profile (mpirun -np 2 planI --profile), predict, train $steps steps"
for round in $(seq "$rounds"); do
  for i in "${!plans[@]}"; do
    read -r slices schedule <<<"${plans[$i]}"
    tag=$i.$round
    "${mpi[@]}" "$work/plan$i" --init "$work/model.onnx" --profile "$work/prof$tag.json" 2>"$work/prof$tag.err" ||
      { echo "bench: plan$i --profile failed: $(tail -3 "$work/prof$tag.err")" >&2; exit 1; }
    "$build/bin/tokpipe-plan" "$work/model.onnx" --seq 256 --calibrate "$work/prof$tag.json" --microbatches 2 \
      --slices "$slices" --schedule "$schedule" --json >"$work/pred$tag.json"
    jq '.iteration_time_s * 1000' "$work/pred$tag.json" >>"$work/pred$i.txt.$$"
    jq -r 'if .drift then "+\(.drift * 100 | round)%" else "?" end' "$work/prof$tag.json" >>"$work/drift$i.txt.$$"
    "${mpi[@]}" "$work/plan$i" --init "$work/model.onnx" --data "$work/train.bin" --steps "$steps" \
      --log "$work/plan$tag.jsonl" 2>"$work/plan$tag.err"
    median_step_ms "$work/plan$tag.jsonl" >>"$work/meas$i.txt.$$"
  done
  echo "round $round done; load: $(cut -d' ' -f1-3 /proc/loadavg)"
done

printf '\n%-24s %12s %12s %8s  %-6s %s\n' "plan (slices schedule)" "predicted ms" "measured ms" "error" "${tol}%" \
  "per round: predicted / measured (the profile's pass spread)"
fails=0
for i in "${!plans[@]}"; do
  pred=$(median <"$work/pred$i.txt.$$") meas=$(median <"$work/meas$i.txt.$$")
  rounds_text=$(paste -d/ "$work/pred$i.txt.$$" "$work/meas$i.txt.$$" "$work/drift$i.txt.$$" |
    awk '{ split($0, x, "/"); printf "%.0f/%.0f (%s) ", x[1], x[2], x[3] }')
  rm -f "$work/pred$i.txt.$$" "$work/meas$i.txt.$$" "$work/drift$i.txt.$$"
  awk -v p="$pred" -v m="$meas" -v name="${plans[$i]}" -v tol="$tol" -v per="$rounds_text" 'BEGIN {
    e = 100 * (p - m) / m; ok = (e <= tol && e >= -tol)
    printf "%-24s %12.1f %12.1f %+7.1f%%  %-6s %s\n", name, p, m, e, ok ? "PASS" : "FAIL", per
    exit !ok }' || fails=$((fails + 1))
done
echo "(predicted: tokpipe-plan MODEL --seq 256 --calibrate $work/profI.R.json --microbatches 2 --slices S --schedule K;"
echo " measured: median step ms of $steps steps, step 1 left out; both the median over $rounds rounds)"
[ "$fails" = 0 ] && echo "PASS: every plan within ${tol}%" || { echo "FAIL: $fails plan(s) off by more than ${tol}%"; exit 1; }
