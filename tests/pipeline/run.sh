#!/bin/sh
# run.sh CASE BIN_DIR SRC_DIR WORK_DIR: one pipeline-runtime test case on the hand-written
# plan pipe_plan.c (pipe_trainer; its shape comes from PIPE_* variables). Prints "ok ..."
# lines and exits 0, or prints "FAIL ..." and exits 1.
#
# The reference is the one-stage, one-microbatch, unsliced, one-replica run in one process;
# every pipeline shape must give its loss and gradients within 1e-5 (relative), and the
# same shape in one process or under mpirun the very same bits.
case=$1 bin=$2 src=$3 work=$4/$1
trainer=$bin/pipe_trainer
mpi="sh $src/../comm/mpirun.sh"
. "$src/../case.sh"
export OMP_NUM_THREADS=1

# A deterministic text (byte tokens), its training and validation token files.
i=0
while [ $i -lt 40 ]; do
  echo "pack my box with five dozen liquor jugs $i; the five boxing wizards jump quickly."
  i=$((i + 1))
done >text.txt
"$bin/tokpipe-tokens" text.txt -o train.bin --val-fraction 0.25 --val-out val.bin 2>/dev/null || { fail "tokpipe-tokens"; exit 1; }

common="--init $src/tiny2.onnx --data train.bin --steps 3 --lr 0.01"

# The log without the timing fields, which differ from run to run.
untimed() { sed -E 's/, "ms": [^,]*, "tokens_per_s": [^,}]*//' "$1"; }

# shape NAME STAGES MICROBATCHES DP SLICES SCHEDULE: sets the PIPE_* variables and `ranks`.
shape() {
  export PIPE_STAGES=$2 PIPE_MICROBATCHES=$3 PIPE_DP=$4 PIPE_SLICES=$5 PIPE_SCHEDULE=$6
  name=$1 ranks=$(($2 * $4))
}

# train NAME [mpi] ARGS...: runs the current shape, writing NAME.grads, NAME.jsonl.
train() {
  n=$1
  shift
  launch=$trainer
  if [ "$1" = mpi ]; then
    launch="$mpi 120 $ranks $trainer"
    shift
  fi
  $launch $common --dump-grads "$n.grads" --log "$n.jsonl" "$@" >"$n.out" 2>&1 ||
    { fail "$n: the run failed: $(tail -5 "$n.out")"; return 1; }
}

# like_reference NAME: gradients and losses within 1e-5 of ref's.
like_reference() {
  if "$bin/tokpipe-compare" "$1.grads" ref.grads --tol 1e-5 >cmp.txt 2>&1 &&
    "$bin/tokpipe-compare" --losses "$1.jsonl" ref.jsonl --tol 1e-5 >>cmp.txt 2>&1; then
    ok "$1: loss and gradients match the one-stage run ($(grep -o 'worst [^ ]* max_rel_err=[^ ]*' cmp.txt | head -1))"
  else
    fail "$1: $(cat cmp.txt)"
  fi
}

same_files() { # same_files WHAT A B
  if cmp -s "$2" "$3"; then ok "$1"; else fail "$1: $2 and $3 differ"; fi
}

reference() {
  shape ref 1 1 1 8 gpipe
  train ref || exit 1
}

case $case in
one-process) # every shape runs in one process too (no MPI needed)
  reference
  for s in "a 2 1 1 8 gpipe" "b 2 2 1 5,3 1f1b" "c 2 2 2 3,3,2 1f1b" "d 1 2 2 5,3 gpipe" "e 2 1 2 4,4 gpipe"; do
    shape $s
    train "$name" --trace "$name.json" && like_reference "$name"
    "$bin/pipe_check_trace" "$name.json" "$ranks" >/dev/null && ok "$name: trace of $ranks ranks" || fail "$name: trace"
  done
  grep -q "pipeline of 2 stages x 2 replicas, 2 microbatches of 1 row, 3 slices, 1f1b schedule; 4 ranks in 1 process (local)" c.out &&
    ok "the start line says the shape" || fail "start line: $(head -2 c.out)"
  ;;

matrix) # 2 stages x {1, 2} microbatches x {1, 2} replicas x {unsliced, 5+3} x both schedules
  reference
  for sched in gpipe 1f1b; do
    for mb in 1 2; do
      for dp in 1 2; do
        for sl in 8 5,3; do
          shape "s2-m$mb-d$dp-$(echo $sl | tr , +)-$sched" 2 $mb $dp $sl $sched
          train "$name" mpi && like_reference "$name"
        done
      done
    done
  done
  ;;

