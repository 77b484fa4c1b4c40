#!/bin/sh
# fifo-frontend.sh BIN_DIR MODELS: each input the frontend reads (a model, textual IR, an
# external-data file, a textual IR blob, tokpipe-run's test data), given as a FIFO, is
# refused with one error line and exit code 1 instead of blocking in open() or read();
# `timeout` turns a hang into a failure. MODELS: the bad-input models (build tree copy).
bin=$1 models=$2
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 2
status=0

check() { # check NAME EXPECTED-LINE TOOL ARGS...
  name=$1 expect=$2
  shift 2
  err=$(timeout 20 "$@" 2>&1 >/dev/null)
  rc=$?
  if [ "$rc" -eq 124 ]; then
    echo "FAIL $name: still blocked after 20 s"
    status=1
  elif [ "$rc" -ne 1 ] || [ "$err" != "$expect" ]; then
    printf 'FAIL %s: exit code %d, expected 1 and the line\n  got:      %s\n  expected: %s\n' "$name" "$rc" "$err" "$expect"
    status=1
  else
    echo "ok $name: $err"
  fi
}

mkfifo model.onnx ir.tir
check onnx_model "tokpipec: error: model.onnx: cannot open 'model.onnx': not a regular file: it is a FIFO" \
  "$bin/tokpipec" model.onnx --emit=ir
check tir "tokpipe-opt: error: ir.tir: cannot open 'ir.tir': not a regular file: it is a FIFO" \
  "$bin/tokpipe-opt" ir.tir

mkdir ext && cp "$models/ext_short/model.onnx" ext/ && mkfifo ext/weights.bin
check external_data "tokpipec: error: ext/model.onnx: initializer 'W': external data location 'weights.bin' cannot be opened: not a regular file: it is a FIFO" \
  "$bin/tokpipec" ext/model.onnx --emit=ir

mkdir blob && mkfifo blob/w.bin && printf 'tir 1 opset 17\nblob 0 "w.bin"\n' >blob/m.tir
check tir_blob "tokpipe-opt: error: blob/m.tir:2:8: blob file 'w.bin' cannot be opened: not a regular file: it is a FIFO" \
  "$bin/tokpipe-opt" blob/m.tir

mkdir run && mkfifo run/input_0.pb
check test_data "tokpipe-run: error: run/input_0.pb: cannot open: not a regular file: it is a FIFO" \
  "$bin/tokpipe-run" "$models/run_data/model.onnx" --test-dir run
exit $status
