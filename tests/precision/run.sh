#!/usr/bin/env bash
# tokpipec --precision bf16 and fp16 on the cpu target (passes/store_half.c, runtime/train):
# one case per ctest precision/<case>. The parity with PyTorch autocast is tests/parity's
# parity/bf16/<fixture> and parity/fp16/<fixture>.
#   resume   a bf16 run of 6 steps equals, bit for bit (log, weights, checkpoint), 3 steps
#            saved and resumed to 6: checkpoints hold the fp32 masters and AdamW state
#   storage  the bf16 trainer's step-1 gradients are not the fp32 trainer's (16-bit
#            storage happened) yet within bf16's rounding of them; the IR stores every
#            parameter and gradient in bf16 and the loss in f32
#   memory   --emit=memory of a bf16 plan: parameters halved against fp32, activations at
#            most 0.7 of fp32's (the values kept from unit to unit are halved; the f32
#            working set of the op running, which stays, is a large part of this 2-layer
#            model's peak: 0.65 of fp32's in all), the 16-bit gradients with their fp32 sum,
#            the fp32 master weights
#   fp16     dynamic loss scaling: from a scale of 2^24 (test hook TOKPIPE_TEST_LOSS_SCALE,
#            growth after 3 good steps in place of 2000) the overflowing steps are skipped,
#            each halving the scale, 3 good steps double it, and the log says so; 3 steps
#            saved and resumed to 8 equal 8 steps bit for bit (the checkpoint keeps the
#            scale and its counters)
#   tensor   bf16 over 2 tensor ranks (a tied head over a padded vocabulary, large logits)
#            gives one rank's bf16 step-1 gradients within 1e-3 of the largest (measured
#            2.3e-4): the loss's backward reads the logits its forward statistics saw
#   profile  a bf16 trainer's --profile: the probes' units are stored as the plan's (they
#            write the plan's 16-bit gradient buffers)
#   usage    --precision takes fp32, bf16 or fp16
# usage: run.sh CASE BIN_DIR FIXTURE_DIR WORK_DIR
set -uo pipefail
case=$1 bin=$2 fixture=$3 work=$4/$1 src=$(cd "$(dirname "$0")" && pwd)
fail() { echo "precision/$case: FAIL: $*" >&2; exit 1; }
ok() { echo "precision/$case: ok: $*"; }
untimed() { sed -E 's/, "ms": [^,]*, "tokens_per_s": [^,}]*//' "$1"; }
rm -rf "$work" && mkdir -p "$work" && cd "$work" || fail "cannot make $work"

# run_and_resume "OPTIONS": ./trainer for the --steps of OPTIONS at once (full/) and as 3
# steps saved and resumed (stop/): the same log and weights, bit for bit
run_and_resume() {
  ./trainer --init "$model" $1 --save full --log full.jsonl --dump-weights full.safetensors 2>/dev/null ||
    fail "uninterrupted run"
  ./trainer --init "$model" $1 --steps 3 --save stop --log stop.jsonl 2>/dev/null || fail "3-step run"
  ./trainer $1 --resume stop --save stop --log stop.jsonl --dump-weights stop.safetensors 2>/dev/null ||
    fail "resume of the 3-step run"
  [ "$(untimed full.jsonl)" = "$(untimed stop.jsonl)" ] && ok "3 steps + the rest resumed: the same log" ||
    fail "logs differ: $(untimed full.jsonl >a.txt; untimed stop.jsonl | diff a.txt -)"
  cmp -s full.safetensors stop.safetensors && ok "the same weights, bit for bit" || fail "weights differ"
}
model=$fixture/model.onnx data=$fixture/train_bf16/train.bin
shape="--batch 4 --seq 32"

case $case in
resume)
  "$bin/tokpipec" "$model" $shape --precision bf16 --stages 2 --microbatches 2 --exe trainer ||
    fail "tokpipec could not build a bf16 trainer"
  run_and_resume "--data $data --lr 0.01 --steps 6 --save-every 3"
  cmp -s full/checkpoint.safetensors stop/checkpoint.safetensors && ok "the same checkpoint" ||
    fail "checkpoints differ"
  # the masters are fp32: a weight the rounding to bf16 would change (low 16 bits not zero)
  "$bin/tokpipe-compare" full.safetensors full.safetensors >/dev/null || fail "cannot read the weights"
  # (through a file: grep -q leaving a pipe early would fail the pipeline under pipefail)
  od -An -v -tx4 -w4 full.safetensors | tail -n 2000 >last_words.txt
  grep -qv '0000$' last_words.txt && ok "the weights keep fp32 bits" ||
    fail "every weight is a bf16 value: the checkpoint lost the fp32 masters"
  ;;
