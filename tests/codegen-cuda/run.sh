#!/bin/sh
# run.sh CASE BIN_DIR SRC_DIR BUILD_DIR WORK_DIR CC [ARG...]: one test of the CUDA plans
# (tokpipec --target cuda). Prints "ok ..." lines and exits 0, or "FAIL ..." lines and exits 1.
#   compile DIR   the fixture DIR's plan in every shape (below), fp32 and bf16: written, free of
#                 host reads of device memory, bf16 with bf16 storage and bf16 products only,
#                 and compiled with -Werror against the CUDA headers (tokpipe-cuda.pc)
#   link          tokpipec --target cuda --exe and cc plan.c $(pkg-config ... tokpipe-cuda)
#                 link trainers (needs runtime/cuda's ops and backend)
#   no-gpu T      the link test's trainer T, on a machine without a GPU: one line saying so,
#                 exit 1
#   install       cmake --install: the CUDA runtime, its headers and tokpipe-cuda.pc are
#                 installed, and a CUDA plan compiles against the installed flags
#   no-cuda       (a tokpipec built without CUDA) --target cuda writes the plan; --exe
#                 refuses it with one line
#   emulated A B M [TOL]  the trainers A (the CUDA plan on the emulated CUDA runtime, on the
#                 CPU) and B (the CPU plan of the same model M and shape) train 2 steps
#                 alike: losses and gradients within TOL (relative; 1e-5 unless given); and A
#                 without a GPU says so
#   emulated-vocab A B M PLAN  like emulated, on model M whose vocabulary the CUDA plan PLAN
#                 (trainer A's) pads (its param_pad): tokens over the whole vocabulary, the
#                 losses and every gradient within 1e-5; and the checkpoints (--save) of a
#                 step at lr 0 (AdamW would turn the 1e-7 noise of a gradient that is zero
#                 in exact arithmetic, attention's key bias, into steps of lr's size) hold
#                 the same tensors of the same shapes (the true vocabulary's) within 1e-5:
#                 the weights as loaded, the moments of step 1's gradients
#   emulated-skip A B M  the fp16 trainers A (CUDA, emulated) and B (CPU) of model M, from a
#                 loss scale of 2^17 for 4 steps: the same scales, overflowing steps skipped
#                 (halving the scale, which the units read from device memory) then updates
#   emulated-same A B M  two CUDA trainers of model M on the emulated runtime (a plan and the
#                 same plan with --recompute full, or under --schedule zb) train a step to
#                 the same gradients (the bytes of --dump-grads) and loss
#   emulated-mpi A B NP M  the CUDA trainer A of model M on the emulated runtime under
#                 mpirun -np NP, 2 steps: with one emulated GPU per process, its messages over
#                 NCCL links (the trainer says nccl, no note of host copies), against B (the
#                 CPU plan, one process): losses and last gradients within 1e-5; and with
#                 every process on one emulated GPU (which NCCL refuses: MPI with host copies,
#                 and a note saying so) the NCCL run's losses and gradients, bit for bit
case=$1 bin=$2 src=$3 build=$4 work=$5/$1 cc=$6
shift 6
root=$src/../..
tokpipec=$bin/tokpipec
. "$src/../case.sh"
export OMP_NUM_THREADS=1

# A static fixture with vocabulary 128 (tests/codegen's), for the link and install tests.
model=$root/tests/fixtures/gpt_o17_erf_tied_bias_static/model.onnx
# cuda_flags PC_DIR 'PKG-CONFIG OPTIONS': tokpipe-cuda's flags from the .pc files in PC_DIR.
# shellcheck disable=SC2086 # the options are words
cuda_flags() { PKG_CONFIG_PATH=$1 pkg-config $2 tokpipe-cuda; }