same-bits) # one process and mpirun run the same arithmetic
  for s in "x 2 2 2 5,3 1f1b" "y 2 1 1 3,3,2 gpipe"; do
    shape $s
    train "$name-local" --dump-weights "$name-local.weights" &&
      train "$name-mpi" mpi --dump-weights "$name-mpi.weights" || continue
    same_files "$name: the same gradients in one process and under mpirun -np $ranks" "$name-local.grads" "$name-mpi.grads"
    same_files "$name: the same weights after 3 steps" "$name-local.weights" "$name-mpi.weights"
    [ "$(untimed "$name-local.jsonl")" = "$(untimed "$name-mpi.jsonl")" ] && ok "$name: the same log" || fail "$name: logs differ"
  done
  ;;

outputs) # gathered to one file by rank 0: weights, ONNX, trace, log with validation
  shape o 2 2 2 5,3 1f1b
  train o-local --dump-weights o-local.weights --export-onnx o-local.onnx --val-data val.bin
  train o mpi --dump-weights o.weights --export-onnx o.onnx --val-data val.bin --trace o.json
  same_files "--dump-weights: one file, as in one process" o-local.weights o.weights
  same_files "--export-onnx: one model, as in one process" o-local.onnx o.onnx
  grep -q '"val_loss"' o.jsonl && [ "$(untimed o-local.jsonl)" = "$(untimed o.jsonl)" ] &&
    ok "--log with val_loss, as in one process" || fail "log: $(cat o.jsonl)"
  "$bin/pipe_check_trace" o.json 4 >check.txt 2>&1 && ok "--trace: valid JSON, 4 ranks ($(cat check.txt))" ||
    fail "trace: $(cat check.txt)"
  [ "$(grep -c '"step"' o.jsonl)" -eq 3 ] && [ "$(grep -c 'step ' o.out)" -eq 3 ] &&
    ok "one log line and one progress line per step" || fail "log lines: $(cat o.out)"
  ;;

resume) # checkpoints gather to one file; a resumed run continues bit for bit
  shape r 2 2 2 5,3 1f1b
  common="--init $src/tiny2.onnx --data train.bin --lr 0.01"
  $mpi 120 4 "$trainer" $common --steps 4 --dump-weights full.weights --log full.jsonl 2>/dev/null || fail "4 steps"
  $mpi 120 4 "$trainer" $common --steps 2 --save ck 2>/dev/null || fail "2 steps"
  common="--data train.bin --lr 0.01"
  $mpi 120 4 "$trainer" $common --steps 4 --resume ck --dump-weights resumed.weights --log ck.jsonl 2>/dev/null || fail "resume"
  same_files "2 steps + 2 resumed under mpirun: the same weights" full.weights resumed.weights
  "$trainer" $common --steps 4 --resume ck --dump-weights local.weights 2>/dev/null || fail "resume in one process"
  same_files "an mpirun checkpoint resumed in one process: the same weights" full.weights local.weights
  ;;

errors) # a wrong process count is one clear error; so is a failure of one rank only
  shape p 2 1 1 8 gpipe
  $mpi 60 3 "$trainer" $common >out.txt 2>&1
  rc=$?
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(grep -c 'error' out.txt)" -eq 1 ] &&
    grep -q "pipe_trainer: error: the plan has 2 stages x 1 replica = 2 ranks; mpirun started 3" out.txt &&
    ok "exit $rc: $(grep error out.txt)" || fail "exit $rc: $(cat out.txt)"
  shape p 2 1 2 8 gpipe
  $mpi 60 2 "$trainer" $common >out.txt 2>&1
  grep -q "the plan has 2 stages x 2 replicas = 4 ranks; mpirun started 2" out.txt && ok "2 x 2 on 2: $(grep error out.txt)" ||
    fail "2 x 2 on 2: $(cat out.txt)"
  # tests/train's tiny.onnx has the first stage's parameters, not the last one's 'gain'
  $mpi 60 4 "$trainer" --init "$src/../train/tiny.onnx" --data train.bin --steps 2 >out.txt 2>&1
  rc=$?
  [ $rc -eq 1 ] && [ "$(grep -c 'error' out.txt)" -eq 1 ] &&
    grep -q "pipe_trainer: error: rank 1: .*tiny.onnx: initializer 'gain' is missing" out.txt &&
    ok "only the last stage fails: $(grep error out.txt)" || fail "exit $rc: $(cat out.txt)"
  ;;

