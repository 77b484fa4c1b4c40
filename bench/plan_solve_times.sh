#!/bin/sh
# Solve times of the exact slicing DP (passes/planner/slicing.c) at granularity 1 for
# sequence lengths 2048, 4096 and 8192 on the GPT3-13B setting of the paper's sweep
# (pipeline 40, tensor 8, p3.16xlarge), batch 1 and 4 (joint batch x token knapsack).
# Prints the DP's own time (not building the cost table) and its number of DP runs.
# usage: bench/plan_solve_times.sh [BUILD_DIR]
plan=${1:-build}/bin/tokpipe-plan
[ -x "$plan" ] || { echo "plan_solve_times.sh: $plan not built" >&2; exit 2; }
printf '%6s %5s %10s %8s %8s  %s\n' L batch solve_s dp_runs slices "total wall (incl. cost table, simulation)"
for L in 2048 4096 8192; do
  for B in 1 4; do
    start=$(date +%s.%N)
    out=$($plan --model layers=40,hidden=5120,heads=40,seq=$L,vocab=50257 --pipeline 40 \
          --tensor 8 --batch $B --granularity 1 --no-joint --json) || exit 1
    end=$(date +%s.%N)
    echo "$out" | jq -r --arg L $L --arg B $B --arg wall "$(echo "$end - $start" | bc)" \
      '"\($L|tonumber) \($B|tonumber) \(.solve_time_s) \(.dp_evaluations) \([.slices[].lengths|length]|add) \($wall)"' |
      awk '{ printf "%6d %5d %10.3f %8d %8d  %.2f s\n", $1, $2, $3, $4, $5, $6 }'
  done
done
