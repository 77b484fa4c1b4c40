#!/bin/sh
# trainer.sh CASE BIN_DIR SRC_DIR WORK_DIR: the trainer runtime on the CUDA compute backend
# (runtime/cuda/backend.cu, tp_plan_device_cuda) over the emulated CUDA runtime, against the
# CPU backend: the hand-written plans of tests/train (tiny_plan.c) and tests/pipeline
# (pipe_plan.c) built twice, as tiny_trainer / pipe_trainer and, with .device set to
# the CUDA device, as tiny_trainer_cuda / pipe_trainer_cuda (test_device.h: a unit's loss
# reaches the host only at its stream's next synchronization, as on a GPU).
#
# What must be the same bits: losses, --dump-grads, --dump-weights, checkpoints, --export-onnx.
# The units are the same code on both (emulated device memory is host memory), and the
# backend's math (gradient sums and means, clipping, AdamW) is elementwise, one rounding per
# element as on the CPU. What differs: the gradient norm's sum of squares, summed over the
# same 64 pieces but in another order inside each (a GPU reduction): the double norms differ
# by about 1e-16 (relative; test_compute_cuda checks 1e-12), and the log's grad_norm, the
# norm rounded to a float, may then differ by one float step (2^-23 relative). With
# --grad-clip active (the norm scales the gradients) the weights must be within 1e-6.
case=$1 bin=$2 src=$3 work=$4/$1
mpi="sh $src/../comm/mpirun.sh"
. "$src/../case.sh"
export OMP_NUM_THREADS=1

# byte tokens of this script: both backends read the same data
"$bin/tokpipe-tokens" "$src/trainer.sh" -o train.bin --val-fraction 0.25 --val-out val.bin 2>/dev/null ||
  { fail "tokpipe-tokens"; exit 1; }

# The log without the timing fields and the grad norm.
unnormed() { sed -E 's/, "grad_norm": [^,]*//; s/, "ms": [^,]*, "tokens_per_s": [^,}]*//' "$1"; }
norms() { sed -E 's/.*"grad_norm": ([^,}]*).*/\1/' "$1"; }

same_files() { # same_files WHAT A B
  if cmp -s "$2" "$3"; then ok "$1"; else fail "$1: $2 and $3 differ"; fi
}

# same_run NAME: NAME-cpu.* and NAME-cuda.* (what exists of grads, weights, checkpoint,
# export) the same bits, the same losses, grad norms within one float step.
same_run() {
  n=$1
  for f in grads:--dump-grads weights:--dump-weights onnx:--export-onnx; do
    [ -f "$n-cpu.${f%%:*}" ] && same_files "$n: ${f#*:}: the same bits" "$n-cpu.${f%%:*}" "$n-cuda.${f%%:*}"
  done
  [ -d "$n-cpu.save" ] && same_files "$n: checkpoint: the same bits" "$n-cpu.save/checkpoint.safetensors" \
    "$n-cuda.save/checkpoint.safetensors"
  [ "$(unnormed "$n-cpu.jsonl")" = "$(unnormed "$n-cuda.jsonl")" ] && ok "$n: the same losses (log)" ||
    fail "$n: logs differ: $(unnormed "$n-cpu.jsonl" >a.txt; unnormed "$n-cuda.jsonl" | diff a.txt -)"
  norms "$n-cpu.jsonl" >a.txt
  norms "$n-cuda.jsonl" >b.txt
  if paste a.txt b.txt | awk '{ d = $1 - $2; if (d < 0) d = -d; if (!(d <= 1.2e-7 * $1)) bad = 1; n++ }
                             END { exit bad || n == 0 }'; then
    ok "$n: grad norms within one float step ($(paste a.txt b.txt | awk '$1 != $2' | wc -l) of $(wc -l <a.txt) differ)"
  else
    fail "$n: grad norms differ beyond one float step: $(paste a.txt b.txt | tr '\n' ' ')"
  fi
}

# run NAME BACKEND [mpi NP] ARGS...: BACKEND cpu or cuda's trainer ($prog, $prog_cuda).
run() {
  n=$1 b=$2
  shift 2
  exe=$bin/$prog
  [ "$b" = cuda ] && exe=$bin/${prog}_cuda
  launch=$exe
  if [ "$1" = mpi ]; then
    launch="$mpi 120 $2 $exe"
    shift 2
  fi
  $launch --data train.bin --log "$n-$b.jsonl" "$@" >"$n-$b.out" 2>&1 ||
    { fail "$n ($b): the run failed: $(tail -5 "$n-$b.out")"; return 1; }
}

# both NAME ARGS...: the run on each backend, then same_run (ARGS: {} stands for NAME-BACKEND).
both() {
  n=$1
  shift
  for b in cpu cuda; do
    run "$n" "$b" $(echo "$*" | sed "s/{}/$n-$b/g") || return 1
  done
  same_run "$n"
}