# The plan must not read device memory on the host: no float dereference of a view's data,
# no constant array used as tensor data, no loss read in place; and it names the device.
device_only() {
  if grep -nE '\*\(const float \*\)|\(void \*\)(probe[0-9]+_)?k_|io->loss =' "$1" >bad.txt; then
    fail "$1 reads device memory on the host: $(head -3 bad.txt)"
    return 1
  fi
  grep -q '^    \.device = &tp_plan_device_cuda,$' "$1" || { fail "$1: no .device = &tp_plan_device_cuda"; return 1; }
  if grep -E 'CHECK\(tp_' "$1" | grep -vE 'CHECK\(tp_cuda_' >bad.txt; then
    fail "$1 calls a kernel that is not a CUDA one: $(head -3 bad.txt)"
    return 1
  fi
}

# The bf16 plan stores in bf16 (TpPlan.precision) and calls the bf16 matrix products and attention only
# (where the fp32 plan calls any).
products='gemm|matmul|linear_f32|linear_backward_f32|linear_gelu_f32|linear_backward_dgelu_f32|matmul_backward_f32|attention_f32|attention_backward_f32'
bf16_plan() {
  if grep -nE "tp_cuda_($products)\(" "$2" >bad.txt; then
    fail "$2 calls an f32 matrix product: $(head -3 bad.txt)"
    return 1
  fi
  if grep -qE "tp_cuda_($products)\(" "$1" && ! grep -qE "tp_cuda_bf16_($products)\(" "$2"; then
    fail "$2 calls no bf16 matrix product"
    return 1
  fi
  grep -q '\.precision = TP_PLAN_BF16' "$2" || { fail "$2 does not store in bf16 (.precision = TP_PLAN_BF16)"; return 1; }
}

case $case in
compile)
  dir=$1
  name=$(basename "$dir")
  dims=$(cat "$dir/dims" 2>/dev/null)
  long=$dims # the 16-token slicings (7,5,4) on a dynamic model: batch 2, seq 16
  [ -n "$dims" ] && long="--dim batch=2 --dim seq=16"
  cflags=$(cuda_flags "$build" --cflags) || { fail "pkg-config --cflags tokpipe-cuda (build tree)"; exit 1; }
  set -- "plain|$dims" "s2-sl2|$dims --stages 2 --slices 2" \
    "s3-sl754-mb2|$long --stages 3 --slices 7,5,4 --microbatches 2" \
    "s2-sl754-mb2-dp2-1f1b|$long --stages 2 --slices 7,5,4 --microbatches 2 --dp 2 --schedule 1f1b"
  compiled=""
  for shape in "$@"; do
    tag=${shape%%|*} flags=${shape#*|}
    written=yes
    for precision in fp32 bf16; do
      # shellcheck disable=SC2086 # flags is a list of words
      "$tokpipec" "$dir/model.onnx" $flags --target cuda --precision $precision -o "$tag.$precision.c" \
        2>"$tag.$precision.err" || { written=no && break; }
    done
    if [ $written = no ]; then
      if grep -qE "cannot cut [0-9]+ layers? into [0-9]+ stages" "$tag.$precision.err"; then
        ok "$name $tag: skipped: $(sed 's/.*model.onnx: //' "$tag.$precision.err")"
      else
        fail "$name $tag $precision: tokpipec: $(cat "$tag.$precision.err")"
      fi
      continue
    fi
    device_only "$tag.fp32.c" && device_only "$tag.bf16.c" && bf16_plan "$tag.fp32.c" "$tag.bf16.c" &&
      ok "$name $tag: fp32 and bf16 plans written, device memory only"
    # every shape's fp32 plan compiles; bf16 in two shapes
    compiled="$compiled $tag.fp32"
    case $tag in plain | s2-sl754-mb2-dp2-1f1b) compiled="$compiled $tag.bf16" ;; esac
  done
  # the compiles run at once (the plans are independent); each reports its own result
  for plan in $compiled; do
    # shellcheck disable=SC2086 # cflags is a list of flags
    "$cc" -std=c11 -Wall -Wextra -Werror -pedantic $cflags -c "$plan.c" -o "$plan.o" 2>"$plan.cc" &
  done
  wait
  for plan in $compiled; do
    if [ -s "$plan.o" ] && [ ! -s "$plan.cc" ]; then
      ok "$name $plan: $(wc -l <"$plan.c") lines compile cleanly"
    else
      fail "$name $plan: $(head -5 "$plan.cc")"
    fi
  done
  ;;

