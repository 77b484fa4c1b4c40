#!/bin/sh
# usage.sh BUILD_DIR WORK_DIR: bench/gpu_step_counts.sh's bad arguments, each one line naming
# what is wrong: exit 2 for usage (no model, a folder that is no build, an option the script
# sets itself), exit 1 for a model that is not there or that tokpipec refuses.
build=$1 work=$2
# shellcheck disable=SC2034 # case.sh and its fail/ok read it
case=step-counts-usage
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/tests/case.sh"
script=$root/bench/gpu_step_counts.sh
model=$root/tests/fixtures/gpt_o14_tanh_tied_bias_dyn_conv1d/model.onnx
export STEP_COUNTS_WORK=$work/run

# expect CODE TEXT ARGS...: the script exits CODE and its stderr's last line holds TEXT
expect() {
  want=$1 text=$2
  shift 2
  bash "$script" "$@" >out.txt 2>err.txt
  rc=$?
  if [ $rc -eq "$want" ] && tail -1 err.txt | grep -qF -- "$text"; then
    ok "$*: exit $rc: $(tail -1 err.txt)"
  else
    fail "$*: exit $rc (expected $want) and '$text', got: $(cat err.txt)"
  fi
}
expect 2 "expected a build folder and a model" "$build"
expect 2 "BUILD_DIR '$work/none' is not a folder" "$work/none" "$model"
expect 2 "no $work/bin/tokpipec: build it first" "$work" "$model"
expect 1 "error: $work/missing.onnx: no such file" "$build" "$work/missing.onnx"
expect 2 "--target: this script compiles with --target cuda" "$build" "$model" --target cpu
expect 2 "-o: this script compiles with --target cuda" "$build" "$model" -o x.c
expect 1 "error: tokpipec $model --stages 9 --target cuda: tokpipec: error:" "$build" "$model" --stages 9
STEP_COUNTS_TIMEOUT=soon expect 2 "STEP_COUNTS_TIMEOUT must be a positive number of seconds, got 'soon'" "$build" "$model"
exit $status
