#!/bin/sh
# peak_agrees_plan.sh BIN_DIR MODEL.onnx WORK "N..." "COMMON" [tokpipe-plan options]: for each
# slice count N, tokpipe-plan predicts the plan COMMON --slices N (with the options: the
# hardware, --pipeline, --schedule), tokpipec compiles the plan it prints (-o plan.c in
# WORK: COMMON with the JSON's stages, stage cuts, slice lengths and schedule), and the
# planner's largest per-rank peak is within 10% of tokpipec's --emit=memory (both count
# through codegen/rank_memory.h). COMMON holds the options both tools take alike (--dim,
# --seq, --batch, --microbatches).
bin=$1 model=$2 work=$3 counts=$4 common=$5
shift 5
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 2
for n in $counts; do
  # shellcheck disable=SC2086 # COMMON is a list of options
  "$bin/tokpipe-plan" "$model" $common --slices "$n" "$@" --json >plan.json 2>&1 ||
    { echo "FAIL: tokpipe-plan: $(cat plan.json)"; exit 1; }
  stages=$(sed -n 's/^ *"pipeline": \([0-9]*\),$/\1/p' plan.json)
  cuts=$(sed -n 's/^ *"stage_cuts": \[0, *\([0-9, ]*\)\],$/\1/p' plan.json | tr -d ' ')
  schedule=$(sed -n 's/^ *"schedule": "\([a-z0-9]*\)",$/\1/p' plan.json)
  lengths=$(sed -n 's/^ *"slices": \[{"size": [0-9]*, "lengths": \[\([0-9,]*\)\]}.*/\1/p' plan.json)
  planned=$(sed -n 's/^ *"peak_memory_bytes": \[\([0-9, ]*\)\],$/\1/p' plan.json | tr -d ' ')
  [ -n "$stages" ] && [ -n "$schedule" ] && [ -n "$lengths" ] && [ -n "$planned" ] ||
    { echo "FAIL: no stages, schedule, slices or peaks in: $(cat plan.json)"; exit 1; }
  case $lengths in *,*) ;; *) lengths=1 ;; esac # one length would read as a slice count
  command="$bin/tokpipec $model $common --stages $stages${cuts:+ --stage-cuts $cuts} --slices $lengths --schedule $schedule"
  echo "$command"
  $command -o plan.c >tokpipec.txt 2>&1 || { echo "FAIL: it does not compile: $(cat tokpipec.txt)"; exit 1; }
  [ -s plan.c ] || { echo "FAIL: no plan.c"; exit 1; }
  $command --emit=memory >memory.txt 2>&1 || { echo "FAIL: --emit=memory: $(cat memory.txt)"; exit 1; }
  awk -v planned="$planned" -v n="$n" '$1 == "peak" { if ($2 > max) max = $2 } END {
    k = split(planned, p, ","); top = 0
    for (i = 1; i <= k; i++) if (p[i] > top) top = p[i]
    r = max / top
    printf "%d slices: tokpipec %d bytes, tokpipe-plan %d: ratio %.4f\n", n, max, top, r
    exit !(r >= 0.9 && r <= 1.1) }' memory.txt || { echo "FAIL: the peaks differ by more than 10%"; exit 1; }
done
