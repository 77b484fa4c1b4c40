#!/bin/sh
# run.sh CASE BIN_DIR SRC_DIR WORK_DIR CC: one test of tensor-parallel plans (tokpipec
# --tensor N: passes/shard_tensor.c in the pipeline, codegen/'s AllReduce and reduce tables).
# Prints "ok ..." lines and exits 0, or "FAIL ..." lines and exits 1. The cases:
#   plans     tiny GPTs and hf_llama at --tensor 2, cpu and cuda targets: the plan compiles
#             with -Werror -pedantic, calls io->tensor_allreduce once per AllReduce of the IR,
#             and each unit's calls are what its stage's forward/backward_reduces say
#   compose   --tensor 2 with stages, slices (also auto), microbatches, 1f1b and dp: the same
#             checks, and the schedule's ALLREDUCE (dp > 1)
#   shared    a K/V head shared by tensor ranks (hf_gemma's one head, hf_llama's two at
#             --tensor 4): its gradient is summed by the schedule's ALLREDUCE even at dp 1;
#             without shared pieces there is none
#   same      --tensor 1 writes the same plan as no --tensor
#   memory    --emit=memory is per tensor rank, and its unsplit line is --tensor 1's
#             parameters, gradients and AdamW state; --max-memory refuses per rank
#   copy      an AllReduce whose operand is read again sums a copy (not in place); one in a
#             module without a tensor group is refused
#   rank      vocabulary-parallel plans (a tied and an untied head): every TensorRank of the
#             IR writes io->tensor_rank (cpu: stored, cuda: tp_cuda_fill_i64 on the stream),
#             and .vocab, .token_limit and what it names are --tensor 1's, the whole
#             vocabulary's, though each rank's table holds half its rows; a TensorRank in a
#             module without a tensor group is refused
case=$1 bin=$2 src=$3 work=$4/$1 cc=$5
root=$src/../..
fixtures=$root/tests/fixtures
tokpipec=$bin/tokpipec
. "$src/../case.sh"

