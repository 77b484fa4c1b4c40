#!/bin/sh
# Round trip of one ONNX fixture through the textual IR:
#   import -> print (first) -> parse -> print (second), first and second byte-identical,
# once as imported and once after the default pipeline (folded constants print inline).
# usage: roundtrip.sh TOKPIPE_OPT MODEL.onnx WORKDIR [--dim NAME=VALUE]...
set -eu
opt=$1 model=$2 work=$3
shift 3
mkdir -p "$work"
for passes in "" "fold-constants,dce"; do
  tag=${passes:-none}
  tag=$(echo "$tag" | tr ',' '_')
  "$opt" "$model" --passes="$passes" "$@" > "$work/$tag.first.tir"
  "$opt" "$work/$tag.first.tir" > "$work/$tag.second.tir"
  if ! cmp "$work/$tag.first.tir" "$work/$tag.second.tir"; then
    echo "roundtrip: $model (passes: ${passes:-none}): print(parse(print(m))) != print(m)" >&2
    diff "$work/$tag.first.tir" "$work/$tag.second.tir" | head -20 >&2
    exit 1
  fi
  echo "roundtrip: $model (passes: ${passes:-none}): $(wc -l < "$work/$tag.first.tir") lines identical"
done
