#!/bin/sh
# check.sh BIN_DIR CASES DIR CASE: runs bad-input case CASE of the file CASES (name|tool|
# arguments|expected line) from folder DIR, where the models are, and checks exit code 1
# (or CODE where the tool is written TOOL:CODE: 2 for a usage error, whose diagnostic line
# the tools follow with a "Try 'TOOL --help'." hint) and the exact single diagnostic line.
bin=$1 cases=$2 dir=$3 case=$4
line=$(grep "^$case|" "$cases") || { echo "no case '$case' in $cases"; exit 2; }
tool=$(echo "$line" | cut -d'|' -f2)
want=1
case $tool in *:*) want=${tool#*:} tool=${tool%%:*} ;; esac
args=$(echo "$line" | cut -d'|' -f3)
expect=$(echo "$line" | cut -d'|' -f4-)
cd "$dir" || exit 2
# shellcheck disable=SC2086 # args are words
err=$("$bin/$tool" $args 2>&1 >/dev/null)
rc=$?
[ "$want" = 2 ] && err=$(printf '%s\n' "$err" | sed "/^Try '$tool --help'.\$/d")
status=0
if [ "$rc" -ne "$want" ]; then
  echo "FAIL $case: exit code $rc, expected $want"
  status=1
fi
if [ "$err" != "$expect" ]; then
  printf 'FAIL %s: diagnostic differs\n  got:      %s\n  expected: %s\n' "$case" "$err" "$expect"
  status=1
fi
[ $status -eq 0 ] && echo "ok $case: $err"
exit $status
