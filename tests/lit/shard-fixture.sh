#!/bin/sh
# shard-tensor on one ONNX fixture in tokpipec's pipeline, with 3 slices and 2 stages:
# over 2 tensor ranks it must split (some @shard param, some AllReduce) and its IR must
# parse back to the same text; over 4 it must split too, or refuse with the one error
# naming heads that do not divide among the ranks.
# usage: shard-fixture.sh TOKPIPE_OPT MODEL.onnx WORKDIR [--dim NAME=VALUE]...
set -eu
opt=$1 model=$2 work=$3
shift 3
# The printed IR names the model's files relative to the model's folder: the IR is written
# beside a copy of the model and its weights.
sh "$(dirname "$0")/copy-model.sh" "$model" "$work"
passes=fold-constants,dce,rebatch,retie-params,raise-transformer,insert-token-dim,shard-tensor,add-loss
passes=$passes,split-sequence,assign-stages,autodiff,finish-stages,dce,verify
for n in 2 4; do
  if ! "$opt" "$work/model.onnx" --passes=$passes --tensor $n --slices 3 --stages 2 "$@" \
      > "$work/tensor$n.tir" 2> "$work/tensor$n.err"; then
    if [ $n -eq 4 ] && [ "$(grep -c 'error: ' "$work/tensor4.err")" -eq 1 ] &&
        grep -q "heads do not divide among the ranks" "$work/tensor4.err"; then
      echo "shard-fixture: $model over 4 ranks: refused: $(grep 'error: ' "$work/tensor4.err")"
      continue
    fi
    echo "shard-fixture: $model over $n ranks failed:" >&2
    cat "$work/tensor$n.err" >&2
    exit 1
  fi
  shards=$(grep -c '@shard(' "$work/tensor$n.tir" || true)
  reduces=$(grep -c '= AllReduce' "$work/tensor$n.tir" || true)
  if [ "$shards" -eq 0 ] || [ "$reduces" -eq 0 ]; then
    echo "shard-fixture: $model over $n ranks: nothing split ($shards @shard params, $reduces AllReduce)" >&2
    exit 1
  fi
  "$opt" "$work/tensor$n.tir" > "$work/tensor$n.again.tir"
  if ! cmp -s "$work/tensor$n.tir" "$work/tensor$n.again.tir"; then
    echo "shard-fixture: $model over $n ranks: print(parse(print(m))) != print(m)" >&2
    diff "$work/tensor$n.tir" "$work/tensor$n.again.tir" | head -20 >&2
    exit 1
  fi
  echo "shard-fixture: $model over $n ranks: $shards @shard params, $reduces AllReduce"
done