# check_reduces PLAN CALLS: PLAN's units call io->tensor_allreduce as often as its reduce
# tables say, CALLS in all; every stage's TpPlanStage points at its tables. (Variables of
# sh functions are global: expect_exit owns $want.)
check_reduces() {
  plan=$1 calls=$2
  awk '
    match($0, /^static void stage[0-9]+_(forward|backward)(_slice[0-9]+)?\(TpStepIO \*io\) \{$/) {
      fn = substr($0, 13, index($0, "(") - 13); calls[fn] = 0; next }
    match($0, /^static void block_[a-z0-9_]+\(TpStepIO \*io, /) { # a shared body (codegen/emit_c.c)
      body = substr($0, 13, index($0, "(") - 13); in_body[body] = 0; next }
    body != "" && /io->tensor_allreduce\(io, / { in_body[body]++ }
    fn != "" && /io->tensor_allreduce\(io, / { calls[fn]++; total++ }
    fn != "" && match($0, /^  block_[a-z0-9_]+\(io, /) { # its calls count where it is called
      b = substr($0, 3, index($0, "(") - 3); calls[fn] += in_body[b]; total += in_body[b] }
    /^}$/ { fn = ""; body = "" }
    match($0, /^static const int stage[0-9]+_(forward|backward)_reduces\[\] = \{.*\};$/) {
      name = substr($0, 18, index($0, "_reduces") - 18)
      list = substr($0, index($0, "{") + 1); sub(/\};$/, "", list)
      n = split(list, counts, ", ")
      for (i = 1; i <= n; i++) table[n == 1 && !((name "_slice0") in calls) ? name : name "_slice" (i - 1)] = counts[i]
      tables++
    }
    /^     \.forward_reduces = stage[0-9]+_forward_reduces,$/ { pointed++ }
    END {
      for (f in calls) if (!(f in table)) { print "unit " f " has no entry in a reduce table"; bad = 1 }
      for (f in table) if (table[f] != calls[f] + 0) { print f " calls " calls[f] + 0 ", its table says " table[f]; bad = 1 }
      if (pointed * 2 != tables) { print tables " reduce tables, " pointed " stages pointing at them"; bad = 1 }
      print total + 0
      exit bad
    }' "$plan" >reduces.txt
  checked=$?
  got=$(tail -1 reduces.txt)
  if [ $checked -ne 0 ] || [ "$(wc -l <reduces.txt)" -ne 1 ]; then
    fail "$plan: $(head -n -1 reduces.txt | head -3 | tr '\n' ' ')"
    return 1
  fi
  [ "$got" = "$calls" ] || { fail "$plan: $got io->tensor_allreduce calls, the IR has $calls AllReduce ops"; return 1; }
}

# plan NAME MODEL OPTIONS...: tokpipec --tensor plan NAME.c (both targets: NAME.cpu.c and
# NAME.cuda.c), compiled with -Werror -pedantic, reduce tables checked against the IR.
plan() {
  name=$1 model=$2
  shift 2
  expect_exit 0 "$name: tokpipec --emit=ir" "$tokpipec" "$model" "$@" --emit=ir -o "$name.tir" || return 1
  ops=$(grep -c '= AllReduce(' "$name.tir")
  [ "$ops" -gt 0 ] || { fail "$name: the IR has no AllReduce"; return 1; }
  for target in cpu cuda; do
    expect_exit 0 "$name $target: tokpipec" "$tokpipec" "$model" "$@" --target $target -o "$name.$target.c" || continue
    grep -q '^    \.tensor = [0-9]*,$' "$name.$target.c" || { fail "$name.$target.c has no .tensor"; continue; }
    check_reduces "$name.$target.c" "$ops" || continue
    if "$cc" -std=c11 -Wall -Wextra -Werror -pedantic -I"$root/runtime" -c "$name.$target.c" -o "$name.$target.o" \
      2>cc.txt; then
      ok "$name $target: $ops io->tensor_allreduce calls, tables match, compiles cleanly"
    else
      fail "$name $target: $(head -5 cc.txt)"
    fi
  done
}

# The schedule's ALLREDUCE instructions of PLAN.
allreduces() { grep -c '{TP_PLAN_ALLREDUCE, ' "$1"; }

llama=$fixtures/hf_llama/model.onnx
gpt=$fixtures/gpt_o17_erf_tied_bias_static/model.onnx

case $case in
plans)
  plan tiny_gpt "$src/../codegen/tiny_gpt.onnx" --tensor 2
  plan gpt_static "$gpt" --tensor 2
  # shellcheck disable=SC2046 # the dims are flags
  plan gpt_dyn "$fixtures/gpt_o14_tanh_untied_nobias_dyn/model.onnx" $(cat "$fixtures/gpt_o14_tanh_untied_nobias_dyn/dims") --tensor 2
  plan hf_llama "$llama" --tensor 2
  # 3 layers x (attention, MLP) x (forward after the row-parallel product, backward at the
  # column-parallel one's input), and the vocabulary-parallel embedding's, loss statistics'
  # and LM head input gradient's
  check_reduces hf_llama.cpu.c 15 || fail "hf_llama: expected 15 calls"
  ;;

compose)
  plan llama_s2_sl3_mb2_dp2_1f1b "$llama" --tensor 2 --stages 2 --slices 3 --microbatches 2 --dp 2 --batch 8 \
    --schedule 1f1b
  plan gpt_s2_sl754_mb2 "$gpt" --tensor 2 --stages 2 --slices 7,5,4 --microbatches 2 --batch 4
  # --slices auto prices the whole model's sizes (read before shard-tensor) on N ranks
  plan llama_auto "$llama" --tensor 2 --stages 2 --slices auto
  grep -q '^ \* (--slices auto chose .* for 2 stages x 2 tensor ranks x 1 microbatch on the cpu profile' llama_auto.cpu.c &&
    ok "--slices auto: $(grep -o 'chose [^:]*' llama_auto.cpu.c) for 2 stages x 2 tensor ranks" ||
    fail "--slices auto: $(grep -- '--slices auto' llama_auto.cpu.c)"
  n=$(allreduces llama_s2_sl3_mb2_dp2_1f1b.cpu.c)
  [ "$n" = 2 ] && ok "dp 2: one ALLREDUCE per stage" || fail "dp 2: $n ALLREDUCE instructions, expected 2"
  ;;

shared)
  # hf_gemma: one key/value head; both tensor ranks hold it whole (parts 1 of 2)
  plan gemma "$fixtures/hf_gemma/model.onnx" --tensor 2
  n=$(allreduces gemma.cpu.c)
  [ "$n" = 1 ] && ok "gemma: ALLREDUCE sums the shared K/V head's gradients" || fail "gemma: $n ALLREDUCE, expected 1"
  grep -q ', {1, 1, 1}},$' gemma.cpu.c && ok "gemma: K/V weights split in 1 part" ||
    fail "gemma: no parameter with shard {1, 1, 1}"
  plan llama4 "$llama" --tensor 4
  n=$(allreduces llama4.cpu.c)
  [ "$n" = 1 ] && ok "llama --tensor 4: ALLREDUCE for its 2 K/V heads over 4 ranks" || fail "llama4: $n ALLREDUCE"
  plan llama2 "$llama" --tensor 2
  n=$(allreduces llama2.cpu.c)
  [ "$n" = 0 ] && ok "llama --tensor 2: no shared pieces, no ALLREDUCE" || fail "llama2: $n ALLREDUCE, expected 0"
  ;;

