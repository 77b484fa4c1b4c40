#!/bin/sh
# run.sh CASE BIN_DIR SRC_DIR WORK_DIR: --zero 1 (the replicas shard the AdamW state) on
# trainers tokpipec generates from a GPT fixture (2 layers, tied embedding and head), under
# mpirun as the data-parallel tests run them. Prints "ok ..." lines and exits 0, or prints
# "FAIL ..." and exits 1.
#   bits     3 steps with gradient clipping: --zero 1 --dp 2 gives the bits of --dp 2
#            (weights, step 1's gradients, the log), under mpirun and in one process (on the
#            strict CPU backend: device memory the runtime touches directly is a crash); also
#            with 2 stages and 2 microbatches (1f1b, sliced; and bf16 storage, where each
#            replica keeps its shard's fp32 masters and the 16-bit working copies are
#            gathered), with fp16 storage over 1 stage, and with 2 tensor ranks (a Gemma
#            fixture, under mpirun only); --zero 1 --dp 1 is the plan of --dp 1
#   resume   a --zero 1 --dp 2 checkpoint holds whole tensors: the bytes of a plain --dp 2
#            one; it resumes bit for bit under --zero 1 (mpirun, one process) and plain
#            --dp 2, and a plain one under --zero 1; under --zero 1 --dp 4 as under plain
#            --dp 4 (bits), and like the uninterrupted run under --dp 1 and --dp 4
#            (1e-3 of each tensor's largest value: the sums run in other orders, and AdamW
#            turns the float noise of gradients zero in exact arithmetic, the key biases',
#            into steps of up to the learning rate; every other tensor agrees to 1e-5); and
#            under bf16 storage (the checkpoint's whole fp32 masters gathered from the
#            shards, scattered to them again): the bytes of plain --dp 2's checkpoint, resumed
#            bit for bit under --zero 1 (mpirun, one process) and plain --dp 2, and under
#            --zero 1 --dp 4 as under plain --dp 4
#   memory   --emit=memory: a rank's optimizer state under --zero 1 --dp 2 is half of --dp 2's,
#            and under bf16 its fp32 master weights too (the fixture has no frozen parameter)
#   cuda-emulated TRAINERS_DIR  tests/codegen's tiny GPT's --dp 2 CUDA trainers on the
#            emulated runtime (built by CMakeLists.txt), a GPU per
#            process (NCCL: ncclReduce and ncclBroadcast): --zero 1 gives the bits of plain
#            --dp 2, and of itself in one process (one GPU, host collectives); its step 1
#            gradients those of the CPU --zero 1 trainer within 1e-5 (other kernels); under
#            bf16 (the 16-bit working copies all-gathered) --zero 1 --dp 2 gives the bits
#            of bf16 --dp 2
case=$1 bin=$2 src=$3 work=$4/$1 trainers=$5
mpi="sh $src/../comm/mpirun.sh"
. "$src/../case.sh"
export OMP_NUM_THREADS=1

model=$src/../fixtures/gpt_o14_tanh_tied_bias_dyn_conv1d/model.onnx bt="--batch 4 --seq 7"
i=0
while [ $i -lt 30 ]; do
  echo "pack my box with five dozen liquor jugs $i; the five boxing wizards jump quickly."
  i=$((i + 1))
done >text.txt
"$bin/tokpipe-tokens" text.txt -o train.bin 2>/dev/null || { fail "tokpipe-tokens"; exit 1; }
opts="--lr 0.01 --grad-clip 0.5" data=train.bin

# The log without the timing fields, which differ from run to run.
untimed() { sed -E 's/, "ms": [^,]*, "tokens_per_s": [^,}]*//' "$1"; }

# gen NAME 'TOKPIPEC OPTIONS': the trainer NAME; its rank count in ranks_NAME.
gen() {
  # shellcheck disable=SC2086
  "$bin/tokpipec" "$model" $bt --exe "$1" $2 >"$1.gen" 2>&1 || { fail "tokpipec $2: $(cat "$1.gen")"; return 1; }
  s=$(echo " $2 " | sed -n 's/.* --stages \([0-9]*\) .*/\1/p') d=$(echo " $2 " | sed -n 's/.* --dp \([0-9]*\) .*/\1/p')
  n=$(echo " $2 " | sed -n 's/.* --tensor \([0-9]*\) .*/\1/p')
  eval "ranks_$1=$((${s:-1} * ${d:-1} * ${n:-1}))"
}

# train TRAINER OUT [local] ARGS...: runs TRAINER (under mpirun unless local or one rank),
# writing OUT.out.
train() {
  exe=$1 out=$2
  shift 2
  eval "n=\$ranks_$exe"
  launch=./$exe
  if [ "$1" = local ]; then
    shift
  elif [ "$n" -gt 1 ]; then
    launch="$mpi 120 $n ./$exe"
  fi
  $launch --data "$data" $opts "$@" >"$out.out" 2>&1 || { fail "$out: the run failed: $(tail -5 "$out.out")"; return 1; }
}

