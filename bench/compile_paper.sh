#!/bin/sh
# Paper-scale compiles: for the TeraPipe paper's settings 1-10
# (its table of GPT-3 settings; bench/plan_paper.sh: GPT3-1B, 13B, 44B, 175B
# at sequence 2048 on the paper's device counts and batches), tokpipe-plan's layout search
# picks the plan (pipeline x tensor x data, microbatches, slices, schedule, storage,
# --zero and --recompute; 16 GiB per V100) and prints its tokpipec command line; this
# script runs that command as it is printed, its own --max-memory included, on a
# full-size GPT-3-shaped ONNX model whose weights are a sparse external-data file
# (bench/gpt3_onnx.py: never written, so nothing but metadata can be read cheaply), only
# MODEL.onnx and the output file put in. Printed: the plan, its options, the largest
# rank's peak by tokpipec (`--emit=memory`, the same options without the bound) beside
# the planner's (the same model: codegen/rank_memory.h) and their ratio, whether the
# compile under the bound succeeded, its wall time and max resident memory, plan.c's size,
# and with --cc the time of `cc -O2 -c plan.c`. With --slices N|L1,..|auto, the paper's
# own layout of each setting (S x N x D, one microbatch per replica, gpipe) cut into those
# slices is compiled instead (no planner's peak).
# usage: bench/compile_paper.sh [BUILD_DIR] [--settings 1,2,..] [--slices N|auto] [--cc]
#                               [--work DIR] [-- extra tokpipec options]
# The models are kept in the work folder (default /tmp/tokpipe-paper) for the next run.
build=build settings=1,2,3,4,5,6,7,8,9,10 cc=0 work=${TMPDIR:-/tmp}/tokpipe-paper slices=
case $1 in -*|'') ;; *) build=$1; shift ;; esac
while [ $# -gt 0 ]; do
  case $1 in
  --settings) settings=$2; shift 2 ;;
  --cc) cc=1; shift ;;
  --slices) slices=$2; shift 2 ;;
  --work) work=$2; shift 2 ;;
  --) shift; break ;;
  *) echo "compile_paper.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
extra="$*"
here=$(dirname "$0")
tokpipec=$build/bin/tokpipec plan=$build/bin/tokpipe-plan
for tool in "$tokpipec" "$plan"; do [ -x "$tool" ] || { echo "compile_paper.sh: $tool not built" >&2; exit 2; }; done
[ -x /usr/bin/time ] || { echo "compile_paper.sh: needs /usr/bin/time (Debian package time)" >&2; exit 2; }
mkdir -p "$work" || exit 1

# model NAME: its folder, written once (layers, hidden, heads from the paper's table)
model() {
  case $1 in
  gpt3-1b) dims="24 2048 16" ;;
  gpt3-13b) dims="40 5120 40" ;;
  gpt3-44b) dims="96 6144 48" ;;
  gpt3-175b) dims="96 12288 96" ;;
  esac
  # weights.bin is written last
  # shellcheck disable=SC2086 # dims are words
  [ -f "$work/$1/weights.bin" ] || { mkdir -p "$work/$1" && /usr/bin/python3 "$here/gpt3_onnx.py" "$work/$1" $dims >&2; } ||
    { echo "compile_paper.sh: cannot write $work/$1" >&2; exit 1; }
  echo "$work/$1"
}

# measure LOG CMD..: runs CMD under /usr/bin/time; prints "seconds max-RSS-MiB" or "failed"
measure() {
  log=$1; shift
  if /usr/bin/time -f '%e %M' -o "$log.time" "$@" >"$log" 2>&1; then
    awk '{ printf "%6.1f s %6.0f MiB", $1, $2 / 1024 }' "$log.time"
  else
    printf '%-17s' "failed (see $log)"
  fi
}

printf '%-3s %-9s %4s %5s | %-10s %3s %-6s %6s | %-30s | %10s %10s %6s | %-25s | %9s %11s' set model GPUs batch \
  "SxNxD" mb slices sched options "tokpipec" "planner" ratio "-o plan.c (bound)" "lines" "bytes"
