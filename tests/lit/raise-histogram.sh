#!/bin/sh
# Usage: raise-histogram.sh TOKPIPE_OPT FIXTURE_DIR
# Imports FIXTURE_DIR/model.onnx (with the --dim flags of its dims file), runs the raising
# pipeline with verification and prints how many ops of each kind the result has, one
# "Op: N" line per kind in name order, between BEGIN and END lines (so FileCheck can check
# the whole list with CHECK-NEXT).
set -e
dims=$(cat "$2/dims" 2>/dev/null || true)
ir=$("$1" "$2/model.onnx" $dims --verify-each --passes=fold-constants,dce,retie-params,raise-transformer,dce)
echo BEGIN
printf '%s\n' "$ir" | grep -oE '= [A-Za-z]+\(' | sed 's/^= //; s/($//' | LC_ALL=C sort | uniq -c | awk '{print $2 ": " $1}'
echo END