same)
  expect_exit 0 "no --tensor" "$tokpipec" "$llama" --stages 2 --slices 2 -o none.c &&
    expect_exit 0 "--tensor 1" "$tokpipec" "$llama" --stages 2 --slices 2 --tensor 1 -o one.c &&
    if cmp -s none.c one.c; then ok "--tensor 1 is no --tensor"; else fail "--tensor 1 changes the plan"; fi
  grep -qE 'tensor_allreduce|_reduces|\.tensor =|Tensor parallel' one.c &&
    fail "a --tensor 1 plan has tensor parts: $(grep -m1 -E 'tensor_allreduce|_reduces|\.tensor =|Tensor parallel' one.c)"
  ;;

memory)
  expect_exit 0 "--emit=memory" "$tokpipec" "$llama" --stages 2 --emit=memory -o one.txt || exit 1
  expect_exit 0 "--tensor 2 --emit=memory" "$tokpipec" "$llama" --stages 2 --tensor 2 --emit=memory -o two.txt || exit 1
  grep -q '^ranks: 2 stages x 2 tensor ranks x 1 replica;' two.txt || fail "no tensor ranks in $(grep '^ranks' two.txt)"
  grep -q '^ranks 2-3 (stage 1, per tensor rank):$' two.txt || fail "no per-tensor-rank heading for stage 1"
  # per stage: parameters + gradients + state at --tensor 1 = the unsplit line at --tensor 2,
  # which is more than this plan's (split) figures
  awk '
    FNR == 1 { file++; s = "" }
    /^totals/ { s = "" }
    /^rank [0-9]+ \(stage/ || /^ranks [0-9]+-[0-9]+ \(stage/ { s = $0; sub(/.*stage /, "", s); s += 0 }
    s != "" && /^  (parameters|gradients|optimizer state) / { v = $0; sub(/ bytes.*/, "", v); sub(/.* /, "", v); fixed[file, s] += v }
    s != "" && /^  unsplit / { v = $0; sub(/ bytes.*/, "", v); sub(/.* /, "", v); unsplit[s] = v }
    END {
      for (k = 0; k < 2; k++) {
        if (unsplit[k] != fixed[1, k]) { printf "stage %d: unsplit %s, --tensor 1 holds %s\n", k, unsplit[k], fixed[1, k]; bad = 1 }
        if (!(fixed[2, k] < fixed[1, k])) { printf "stage %d: --tensor 2 holds %s, not less than %s\n", k, fixed[2, k], fixed[1, k]; bad = 1 }
        printf "stage %d: %s -> %s bytes; ", k, fixed[1, k], fixed[2, k]
      }
      exit bad
    }' one.txt two.txt >verdict.txt && ok "per tensor rank: $(cat verdict.txt)" || fail "$(cat verdict.txt)"
  peak=$(awk '/^ranks 0-1/ { r = 1 } r && /^  peak/ { print $2; exit }' two.txt)
  expect_message 1 "--max-memory below the tensor rank's peak" \
    "rank 0 (pipeline stage 0, tensor rank 0 of 2, the others alike) needs $peak bytes at its peak, 1 more than --max-memory $((peak - 1))" \
    "$tokpipec" "$llama" --stages 2 --tensor 2 --max-memory $((peak - 1)) -o plan.c
  expect_exit 0 "--max-memory at the tensor rank's peak" "$tokpipec" "$llama" --stages 2 --tensor 2 --max-memory "$peak" \
    -o plan.c && ok "--max-memory $peak: the plan fits"
  ;;

copy)
  # %p is summed over the group and read again by the residual: the sum goes to a copy
  cat >again.tir <<'TIR'
tir 1 opset 17
input %ids : i64[2, 4]
param %wte : f32[16, 8] = dense<0.5>
param %w : f32[8, 8] = dense<0.125> @shard(axis=1, parts=2, ranks=2)
%x : f32[2, 4, 8] = Embedding(%wte, %ids) loc("/wte" Gather)
%p : f32[2, 4, 8] = Linear(%x, %w) {transpose_w = 0} loc("/fc" MatMul)
%s : f32[2, 4, 8] = AllReduce(%p) {group = "tensor", reduce = "sum"} loc("/fc" MatMul)
%y : f32[2, 4, 8] = Add(%p, %s) loc("/add" Add)
output %y
TIR
  expect_exit 0 "--emit=c" "$bin/tokpipe-opt" again.tir --emit=c -o again.c || exit 1
  if grep -A1 'CHECK(tp_reshape(&p, &s));' again.c | grep -q 'io->tensor_allreduce(io, s.data, 64);'; then
    ok "the operand read again: copied, then summed"
  else
    fail "no copy before the sum: $(grep -n 'tensor_allreduce\|tp_reshape' again.c)"
  fi
  "$cc" -std=c11 -Wall -Wextra -Werror -pedantic -I"$root/runtime" -c again.c -o again.o 2>cc.txt ||
    fail "again.c: $(head -3 cc.txt)"
  sed 's/ @shard(axis=1, parts=2, ranks=2)//' again.tir >whole.tir
  expect_message 1 "AllReduce without a tensor group" \
    "whole.tir: node '/fc' (MatMul, opset 17): codegen: AllReduce works over the tensor group, but the module has none (tokpipec --tensor N)" \
    "$bin/tokpipe-opt" whole.tir --emit=c -o whole.c
  ;;

rank)
  for m in "gpt_static $gpt" "llama $llama"; do
    name=${m%% *} model=${m#* }
    plan "$name" "$model" --tensor 2 || continue
    ranks=$(grep -c '= TensorRank()' "$name.tir")
    [ "$ranks" -gt 0 ] || { fail "$name: the IR has no TensorRank"; continue; }
    cpu=$(grep -c '^  \*(int64_t \*)[A-Za-z0-9_]*\.data = io->tensor_rank;$' "$name.cpu.c")
    cuda=$(grep -c '^  CHECK(tp_cuda_fill_i64([A-Za-z0-9_]*\.data, io->tensor_rank, io->stream));$' "$name.cuda.c")
    [ "$cpu" = "$ranks" ] && [ "$cuda" = "$ranks" ] && ok "$name: $ranks TensorRank ops write io->tensor_rank" ||
      fail "$name: $ranks TensorRank ops, $cpu io->tensor_rank stores (cpu), $cuda tp_cuda_fill_i64 (cuda)"
    expect_exit 0 "$name --tensor 1" "$tokpipec" "$model" -o "$name.one.c" || continue
    for field in vocab token_limit token_limit_of; do
      one=$(sed -n "s/^    \.$field = \(.*\),$/\1/p" "$name.one.c") two=$(sed -n "s/^    \.$field = \(.*\),$/\1/p" "$name.cpu.c")
      [ -n "$one" ] && [ "$one" = "$two" ] && ok "$name: .$field = $two" || fail "$name: .$field: --tensor 2 '$two', --tensor 1 '$one'"
    done
    table=$(sed -n "s/^    \.token_limit_of = \"the [0-9]* rows of table '\(.*\)'\",\$/\1/p" "$name.cpu.c")
    rows() { sed -n "s/^    {\"$table\", \"[^\"]*\", [0-9]*, {\([0-9]*\),.*/\1/p" "$1"; }
    whole=$(rows "$name.one.c") part=$(rows "$name.cpu.c")
    [ -n "$table" ] && [ -n "$part" ] && [ "$((part * 2))" = "$whole" ] &&
      ok "$name: table '$table' split: $part of its $whole rows per rank" ||
      fail "$name: table '$table': $part rows per rank at --tensor 2, $whole at --tensor 1"
  done
  cat >rank.tir <<'TIR'
tir 1 opset 17
input %ids : i64[2, 4]
param %wte : f32[8, 8] = dense<0.5>
%p : i64[] = TensorRank() {group = "tensor"} loc("/wte" Gather)
%x : f32[2, 4, 8] = Embedding(%wte, %ids, %p) {vocab_parts = 2} loc("/wte" Gather)
output %x
TIR
  expect_message 1 "TensorRank without a tensor group" \
    "rank.tir: node '/wte' (Gather, opset 17): codegen: TensorRank works over the tensor group, but the module has none (tokpipec --tensor N)" \
    "$bin/tokpipe-opt" rank.tir --emit=c -o rank.c
  sed 's/dense<0.5>/dense<0.5> @shard(axis=0, parts=2, ranks=2)/' rank.tir >split.tir
  expect_exit 0 "TensorRank with a tensor group" "$bin/tokpipe-opt" split.tir --emit=c -o split.c &&
    grep -q '^  \*(int64_t \*)p\.data = io->tensor_rank;$' split.c && ok "split.tir: TensorRank stores io->tensor_rank" ||
    fail "split.tir: $(grep -n 'tensor_rank' split.c)"
  ;;

*)
  echo "run.sh: unknown case '$case'"
  exit 2
  ;;
esac
exit $status