link)
  expect_exit 0 "tokpipec --target cuda --precision bf16 --exe" \
    "$tokpipec" "$model" --target cuda --precision bf16 -o plan.c --exe trainer -v && [ -x trainer ] &&
    ok "linked: $(head -1 err.txt)"
  flags=$(cuda_flags "$build" "--cflags --libs") || { fail "pkg-config tokpipe-cuda (build tree)"; exit 1; }
  # shellcheck disable=SC2086
  expect_exit 0 "cc plan.c \$(pkg-config --cflags --libs tokpipe-cuda)" "$cc" plan.c $flags -o trainer2 &&
    ok "cc plan.c $flags"
  ;;

no-gpu)
  trainer=$1 # the link test's
  [ -x "$trainer" ] || { fail "no trainer from the link test ($trainer)"; exit 1; }
  "$trainer" --data none.bin --steps 1 >out.txt 2>&1
  rc=$?
  if [ $rc -eq 1 ] && [ "$(wc -l <out.txt)" -eq 1 ] && grep -q 'error: no CUDA GPU' out.txt; then
    ok "without a GPU: $(cat out.txt)"
  else
    fail "without a GPU: exit code $rc (expected 1) and one line saying there is no CUDA GPU, got: $(cat out.txt)"
  fi
  ;;

install)
  expect_exit 0 "cmake --install" cmake --install "$build" --prefix "$work/prefix" || exit 1
  for f in lib/libtokpipe_cuda.a lib/pkgconfig/tokpipe-cuda.pc include/tokpipe/runtime/cuda/ops.h \
    include/tokpipe/runtime/cuda/stream.h include/tokpipe/runtime/cuda/kernels.h include/tokpipe/runtime/cuda/blas.h \
    include/tokpipe/runtime/cuda/check.h; do
    [ -e "prefix/$f" ] || fail "not installed: $f"
  done
  cflags=$(cuda_flags "$work/prefix/lib/pkgconfig" --cflags) || { fail "pkg-config of the installed tokpipe-cuda.pc"; exit 1; }
  case $cflags in *"$work/prefix/"*) ;; *) fail "the installed .pc does not point into the prefix: $cflags" ;; esac
  expect_exit 0 "installed tokpipec --target cuda" prefix/bin/tokpipec "$model" --target cuda -o plan.c || exit 1
  # shellcheck disable=SC2086
  expect_exit 0 "cc -c plan.c \$(pkg-config --cflags tokpipe-cuda) (installed)" \
    "$cc" -std=c11 -Wall -Wextra -Werror -c plan.c $cflags -o plan.o && ok "compiles with $cflags"
  ;;

no-cuda)
  expect_exit 0 "tokpipec --target cuda -o plan.c" "$tokpipec" "$model" --target cuda -o plan.c &&
    device_only plan.c && ok "the plan is written"
  expect_message 1 "--exe without the CUDA runtime" \
    "tokpipec: error: --exe: this tokpipec was built without the CUDA runtime (TOKPIPE_CUDA=OFF)" \
    "$tokpipec" "$model" --target cuda --exe trainer
  [ ! -e trainer ] || fail "a trainer was written"
  ;;

