#!/usr/bin/env bash
# Benchmark (not a test): the pipeline schedules side by side on this CPU. The model is
# bench/train_pytorch.py's GPT (4 layers, C=256, 4 heads, T=256, vocabulary 256, tied head);
# each plan is --stages 2 --batch 8 --microbatches 4 --slices 4 with one schedule of
# SCHEDULES (gpipe, 1f1b, zb, interleaved with --chunks 2; one tokpipec refuses is listed as
# such), trained STEPS steps under mpirun with 2 ranks x BENCH_THREADS threads, in ROUNDS
# interleaved rounds. Printed per schedule: the median step time (--log "ms", step 1 left
# out; the median of the rounds' medians), tokpipe-plan's predicted step (--hardware cpu,
# uncalibrated) and each rank's idle fraction measured from the trainer's --trace (the
# last round): 1 - its compute time / the wall time, from the end of its first optimizer
# step to the end of its last.
#   bash bench/schedules.sh [STEPS]          (default 10)
#   env: TOKPIPE_BUILD (default build), BENCH_THREADS (default 1), BENCH_ROUNDS (default 3),
#        SCHEDULES (default "gpipe 1f1b zb interleaved")
set -euo pipefail
cd "$(dirname "$0")/.."
build=${TOKPIPE_BUILD:-build}
steps=${1:-10}
rounds=${BENCH_ROUNDS:-3}
read -r -a schedules <<<"${SCHEDULES:-gpipe 1f1b zb interleaved}"
work=$build/bench/schedules
shape=(--batch 8 --seq 256 --stages 2 --microbatches 4 --slices 4)

for tool in tokpipec tokpipe-plan; do
  [ -x "$build/bin/$tool" ] || { echo "bench: no $build/bin/$tool; build the tree first" >&2; exit 2; }
done
mkdir -p "$work"
. bench/bench_gpt.sh
export_bench_gpt "$work"

export OMP_NUM_THREADS=${BENCH_THREADS:-1}
export OPENBLAS_NUM_THREADS=$OMP_NUM_THREADS
options() { # SCHEDULE: its tokpipec / tokpipe-plan options
  if [ "$1" = interleaved ]; then echo "--schedule interleaved --chunks 2"; else echo "--schedule $1"; fi
}
echo "== compile and predict: ${shape[*]} x {${schedules[*]}}"
ran=()
for k in "${schedules[@]}"; do
  # shellcheck disable=SC2046 # words
  if ! "$build/bin/tokpipec" "$work/model.onnx" -o "$work/$k.c" --exe "$work/$k" "${shape[@]}" $(options "$k") \
    2>"$work/$k.err"; then
    echo "$k: not compiled: $(head -1 "$work/$k.err")"
    continue
  fi
  # shellcheck disable=SC2046
  "$build/bin/tokpipe-plan" "$work/model.onnx" --seq 256 --hardware cpu --pipeline 2 --batch 8 --microbatches 4 \
    --slices 4 $(options "$k") --json >"$work/$k.pred.json" 2>"$work/$k.pred.err" || echo null >"$work/$k.pred.json"
  rm -f "$work/$k.meas"
  ran+=("$k")
done
[ ${#ran[@]} -gt 0 ] || { echo "bench: no schedule compiled" >&2; exit 1; }
. bench/openblas_core.sh
openblas_core "$work/${ran[0]}" --version
echo "2 ranks x $OMP_NUM_THREADS thread(s); load: $(cut -d' ' -f1-3 /proc/loadavg)"

for round in $(seq "$rounds"); do
  for k in "${ran[@]}"; do
    timeout -k 5 900 mpirun --allow-run-as-root --oversubscribe -np 2 "$work/$k" --init "$work/model.onnx" \
      --data "$work/train.bin" --steps "$steps" --log "$work/$k.jsonl" --trace "$work/$k.trace.json" \
      2>"$work/$k.run.err" || { echo "bench: $k failed: $(tail -3 "$work/$k.run.err")" >&2; exit 1; }
    median_step_ms "$work/$k.jsonl" >>"$work/$k.meas"
  done
  echo "round $round done; load: $(cut -d' ' -f1-3 /proc/loadavg)"
done

# idle TRACE: "rank0 rank1 ..." idle fractions, after each rank's first optimizer step
idle() {
  jq -r '[.traceEvents[] | select(.ph == "X")] | group_by(.pid) | map(
      (map(select(.name | startswith("optimizer-step")) | .ts + .dur) | min) as $a
      | (map(.ts + .dur) | max) as $b
      | ([.[] | select(.cat == "compute" and .ts >= $a) | .dur] | add // 0) as $busy
      | (1 - $busy / ($b - $a)) * 100 | floor / 100 | tostring) | join(" ")' "$1"
}
printf '\n%-12s %12s %12s | %s\n' schedule "measured ms" "predicted ms" "idle fraction per rank (trace)"
for k in "${ran[@]}"; do
  meas=$(median <"$work/$k.meas")
  pred=$(jq 'if . == null then "-" else .iteration_time_s * 1000 end' "$work/$k.pred.json")
  printf '%-12s %12.1f %12s | %s\n' "$k" "$meas" "$(printf '%.1f' "$pred" 2>/dev/null || echo -)" \
    "$(idle "$work/$k.trace.json")"
done