[ $cc = 1 ] && printf ' | %s' "cc -O2 -c"
echo
for s in $(echo "$settings" | tr , ' '); do
  case $s in # model gpus batch and the paper's S N D (bench/plan_paper.sh)
  1) set -- gpt3-1b 192 128 24 1 8 ;;
  2) set -- gpt3-1b 192 72 12 8 2 ;;
  3) set -- gpt3-1b 192 72 24 8 1 ;;
  4) set -- gpt3-13b 320 32 20 8 2 ;;
  5) set -- gpt3-13b 320 32 40 8 1 ;;
  6) set -- gpt3-44b 384 8 96 1 4 ;;
  7) set -- gpt3-44b 384 8 24 8 2 ;;
  8) set -- gpt3-44b 384 8 48 8 1 ;;
  9) set -- gpt3-175b 384 2 96 4 1 ;;
  10) set -- gpt3-175b 384 2 48 8 1 ;;
  *) echo "compile_paper.sh: no setting $s in the paper's table (1..10)" >&2; exit 2 ;;
  esac
  name=$1 gpus=$2 batch=$3
  dir=$(model "$name") || exit 1
  out=$work/setting$s
  planned=0
  if [ -n "$slices" ]; then # the paper's layout, as tokpipe-plan would print it
    command="tokpipec MODEL.onnx --batch $batch --stages $4 --tensor $5 --dp $6 --microbatches 1 --slices $slices"
    command="$command --schedule gpipe --max-memory 17179869184 -o plan.c"
    layout="${4}x${5}x${6}"
  else
    found=$("$plan" --model "$name" --hardware p3.16xlarge --gpus "$gpus" --batch "$batch" --json 2>&1) || {
      echo "$s: tokpipe-plan: $found"; continue; }
    command=$(echo "$found" | sed -n 's/.*"tokpipec": "\([^"]*\)".*/\1/p')
    layout=$(echo "$found" | sed -n 's/^  "\(pipeline\|tensor\|data\)": \([0-9]*\),$/\2/p' | paste -sd x)
    planned=$(echo "$found" | sed -n 's/.*"memory": {[^}]*"peak": \([0-9]*\)}.*/\1/p')
  fi
  # the command's words (plain: tokpipe-plan quotes only odd ones), MODEL.onnx and -o put in
  # shellcheck disable=SC2086
  set -- $command
  [ "$1 $2" = "tokpipec MODEL.onnx" ] || { echo "$s: not a command line: $command"; continue; }
  shift 2
  args=$(echo "$*" | sed 's/ -o plan\.c$//')
  # settings of one model, device count and batch get the same plan: compiled once
  same=$(sed -n "s/^\([0-9]*\) $name $args\$/\1/p" "$work/compiled.$$" 2>/dev/null | head -1)
  echo "$s $name $args" >>"$work/compiled.$$"
  [ -n "$same" ] && { echo "$s   $name: the plan of setting $same"; continue; }
  mb=$(echo "$args" | sed -n 's/.*--microbatches \([0-9]*\).*/\1/p')
  nslices=$(echo "$args" | sed -n 's/.*--slices \([0-9a-z,]*\).*/\1/p' | awk -F, '{ print (NF > 1 ? NF : $1) }')
  sched=$(echo "$args" | sed -n 's/.*--schedule \([a-z0-9]*\).*/\1/p')
  options=$(echo "$args" | grep -o -- '--\(precision\|zero\|recompute\) [a-z0-9]*' | paste -sd ' ')
  printf '%-3s %-9s %4s %5s | %-10s %3s %-6s %6s | %-30s | ' "$s" "$name" "$gpus" "$batch" "$layout" "$mb" "$nslices" \
    "$sched" "${options:-fp32}"
  unbound=$(echo "$args" | sed 's/ --max-memory [0-9]*//')
  # the largest rank's peak in tokpipec's memory plan, beside the planner's
  # shellcheck disable=SC2086 # args are words
  "$tokpipec" "$dir/model.onnx" $unbound $extra --emit=memory >"$out.memory.log" 2>&1
  awk -v planned="$planned" '$1 == "peak" { if ($2 > max) max = $2 } END {
    if (!max) { printf "%10s %10s %6s | ", "failed", "-", "-"; exit }
    printf "%6.2f GiB %6.2f GiB ", max / 2^30, planned / 2^30
    if (planned) printf "%6.3f | ", max / planned; else printf "%6s | ", "-" }' "$out.memory.log"
  # shellcheck disable=SC2086
  printf '%s | ' "$(measure "$out.plan.log" "$tokpipec" "$dir/model.onnx" $args $extra -o "$out.plan.c")"
  if [ -f "$out.plan.c" ]; then
    printf '%9s %11s' "$(wc -l <"$out.plan.c")" "$(wc -c <"$out.plan.c")"
    # shellcheck disable=SC2046 # pkg-config's flags are words
    [ $cc = 1 ] && printf ' | %s' "$(measure "$out.cc.log" cc -O2 $(PKG_CONFIG_PATH=$build pkg-config --cflags tokpipe) \
      -c "$out.plan.c" -o "$out.plan.o")"
  fi
  echo
  echo "    tokpipec MODEL.onnx $args -o plan.c"
  rm -f "$out.plan.c" "$out.plan.o"
done
rm -f "$work/compiled.$$"
