#!/bin/sh
# The TeraPipe paper's settings (its table of GPT-3 settings 1-10) with tokpipe-plan,
# one hardware profile (tools/profiles/p3.16xlarge.json: V100 16 GB, its memory the bound)
# for every setting, no tuning. Two tables:
# 1. the paper's layout: predicted vs reported latency, batch-only baseline and TeraPipe,
#    and the speedup (settings with reported times: 1, 5, 6, 8, 9, 10; and the sequence
#    sweep, "sweep");
# 2. the joint search over (pipeline S, tensor N, data D, microbatches, slices, schedule)
#    on the paper's device count and batch against the paper's hand-picked (S, N, D) with
#    TeraPipe's slicing: both predicted by the same model, the ratio, and the tokpipec
#    command line that compiles the search's choice (bench/compile_paper.sh runs them).
# Settings 2, 3, 4 and 7 have no reported times in the paper: their layouts (batch, S, N, D) are the
# paper authors' own (github.com/zhuohan123/terapipe, latency_model.py's inputs, the
# paper's Table 1); no reported times for them here.
# usage: bench/plan_paper.sh [BUILD_DIR] [--settings 1,2,..,10,sweep] [-- extra tokpipe-plan options]
build=build settings=1,2,3,4,5,6,7,8,9,10,sweep
case $1 in -*|'') ;; *) build=$1; shift ;; esac
while [ $# -gt 0 ]; do
  case $1 in
  --settings) settings=$2; shift 2 ;;
  --) shift; break ;;
  *) echo "plan_paper.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
extra="$*"
plan=$build/bin/tokpipe-plan
[ -x "$plan" ] || { echo "plan_paper.sh: $plan not built" >&2; exit 2; }

# field NAME: a top-level number of tokpipe-plan --json (one key per line)
field() { sed -n "s/^  \"$1\": \([-0-9.e+]*\),\{0,1\}$/\1/p"; }
joint_time() { sed -n 's/^  "joint": {"iteration_time_s": \([-0-9.e+]*\),.*/\1/p'; }
joint_schedule() { sed -n 's/^  "joint": .*"schedule": "\([a-z0-9]*\)".*/\1/p'; }
command_line() { sed -n 's/^  "joint": .*"tokpipec": "\(.*\)"},$/\1/p'; }
fits() { sed -n 's/^  "fits_memory": \([a-z]*\)$/\1/p'; }

# setting N: "model batch data pipe tensor seq reported_without reported_with" (- = not
# reported in the paper)
setting() {
  case $1 in
  1) echo gpt3-1b 128 8 24 1 2048 1.517 1.254 ;;
  2) echo gpt3-1b 72 2 12 8 2048 - - ;;
  3) echo gpt3-1b 72 1 24 8 2048 - - ;;
  4) echo gpt3-13b 32 2 20 8 2048 - - ;;
  5) echo gpt3-13b 32 1 40 8 2048 1.863 1.328 ;;
  6) echo gpt3-44b 8 4 96 1 2048 13.319 7.103 ;;
  7) echo gpt3-44b 8 2 24 8 2048 - - ;;
  8) echo gpt3-44b 8 1 48 8 2048 2.662 1.111 ;;
  9) echo gpt3-175b 2 1 96 4 2048 9.990 1.481 ;;
  10) echo gpt3-175b 2 1 48 8 2048 5.822 1.160 ;;
  sweep) printf '%s\n' "gpt3-13b 8 1 40 8 4096 2.526 0.913" "gpt3-13b 4 1 40 8 6144 3.754 0.756" \
       "gpt3-13b 2 1 40 8 8192 4.978 0.636" ;;
  *) echo "plan_paper.sh: no setting '$1' (1..10, sweep)" >&2; exit 2 ;;
  esac
}
spec() { # model seq: the tokpipe-plan --model description
  case $1 in
  gpt3-13b) echo "layers=40,hidden=5120,heads=40,seq=$2,vocab=50257" ;;
  *) echo "$1" ;;
  esac
}
for s in $(echo "$settings" | tr , ' '); do setting "$s" >/dev/null || exit 2; done
all=$(for s in $(echo "$settings" | tr , ' '); do setting "$s" | sed "s/^/$s /"; done)
tmp=${TMPDIR:-/tmp}/plan_paper.$$
mkdir -p "$tmp" || exit 1
trap 'rm -rf "$tmp"' EXIT