shape() { export PIPE_STAGES=$1 PIPE_MICROBATCHES=$2 PIPE_DP=$3 PIPE_SLICES=$4 PIPE_SCHEDULE=$5; }

case $case in
tiny) # ABI 1: two stage functions in one process; every output, resume, clipping
  prog=tiny_trainer
  both tiny --init "$src/../train/tiny.onnx" --steps 6 --lr 0.01 --val-data val.bin --val-every 3 --dump-grads {}.grads \
    --dump-weights {}.weights --save {}.save --save-every 3 --export-onnx {}.onnx
  # resumed from step 3's checkpoint, each backend from the other's
  for b in cpu cuda; do
    other=cuda
    [ $b = cuda ] && other=cpu
    TOKPIPE_TEST_KILL_AFTER_STEP=4 "$bin/${prog}$([ $other = cuda ] && echo _cuda)" --init "$src/../train/tiny.onnx" \
      --data train.bin --steps 6 --lr 0.01 --save "half-$other.save" --save-every 3 >/dev/null 2>&1
    run resume $b --resume "half-$other.save" --steps 6 --lr 0.01 --val-data val.bin --val-every 3 \
      --dump-weights "resume-$b.weights" --save "resume-$b.save" || continue
    same_files "resumed on $b from $other's step 3: the weights of the uninterrupted run" tiny-cpu.weights \
      "resume-$b.weights"
  done
  # --grad-clip below the norm: the norm scales the gradients, so the weights within 1e-6
  for b in cpu cuda; do run clip $b --init "$src/../train/tiny.onnx" --steps 4 --lr 0.01 --grad-clip 0.05 \
    --dump-weights "clip-$b.weights"; done
  "$bin/tokpipe-compare" clip-cuda.weights clip-cpu.weights --tol 1e-6 >cmp.txt 2>&1 &&
    ok "--grad-clip: weights within 1e-6 ($(grep -o 'max_rel_err=[^ ]*' cmp.txt | sort | tail -1))" ||
    fail "--grad-clip: $(cat cmp.txt)"
  [ "$(unnormed clip-cpu.jsonl | head -1)" = "$(unnormed clip-cuda.jsonl | head -1)" ] &&
    ok "--grad-clip: the same first loss" || fail "--grad-clip: first losses differ"
  ;;

pipeline) # ABI 2 in one process: stages x microbatches x slices x replicas, each stage its own stream
  prog=pipe_trainer
  for s in "a 2 1 1 8 gpipe" "b 2 2 1 5,3 1f1b" "c 2 2 2 3,3,2 1f1b" "d 1 2 2 5,3 gpipe"; do
    set -- $s
    shape $2 $3 $4 $5 $6
    both "$1" --init "$src/../pipeline/tiny2.onnx" --steps 3 --lr 0.01 --dump-grads {}.grads --dump-weights {}.weights
  done
  # The host waits for a rank's stream where every rank's does (the step's end, the norm,
  # the update): the last stage as often as the first, not once more per microbatch to
  # read its loss (its loss copies are read at the schedule's end).
  shape 2 4 1 5,3 1f1b
  PIPE_COUNT_SYNCS=1 run syncs cuda --init "$src/../pipeline/tiny2.onnx" --steps 3 --lr 0.01 --val-data val.bin \
    --val-every 2 && {
    first=$(sed -n 's/^stream 1: \([0-9]*\) synchronizations$/\1/p' syncs-cuda.out)
    last=$(sed -n 's/^stream 2: \([0-9]*\) synchronizations$/\1/p' syncs-cuda.out)
    [ -n "$first" ] && [ "$first" = "$last" ] && ok "4 microbatches: both stages' streams synchronized $first times" ||
      fail "stage 0's stream synchronized ${first:-?} times, stage 1's ${last:-?}: $(cat syncs-cuda.out)"
  }
  ;;

