#!/bin/sh
# usage: check.sh RC TEXT COMMAND ARGS...: COMMAND exits with RC and its stderr (one line
# for RC 1) contains TEXT; with RC 0, TEXT is a file its stdout must equal after the
# volatile "solve_time_s" line is dropped.
rc=$1 text=$2
shift 2
out=$("$@" 2>/tmp/planner_check_err.$$); got=$?
err=$(cat /tmp/planner_check_err.$$); rm -f /tmp/planner_check_err.$$
if [ "$got" != "$rc" ]; then echo "exit $got, want $rc; stderr: $err"; exit 1; fi
if [ "$rc" = 0 ]; then
  echo "$out" | grep -v '"solve_time_s"' | diff -u "$text" - || { echo "output differs from $text"; exit 1; }
  exit 0
fi
case $err in *"$text"*) ;; *) echo "stderr lacks '$text': $err"; exit 1 ;; esac
if [ "$rc" = 1 ] && [ "$(printf '%s\n' "$err" | wc -l)" != 1 ]; then echo "not one line: $err"; exit 1; fi
exit 0
