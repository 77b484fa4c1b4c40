#!/usr/bin/env bash
# Training parity with PyTorch for one fixture (references: tools/make_parity_fixtures.py).
# Compiles a trainer for the model, trains 10 AdamW steps from the model's own weights on
# train/train.bin, and checks against PyTorch:
#   step 1's loss             within 1e-5 relative
#   every step-1 gradient     within 1e-4 of the tensor's largest reference magnitude
#   the 10 losses             within 1e-4 relative
# usage: parity.sh TOKPIPEC TOKPIPE_COMPARE FIXTURE_DIR WORK_DIR
set -uo pipefail
tokpipec=$1 compare=$2 fixture=$3 work=$4
ref=$fixture/train
fail() { echo "parity: FAIL: $(basename "$fixture"): $*" >&2; exit 1; }

[ -x "$compare" ] || fail "tokpipe-compare is not built ($compare)"
{ rm -rf "$work" && mkdir -p "$work"; } || fail "cannot make $work"
read -r -a compile_flags <<<"$(sed -n 's/^tokpipec //p' "$ref/args")"
read -r -a train_flags <<<"$(sed -n 's/^trainer //p' "$ref/args")"

"$tokpipec" "$fixture/model.onnx" --exe "$work/trainer" "${compile_flags[@]}" ||
  fail "tokpipec could not build a trainer from model.onnx (exit $?)"
"$work/trainer" --init "$fixture/model.onnx" --data "$ref/train.bin" --steps 10 \
  "${train_flags[@]}" --dump-grads "$work/grads.safetensors" --log "$work/log.jsonl" \
  2>"$work/trainer.err"
rc=$?
[ $rc = 0 ] || { tail -n 5 "$work/trainer.err" >&2; fail "the trainer exited with $rc"; }

"$compare" --losses "$work/log.jsonl" "$ref/losses.jsonl" --steps 1 --tol 1e-5 ||
  fail "step 1's loss differs from PyTorch's"
"$compare" "$work/grads.safetensors" "$ref/grads.safetensors" --tol 1e-4 ||
  fail "step 1's gradients differ from PyTorch's"
"$compare" --losses "$work/log.jsonl" "$ref/losses.jsonl" --steps 10 --tol 1e-4 ||
  fail "the losses of 10 AdamW steps differ from PyTorch's"
echo "parity: ok: $(basename "$fixture")"
