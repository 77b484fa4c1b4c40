#!/usr/bin/env bash
# The parity matrix of one fixture (references: tests/parity): trainers compiled by
# tokpipec --exe for a pairwise-covering set of pipeline shapes, stages S in {1, 2, 3}, token
# slices {unsliced, 2, uneven like 7,5,4 for T = 16}, microbatches M and replicas D in
# {1, 2} where the batch divides, both schedules. Each shape trains 10 AdamW steps and must
# give, against the S=1, M=1, D=1 unsliced trainer:
#   step 1's loss and every step-1 gradient   within 1e-5 relative
# and against PyTorch, like parity.sh:
#   step 1's loss 1e-5, step-1 gradients 1e-4, the 10 losses 1e-4
# The shapes run all their ranks in one process; the one marked "mpi" runs under mpirun
# -np S*D. MODE "all" runs every shape, "mpi" only the mpirun one (the sanitizer build).
# SHAPES, when given, replace the set, in its form "S SLICES M D SCHEDULE [mpi]": e.g.
# "2 2 2 1 1f1b mpi", the 2-stage, 2-slice, 2-microbatch 1F1B pipeline of a fixture.
# usage: matrix.sh TOKPIPEC TOKPIPE_COMPARE FIXTURE_DIR WORK_DIR all|mpi [SHAPES...]
set -uo pipefail
tokpipec=$1 compare=$2 fixture=$3 work=$4 mode=$5
shift 5
ref=$fixture/train
name=$(basename "$fixture")
status=0
fail() { echo "matrix: FAIL: $name: $*" >&2; status=1; }

. "$(dirname "$0")/fixture.sh" # compile_flags, train_flags, B, T, uneven

# The shapes: "S SLICES M D SCHEDULE [mpi]", SLICES 1 = unsliced. Every value of every
# dimension appears where the batch allows; the pairs are covered as far as 4 shapes can
# (5 for B = 2 mod 4).
# A model exported with a fixed batch gets the same shapes: tokpipec re-batches it
# (passes/rebatch.c) to the rows of a microbatch.
if [ $((B % 2)) = 1 ]; then # M = D = 1 (odd batch: also 3)
  m=1 d=1
  [ "$B" = 3 ] && m=3 d=3
  shapes=("2 1 1 1 gpipe" "2 2 1 1 1f1b mpi" "1 $uneven $m 1 1f1b" "2 $uneven 1 $d gpipe")
elif [ $((B % 4)) = 0 ]; then # M x D = 2 x 2 fits
  shapes=("2 1 2 2 gpipe" "2 2 1 1 1f1b" "1 $uneven 2 2 1f1b" "2 $uneven 1 2 gpipe mpi")
else # B = 2 mod 4: M = 2 or D = 2, not both; under mpirun the 2-stage, 2-slice,
  # 2-microbatch 1F1B pipeline every Hugging Face fixture must show (stages, slices,
  # microbatches and the interleaved schedule at once, across processes)
  shapes=("2 1 2 1 gpipe" "2 2 1 2 1f1b" "1 $uneven 2 1 1f1b" "2 $uneven 1 2 gpipe" "2 2 2 1 1f1b mpi")
fi

# Three stages where the model has three layers (the Hugging Face fixtures; the GPT ones
# have two, which tokpipec refuses to cut in three, saying so). Given shapes replace them all.
if [ $# -gt 0 ]; then
  shapes=("$@")
elif "$tokpipec" "$fixture/model.onnx" "${compile_flags[@]}" --stages 3 -o "$work/three.tir" \
  2>"$work/three.err"; then
  shapes+=("3 $uneven 1 1 1f1b")
elif ! grep -q 'cannot cut 2 layers into 3 stages' "$work/three.err"; then
  fail "tokpipec --stages 3: $(cat "$work/three.err")"
fi

# train TAG RANKS [tokpipec flags...]: builds $work/TAG and trains it 10 steps, under mpirun
# when RANKS is not "local"
train() {
  local tag=$1 ranks=$2
  shift 2
  "$tokpipec" "$fixture/model.onnx" --exe "$work/$tag" "${compile_flags[@]}" "$@" 2>"$work/$tag.cerr" ||
    { fail "tokpipec $* could not build a trainer: $(cat "$work/$tag.cerr")"; return 1; }
  local launch=("$work/$tag")
  # Under AddressSanitizer, OpenMPI's own allocations kept to the end read as leaks (as in
  # tests/comm/mpirun.sh); the one-process shapes are leak-checked.
  [ "$ranks" = local ] || launch=(env "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
    timeout -k 5 200 mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$ranks" "$work/$tag")
  OMP_NUM_THREADS=1 "${launch[@]}" --init "$fixture/model.onnx" --data "$ref/train.bin" --steps 10 \
    "${train_flags[@]}" --dump-grads "$work/$tag.grads" --log "$work/$tag.jsonl" >"$work/$tag.err" 2>&1 ||
    { fail "the trainer built with $* exited with $?: $(tail -n 5 "$work/$tag.err")"; return 1; }
}

# check TAG WHAT OTHER TOL [--losses] [--steps N]: tokpipe-compare, its worst error kept
check() {
  local tag=$1 what=$2 other=$3 tol=$4 out
  shift 4
  if [ "${1:-}" = --losses ]; then
    shift
    out=$("$compare" --losses "$work/$tag.jsonl" "$other" "$@" --tol "$tol" 2>&1)
  else
    out=$("$compare" "$work/$tag.grads" "$other" --tol "$tol" 2>&1)
  fi || { fail "$tag: $what: $out"; return 1; }
  echo "  $tag: $what (tol $tol): $(grep -o 'worst [^(]*' <<<"$out")"
}

train whole local || exit 1
for shape in "${shapes[@]}"; do
  read -r S sl M D sched how <<<"$shape"
  [ "$mode" = all ] || [ "${how:-}" = mpi ] || continue
  ranks=local
  [ "${how:-}" = mpi ] && ranks=$((S * D))
  tag="s$S-${sl//,/-}-m$M-d$D-$sched"
  flags=(--stages "$S" --microbatches "$M" --dp "$D" --schedule "$sched")
  [ "$sl" = 1 ] || flags+=(--slices "$sl")
  where="all ranks in one process"
  [ "$ranks" = local ] || where="mpirun -np $ranks"
  echo "matrix: $name: ${flags[*]} ($where)"
  train "$tag" "$ranks" "${flags[@]}" || continue
  check "$tag" "step-1 loss vs unsliced" "$work/whole.jsonl" 1e-5 --losses --steps 1 &&
    check "$tag" "step-1 gradients vs unsliced" "$work/whole.grads" 1e-5 &&
    check "$tag" "step-1 loss vs PyTorch" "$ref/losses.jsonl" 1e-5 --losses --steps 1 &&
    check "$tag" "step-1 gradients vs PyTorch" "$ref/grads.safetensors" 1e-4 &&
    check "$tag" "10 losses vs PyTorch" "$ref/losses.jsonl" 1e-4 --losses --steps 10 &&
    echo "matrix: ok: $name ${flags[*]}"
done
exit $status
