#!/usr/bin/env bash
# Token slicing is numerically the unsliced run, for one fixture with PyTorch references
# (tests/parity). Compiles the unsliced trainer and trainers with --slices 2 and an uneven
# slicing (about 45%, 31%, 24% of T, e.g. 7,5,4 for T = 16), trains each 10 AdamW steps
# from the model's weights and checks every sliced run:
#   step 1's loss and every step-1 gradient  within 1e-5 relative of the unsliced run's
#   the 10 losses                            within 1e-4 relative of PyTorch's (parity.sh)
# and that the program's header records the slicing.
# usage: slicing.sh TOKPIPEC TOKPIPE_COMPARE FIXTURE_DIR WORK_DIR
set -uo pipefail
tokpipec=$1 compare=$2 fixture=$3 work=$4
ref=$fixture/train
name=$(basename "$fixture")
fail() { echo "slicing: FAIL: $name: $*" >&2; exit 1; }

[ -x "$compare" ] || fail "tokpipe-compare is not built ($compare)"
{ rm -rf "$work" && mkdir -p "$work"; } || fail "cannot make $work"
read -r -a compile_flags <<<"$(sed -n 's/^tokpipec //p' "$ref/args")"
read -r -a train_flags <<<"$(sed -n 's/^trainer //p' "$ref/args")"
T=$(sed -n 's/^tokpipec .*--seq \([0-9]*\).*/\1/p' "$ref/args")
[ -n "$T" ] && [ "$T" -ge 3 ] || fail "no --seq T >= 3 in $ref/args"
a=$((T * 45 / 100)) r=$((T - T * 45 / 100))
b=$((r * 56 / 100))
uneven="$a,$b,$((r - b))"

# train NAME [tokpipec flags...]: builds $work/NAME and trains it 10 steps
train() {
  local tag=$1
  shift
  "$tokpipec" "$fixture/model.onnx" -o "$work/$tag.c" --exe "$work/$tag" "${compile_flags[@]}" "$@" ||
    fail "tokpipec $* could not build a trainer (exit $?)"
  "$work/$tag" --init "$fixture/model.onnx" --data "$ref/train.bin" --steps 10 "${train_flags[@]}" \
    --dump-grads "$work/$tag.grads.safetensors" --log "$work/$tag.log.jsonl" 2>"$work/$tag.err" ||
    { tail -n 5 "$work/$tag.err" >&2; fail "the trainer built with $* exited with $?"; }
}

train whole
for slices in 2 "$uneven"; do
  tag=slices-${slices//,/-}
  train "$tag" --slices "$slices"
  n=$(tr ',' '\n' <<<"$slices" | wc -l)
  [ "$slices" = 2 ] && n=2
  grep -q "^ \* Token slices ($n): " "$work/$tag.c" || fail "--slices $slices: the program's header does not record the slicing"
  "$compare" --losses "$work/$tag.log.jsonl" "$work/whole.log.jsonl" --steps 1 --tol 1e-5 ||
    fail "--slices $slices: step 1's loss differs from the unsliced run's"
  "$compare" "$work/$tag.grads.safetensors" "$work/whole.grads.safetensors" --tol 1e-5 ||
    fail "--slices $slices: step 1's gradients differ from the unsliced run's"
  "$compare" --losses "$work/$tag.log.jsonl" "$ref/losses.jsonl" --steps 10 --tol 1e-4 ||
    fail "--slices $slices: the losses of 10 AdamW steps differ from PyTorch's"
  echo "slicing: ok: $name --slices $slices"
done