storage)
  "$bin/tokpipec" "$model" $shape --precision bf16 --exe bf16 && "$bin/tokpipec" "$model" $shape --exe fp32 ||
    fail "tokpipec could not build the trainers"
  for p in bf16 fp32; do
    ./$p --init "$model" --data "$data" --steps 1 --dump-grads $p.safetensors 2>/dev/null || fail "$p trainer"
  done
  "$bin/tokpipe-compare" bf16.safetensors fp32.safetensors --tol 1e-4 >out.txt 2>&1 &&
    fail "bf16 gradients equal fp32's within 1e-4: nothing was stored in 16 bits"
  ok "bf16 gradients differ from fp32's: $(tail -1 out.txt)"
  "$bin/tokpipe-compare" bf16.safetensors fp32.safetensors --tol 5e-2 >out.txt 2>&1 ||
    fail "bf16 gradients beyond bf16's rounding of fp32's: $(tail -1 out.txt)"
  "$bin/tokpipec" "$model" $shape --precision bf16 --stages 2 --emit=ir -o bf16.tir || fail "tokpipec --emit=ir"
  grep -q '^param .* : f32' bf16.tir && fail "a parameter stays f32: $(grep -m1 '^param .* : f32' bf16.tir)"
  grep '^grad ' bf16.tir | grep -qv '\.bf16"\?$' && fail "a gradient is not the bf16 value: $(grep '^grad ' bf16.tir | grep -m1 -v '\.bf16"\?$')"
  grep -q '^%loss : f32\[\]' bf16.tir || fail "the loss is not f32"
  grep -q ': bf16\[.*= Reshape(.*@boundary' bf16.tir || fail "no boundary copy moves a bf16 value"
  ok "the IR stores parameters, gradients and boundary messages in bf16, the loss in f32"
  ;;
memory)
  for p in fp32 bf16; do
    "$bin/tokpipec" "$model" --batch 32 --seq 32 --precision $p --emit=memory >$p.txt || fail "--emit=memory ($p)"
  done
  bytes() { sed -n "/^rank 0/,\$s/^  $2  *\([0-9]*\) bytes.*/\1/p" "$1" | head -1; }
  a32=$(bytes fp32.txt activations) a16=$(bytes bf16.txt activations)
  p32=$(bytes fp32.txt parameters) p16=$(bytes bf16.txt parameters)
  [ -n "$a32" ] && [ -n "$a16" ] && [ $((a16 * 100)) -le $((a32 * 70)) ] ||
    fail "bf16 activations $a16 bytes, fp32 $a32: not about halved"
  [ $((p16 * 2)) -eq "$p32" ] || fail "bf16 parameters $p16 bytes, fp32 $p32: not halved"
  grep -q "^  master weights  *$p32 bytes.*fp32" bf16.txt || fail "no fp32 master weights line of $p32 bytes"
  grep -q "^  gradients  *$((p16 * 3)) bytes.*16-bit, and the step's fp32 sum" bf16.txt ||
    fail "gradients are not 16-bit plus the fp32 sum: $(grep '^  gradients' bf16.txt | tail -1)"
  ok "activations $a32 -> $a16 bytes, parameters $p32 -> $p16 (+ fp32 masters), gradients 16-bit + fp32 sum"
  ;;
fp16)
  "$bin/tokpipec" "$model" $shape --precision fp16 --exe trainer || fail "tokpipec could not build an fp16 trainer"
  export TOKPIPE_TEST_LOSS_SCALE=16777216,3
  run_and_resume "--data $data --steps 8 --save-every 3"
  scales=$(sed -E 's/.*"loss_scale": ([0-9]*)(, "skipped": true)?}/\1\2/' full.jsonl | tr '\n' ' ')
  want='16777216, "skipped": true 8388608, "skipped": true 4194304, "skipped": true 2097152, "skipped": true '
  want+='1048576 1048576, "skipped": true 524288 524288 '
  [ "$scales" = "$want" ] && ok "4 overflows skipped, halving 2^24 to 2^20; a skip; then 2^19" ||
    fail "loss scales of the 8 steps: $scales, want $want"
  TOKPIPE_TEST_LOSS_SCALE=1024,3 ./trainer --init "$model" --data "$data" --steps 7 --log grow.jsonl 2>/dev/null ||
    fail "run from a scale of 1024"
  scales=$(sed -E 's/.*"loss_scale": ([0-9]*).*/\1/' grow.jsonl | tr '\n' ' ')
  [ "$scales" = "1024 1024 1024 2048 2048 2048 4096 " ] && ok "3 good steps double the scale" ||
    fail "loss scales from 1024: $scales"
  ;;
tensor)
  tied=$fixture/../vocab/gpt_o17_tied_v125
  for n in 1 2; do
    "$bin/tokpipec" "$tied/model.onnx" --batch 2 --seq 16 --tensor $n --precision bf16 --exe t$n ||
      fail "tokpipec --tensor $n"
    sh "$src/../comm/mpirun.sh" 100 $n ./t$n --init "$tied/model.onnx" --data "$tied/train/train.bin" --steps 1 \
      --dump-grads t$n.safetensors 2>err.txt || fail "t$n: $(tail -2 err.txt)"
  done
  "$bin/tokpipe-compare" t2.safetensors t1.safetensors --tol 1e-3 >out.txt 2>&1 &&
    ok "2 tensor ranks: one rank's gradients, $(tail -1 out.txt)" || fail "2 tensor ranks: $(tail -1 out.txt)"
  ;;
profile)
  "$bin/tokpipec" "$model" $shape --precision bf16 --stages 2 --profile-grid 8,16:0,8,16 --exe trainer ||
    fail "tokpipec could not build a bf16 trainer with probes"
  ./trainer --init "$model" --profile profile.json 2>err.txt && [ -s profile.json ] && ok "--profile ran its probes" ||
    fail "--profile: $(tail -2 err.txt)"
  ;;
usage)
  "$bin/tokpipec" "$model" $shape --precision fp8 --emit=memory >/dev/null 2>err.txt
  rc=$?
  [ $rc -eq 2 ] && grep -q "precision expects fp32, bf16 or fp16, got 'fp8'" err.txt && ok "--precision fp8: exit 2" ||
    fail "--precision fp8: exit $rc, $(cat err.txt)"
  ;;
*) fail "unknown case" ;;
esac
