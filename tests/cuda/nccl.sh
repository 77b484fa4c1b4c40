#!/bin/sh
# One case of the NCCL transport's tests (test_cuda_nccl.cpp says what each mode checks).
# Usage: nccl.sh CASE TEST_CUDA_NCCL, or nccl.sh tensor-trainer TRAINER STAGED_TRAINER
# TOKPIPEC TOKPIPE_COMPARE FIXTURE WORK. TOKPIPE_CUDA_EMULATE_DEVICES: the GPUs of the node.
set -u
case=$1 prog=$2
here=$(dirname "$0")
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# mpirun -np NP with DEVICES emulated GPUs: test_cuda_nccl ARGS...
on() {
  devices=$1 np=$2
  shift 2
  TOKPIPE_CUDA_EMULATE_DEVICES=$devices sh "$here/../comm/mpirun.sh" 60 "$np" "$prog" "$@"
}

case $case in
p2p-2) on 2 2 p2p ;;
p2p-4) on 4 4 p2p ;;
allreduce-2) on 2 2 allreduce 2 ;;    # tied pair
allreduce-2x2) on 4 4 allreduce 2 ;;  # replicas of two, tied pairs
allreduce-1x4) on 4 4 allreduce 1 ;;  # replicas of four
order-2) on 2 2 order 2 ;;
order-2x2) on 4 4 order 2 ;;
order-4) on 4 4 order 4 ;;
# interleaved plans: 2 pipeline ranks x 2 virtual stages, 1 or 2 replicas
interleaved-2) on 2 2 interleaved 2 ;;
interleaved-2x2) on 4 4 interleaved 2 ;;
# tensor parallelism (plan.h's layout: rank (d * S + k) * N + t): sN stages, nN tensor
# ranks, dN replicas
p2p-s2n2) on 4 4 p2p 2 2 ;;            # stage peers at the same tensor rank
allreduce-s2n2) on 4 4 allreduce 2 2 ;;   # tied pairs at the same tensor rank
allreduce-s1n2d2) on 4 4 allreduce 1 2 ;; # replicas at the same tensor rank
tensor-s2n2) on 4 4 tensor 2 2 ;;         # two tensor groups at once
tensor-s1n4) on 4 4 tensor 1 4 ;;
order-s2n2) on 4 4 order 2 2 ;;
order-s1n2d2) on 4 4 order 1 2 ;;
order-s1n4) on 4 4 order 1 4 ;;           # groups of shared pieces
fallback-one) TOKPIPE_CUDA_EMULATE_DEVICES=1 "$prog" fallback ;;
fallback-shared) # two processes on one GPU: the host transport, and rank 0 says why
  on 1 2 fallback >"$out" 2>&1
  rc=$?
  cat "$out"
  [ $rc -eq 0 ] && [ "$(grep -c 'test_cuda_nccl: note: processes share a GPU, which NCCL does not allow: messages go through mpi with host copies' "$out")" -eq 1 ] ;;
missing-group) # an all-reduce over a group no schedule uses: one line per rank, the job ends
  on 4 4 missing >"$out" 2>&1
  rc=$?
  cat "$out"
  [ $rc -ne 0 ] && [ $rc -ne 124 ] &&
    grep -Eq '^test_cuda_nccl: error: rank [01]: internal error: no NCCL communicator for an all-reduce over ranks \{0, 1\} was created at start-up \(the plan.s schedules use none\)$' "$out" ;;
fail-rank) # ncclCommSplit fails on rank 1 while rank 0 waits in it: one line naming the
  # rank, the call and NCCL's detail, and the whole job ends through MPI_Abort (no timeout)
  TOKPIPE_NCCL_EMULATE_FAIL_RANK=1 on 2 2 p2p >"$out" 2>&1
  rc=$?
  cat "$out"
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(grep -c 'error:' "$out")" -eq 1 ] &&
    grep -Eq '^test_cuda_nccl: error: rank 1: .*comm_nccl.cu:[0-9]+: ncclCommSplit\(.*\): internal error \(emulated failure of rank 1 \(TOKPIPE_NCCL_EMULATE_FAIL_RANK\)\)$' "$out" ;;
tensor-trainer) # --tensor 2 CUDA plans as processes with a GPU each, which must say NCCL
  # carries them: 1 stage (tensor.sh checks it against the one-process CPU trainer, whose
  # run it leaves in WORK/whole.*), then 2 stages x 2 tensor ranks, whose step 1 (loss,
  # gradients: before any update) must be the same within 1e-5
  staged=$3 compare=$5 fixture=$6 work=$7
  nccl_said() { grep -q " $1 ranks in $1 processes (nccl)\$" "$2" ||
    { echo "nccl.sh: $2: not over NCCL: $(grep -m1 ' ranks in ' "$2")"; exit 1; }; }
  TOKPIPE_CUDA_EMULATE_DEVICES=2 bash "$here/../tensor/tensor.sh" "$4" "$compare" "$fixture" "$work" emulated "$prog" ||
    exit 1
  nccl_said 2 "$work/t2.err"
  echo "tensor: 2 stages x 2 tensor ranks, 2 slices, 2 microbatches, 1f1b (mpirun -np 4)"
  TOKPIPE_CUDA_EMULATE_DEVICES=4 sh "$here/../comm/mpirun.sh" 200 4 "$staged" --init "$fixture/model.onnx" --data "$fixture/train/train.bin" \
    --steps 1 --log "$work/s2.jsonl" --dump-grads "$work/s2.grads" >"$work/s2.err" 2>&1 ||
    { echo "nccl.sh: the staged trainer failed: $(grep -m1 'error:' "$work/s2.err" || tail -5 "$work/s2.err")"; exit 1; }
  nccl_said 4 "$work/s2.err"
  "$compare" --losses "$work/s2.jsonl" "$work/whole.jsonl" --steps 1 --tol 1e-5 &&
    "$compare" "$work/s2.grads" "$work/whole.grads" --tol 1e-5 ;;
*) echo "unknown case $case"; exit 2 ;;
esac
