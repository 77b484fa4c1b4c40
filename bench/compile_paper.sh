#!/bin/sh
# Paper-scale compiles (issue 14): for the TeraPipe paper's settings
# (../shared/reference/terapipe.md section 5: GPT3-1B, 13B, 44B, 175B at sequence 2048),
# writes a full-size GPT-3-shaped ONNX model whose weights are a sparse external-data file
# (bench/gpt3_onnx.py: never written, so nothing but metadata can be read cheaply), then
# times `tokpipec --emit=memory` and `tokpipec -o plan.c` with the paper's batch, data
# replicas and pipeline stages, printing wall time and max resident memory of each, and
# plan.c's size (lines, bytes); with --cc also the time of `cc -O2 -c plan.c`.
# usage: bench/compile_paper.sh [BUILD_DIR] [--settings 1,5,..] [--slices N|auto] [--cc]
#                               [--work DIR] [-- extra tokpipec options]
# The models are kept in the work folder (default /tmp/tokpipe-paper) for the next run.
build=build settings=1,5,6,8,9,10 slices=16 cc=0 work=${TMPDIR:-/tmp}/tokpipe-paper
case $1 in -*|'') ;; *) build=$1; shift ;; esac
while [ $# -gt 0 ]; do
  case $1 in
  --settings) settings=$2; shift 2 ;;
  --slices) slices=$2; shift 2 ;;
  --cc) cc=1; shift ;;
  --work) work=$2; shift 2 ;;
  --) shift; break ;;
  *) echo "compile_paper.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
extra="$*"
here=$(dirname "$0")
tokpipec=$build/bin/tokpipec
[ -x "$tokpipec" ] || { echo "compile_paper.sh: $tokpipec not built" >&2; exit 2; }
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
    awk '{ printf "%7.1f s %7.0f MiB", $1, $2 / 1024 }' "$log.time"
  else
    printf '%17s' "failed (see $log)"
  fi
}

printf '%-3s %-9s %5s %3s %5s %6s | %-22s | %-22s | %9s %11s' setting model batch dp stages slices \
  "--emit=memory" "-o plan.c" "lines" "bytes"
[ $cc = 1 ] && printf ' | %s' "cc -O2 -c"
echo
for s in $(echo "$settings" | tr , ' '); do
  case $s in # model batch dp stages (tensor parallelism: tokpipec's --tensor, where built)
  1) set -- gpt3-1b 128 8 24 ;;
  5) set -- gpt3-13b 32 1 40 ;;
  6) set -- gpt3-44b 8 4 96 ;;
  8) set -- gpt3-44b 8 1 48 ;;
  9) set -- gpt3-175b 2 1 96 ;;
  10) set -- gpt3-175b 2 1 48 ;;
  *) echo "compile_paper.sh: no setting $s in the paper's table (1, 5, 6, 8, 9, 10)" >&2; exit 2 ;;
  esac
  dir=$(model "$1") || exit 1
  out=$work/setting$s
  # the plan is for the paper's cluster, not this machine: no memory bound
  args="$dir/model.onnx --batch $2 --dp $3 --stages $4 --slices $slices --max-memory 1125899906842624 $extra"
  printf '%-7s %-9s %5s %3s %5s %6s | ' "$s" "$1" "$2" "$3" "$4" "$slices"
  # shellcheck disable=SC2086 # args are words
  printf '%s | ' "$(measure "$out.memory.log" "$tokpipec" $args --emit=memory)"
  # shellcheck disable=SC2086
  printf '%s | ' "$(measure "$out.plan.log" "$tokpipec" $args -o "$out.plan.c")"
  if [ -f "$out.plan.c" ]; then
    printf '%9s %11s' "$(wc -l <"$out.plan.c")" "$(wc -c <"$out.plan.c")"
    # shellcheck disable=SC2046 # pkg-config's flags are words
    [ $cc = 1 ] && printf ' | %s' "$(measure "$out.cc.log" cc -O2 $(PKG_CONFIG_PATH=$build pkg-config --cflags tokpipe) \
      -c "$out.plan.c" -o "$out.plan.o")"
  fi
  echo
  rm -f "$out.plan.c" "$out.plan.o"
done
