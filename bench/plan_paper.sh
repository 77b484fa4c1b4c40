#!/bin/sh
# Reproduces the TeraPipe paper's table (../shared/reference/terapipe.md section 5) with
# tokpipe-plan: predicted vs reported latency (batch-only baseline and TeraPipe) and
# speedup for settings 1, 5, 6, 8, 9, 10 and the sequence-length sweep, then what the
# joint search (1f1b, stage cuts, recomputation, memory bound) gains over TeraPipe's plan.
# One hardware profile (tools/profiles/p3.16xlarge.json) for every setting, no tuning.
# usage: bench/plan_paper.sh [BUILD_DIR] [extra tokpipe-plan options]
build=${1:-build}
[ $# -gt 0 ] && shift
extra="$*"
plan=$build/bin/tokpipe-plan
[ -x "$plan" ] || { echo "plan_paper.sh: $plan not built" >&2; exit 2; }

# field NAME: a top-level number of tokpipe-plan --json (one key per line)
field() { sed -n "s/^  \"$1\": \([-0-9.e+]*\),\{0,1\}$/\1/p"; }
joint() { sed -n 's/^  "joint": {"iteration_time_s": \([-0-9.e+]*\), "speedup_over_terapipe": \([0-9.]*\), "schedule": "\([a-z0-9]*\)", "recompute": \([a-z]*\).*/\1 \2 \3 \4/p'; }

printf '%-8s %-10s %5s %6s | %8s %8s %8s | %8s %8s %8s | %7s %7s %6s | %s\n' \
  setting model batch L "w/o rep" "w/o pred" err "with rep" "w/ pred" err "x rep" "x pred" err "joint (s, gain, schedule, recompute)"
row() { # name model batch data pipe tensor seq rep_without rep_with
  name=$1 model=$2 batch=$3 data=$4 pipe=$5 tensor=$6 seq=$7 rw=$8 rt=$9
  case $model in
  gpt3-13b) spec="layers=40,hidden=5120,heads=40,seq=$seq,vocab=50257" ;;
  *) spec=$model ;;
  esac
  out=$($plan --model "$spec" --hardware p3.16xlarge --gpus $((data * pipe * tensor)) \
        --pipeline $pipe --tensor $tensor --data $data --batch $batch --json $extra 2>&1) || {
    echo "$name: $out"; return; }
  pw=$(echo "$out" | field baseline_time_s)
  pt=$(echo "$out" | field iteration_time_s)
  j=$(echo "$out" | joint)
  awk -v n="$name" -v m="$model" -v b="$batch" -v L="$seq" -v rw="$rw" -v rt="$rt" -v pw="$pw" -v pt="$pt" -v j="$j" 'BEGIN {
    rs = rw / rt; ps = pw / pt
    printf "%-8s %-10s %5d %6d | %8.3f %8.3f %+7.0f%% | %8.3f %8.3f %+7.0f%% | %6.2fx %6.2fx %+5.0f%% | %s\n",
      n, m, b, L, rw, pw, 100 * (pw - rw) / rw, rt, pt, 100 * (pt - rt) / rt, rs, ps, 100 * (ps - rs) / rs, j }'
}
row 1 gpt3-1b 128 8 24 1 2048 1.517 1.254
row 5 gpt3-13b 32 1 40 8 2048 1.863 1.328
row 6 gpt3-44b 8 4 96 1 2048 13.319 7.103
row 8 gpt3-44b 8 1 48 8 2048 2.662 1.111
row 9 gpt3-175b 2 1 96 4 2048 9.990 1.481
row 10 gpt3-175b 2 1 48 8 2048 5.822 1.160
row sweep gpt3-13b 8 1 40 8 4096 2.526 0.913
row sweep gpt3-13b 4 1 40 8 6144 3.754 0.756
row sweep gpt3-13b 2 1 40 8 8192 4.978 0.636
