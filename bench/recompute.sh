#!/usr/bin/env bash
# Benchmark (not a test): activation recomputation on bench/train_pytorch.py's GPT (4 layers,
# C=256, 4 heads, T=256, vocabulary 256, tied head). One plan, compiled with tokpipec
# --recompute none, selective and full (default --batch 8 --seq 256, one process; other
# tokpipec options after the step count replace them), each trained STEPS steps from the
# model's weights on the same tokens, in ROUNDS interleaved rounds. Printed per mode:
#   step ms       the median "ms" of the trainer's --log (step 1 left out), median over rounds
#   arena         the activation arena of stage 0 (tokpipec --emit=memory)
#   peak          rank 0's peak of --emit=memory (parameters, gradients, AdamW, activations)
#   max RSS       the trainer's measured maximum resident set (/usr/bin/time), largest round
# and each mode's step time and peaks against none. The step-1 losses of the three agree to
# the bit (checked: recomputation changes nothing but time and memory).
#   bash bench/recompute.sh [STEPS [TOKPIPEC OPTIONS...]]     (default 10)
#   env: TOKPIPE_BUILD (default build), BENCH_THREADS (OpenMP threads, default 2),
#        BENCH_ROUNDS (default 3)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${TOKPIPE_BUILD:-build}
steps=${1:-10}
shift $(($# > 0 ? 1 : 0))
shape=("$@")
[ ${#shape[@]} -gt 0 ] || shape=(--batch 8 --seq 256)
rounds=${BENCH_ROUNDS:-3}
work=$build/bench/recompute
modes=(none selective full)

[ -x "$build/bin/tokpipec" ] || { echo "bench: no $build/bin/tokpipec; build the tree first" >&2; exit 2; }
[[ $("$build/bin/tokpipec" --help) == *--recompute* ]] || { echo "bench: this tokpipec has no --recompute" >&2; exit 2; }
[ -x /usr/bin/time ] || { echo "bench: needs /usr/bin/time (Debian package time) for the RSS" >&2; exit 2; }
mkdir -p "$work"
. bench/bench_gpt.sh
export_bench_gpt "$work"

export OMP_NUM_THREADS=${BENCH_THREADS:-2}
export OPENBLAS_NUM_THREADS=$OMP_NUM_THREADS
echo "== compile: ${shape[*]} --recompute {${modes[*]}}"
# bytes_of FILE PATTERN: the bytes on the first line of tokpipec --emit=memory matching PATTERN
bytes_of() { awk -v p="$2" '$0 ~ p { print $2; exit }' "$1"; }
for mode in "${modes[@]}"; do
  "$build/bin/tokpipec" "$work/model.onnx" "${shape[@]}" --recompute "$mode" --emit=memory -o "$work/$mode.memory" &&
    "$build/bin/tokpipec" "$work/model.onnx" "${shape[@]}" --recompute "$mode" -o "$work/$mode.c" \
      --exe "$work/$mode" 2>"$work/$mode.err" || { echo "bench: tokpipec: $(cat "$work/$mode.err")" >&2; exit 1; }
done
. bench/openblas_core.sh
openblas_core "$work/none" --version
echo "$OMP_NUM_THREADS thread(s); load: $(cut -d' ' -f1-3 /proc/loadavg)"

for round in $(seq "$rounds"); do
  for mode in "${modes[@]}"; do
    tag=$mode.$round
    /usr/bin/time -f %M -o "$work/$tag.rss" "$work/$mode" --init "$work/model.onnx" --data "$work/train.bin" \
      --steps "$steps" --log "$work/$tag.jsonl" 2>"$work/$tag.err" ||
      { echo "bench: $mode failed: $(tail -3 "$work/$tag.err")" >&2; exit 1; }
    median_step_ms "$work/$tag.jsonl" >>"$work/$mode.ms.$$"
    tail -1 "$work/$tag.rss" >>"$work/$mode.kib.$$"
    jq -c 'select(.step == 1) | .loss' "$work/$tag.jsonl" >>"$work/$mode.loss.$$"
  done
  echo "round $round done; load: $(cut -d' ' -f1-3 /proc/loadavg)"
done

for mode in selective full; do
  cmp -s "$work/none.loss.$$" "$work/$mode.loss.$$" ||
    { echo "bench: --recompute $mode changes step 1's loss: $(paste "$work/none.loss.$$" "$work/$mode.loss.$$")" >&2; exit 1; }
done
printf '\n%-10s %9s %8s | %14s %14s %14s | %s\n' recompute "step ms" "/ none" "arena MiB" "peak MiB" "max RSS MiB" \
  "peak, RSS / none"
ms0= peak0= rss0=
for mode in "${modes[@]}"; do
  ms=$(median <"$work/$mode.ms.$$") rss=$(sort -n "$work/$mode.kib.$$" | tail -1)
  arena=$(bytes_of "$work/$mode.memory" '^  arena') peak=$(bytes_of "$work/$mode.memory" '^  peak')
  rm -f "$work/$mode.ms.$$" "$work/$mode.kib.$$" "$work/$mode.loss.$$"
  [ -z "$ms0" ] && ms0=$ms peak0=$peak rss0=$rss
  awk -v m="$mode" -v ms="$ms" -v ms0="$ms0" -v a="$arena" -v p="$peak" -v p0="$peak0" -v r="$rss" -v r0="$rss0" 'BEGIN {
    printf "%-10s %9.1f %8.2f | %14.1f %14.1f %14.1f | %.2f, %.2f\n", m, ms, ms / ms0, a / 1048576, p / 1048576,
      r / 1024, p / p0, r / r0 }'
done
echo "(tokpipec MODEL ${shape[*]} --recompute MODE; step: median ms of $steps steps, step 1 left out, median"
echo " over $rounds rounds; arena and peak: tokpipec --emit=memory, stage 0 / rank 0; max RSS: /usr/bin/time)"
