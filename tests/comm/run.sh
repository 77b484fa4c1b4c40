#!/bin/sh
# One case of the communication tests. Usage: run.sh CASE TEST_COMM
set -u
case=$1 prog=$2
here=$(dirname "$0")
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# A run that must fail: non-zero, not by the time limit, within `within` seconds, saying `msg`.
must_fail() {
  within=$1 msg=$2 mode=$3
  shift 3
  start=$(date +%s)
  "$@" >"$out" 2>&1
  rc=$? took=$(($(date +%s) - start))
  cat "$out"
  [ $rc -ne 0 ] || { echo "FAIL: exit 0"; exit 1; }
  [ $rc -ne 124 ] || { echo "FAIL: hung until the time limit"; exit 1; }
  [ $took -le "$within" ] || { echo "FAIL: took ${took}s, more than ${within}s"; exit 1; }
  grep -q "$msg" "$out" || { echo "FAIL: no message matching '$msg'"; exit 1; }
  sleep 1
  ! pgrep -f "$prog $mode" >/dev/null || { echo "FAIL: ranks are left running"; exit 1; }
  echo "ok: exit $rc after ${took}s"
}

case $case in
local) "$prog" basic ;;
mpi-2) sh "$here/mpirun.sh" 60 2 "$prog" basic ;;
mpi-3) sh "$here/mpirun.sh" 60 3 "$prog" basic ;;
die) # mpirun notices the killed rank and ends the others
  must_fail 15 "exited on signal 9" die sh "$here/mpirun.sh" 60 3 "$prog" die ;;
hang) # nobody dies: the waiting ranks' watchdog ends the job
  export TOKPIPE_COMM_TIMEOUT=2
  must_fail 15 "rank [02]: no progress for 2 s waiting for the test message (peer: rank 1)" hang \
    sh "$here/mpirun.sh" 60 3 "$prog" hang ;;
size) # rank 1 all-reduces 8 floats, the others 4
  export TOKPIPE_COMM_TIMEOUT=20
  must_fail 15 "rank 0: ranks 0 and 1 are out of step (the size differs): rank 0's collective #1 over 3 ranks is an all-reduce of 16 bytes; rank 1's collective #1 over 3 ranks is an all-reduce of 32 bytes" size \
    sh "$here/mpirun.sh" 60 3 "$prog" size ;;
order) # rank 1 runs one all-reduce more than the others
  export TOKPIPE_COMM_TIMEOUT=20
  must_fail 15 "rank 0: ranks 0 and 1 are out of step (the kind differs): rank 0's collective #2 over 3 ranks is a barrier of 0 bytes; rank 1's collective #2 over 3 ranks is an all-reduce of 16 bytes" order \
    sh "$here/mpirun.sh" 60 3 "$prog" order ;;
longer | shorter) # rank 0 sends 16 (4) bytes, rank 1 expects 8
  export TOKPIPE_COMM_TIMEOUT=20
  [ $case = longer ] && got=more || got=4
  must_fail 15 "rank 1: the test message from rank 0 has $got bytes, not the 8 this rank expects: the ranks are out of step" $case \
    sh "$here/mpirun.sh" 60 2 "$prog" $case ;;
*) echo "unknown case $case"; exit 2 ;;
esac