same() { # same WHAT A B
  if cmp -s "$2" "$3"; then ok "$1"; else fail "$1: $2 and $3 differ"; fi
}

case $case in
bits)
  # shape NAME 'OPTIONS': trains plain and --zero 1 3 steps, compares
  shape() {
    gen "$1" "$2" && gen "$1z" "$2 --zero 1" || return
    for exe in "$1" "$1z"; do
      train "$exe" "$exe" --init "$model" --steps 3 --dump-weights "$exe.w" --dump-grads "$exe.g" --log "$exe.jsonl"
    done
    same "$2 --zero 1: the weights of $2 after 3 steps" "$1.w" "$1z.w"
    same "$2 --zero 1: step 1's gradients (gathered from the shards)" "$1.g" "$1z.g"
    [ -s "$1.jsonl" ] && [ "$(untimed "$1.jsonl")" = "$(untimed "$1z.jsonl")" ] && ok "$2 --zero 1: the same losses and gradient norms" ||
      fail "$2 --zero 1: logs differ: $(untimed "$1.jsonl") vs $(untimed "$1z.jsonl")"
    case "$2" in *--tensor*) return ;; esac # one process per rank
    TOKPIPE_TEST_STRICT_DEVICE=1 train "$1z" "$1zl" local --init "$model" --steps 3 --dump-weights "$1zl.w" \
      --dump-grads "$1zl.g"
    same "$2 --zero 1 in one process: the weights under mpirun" "$1z.w" "$1zl.w"
    same "$2 --zero 1 in one process: the gradients under mpirun" "$1z.g" "$1zl.g"
  }
  shape d2 "--dp 2"
  shape s2 "--stages 2 --microbatches 2 --dp 2 --schedule 1f1b --slices 3,2,2"
  shape b2 "--stages 2 --microbatches 2 --dp 2 --precision bf16" # shards of fp32 masters
  shape f2 "--dp 2 --precision fp16"
  # tensor ranks too (hf_gemma: GQA, K/V heads held by pairs of ranks): 2 x 2 ranks
  gpt=$model model=$src/../fixtures/hf_gemma/model.onnx bt="--batch 2 --seq 16" data=$src/../fixtures/hf_gemma/train/train.bin
  shape t2 "--tensor 2 --dp 2"
  model=$gpt bt="--batch 4 --seq 7"
  "$bin/tokpipec" "$model" $bt --zero 1 -o z1.c && "$bin/tokpipec" "$model" $bt -o n1.c &&
    same "--zero 1 --dp 1: the plan of --dp 1" n1.c z1.c
  ;;

resume)
  # resume_under P 'OPTIONS': a --zero 1 --dp 2 run of OPTIONS (trainers and files named
  # P...), uninterrupted 3 steps, and 2 steps saved then resumed for the third under
  # --zero 1, in one process, under plain --dp 2, and under --zero 1 --dp 4 against plain
  # --dp 4; the checkpoint is a plain --dp 2 one's bytes. What it says starts with $say.
  resume_under() {
    p=$1
    gen "${p}z2" "--dp 2 --zero 1 $2" && gen "${p}d2" "--dp 2 $2" && gen "${p}z4" "--dp 4 --zero 1 $2" &&
      gen "${p}d4" "--dp 4 $2" || exit 1
    train "${p}z2" "${p}full" --init "$model" --steps 3 --dump-weights "${p}full.w"
    train "${p}z2" "${p}part" --init "$model" --steps 2 --save "${p}ck"
    train "${p}d2" "${p}part-plain" --init "$model" --steps 2 --save "${p}ck-plain"
    train "${p}z2" "${p}z2" --resume "${p}ck" --steps 3 --dump-weights "${p}z2.w"
    train "${p}z2" "${p}z2l" local --resume "${p}ck" --steps 3 --dump-weights "${p}z2l.w"
    for n in d2 z4 d4; do train "$p$n" "$p$n" --resume "${p}ck" --steps 3 --dump-weights "$p$n.w"; done
    same "${say}a --zero 1 --dp 2 checkpoint: the bytes of a --dp 2 one" "${p}ck/checkpoint.safetensors" \
      "${p}ck-plain/checkpoint.safetensors"
    same "${say}... resumed under --zero 1: the uninterrupted weights" "${p}full.w" "${p}z2.w"
    same "${say}... resumed in one process: the uninterrupted weights" "${p}full.w" "${p}z2l.w"
    same "${say}... resumed under plain --dp 2: the uninterrupted weights" "${p}full.w" "${p}d2.w"
    same "${say}... resumed under --zero 1 --dp 4: the weights of plain --dp 4" "${p}d4.w" "${p}z4.w"
  }
  say="" resume_under "" ""
  # and across: a plain --dp 2 checkpoint under --zero 1, and --dp 1 and --zero 1 --dp 4
  # (other sums, so within rounding) against the uninterrupted run
  gen d1 "" || exit 1
  train z2 plain-z2 --resume ck-plain --steps 3 --dump-weights plain-z2.w
  train d1 d1 --resume ck --steps 3 --dump-weights d1.w
  same "a plain --dp 2 checkpoint resumed under --zero 1: the uninterrupted weights" full.w plain-z2.w
  for n in d1 z4; do
    if "$bin/tokpipe-compare" "$n.w" full.w --tol 1e-3 >cmp.txt 2>&1; then
      ok "... resumed as $n: like the uninterrupted run ($(tail -1 cmp.txt))"
    else
      fail "$n: $(cat cmp.txt)"
    fi
  done
  # bf16 storage: the replicas hold shards of the fp32 masters, checkpoints the whole ones
  say="bf16: " resume_under b "--precision bf16"
  ;;

