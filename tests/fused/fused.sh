#!/usr/bin/env bash
# The fused ops of modern blocks (RMSNorm, Rotary, SwiGLU) train exactly as the primitive
# chains they replace, on the fused_block fixture with its rotary tables trainable (no
# --freeze, so Rotary's dCos and dSin run too): trainers compiled by tokpipec --exe with
# and without --no-fuse, and fused with --slices 2, train 10 AdamW steps from the model's
# weights; against the primitive run:
#   every step-1 gradient   within 1e-5 of the tensor's largest magnitude
#   the 10 losses           within 1e-5 relative
# and the fused program calls the fused kernels (forward and backward), the other none.
# usage: fused.sh TOKPIPEC TOKPIPE_COMPARE FIXTURE_DIR WORK_DIR
set -uo pipefail
tokpipec=$1 compare=$2 fixture=$3 work=$4
fail() { echo "fused: FAIL: $*" >&2; exit 1; }

[ -x "$compare" ] || fail "tokpipe-compare is not built ($compare)"
{ rm -rf "$work" && mkdir -p "$work"; } || fail "cannot make $work"
read -r -a train_flags <<<"$(sed -n 's/^trainer //p' "$fixture/train/args")"

# train NAME [tokpipec flags...]: builds $work/NAME (and NAME.c), trains it 10 steps
train() {
  local tag=$1
  shift
  "$tokpipec" "$fixture/model.onnx" --batch 2 --seq 16 -o "$work/$tag.c" --exe "$work/$tag" "$@" ||
    fail "tokpipec $* could not build a trainer"
  "$work/$tag" --init "$fixture/model.onnx" --data "$fixture/train/train.bin" --steps 10 "${train_flags[@]}" \
    --dump-grads "$work/$tag.grads.safetensors" --log "$work/$tag.log" 2>"$work/$tag.err" ||
    { tail -n 5 "$work/$tag.err" >&2; fail "the $tag trainer failed"; }
}

train primitive --no-fuse
train fused
train sliced --slices 2

for k in tp_rmsnorm_f32 tp_rmsnorm_backward_f32 tp_rotary_f32 tp_rotary_backward_f32 tp_swiglu_f32 tp_swiglu_backward_f32; do
  grep -q "$k(" "$work/fused.c" || fail "the fused program does not call $k"
  ! grep -q "$k(" "$work/primitive.c" || fail "the --no-fuse program calls $k"
done
for tag in fused sliced; do
  "$compare" "$work/$tag.grads.safetensors" "$work/primitive.grads.safetensors" --tol 1e-5 ||
    fail "$tag: step-1 gradients differ from the primitive chains'"
  "$compare" --losses "$work/$tag.log" "$work/primitive.log" --steps 10 --tol 1e-5 ||
    fail "$tag: the 10 losses differ from the primitive chains'"
done
grep -q '"blocks.2.sin"' <(head -c 4096 "$work/fused.grads.safetensors") || fail "no gradient of the trainable Sin table"
echo "fused: ok"
