#!/bin/sh
# Copies an ONNX model and its external-data files (the *.bin beside it, and the dynamo
# exporter's MODEL.onnx.data) into a folder as
# model.onnx, so that the IR printed there names its files inside its own folder (a .tir
# reads blobs from its own folder only).
# usage: copy-model.sh MODEL.onnx DIR
set -eu
mkdir -p "$2"
cp "$1" "$2/model.onnx"
for f in "$(dirname "$1")"/*.bin "$1.data"; do
  if [ -e "$f" ]; then cp "$f" "$2/"; fi
done