memory)
  state() { # the optimizer state bytes of rank 0
    # shellcheck disable=SC2086
    "$bin/tokpipec" "$model" $bt $1 --emit=memory | sed -n '/^rank 0 /,$s/^  optimizer state *\([0-9]*\) bytes.*/\1/p'
  }
  plain=$(state "--dp 2") zero=$(state "--dp 2 --zero 1") one=$(state "--dp 1 --zero 1")
  [ -n "$plain" ] && [ -n "$zero" ] && [ $((zero * 2)) -ge "$plain" ] && [ $((zero * 2)) -le $((plain + 16)) ] &&
    ok "a rank's optimizer state: $plain bytes under --dp 2, $zero under --zero 1 --dp 2" ||
    fail "optimizer state: --dp 2 $plain bytes, --zero 1 --dp 2 $zero"
  [ "$one" = "$plain" ] && ok "--zero 1 --dp 1: all of it ($one bytes)" || fail "--zero 1 --dp 1: $one bytes, not $plain"
  masters() { # the fp32 master weight bytes of rank 0
    # shellcheck disable=SC2086
    "$bin/tokpipec" "$model" $bt $1 --precision bf16 --emit=memory |
      sed -n '/^rank 0 /,$s/^  master weights *\([0-9]*\) bytes.*/\1/p'
  }
  plain=$(masters "--dp 2") zero=$(masters "--dp 2 --zero 1")
  [ -n "$plain" ] && [ -n "$zero" ] && [ $((zero * 2)) -ge "$plain" ] && [ $((zero * 2)) -le $((plain + 16)) ] &&
    ok "bf16: a rank's fp32 master weights: $plain bytes under --dp 2, $zero under --zero 1 --dp 2" ||
    fail "bf16 master weights: --dp 2 $plain bytes, --zero 1 --dp 2 $zero"
  ;;

cuda-emulated)
  run() { # run NAME TRAINER [PROCESSES]
    n=$1 exe=$2 np=${3:-1}
    launch=$trainers/$exe
    [ "$np" -gt 1 ] && launch="$mpi 200 $np $launch"
    TOKPIPE_CUDA_EMULATE_DEVICES=2 $launch $opts --init "$model" --data tiny.bin --steps 2 --dump-weights "$n.w" --dump-grads "$n.g" \
      >"$n.out" 2>&1 || { fail "$n: the run failed: $(tail -5 "$n.out")"; return 1; }
  }
  model=$src/../codegen/tiny_gpt.onnx
  byte_tokens 16 200 tiny.bin || exit 1
  run plain zero_dp2_cuda 2 && run zero zero_dp2_zero_cuda 2 && run local zero_dp2_zero_cuda &&
    run cpu zero_dp2_zero_cpu 2 && run bf16 zero_dp2_bf16_cuda 2 && run bf16-zero zero_dp2_zero_bf16_cuda 2 || exit 1
  grep -q " 2 ranks in 2 processes (nccl)\$" zero.out && ok "over NCCL: $(grep -m1 ' ranks in ' zero.out)" ||
    fail "not over NCCL: $(cat zero.out)"
  same "CUDA --zero 1 --dp 2: the weights of --dp 2 after 2 steps" plain.w zero.w
  same "CUDA --zero 1 --dp 2: step 1's gradients" plain.g zero.g
  same "CUDA --zero 1 in one process: the weights under NCCL" zero.w local.w
  same "CUDA bf16 --zero 1 --dp 2 (16-bit values all-gathered): the weights of bf16 --dp 2" bf16.w bf16-zero.w
  if "$bin/tokpipe-compare" zero.g cpu.g --tol 1e-5 >cmp.txt 2>&1; then
    ok "CUDA --zero 1: the CPU trainer's step 1 gradients ($(tail -1 cmp.txt))"
  else
    fail "CUDA against CPU: $(cat cmp.txt)"
  fi
  ;;

*)
  echo "unknown case $case"
  exit 2
  ;;
esac
exit $status
