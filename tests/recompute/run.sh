#!/bin/sh
# Activation recomputation (passes/recompute.c) on one model and plan:
#   run.sh CASE BIN WORK MODEL RANKS 'OPTIONS' [halve]
# compiles the plan with tokpipec --recompute none, selective and full, trains each 2 steps
# from the model's weights on the same tokens (under mpirun -np RANKS when RANKS > 1) and
# checks that
#   - the IR of selective and full has recomputed ops (@recompute);
#   - step 1's gradients (--dump-grads) are the same bytes, and both steps' losses and
#     gradient norms the same numbers: recomputing runs the same kernels on the same values;
#   - per rank (--emit=memory), the activations of selective and full are no more than
#     without recompute, and selective's are less on some rank; with `halve`, full's are at
#     most half of them on every rank.
# The tokens come from the fixture's train/train.bin, or where it has none are bytes below
# 32 (tests/case.sh's byte_tokens; tests/stages/deep_gpt.onnx's vocabulary).
case=$1 bin=$2 work=$3/$1 model=$4 ranks=$5 options=$6 expect=${7:-}
. "$(dirname "$0")/../case.sh"

if [ -f "$(dirname "$model")/train/train.bin" ]; then
  cp "$(dirname "$model")/train/train.bin" train.bin
else
  byte_tokens 32 600 train.bin || exit 1 # tests/stages/deep_gpt.onnx: vocabulary 32
fi

# The activations line of each rank's block of --emit=memory, one number a line.
rank_activations() {
  awk '/^ranks? [0-9]/ { rank = 1 } rank && /^  activations/ { print $2; rank = 0 }' "$1"
}

for mode in none selective full; do
  # shellcheck disable=SC2086
  "$bin/tokpipec" "$model" $options --recompute $mode --emit=memory -o $mode.memory 2>err.txt &&
    "$bin/tokpipec" "$model" $options --recompute $mode -o $mode.tir 2>err.txt &&
    "$bin/tokpipec" "$model" $options --recompute $mode --exe ./$mode 2>err.txt ||
    { fail "tokpipec $options --recompute $mode: $(cat err.txt)"; exit "$status"; }
  launch=./$mode
  [ "$ranks" -gt 1 ] && launch="timeout -k 5 200 mpirun --allow-run-as-root --oversubscribe --bind-to none -np $ranks ./$mode"
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=1 $launch --init "$model" --data train.bin --steps 2 --dump-grads $mode.grads \
    --log $mode.jsonl >$mode.out 2>&1 || { fail "the --recompute $mode trainer: $(tail -n 5 $mode.out)"; exit "$status"; }
  sed 's/, "ms".*//' $mode.jsonl >$mode.losses
  rank_activations $mode.memory >$mode.act
  [ -s $mode.act ] || { fail "no per-rank activations in tokpipec --emit=memory: $(cat $mode.memory)"; exit "$status"; }
done

for mode in selective full; do
  n=$(grep -c '@backward @recompute' $mode.tir)
  if [ "$n" -gt 0 ]; then ok "--recompute $mode recomputes $n ops in the backward"; else fail "--recompute $mode recomputes nothing"; fi
  if cmp -s none.grads $mode.grads && cmp -s none.losses $mode.losses; then
    ok "--recompute $mode: step 1's gradients are bit for bit those without ($(wc -c <$mode.grads) bytes), the losses too"
  else
    fail "--recompute $mode changes the gradients or losses: $(cmp none.grads $mode.grads) $(diff none.losses $mode.losses)"
  fi
done

# per rank: none, selective, full
paste none.act selective.act full.act >act.txt
echo "per-rank activation bytes (none selective full):" && sed 's/^/  /' act.txt
awk -v halve="$expect" '
  { if ($2 > $1 || $3 > $1) bad = bad " rank " NR - 1 ": more than without recompute;"
    if ($2 < $1) lower = 1
    if (halve == "halve" && 2 * $3 > $1) bad = bad " rank " NR - 1 ": full keeps more than half;" }
  END { if (!lower) bad = bad " selective lowers no rank;"; if (bad) { print bad; exit 1 } }' act.txt >verdict.txt ||
  fail "activations:$(cat verdict.txt)"
[ $status -eq 0 ] && ok "activations per rank: selective and full lower them${expect:+ (full at most half)}"
exit $status