disagree) # processes given other options, data or checkpoints (an MPMD launch, a stale copy on
  # another node) stop before the first step with one error naming the field and processes;
  # a resume never reads a checkpoint another trainer is replacing
  shape g 2 1 1 8 gpipe
  export TOKPIPE_COMM_TIMEOUT=20
  # must_stop WHAT MESSAGE MPIRUN-ARGS...: exit 1 in 15 s, one error line, saying MESSAGE
  must_stop() {
    what=$1 msg=$2
    shift 2
    start=$(date +%s)
    $mpi 60 "$@" >out.txt 2>&1
    rc=$? took=$(($(date +%s) - start))
    [ $rc -eq 1 ] && [ $took -le 15 ] && [ "$(grep -c 'error' out.txt)" -eq 1 ] && grep -qF -- "$msg" out.txt &&
      ok "$what: exit 1 after ${took}s: $(grep error out.txt)" || fail "$what: exit $rc after ${took}s: $(cat out.txt)"
  }
  "$trainer" --init "$src/tiny2.onnx" --data train.bin --steps 2 --save ck2 2>/dev/null &&
    "$trainer" --init "$src/tiny2.onnx" --data train.bin --steps 3 --save ck3 2>/dev/null || fail "checkpoints"
  must_stop "each process its own checkpoint" "the processes disagree on the --resume checkpoint's step: process 0 has 2, process 1 has 3" \
    1 "$trainer" --data train.bin --steps 4 --resume ck2 : -np 1 "$trainer" --data train.bin --steps 4 --resume ck3
  # other letters: the same token count, another CRC
  tr a-y b-z <text.txt >text2.txt
  "$bin/tokpipe-tokens" text2.txt -o same_size.bin --val-fraction 0.25 --val-out same_size_val.bin 2>/dev/null
  must_stop "another --data file on process 1" "the processes disagree on the --data file's CRC-32C: process 0 has" \
    1 "$trainer" $common : -np 1 "$trainer" --init "$src/tiny2.onnx" --data same_size.bin --steps 3 --lr 0.01
  must_stop "--log on process 0 only" "the processes disagree on --log: process 0 has --log, process 1 has no --log" \
    1 "$trainer" $common --log only0.jsonl : -np 1 "$trainer" $common
  must_stop "another --lr on process 1" "the processes disagree on --lr: process 0 has 0.01" \
    1 "$trainer" $common : -np 1 "$trainer" $common --lr 0.02
  # a command line wrong on process 1 only: exit 2 at once, process 1 says why
  start=$(date +%s)
  $mpi 60 1 "$trainer" $common : -np 1 "$trainer" $common --lr abc >out.txt 2>&1
  rc=$? took=$(($(date +%s) - start))
  [ $rc -eq 2 ] && [ $took -le 15 ] && grep -q "rank 1's command line" out.txt &&
    grep -q -- "error: --lr needs a number in \[0, .*\], not 'abc'" out.txt &&
    ok "a usage error on process 1 only: exit 2 after ${took}s" || fail "usage error on process 1: exit $rc after ${took}s: $(cat out.txt)"
  # a trainer saving to ck every step, a resume from ck under mpirun meanwhile
  "$trainer" --init "$src/tiny2.onnx" --data train.bin --steps 100000 --save busy --save-every 1 2>/dev/null &
  writer=$!
  i=0
  while [ ! -f busy/checkpoint.safetensors ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
  must_stop "a resume from a folder another trainer saves to" \
    "--resume checkpoint 'busy/checkpoint.safetensors' is being written by another process (it holds 'busy/checkpoint.safetensors.lock')" \
    2 "$trainer" --data train.bin --steps 100001 --resume busy
  kill "$writer"
  wait "$writer" 2>/dev/null
  # once it has stopped, the same resume runs
  $mpi 60 2 "$trainer" --data train.bin --steps 3 --resume ck2 >out.txt 2>&1 &&
    ok "a resume of an idle folder under mpirun runs" || fail "resume: $(cat out.txt)"
  ;;

rank-death) # a rank killed after step 1: the others end with an error, no hang
  shape k 2 2 2 5,3 1f1b
  start=$(date +%s)
  TOKPIPE_TEST_KILL_AFTER_STEP=1 TOKPIPE_TEST_KILL_RANK=1 $mpi 60 4 "$trainer" $common --steps 1000 >out.txt 2>&1
  rc=$? took=$(($(date +%s) - start))
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $took -le 20 ] && grep -q "exited on signal 9" out.txt &&
    ok "exit $rc after ${took}s: $(grep 'signal 9' out.txt)" || fail "exit $rc after ${took}s: $(cat out.txt)"
  ;;

