#!/bin/sh
# Runs the ONNX node-test conformance suite (ctest label `conformance`) of a build folder
# and prints the failures and the pass count. Exit status: ctest's.
# usage: tests/conformance/summary.sh [BUILD_DIR] [extra ctest args...]
build=${1:-build}
[ $# -gt 0 ] && shift
log=$(mktemp)
trap 'rm -f "$log"' EXIT
ctest --test-dir "$build" -L conformance -j "$(nproc)" "$@" >"$log" 2>&1
rc=$?
grep -E '^[[:space:]]+[0-9]+ - node/' "$log" | sed 's/^[[:space:]]*/FAILED: /'
summary=$(grep -E 'tests passed, [0-9]+ tests failed out of [0-9]+' "$log")
if [ -z "$summary" ]; then
  cat "$log"
  echo "node tests: ctest did not run (is $build configured and built?)"
  exit 1
fi
total=$(echo "$summary" | sed -E 's/.* out of ([0-9]+).*/\1/')
failed=$(echo "$summary" | sed -E 's/.* ([0-9]+) tests failed.*/\1/')
echo "node tests: $((total - failed)) of $total passed"
exit $rc
