#!/bin/sh
# Round trip of one ONNX fixture through the textual IR:
#   import -> print (first) -> parse -> print (second), first and second byte-identical,
# as imported, after folding (folded constants print inline) and after the training passes
# (backward ops with their placement, the loss and the gradient map).
# usage: roundtrip.sh TOKPIPE_OPT MODEL.onnx WORKDIR [--dim NAME=VALUE]...
set -eu
opt=$1 model=$2 work=$3
shift 3
# The printed IR names the model's files relative to the model's folder: the IR is written
# beside a copy of the model and its weights.
sh "$(dirname "$0")/copy-model.sh" "$model" "$work"
model=$work/model.onnx
for passes in "" "fold-constants,dce" "fold-constants,dce,retie-params,raise-transformer,add-loss,autodiff,dce"; do
  tag=${passes:-none}
  tag=$(echo "$tag" | tr ',' '_' | cut -c1-40)
  "$opt" "$model" --passes="$passes" "$@" > "$work/$tag.first.tir"
  "$opt" "$work/$tag.first.tir" > "$work/$tag.second.tir"
  if ! cmp "$work/$tag.first.tir" "$work/$tag.second.tir"; then
    echo "roundtrip: $model (passes: ${passes:-none}): print(parse(print(m))) != print(m)" >&2
    diff "$work/$tag.first.tir" "$work/$tag.second.tir" | head -20 >&2
    exit 1
  fi
  echo "roundtrip: $model (passes: ${passes:-none}): $(wc -l < "$work/$tag.first.tir") lines identical"
done