generated-fixture | generated-deep | generated-interleaved) # trainers tokpipec generates, under mpirun
  # gen NAME MODEL 'TOKPIPEC OPTIONS': compiles the trainer NAME, trains it 3 steps on
  # train.bin (under mpirun when it has several ranks); then compared with ref's
  gen() {
    n=$1 model=$2
    # shellcheck disable=SC2086
    "$bin/tokpipec" "$model" --exe "$n" $3 >"$n.out" 2>&1 || { fail "tokpipec $3: $(cat "$n.out")"; return 1; }
    s=$(echo " $3 " | sed -n 's/.* --stages \([0-9]*\) .*/\1/p') d=$(echo " $3 " | sed -n 's/.* --dp \([0-9]*\) .*/\1/p')
    t=$(echo " $3 " | sed -n 's/.* --tensor \([0-9]*\) .*/\1/p')
    ranks=$((${s:-1} * ${d:-1} * ${t:-1}))
    launch=./$n
    [ $ranks -gt 1 ] && launch="$mpi 200 $ranks ./$n"
    # shellcheck disable=SC2086
    $launch --init "$model" --data train.bin --steps ${steps:-3} ${train_flags:-} --dump-grads "$n.grads" --log "$n.jsonl" >"$n.out" 2>&1 ||
      { fail "$n ($3): the run failed: $(tail -5 "$n.out")"; return 1; }
  }
  if [ $case = generated-fixture ]; then # 2 layers, tied embedding and head, B 4, T 7
    model=$src/../fixtures/gpt_o14_tanh_tied_bias_dyn_conv1d/model.onnx bt="--batch 4 --seq 7"
    set -- "--stages 2" "--stages 2 --microbatches 2 --slices 2" "--stages 2 --dp 2 --slices 3,2,2" \
      "--stages 2 --microbatches 2 --dp 2" "--stages 2 --schedule 1f1b --slices 3,2,2" \
      "--stages 2 --microbatches 2 --schedule 1f1b" "--stages 2 --dp 2 --schedule 1f1b --slices 2" \
      "--stages 2 --microbatches 2 --dp 2 --schedule 1f1b --slices 3,2,2" "--dp 2 --microbatches 2 --slices 3,2,2"
  else # 4 layers (tests/stages), tied, B 4, T 8
    model=$src/../stages/deep_gpt.onnx bt="--batch 4 --seq 8"
    byte_tokens 32 400 train.bin || exit 1 # its vocabulary is 32
    set -- "--stages 3 --microbatches 2 --slices 3,3,2 --schedule 1f1b" "--stages 4 --slices 2" \
      "--stages 4 --microbatches 2 --dp 2 --slices 5,3 --schedule 1f1b"
    if [ $case = generated-interleaved ]; then # 2 ranks x 2 chunks: the 4 layers as 4 virtual stages
      # 10 steps on the tokens of PyTorch's references (tests/stages/make_deep_gpt.py), which
      # each shape must match as tests/matrix's do
      parity=$src/../stages/deep_gpt_parity/train
      cp "$parity/train.bin" train.bin
      steps=10 train_flags=$(sed -n 's/^trainer //p' "$parity/args")
      set -- "--stages 2 --schedule interleaved --chunks 2 --microbatches 2 --slices 3,3,2" \
        "--stages 2 --schedule interleaved --chunks 2 --microbatches 2 --dp 2 --slices 5,3" \
        "--stages 2 --schedule interleaved --chunks 2 --microbatches 2 --dp 2 --zero 1 --stage-cuts 1,2,3" \
        "--stages 2 --schedule interleaved --chunks 2 --tensor 2 --microbatches 2 --slices 5,3"
    fi
  fi
  gen ref "$model" "$bt" || exit 1
  k=0
  for opts in "$@"; do
    k=$((k + 1))
    gen "g$k" "$model" "$bt $opts" && like_reference "g$k" && ok "g$k is $opts" || continue
    [ $case = generated-interleaved ] || continue
    if "$bin/tokpipe-compare" "g$k.grads" "$parity/grads.safetensors" --tol 1e-4 >cmp.txt 2>&1 &&
      "$bin/tokpipe-compare" --losses "g$k.jsonl" "$parity/losses.jsonl" --tol 1e-4 --steps 10 >>cmp.txt 2>&1; then
      ok "g$k: step-1 gradients and 10 losses within 1e-4 of PyTorch's ($(grep -o 'worst [^ ]* max_rel_err=[^ ]*' cmp.txt | tr '\n' ' '))"
    else
      fail "g$k vs PyTorch: $(cat cmp.txt)"
    fi
  done
  if [ $case = generated-interleaved ]; then
    $mpi 200 4 ./g2 --init "$model" --data train.bin --steps 1 --trace g2.json >g2t.out 2>&1
    "$bin/pipe_check_trace" g2.json 4 >check.txt 2>&1 && grep -q '"forward mb1/s1 of stage 3"' g2.json &&
      ok "--trace: 4 ranks, units named by virtual stage ($(cat check.txt))" || fail "trace: $(cat check.txt)"
    grep -q "pipeline of 2 stages of 2 virtual stages each x 2 replicas, 2 microbatches of 1 row, 2 slices, interleaved schedule; 4 ranks" g2t.out &&
      ok "the start line says the shape" || fail "start line: $(head -3 g2t.out)"
    # one process hosting both ranks: the same bits as mpirun
    ./g1 --init "$model" --data train.bin --steps ${steps} ${train_flags} --dump-grads g1-local.grads >g1-local.out 2>&1
    same_files "g1 in one process: the same gradients as under mpirun -np 2" g1-local.grads g1.grads
    # a checkpoint of 2 steps under mpirun, resumed in one process: 4 steps' weights to the bit
    $mpi 200 2 ./g1 --init "$model" --data train.bin --steps 4 $train_flags --dump-weights full.weights >ck.out 2>&1 &&
      $mpi 200 2 ./g1 --init "$model" --data train.bin --steps 2 $train_flags --save ck >>ck.out 2>&1 &&
      ./g1 --data train.bin --steps 4 $train_flags --resume ck --dump-weights resumed.weights >>ck.out 2>&1 ||
      fail "checkpoints: $(tail -5 ck.out)"
    same_files "g1: 2 steps under mpirun, saved, resumed in one process: the weights of 4 steps" full.weights resumed.weights
    # the process count is S x N x D, not the virtual stages'
    $mpi 60 4 ./g1 --init "$model" --data train.bin --steps 1 >out.txt 2>&1
    grep -q "error: the plan has 2 stages (of 2 interleaved virtual stages each) x 1 replica = 2 ranks; mpirun started 4" out.txt &&
      ok "4 processes for 2 ranks: $(grep error out.txt)" || fail "process count: $(cat out.txt)"
    # refused with one clear error: too few layers, bad --chunks
    refused() { # refused EXIT MESSAGE OPTIONS...
      want=$1 msg=$2
      shift 2
      "$bin/tokpipec" "$model" $bt --emit=c -o bad.c "$@" >out.txt 2>&1
      rc=$?
      [ $rc -eq "$want" ] && [ "$(grep -c error out.txt)" -eq 1 ] && grep -qF -- "$msg" out.txt &&
        ok "$*: exit $rc: $(cat out.txt)" || fail "$*: exit $rc: $(cat out.txt)"
    }
    refused 1 "cannot cut 4 layers into 2 stages x 3 chunks = 6 virtual stages (--schedule interleaved)" \
      --stages 2 --schedule interleaved --chunks 3
    refused 2 "--schedule interleaved needs --chunks V, V >= 2" --stages 2 --schedule interleaved
    refused 2 "(--chunks 1 is --schedule 1f1b)" --stages 2 --schedule interleaved --chunks 1
    refused 2 "--chunks 2 cuts each rank's layers into chunks for --schedule interleaved" --stages 2 --chunks 2
    refused 2 "--schedule interleaved needs --stages S, S >= 2" --schedule interleaved --chunks 2
    refused 2 "--chunks must be in [1, 64], got 0" --stages 2 --schedule interleaved --chunks 0
    refused 1 "--stage-cuts '1,2' has 2 cuts, but 4 stages need 3" --stages 2 --schedule interleaved --chunks 2 --stage-cuts 1,2
  fi
  ;;

