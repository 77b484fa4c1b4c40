#!/usr/bin/env bash
# Training parity with PyTorch for one fixture (references: tools/make_parity_fixtures.py).
# Compiles a trainer for the model, trains 10 AdamW steps from the model's own weights on
# train/train.bin, and checks against PyTorch:
#   step 1's loss             within 1e-5 relative
#   every step-1 gradient     within 1e-4 of the tensor's largest reference magnitude
#   the 10 losses             within 1e-4 relative
# usage: parity.sh TOKPIPEC TOKPIPE_COMPARE FIXTURE_DIR WORK_DIR
#
# tests/device/run.sh runs it on a GPU with PARITY_TRAINER, a trainer compiled beforehand
# (TOKPIPEC is then not run), and PARITY_TOLS "LOSS GRADIENTS LOSSES", other tolerances (bf16).
# PARITY_REF names the fixture's folder of references (default train; train_bf16: PyTorch
# autocast, tools/make_bf16_parity_fixtures.py).
set -uo pipefail
tokpipec=$1 compare=$2 fixture=$3 work=$4
ref=$fixture/${PARITY_REF:-train}
trainer=${PARITY_TRAINER:-$work/trainer}
read -r tol_loss tol_grads tol_losses <<<"${PARITY_TOLS:-1e-5 1e-4 1e-4}"
fail() { echo "parity: FAIL: $(basename "$fixture"): $*" >&2; exit 1; }

[ -x "$compare" ] || fail "tokpipe-compare is not built ($compare)"
{ rm -rf "$work" && mkdir -p "$work"; } || fail "cannot make $work"
read -r -a compile_flags <<<"$(sed -n 's/^tokpipec //p' "$ref/args")"
read -r -a train_flags <<<"$(sed -n 's/^trainer //p' "$ref/args")"

[ -n "${PARITY_TRAINER:-}" ] || "$tokpipec" "$fixture/model.onnx" --exe "$trainer" "${compile_flags[@]}" ||
  fail "tokpipec could not build a trainer from model.onnx (exit $?)"
"$trainer" --init "$fixture/model.onnx" --data "$ref/train.bin" --steps 10 \
  "${train_flags[@]}" --dump-grads "$work/grads.safetensors" --log "$work/log.jsonl" \
  2>"$work/trainer.err"
rc=$?
[ $rc = 0 ] || { tail -n 5 "$work/trainer.err" >&2; fail "the trainer exited with $rc"; }

"$compare" --losses "$work/log.jsonl" "$ref/losses.jsonl" --steps 1 --tol "$tol_loss" ||
  fail "step 1's loss differs from PyTorch's"
"$compare" "$work/grads.safetensors" "$ref/grads.safetensors" --tol "$tol_grads" ||
  fail "step 1's gradients differ from PyTorch's"
"$compare" --losses "$work/log.jsonl" "$ref/losses.jsonl" --steps 10 --tol "$tol_losses" ||
  fail "the losses of 10 AdamW steps differ from PyTorch's"
echo "parity: ok: $(basename "$fixture")"
