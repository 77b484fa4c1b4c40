#!/bin/sh
#   check.sh BUILD_DIR WORK_DIR MODEL 'TOKPIPEC OPTIONS' 'ENFORCED LIMITS' 'ALL LIMITS'
# Runs bench/gpu_step_counts.sh on MODEL with the options and checks every rank's last-step
# counts against each limit (NAME=V: equal; NAME<=V: at most). A limit in ALL but not in
# ENFORCED is reported, not failed on. Prints "ok ..." / "FAIL ..." lines; exits 1 on a
# failure.
build=$1 work=$2 model=$3 options=$4 enforced=$5 limits=$6
# shellcheck disable=SC2034 # case.sh and its fail/ok read it
case=step-counts
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/tests/case.sh"

# shellcheck disable=SC2086 # the options are words
STEP_COUNTS_WORK=$work/run bash "$root/bench/gpu_step_counts.sh" "$build" "$model" $options >counts.txt 2>err.txt ||
  { fail "gpu_step_counts.sh $options: $(cat err.txt)"; exit 1; }
cat counts.txt
ranks=$(wc -l <counts.txt)
[ "$ranks" -ge 2 ] || fail "expected a line per rank of the 2-stage plan, got $ranks"

# value LINE NAME: the count NAME=... of a counts line
value() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
for limit in $limits; do
  name=${limit%%[<=]*} op=$(echo "$limit" | sed 's/^[a-z0-9_]*\([<=]*\).*/\1/') bound=${limit##*=}
  case " $enforced " in *" $limit "*) strict=yes ;; *) strict=no ;; esac
  broken=""
  while read -r line; do
    rank=$(echo "$line" | sed 's/^step counts (\(rank [0-9]*\)).*/\1/') v=$(value "$line" "$name")
    [ -n "$v" ] || { broken="$broken $rank has no $name;"; continue; }
    if ! awk -v v="$v" -v b="$bound" -v op="$op" 'BEGIN { exit !(op == "=" ? v == b : v <= b) }'; then
      broken="$broken $rank $name=$v;"
    fi
  done <counts.txt
  if [ -z "$broken" ]; then
    ok "$limit holds on every rank"
  elif [ $strict = yes ]; then
    fail "$limit broken:$broken"
  else
    ok "$limit not enforced (TOKPIPE_STEP_COUNT_LIMITS), and broken:$broken"
  fi
done
exit $status