emulated)
  cuda=$1 cpu=$2 model=$3 tol=${4:-1e-5}
  byte_tokens 16 300 train.bin || exit 1 # the model's vocabulary is 16
  for t in cuda cpu; do
    eval "trainer=\$$t"
    expect_exit 0 "the $t trainer" "$trainer" --init "$model" --data train.bin --steps 2 --lr 0.01 \
      --dump-grads "$t.grads" --log "$t.jsonl" || exit 1
  done
  if "$bin/tokpipe-compare" cuda.grads cpu.grads --tol "$tol" >cmp.txt 2>&1 &&
    "$bin/tokpipe-compare" --losses cuda.jsonl cpu.jsonl --tol "$tol" >>cmp.txt 2>&1; then
    ok "the emulated CUDA trainer's losses and gradients are the CPU trainer's ($(grep -o 'worst [^ ]* max_rel_err=[^ ]*' cmp.txt | head -1))"
  else
    fail "the emulated CUDA trainer differs from the CPU trainer: $(cat cmp.txt)"
  fi
  TOKPIPE_CUDA_EMULATE_DEVICES=0 "$cuda" --init "$model" --data train.bin --steps 1 >out.txt 2>&1
  rc=$?
  if [ $rc -eq 1 ] && [ "$(wc -l <out.txt)" -eq 1 ] && grep -q 'error: no CUDA GPU' out.txt; then
    ok "without a GPU: $(cat out.txt)"
  else
    fail "without a GPU: exit code $rc (expected 1) and one line saying there is no CUDA GPU, got: $(cat out.txt)"
  fi
  ;;

emulated-vocab)
  cuda=$1 cpu=$2 model=$3 plan=$4 vocab=$5
  grep -q '^static const int param_pad' "$plan" || fail "the CUDA plan $plan pads no vocabulary"
  byte_tokens "$vocab" 300 train.bin || exit 1
  for t in cuda cpu; do
    eval "trainer=\$$t"
    mkdir -p "$t.ckpt"
    expect_exit 0 "the $t trainer" "$trainer" --init "$model" --data train.bin --steps 2 --lr 0.01 \
      --dump-grads "$t.grads" --log "$t.jsonl" || exit 1
    expect_exit 0 "the $t trainer at lr 0" "$trainer" --init "$model" --data train.bin --steps 1 --lr 0 \
      --save "$t.ckpt" || exit 1
  done
  if "$bin/tokpipe-compare" cuda.grads cpu.grads --tol 1e-5 >cmp.txt 2>&1 &&
    "$bin/tokpipe-compare" --losses cuda.jsonl cpu.jsonl --tol 1e-5 >>cmp.txt 2>&1; then
    ok "the padded CUDA plan's losses and gradients are the CPU trainer's ($(grep -o 'worst [^ ]* max_rel_err=[^ ]*' cmp.txt | head -1))"
  else
    fail "the padded CUDA plan differs from the CPU trainer: $(cat cmp.txt)"
  fi
  if "$bin/tokpipe-compare" cuda.ckpt/checkpoint.safetensors cpu.ckpt/checkpoint.safetensors --tol 1e-5 -v \
    >ckpt.txt 2>&1; then
    ok "the checkpoints hold the same tensors, of the true vocabulary's shapes ($(grep -c . ckpt.txt) lines compared)"
  else
    fail "the checkpoints differ: $(cat ckpt.txt)"
  fi
  ;;

emulated-skip)
  # shellcheck disable=SC2034 # cuda and cpu are read through eval
  cuda=$1 cpu=$2 model=$3
  byte_tokens 16 300 train.bin || exit 1
  for t in cuda cpu; do
    eval "trainer=\$$t"
    TOKPIPE_TEST_LOSS_SCALE=131072,3 expect_exit 0 "the $t fp16 trainer" "$trainer" --init "$model" \
      --data train.bin --steps 4 --lr 0.01 --log "$t.jsonl" || exit 1
    sed -E 's/.*"loss_scale": ([0-9]*)(, "skipped": true)?}/\1\2/' "$t.jsonl" | tr '\n' ' ' >"$t.scales"
  done
  scales=$(cat cuda.scales)
  case $scales in
  '131072, "skipped": true '*', "skipped": true '*[0-9]' ')
    if [ "$scales" = "$(cat cpu.scales)" ]; then
      ok "overflows skipped, halving the scale, then an update, as on the cpu: $scales"
    else
      fail "loss scales $scales, the CPU trainer's $(cat cpu.scales)"
    fi
    ;;
  *) fail "loss scales of the 4 steps (want skips from 2^17, then an update): $scales" ;;
  esac
  ;;

