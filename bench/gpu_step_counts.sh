#!/usr/bin/env bash
# What a CUDA step costs besides its arithmetic, without a GPU: compiles MODEL with
# tokpipec --target cuda and the given options, builds the trainer on the emulated CUDA
# runtime of BUILD_DIR (tokpipe-cuda-emulated.pc, written by tests/cuda/CMakeLists.txt),
# trains 3 steps under mpirun with one emulated GPU per process, and prints the trainer's
# counts of the last step, one line per rank (runtime/cuda/stats.h):
#   step counts (rank R): launches=L syncs=H allocs=A queries=Q pageable=P convert_bytes=C fp32_flop_share=F
#
#   bash bench/gpu_step_counts.sh BUILD_DIR MODEL.onnx [tokpipec options]
#   e.g. bash bench/gpu_step_counts.sh build tests/fixtures/hf_gpt2/model.onnx \
#          --stages 2 --slices 2 --microbatches 2 --schedule 1f1b --precision bf16
# The options are tokpipec's (--target, -o and --exe are this script's). The training
# tokens are bytes 1..15, within any vocabulary of 16 or more. The work files go to
# STEP_COUNTS_WORK (default BUILD_DIR/bench/gpu_step_counts); a run is stopped after
# STEP_COUNTS_TIMEOUT seconds (default 600). Exit status: 0 ok, 1 a step failed (or bad
# input), 2 bad usage.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
usage() {
  echo "usage: gpu_step_counts.sh BUILD_DIR MODEL.onnx [tokpipec options]" >&2
  [ $# -gt 0 ] && echo "gpu_step_counts.sh: error: $*" >&2
  exit 2
}
die() { echo "gpu_step_counts.sh: error: $*" >&2; exit 1; }

[ $# -ge 2 ] || usage "expected a build folder and a model"
build=$1 model=$2
shift 2
[ -d "$build" ] || usage "BUILD_DIR '$build' is not a folder"
build=$(cd "$build" && pwd)
for tool in tokpipec tokpipe-tokens; do
  [ -x "$build/bin/$tool" ] || usage "no $build/bin/$tool: build it first (cmake --build $build --target $tool)"
done
[ -f "$build/tokpipe-cuda-emulated.pc" ] && [ -f "$build/lib/libtokpipe_cuda_emulated.a" ] ||
  usage "no emulated CUDA runtime in $build (tokpipe-cuda-emulated.pc, lib/libtokpipe_cuda_emulated.a): build the target tokpipe_cuda_emulated (needs a C++ compiler)"
[ -f "$model" ] || die "$model: no such file"
for opt in "$@"; do
  case $opt in
  --target | --target=* | -o | --exe | --exe=*) usage "$opt: this script compiles with --target cuda and names the outputs itself" ;;
  esac
done
timeout_s=${STEP_COUNTS_TIMEOUT:-600}
[[ $timeout_s =~ ^[1-9][0-9]*$ ]] || usage "STEP_COUNTS_TIMEOUT must be a positive number of seconds, got '$timeout_s'"
work=${STEP_COUNTS_WORK:-$build/bench/gpu_step_counts}
mkdir -p "$work" || die "cannot make $work"
steps=3

# the plan, and the trainer on the emulated runtime
"$build/bin/tokpipec" "$model" "$@" --target cuda -o "$work/plan.c" 2>"$work/tokpipec.err" ||
  die "tokpipec $model $* --target cuda: $(cat "$work/tokpipec.err")"
export PKG_CONFIG_PATH=$build${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
cc=$(pkg-config --variable=cc tokpipe-cuda-emulated) && flags=$(pkg-config --cflags --libs tokpipe-cuda-emulated) ||
  die "pkg-config tokpipe-cuda-emulated (in $build) failed"
# shellcheck disable=SC2086 # flags is a list of words
"$cc" -std=c11 "$work/plan.c" $flags -o "$work/trainer" 2>"$work/cc.err" ||
  die "compiling the plan on the emulated CUDA runtime: $(head -5 "$work/cc.err")"

# the processes the plan runs as: pipeline ranks x tensor ranks x replicas (train/plan.h;
# an interleaved plan's nstages are its ranks' chunks virtual stages each)
field() { sed -n "s/^    \.$1 = \([0-9]*\),\$/\1/p" "$work/plan.c" | head -1; }
stages=$(field nstages) dp=$(field dp) tensor=$(field tensor) rows=$(field batch) seq=$(field seq)
microbatches=$(field microbatches) chunks=$(field chunks)
[ -n "$stages" ] && [ -n "$dp" ] && [ -n "$rows" ] && [ -n "$seq" ] ||
  die "$work/plan.c: no .nstages, .dp, .batch or .seq (is this tokpipec's plan format?)"
[ "${chunks:-0}" -gt 1 ] && stages=$((stages / chunks))
ranks=$((stages * dp * ${tensor:-1}))

# tokens: 3 steps of the global batch (a microbatch's rows x microbatches x replicas) x seq,
# plus one for the last target
n=$((steps * rows * ${microbatches:-1} * dp * seq + 1)) i=0
while [ $i -lt $n ]; do
  printf "\\$(printf %03o $((i * 7 % 15 + 1)))"
  i=$((i + 1))
done >"$work/tokens.txt"
"$build/bin/tokpipe-tokens" "$work/tokens.txt" -o "$work/train.bin" 2>"$work/tokens.err" ||
  die "tokpipe-tokens: $(cat "$work/tokens.err")"

# one emulated GPU per process: the node has as many as there are ranks
launch=("$work/trainer")
[ "$ranks" -gt 1 ] && launch=(sh "$here/../tests/comm/mpirun.sh" "$timeout_s" "$ranks" "$work/trainer")
TOKPIPE_CUDA_EMULATE_DEVICES=$ranks timeout -k 5 "$timeout_s" "${launch[@]}" --init "$model" \
  --data "$work/train.bin" --steps $steps >"$work/train.log" 2>&1 ||
  die "the trainer ($ranks process(es)) failed: $(tail -5 "$work/train.log")"

# each rank's last line (the last step's counts), in rank order
status=0
for r in $(seq 0 $((ranks - 1))); do
  line=$(grep "^step counts (rank $r): " "$work/train.log" | tail -1)
  if [ -z "$line" ]; then
    echo "gpu_step_counts.sh: error: rank $r printed no step counts ($work/train.log)" >&2
    status=1
  elif [ "$(grep -c "^step counts (rank $r): " "$work/train.log")" -ne $steps ]; then
    echo "gpu_step_counts.sh: error: rank $r printed $(grep -c "^step counts (rank $r): " "$work/train.log") step counts lines for $steps steps" >&2
    status=1
  else
    echo "$line"
  fi
done
exit $status
