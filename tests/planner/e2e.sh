#!/bin/sh
# e2e.sh BIN_DIR SOURCE_DIR WORK_DIR: the calibration loop end to end on a GPT fixture (2
# layers, tied head): tokpipec --profile-grid auto at 2 stages, mpirun -np 2 trainer
# --profile, tokpipe-plan --calibrate predicts the compiled plan. No timing is asserted
# (the machine is shared): the numbers must be sane, i.e. finite and positive, and the
# predicted step at least the busier rank's compute and at most both ranks' compute plus
# their optimizer steps and 10 ms for transfers.
bin=$1 src=$2 work=$3
fail() { echo "FAIL: $*"; exit 1; }
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 2
model=$src/tests/fixtures/gpt_o14_tanh_tied_bias_dyn_conv1d/model.onnx
plan="--microbatches 2 --slices 3,2,2 --schedule 1f1b"
# shellcheck disable=SC2086
"$bin/tokpipec" "$model" --exe trainer --batch 4 --seq 7 --stages 2 $plan --profile-grid auto >tokpipec.out 2>&1 ||
  fail "tokpipec: $(cat tokpipec.out)"
OMP_NUM_THREADS=1 sh "$src/tests/comm/mpirun.sh" 300 2 ./trainer --init "$model" --profile prof.json >prof.out 2>&1 ||
  fail "trainer --profile: $(cat prof.out)"
grep -q '"stages": 2, "stage_cuts": \[0, 1\], "batch": 2, "seq": 7' prof.json || fail "profile header: $(head -4 prof.json)"
# shellcheck disable=SC2086
"$bin/tokpipe-plan" "$model" --seq 7 --calibrate prof.json $plan --json >pred.json 2>pred.err ||
  fail "tokpipe-plan: $(cat pred.err)"
num() { sed -n "s/^  \"$1\": \([-0-9.e+]*\),\{0,1\}$/\1/p" pred.json; }
list() { sed -n "s/^  \"$1\": \[\(.*\)\],\{0,1\}$/\1/p" pred.json | tr -d ' '; }
step=$(num iteration_time_s) busy=$(list busy_s) opt=$(list optimizer_s)
grep -q '"stage_cuts": \[0, 1\]' pred.json && grep -q '"microbatch_size": 2' pred.json ||
  fail "the prediction is not of the profiled plan: $(cat pred.json)"
awk -v t="$step" -v busy="$busy" -v opt="$opt" 'BEGIN {
  split(busy, b, ","); split(opt, o, ",")
  ok = t > 0 && t < 10 && b[1] > 0 && b[2] > 0 && o[1] >= 0 && o[2] >= 0
  ok = ok && t >= (b[1] > b[2] ? b[1] : b[2]) && t <= b[1] + b[2] + o[1] + o[2] + 0.01
  printf "predicted step %.3f ms; busy %s s; optimizer %s s\n", 1e3 * t, busy, opt
  exit !ok }' || fail "numbers not sane: $(cat pred.json)"
echo "ok: profiled $(grep -c '"stage"' prof.json) samples, predicted the compiled plan"