emulated-mpi)
  a=$1 b=$2 np=$3 model=$4
  byte_tokens 16 300 train.bin || exit 1
  expect_exit 0 "the CPU trainer" "$b" --init "$model" --data train.bin --steps 2 --dump-grads cpu.grads \
    --log cpu.jsonl || exit 1
  # devices 1: the processes share the GPU, so the host transport carries the messages
  for via in nccl:$np mpi:1; do
    TOKPIPE_CUDA_EMULATE_DEVICES=${via#*:} sh "$src/../comm/mpirun.sh" 200 "$np" "$a" --init "$model" \
      --data train.bin --steps 2 --dump-grads "${via%:*}.grads" --log "${via%:*}.jsonl" >"${via%:*}.out" 2>&1 ||
      { fail "mpirun -np $np over ${via%:*}: $(tail -5 "${via%:*}.out")"; exit 1; }
    sed 's/, "ms".*//' "${via%:*}.jsonl" >"${via%:*}.losses"
  done
  if grep -q " ranks in $np processes (nccl)\$" nccl.out && ! grep -q "host copies" nccl.out; then
    ok "one emulated GPU per process: $(grep -o '[0-9]* ranks in .*' nccl.out)"
  else
    fail "one emulated GPU per process: not over NCCL links: $(grep -E ' ranks in |note:' nccl.out)"
  fi
  if grep -q "note: processes share a GPU, which NCCL does not allow: messages go through mpi with host copies" mpi.out &&
    grep -q " ranks in $np processes (mpi)\$" mpi.out; then
    ok "one emulated GPU for all: $(grep -o '[0-9]* ranks in .*' mpi.out), with host copies"
  else
    fail "one emulated GPU for all: not over MPI with host copies: $(grep -E ' ranks in |note:' mpi.out)"
  fi
  if "$bin/tokpipe-compare" nccl.grads cpu.grads --tol 1e-5 >cmp.txt 2>&1 &&
    "$bin/tokpipe-compare" --losses nccl.jsonl cpu.jsonl --tol 1e-5 >>cmp.txt 2>&1; then
    ok "$(basename "$a") under mpirun -np $np over NCCL: the CPU trainer's losses and gradients ($(grep -o 'worst [^ ]* max_rel_err=[^ ]*' cmp.txt | head -1))"
  else
    fail "$(basename "$a") under mpirun -np $np over NCCL: $(cat cmp.txt)"
  fi
  if cmp -s nccl.grads mpi.grads && cmp -s nccl.losses mpi.losses; then
    ok "over NCCL and over MPI: the same gradients to the bit ($(wc -c <nccl.grads) bytes), and losses ($(tr '\n' ' ' <nccl.losses))"
  else
    fail "over NCCL and over MPI: $(cmp nccl.grads mpi.grads) $(diff nccl.losses mpi.losses)"
  fi
  ;;

emulated-same)
  a=$1 b=$2 model=$3
  byte_tokens 16 300 train.bin || exit 1
  for t in a b; do
    eval "trainer=\$$t"
    expect_exit 0 "the trainer $trainer" "$trainer" --init "$model" --data train.bin --steps 1 \
      --dump-grads "$t.grads" --log "$t.jsonl" || exit 1
    sed 's/, "ms".*//' "$t.jsonl" >"$t.losses"
  done
  if cmp -s a.grads b.grads && cmp -s a.losses b.losses; then
    ok "$(basename "$a") and $(basename "$b") give the same gradients to the bit ($(wc -c <a.grads) bytes), and losses"
  else
    fail "$(basename "$a") and $(basename "$b") differ: $(cmp a.grads b.grads) $(diff a.losses b.losses)"
  fi
  ;;

*)
  echo "unknown case '$case'"
  exit 2
  ;;
esac
exit $status