echo "1. The paper's layouts: predicted (p3.16xlarge profile) vs reported iteration time (s)"
printf '%-8s %-10s %5s %6s | %8s %8s %8s | %8s %8s %8s | %7s %7s %6s\n' \
  setting model batch L "w/o rep" "w/o pred" err "with rep" "w/ pred" err "x rep" "x pred" err
echo "$all" | while read -r name model batch data pipe tensor seq rw rt; do
  [ "$rw" = - ] && continue
  out=$($plan --model "$(spec "$model" "$seq")" --hardware p3.16xlarge --gpus $((data * pipe * tensor)) \
        --pipeline "$pipe" --tensor "$tensor" --data "$data" --batch "$batch" --no-joint --json $extra 2>&1) || {
    echo "$name: $out"; continue; }
  pw=$(echo "$out" | field baseline_time_s)
  pt=$(echo "$out" | field iteration_time_s)
  awk -v n="$name" -v m="$model" -v b="$batch" -v L="$seq" -v rw="$rw" -v rt="$rt" -v pw="$pw" -v pt="$pt" 'BEGIN {
    rs = rw / rt; ps = pw / pt
    printf "%-8s %-10s %5d %6d | %8.3f %8.3f %+7.0f%% | %8.3f %8.3f %+7.0f%% | %6.2fx %6.2fx %+5.0f%%\n",
      n, m, b, L, rw, pw, 100 * (pw - rw) / rw, rt, pt, 100 * (pt - rt) / rt, rs, ps, 100 * (ps - rs) / rs }'
done

echo
echo "2. Joint search over (S, N, D, microbatches, slices, schedule) under 16 GiB per V100 vs the paper's"
echo "   (S, N, D) with TeraPipe's slicing; predicted iteration time (s); ratio = paper / search"
printf '%-7s %-9s %4s %5s %4s | %-12s %8s %5s %8s | %-12s %8s %-5s | %6s %7s\n' setting model GPUs batch L \
  "paper SxNxD" TeraPipe fits joint "search SxNxD" joint sched ratio "search"
echo "$all" | while read -r name model batch data pipe tensor seq rw rt; do
  gpus=$((data * pipe * tensor))
  m=$(spec "$model" "$seq")
  layout="--gpus $gpus --pipeline $pipe --tensor $tensor --data $data --batch $batch"
  # shellcheck disable=SC2086 # words
  terapipe=$($plan --model "$m" --hardware p3.16xlarge $layout --no-joint --json $extra 2>&1) || {
    echo "$name: $terapipe"; continue; }
  # shellcheck disable=SC2086
  paper=$($plan --model "$m" --hardware p3.16xlarge $layout --json $extra 2>&1) || echo "$paper" >"$tmp/note.$name"
  start=$(date +%s.%N)
  found=$($plan --model "$m" --hardware p3.16xlarge --gpus $gpus --search all --batch "$batch" --json $extra 2>&1) || {
    echo "$name: $found"; continue; }
  took=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
  pt=$(echo "$terapipe" | field iteration_time_s) pf=$(echo "$terapipe" | fits)
  pj=$(echo "$paper" | joint_time)
  [ -z "$pj" ] && pj=-  # no joint plan of the paper's layout fits (the note below says why)
  S=$(echo "$found" | field pipeline) N=$(echo "$found" | field tensor) D=$(echo "$found" | field data)
  jt=$(echo "$found" | joint_time)
  echo "$name: $(echo "$found" | command_line)" >>"$tmp/commands"
  awk -v n="$name" -v m="$model" -v g=$gpus -v b="$batch" -v L="$seq" -v p="${pipe}x${tensor}x${data}" -v pt="$pt" \
      -v pf="$pf" -v pj="$pj" -v s="${S}x${N}x${D}" -v jt="$jt" -v sc="$(echo "$found" | joint_schedule)" -v took="$took" 'BEGIN {
    printf "%-7s %-9s %4d %5d %4d | %-12s %8s %5s %8s | %-12s %8.4g %-5s | %5.2fx %6.1fs\n", n, m, g, b, L, p,
      sprintf("%.4g", pt), pf == "true" ? "yes" : "no", pj == "-" ? "-" : sprintf("%.4g", pj), s, jt, sc, pt / jt, took }'
done
for f in "$tmp"/note.*; do [ -f "$f" ] && echo "paper's layout, setting ${f##*.}, joint search: $(cat "$f")"; done
echo
echo "tokpipec command lines of the search's choices (MODEL.onnx: the setting's model, bench/gpt3_onnx.py):"
cat "$tmp/commands" 2>/dev/null