mpi) # under mpirun: 2 ranks (2 stages, 2 microbatches, 2 slices) and 4 (2 stages x 2 replicas)
  prog=pipe_trainer
  shape 2 2 1 5,3 1f1b
  both np2 mpi 2 --init "$src/../pipeline/tiny2.onnx" --steps 3 --lr 0.01 --dump-grads {}.grads --dump-weights {}.weights \
    --save {}.save --export-onnx {}.onnx
  shape 2 2 2 3,3,2 1f1b
  both np4 mpi 4 --init "$src/../pipeline/tiny2.onnx" --steps 3 --lr 0.01 --dump-grads {}.grads --dump-weights {}.weights
  # a device with a transport of its own (counting_comm.h, as NCCL): opened, used, closed
  PIPE_COUNTING_COMM=1 run np4-comm cuda mpi 4 --init "$src/../pipeline/tiny2.onnx" --steps 3 --lr 0.01 \
    --dump-grads np4-comm.grads
  same_files "4 ranks over the device's transport: the same gradients" np4-comm.grads np4-cuda.grads
  for r in 0 1 2 3; do
    sends=$(sed -n "s/^pipe_trainer_cuda: rank $r: the device transport carried \([0-9]*\) sends$/\1/p" np4-comm-cuda.out)
    [ "${sends:-0}" -gt 0 ] && ok "rank $r sent its $sends messages over the device's transport" ||
      fail "rank $r: no sends counted: $(cat np4-comm-cuda.out)"
  done
  # the one-process run of the 4-rank shape: the same bits on the CUDA backend
  run np4-one cuda --init "$src/../pipeline/tiny2.onnx" --steps 3 --lr 0.01 --dump-grads np4-one.grads
  same_files "4 ranks in one process or under mpirun: the same gradients" np4-one.grads np4-cuda.grads
  ;;

nccl) # the NCCL transport end to end (emulated NCCL: sends complete only once received, as
  # NCCL's; device memory allocation waits for the whole device): one GPU per rank, so the
  # CUDA device's own open_comm picks NCCL; every rank must say so, the bits must be the
  # CPU trainer's under mpirun, and a steady step's counts (stats.h) show no host wait
  # inside the schedule. 1F1B with several microbatches deadlocks a runtime that
  # allocates (or waits for its stream) between its sends and the receive its peer needs.
  prog=pipe_trainer
  export PIPE_NCCL=1
  for s in "np2-1f1b 2 2 4 1 5,3 1f1b" "np2-gpipe 2 2 2 1 8 gpipe" "np2-dp 2 1 2 2 5,3 gpipe" \
           "np4-1f1b 4 2 2 2 3,3,2 1f1b" "np4-gpipe 4 2 2 2 8 gpipe"; do
    set -- $s
    shape $3 $4 $5 $6 $7
    export TOKPIPE_CUDA_EMULATE_DEVICES=$2
    both "$1" mpi $2 --init "$src/../pipeline/tiny2.onnx" --steps 3 --lr 0.01 \
      --val-data val.bin --val-every 2 --dump-grads {}.grads --dump-weights {}.weights || continue
    r=0
    while [ $r -lt $2 ]; do
      grep -qx "pipe_trainer_cuda: rank $r: messages go through nccl" "$1-cuda.out" &&
        ok "$1: rank $r's messages go through NCCL" || fail "$1: rank $r: not NCCL: $(cat "$1-cuda.out")"
      # the last step (no validation, no dump): the host waits twice (the losses at the
      # schedule's end, the norm's pieces), allocates nothing and copies no pageable memory
      counts=$(grep -o "step counts (rank $r): [a-z_=0-9. ]*" "$1-cuda.out" | tail -1)
      echo "$counts" | grep -qE ' syncs=[0-2] allocs=0 queries=[0-9]+ pageable=0 ' &&
        ok "$1: rank $r's last step: $counts" || fail "$1: rank $r's last step waits or copies more: $counts"
      r=$((r + 1))
    done
  done
  ;;

no-gpu) # no GPU: one error line, exit 1, before any data is read (the data file is missing)
  prog=tiny_trainer
  TOKPIPE_CUDA_EMULATE_DEVICES=0 expect_message 1 "no GPU" \
    "tiny_trainer_cuda: error: no CUDA GPU: cudaGetDeviceCount: no CUDA-capable device is detected" \
    "$bin/tiny_trainer_cuda" --data missing.bin --steps 1
  if command -v mpirun >/dev/null; then
    TOKPIPE_CUDA_EMULATE_DEVICES=0 PIPE_STAGES=2 PIPE_MICROBATCHES=1 PIPE_DP=1 PIPE_SLICES=8 \
      $mpi 60 2 "$bin/pipe_trainer_cuda" --data missing.bin --steps 1 >out.txt 2>&1
    rc=$? # mpirun adds its own lines, without the word error
    [ $rc -eq 1 ] && [ "$(grep -c error out.txt)" -eq 1 ] &&
      grep -qx "pipe_trainer_cuda: error: no CUDA GPU: cudaGetDeviceCount: no CUDA-capable device is detected" out.txt &&
      ok "no GPU under mpirun -np 2: exit $rc, $(grep error out.txt)" || fail "no GPU under mpirun -np 2: exit $rc: $(cat out.txt)"
  fi
  TOKPIPE_CUDA_EMULATE_DEVICES=0 "$bin/tiny_trainer_cuda" --help >/dev/null 2>&1 && ok "--help needs no GPU" || fail "--help failed"
  ;;

*) fail "unknown case"
esac
exit $status
