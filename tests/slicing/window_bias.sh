#!/usr/bin/env bash
# Causal attention with a window and a position bias, trained end to end (model and
# PyTorch references: make_window_bias.py): a grouped-query layer with ALiBi and a window
# of 5, a 4-D layer with a relative bias [1, H, T, T] and a window of 3, T = 16.
#   the unsliced trainer           step 1's loss within 1e-5, every step-1 gradient within
#                                  1e-4 and the 10 AdamW losses within 1e-4 of PyTorch's
#   --slices 2, 3, 7,5,4, --stages 2, --stages 2 --slices 3
#                                  step-1 gradients and the 10 losses within 1e-5 of the
#                                  unsliced run's
#   --stages 2 --slices 5,11 --microbatches 2 --schedule 1f1b
#                                  the same against --microbatches 2 unsliced (a textual
#                                  IR's batch is fixed: two microbatches read 4 rows a step)
#   a copy whose mask has a 300-character name compiles
# usage: window_bias.sh TOKPIPEC TOKPIPE_COMPARE DIR WORK_DIR
set -uo pipefail
tokpipec=$1 compare=$2 ref=$3 work=$4
fail() { echo "window_bias: FAIL: $*" >&2; exit 1; }

[ -x "$compare" ] || fail "tokpipe-compare is not built ($compare)"
{ rm -rf "$work" && mkdir -p "$work"; } || fail "cannot make $work"

# train TAG [tokpipec flags...]: builds $work/TAG and trains it 10 steps
train() {
  local tag=$1
  shift
  "$tokpipec" "$ref/model.tir" -o "$work/$tag.c" --exe "$work/$tag" "$@" ||
    fail "tokpipec $* could not build a trainer (exit $?)"
  "$work/$tag" --init "$ref/weights.safetensors" --data "$ref/train.bin" --steps 10 \
    --dump-grads "$work/$tag.grads.safetensors" --log "$work/$tag.log.jsonl" 2>"$work/$tag.err" ||
    { tail -n 5 "$work/$tag.err" >&2; fail "the trainer built with $* exited with $?"; }
}

# same TAG BASE: TAG's step-1 gradients and 10 losses within 1e-5 of BASE's
same() {
  "$compare" "$work/$1.grads.safetensors" "$work/$2.grads.safetensors" --tol 1e-5 ||
    fail "$1: step 1's gradients differ from $2's"
  "$compare" --losses "$work/$1.log.jsonl" "$work/$2.log.jsonl" --steps 10 --tol 1e-5 ||
    fail "$1: the losses of 10 AdamW steps differ from $2's"
  echo "window_bias: ok: $1 = $2"
}

train whole
grep -q '\.window = 5' "$work/whole.c" && grep -q '\.window = 3' "$work/whole.c" ||
  fail "the program does not compile the attention windows in"
"$compare" --losses "$work/whole.log.jsonl" "$ref/losses.jsonl" --steps 1 --tol 1e-5 ||
  fail "step 1's loss differs from PyTorch's"
"$compare" "$work/whole.grads.safetensors" "$ref/grads.safetensors" --tol 1e-4 ||
  fail "step 1's gradients differ from PyTorch's"
"$compare" --losses "$work/whole.log.jsonl" "$ref/losses.jsonl" --steps 10 --tol 1e-4 ||
  fail "the losses of 10 AdamW steps differ from PyTorch's"
echo "window_bias: ok: whole = PyTorch"

train slices-2 --slices 2
train slices-3 --slices 3
train slices-7-5-4 --slices 7,5,4
train stages-2 --stages 2
train stages-2-slices-3 --stages 2 --slices 3
for tag in slices-2 slices-3 slices-7-5-4 stages-2-slices-3; do
  grep -q '^ \* Token slices' "$work/$tag.c" || fail "$tag: the program's header does not record the slicing"
  same "$tag" whole
done
same stages-2 whole

train mb-2 --microbatches 2
train stages-2-slices-5-11-mb-2-1f1b --stages 2 --slices 5,11 --microbatches 2 --schedule 1f1b
same stages-2-slices-5-11-mb-2-1f1b mb-2

# A mask named by 300 characters (ONNX names are unbounded) compiles in as it is.
long=alibi_$(printf '%0300d' 0)
mkdir -p "$work/named" && cp "$ref/weights.safetensors" "$work/named/" &&
  sed "s/%alibi\b/%$long/g" "$ref/model.tir" >"$work/named/model.tir" || fail "cannot write the long-named copy"
"$tokpipec" "$work/named/model.tir" -o "$work/long.c" --exe "$work/long" ||
  fail "a mask with a 300-character name: no trainer (exit $?)"
grep -q "\.mask = $long" "$work/long.c" || fail "the long-named mask is not in the program"
echo "window_bias: ok: a 300-character mask name"