generated-zb) # split backwards (--schedule zb) under mpirun: 2 and 4 stages with slices
  # 10 steps each: the one-stage run's losses and step-1 gradients within 1e-5, and the
  # very same bits as 1f1b's run of the same shape (the same ops, every sum in its order);
  # --trace shows the input and weight parts as events of their own
  model=$src/../stages/deep_gpt.onnx bt="--batch 4 --seq 8"
  byte_tokens 32 400 train.bin || exit 1 # its vocabulary is 32
  # run NAME 'TOKPIPEC OPTIONS' [TRAINER OPTIONS]: compiles and trains NAME 10 steps
  run() {
    n=$1 shape=$2
    shift 2
    # shellcheck disable=SC2086
    "$bin/tokpipec" "$model" --exe "$n" $bt $shape >"$n.out" 2>&1 || { fail "tokpipec $shape: $(cat "$n.out")"; return 1; }
    s=$(echo " $shape " | sed -n 's/.* --stages \([0-9]*\) .*/\1/p') d=$(echo " $shape " | sed -n 's/.* --dp \([0-9]*\) .*/\1/p')
    launch=./$n ranks=$((${s:-1} * ${d:-1}))
    [ $ranks -gt 1 ] && launch="$mpi 200 $ranks ./$n"
    $launch --init "$model" --data train.bin --steps 10 --dump-grads "$n.grads" --log "$n.jsonl" "$@" >"$n.run" 2>&1 ||
      { fail "$n ($shape): the run failed: $(tail -5 "$n.run")"; return 1; }
  }
  run ref "" || exit 1
  k=0
  for opts in "--stages 2 --microbatches 2 --slices 3,3,2" "--stages 4 --microbatches 2 --slices 2" \
    "--stages 2 --dp 2 --zero 1 --slices 5,3 --recompute full"; do
    k=$((k + 1))
    run "z$k" "$opts --schedule zb" --trace "z$k.json" && like_reference "z$k" || continue
    grep -q ', zb schedule; ' "z$k.run" || fail "z$k: the start line does not name the zb schedule"
    grep -q '"backward-input mb0/s0' "z$k.json" && grep -q '"backward-weight mb0/s0' "z$k.json" &&
      ! grep -q '"backward mb' "z$k.json" && ok "z$k: the trace shows backward-input and backward-weight" ||
      fail "z$k: the trace lacks backward-input or backward-weight events"
    run "o$k" "$opts --schedule 1f1b" || continue
    same_files "z$k ($opts): the gradients are 1f1b's bits" "z$k.grads" "o$k.grads"
    untimed "z$k.jsonl" >z.log && untimed "o$k.jsonl" >o.log && same_files "z$k: the losses are 1f1b's bits" z.log o.log
  done
  # a checkpoint after step 2 resumes to the uninterrupted run's weights after step 4
  train_z1() { $mpi 200 2 ./z1 --data train.bin "$@" >>z1.resume.out 2>&1; }
  if [ -x z1 ] && train_z1 --init "$model" --steps 4 --dump-weights u.weights &&
    train_z1 --init "$model" --steps 2 --save ck && train_z1 --steps 4 --resume ck --dump-weights r.weights; then
    same_files "z1: resumed from a checkpoint, the uninterrupted run's weights" r.weights u.weights
  else
    fail "z1: a checkpointed run failed: $(tail -5 z1.resume.out)"
  fi
  # 16-bit storage: each part rounds what it stores as the whole backward did, and a
  # weight part widens the 16-bit values it reads with its own Casts (exact)
  for p in bf16 fp16; do
    opts="--stages 2 --microbatches 2 --slices 3,3,2 --precision $p"
    if run "zb$p" "$opts --schedule zb" && run "o$p" "$opts --schedule 1f1b"; then
      same_files "zb$p ($opts): the gradients are 1f1b's bits" "zb$p.grads" "o$p.grads"
      untimed "zb$p.jsonl" >z.log && untimed "o$p.jsonl" >o.log && same_files "zb$p: the losses are 1f1b's bits" z.log o.log
    fi
  done
  ;;

*)
  echo "unknown case $case"
  exit 2
  ;;
esac
exit $status
