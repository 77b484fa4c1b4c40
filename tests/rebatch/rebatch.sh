#!/usr/bin/env bash
# Re-batching of one fixed-batch fixture (exported at batch 2; passes/rebatch.c):
#   forward: tokpipec --batch B --forward-only, run by tokpipe-run on PyTorch's logits of
#            the same model at batch B (tests/rebatch/<name>/b<B>, make_rebatch_refs.py),
#            atol 1e-4 / rtol 1e-4 like the fixture tests, for each B there;
#   training at --batch 4 (twice the traced rows): trainers with --microbatches 2 --dp 2
#            (1 row per microbatch) and --microbatches 4 give step 1's loss and every
#            gradient of --microbatches 1 within 1e-5 relative (the matrix's tolerance).
# usage: rebatch.sh TOKPIPEC TOKPIPE_RUN TOKPIPE_COMPARE FIXTURE_DIR REF_DIR WORK_DIR
set -uo pipefail
tokpipec=$1 run=$2 compare=$3 fixture=$4 refs=$5 work=$6
name=$(basename "$fixture")
status=0
fail() { echo "rebatch: FAIL: $name: $*" >&2; status=1; }

[ -x "$compare" ] || { fail "tokpipe-compare is not built ($compare)"; exit 1; }
{ rm -rf "$work" && mkdir -p "$work"; } || { fail "cannot make $work"; exit 1; }
# The IR names the model's files relative to its own folder: print it beside a copy.
cp "$fixture"/model.onnx "$work"/ && { [ ! -e "$fixture/weights.bin" ] || cp "$fixture/weights.bin" "$work"/; } ||
  { fail "cannot copy the model into $work"; exit 1; }
T=$(sed -n 's/^tokpipec .*--seq \([0-9]*\).*/\1/p' "$fixture/train/args")
[ -n "$T" ] || { fail "no --seq in $fixture/train/args"; exit 1; }

for data in "$refs"/b*/; do
  B=${data%/}
  B=${B##*/b}
  tir=$work/model.b$B.tir
  if ! "$tokpipec" "$work/model.onnx" --batch "$B" --seq "$T" --forward-only -o "$tir" 2>"$work/b$B.cerr"; then
    fail "tokpipec --batch $B: $(cat "$work/b$B.cerr")"
    continue
  fi
  out=$("$run" "$tir" --test-dir "$data" --atol 1e-4 --rtol 1e-4 2>&1) &&
    echo "rebatch: ok: $name: forward at batch $B vs PyTorch: $(head -n 1 <<<"$out")" ||
    fail "forward at batch $B vs PyTorch: $out"
done

read -r -a train_flags <<<"$(sed -n 's/^trainer //p' "$fixture/train/args")"
# train TAG [tokpipec flags...]: a trainer at --batch 4, one step, its gradients and loss
train() {
  local tag=$1
  shift
  "$tokpipec" "$fixture/model.onnx" --exe "$work/$tag" --batch 4 --seq "$T" "$@" 2>"$work/$tag.cerr" ||
    { fail "tokpipec --batch 4 $*: $(cat "$work/$tag.cerr")"; return 1; }
  OMP_NUM_THREADS=1 "$work/$tag" --init "$fixture/model.onnx" --data "$fixture/train/train.bin" --steps 1 \
    "${train_flags[@]}" --dump-grads "$work/$tag.grads" --log "$work/$tag.jsonl" >"$work/$tag.err" 2>&1 ||
    { fail "the trainer built with --batch 4 $* exited with $?: $(tail -n 5 "$work/$tag.err")"; return 1; }
}
train whole || exit 1
for shape in "2 2" "4 1"; do
  read -r M D <<<"$shape"
  tag=m$M-d$D
  train "$tag" --microbatches "$M" --dp "$D" || continue
  loss=$("$compare" --losses "$work/$tag.jsonl" "$work/whole.jsonl" --steps 1 --tol 1e-5 2>&1) &&
    grads=$("$compare" "$work/$tag.grads" "$work/whole.grads" --tol 1e-5 2>&1) &&
    echo "rebatch: ok: $name: --batch 4 --microbatches $M --dp $D vs --microbatches 1: $(tail -n 1 <<<"$loss"); $(tail -n 1 <<<"$grads")" ||
    fail "--batch 4 --microbatches $M --dp $D vs --microbatches 1: $loss $grads"
done
exit $status
