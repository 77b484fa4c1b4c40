#!/bin/sh
# fifo.sh BIN_DIR WORK: every JSON and log input of tokpipe-plan and tokpipe-compare given as
# a FIFO is refused at once (exit 1, one line naming it), never waited on: a tool that
# blocks is killed by timeout (exit 124) and fails the test.
bin=$1 work=$2
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 2
mkfifo pipe.json pipe.jsonl || exit 2
printf '{"step": 1, "loss": 2.5}\n' > log.jsonl
model="--model layers=4,hidden=256,heads=4,seq=128,vocab=1000"
status=0
check() { # check EXPECTED-LINE TOOL ARGS...
  want=$1
  shift
  err=$(timeout 10 "$@" 2>&1 >/dev/null)
  rc=$?
  if [ $rc -ne 1 ] || [ "$err" != "$want" ]; then
    printf 'FAIL %s: exit %s\n  got:      %s\n  expected: %s\n' "$*" $rc "$err" "$want"
    status=1
  else
    echo "ok $*"
  fi
}
fifo="cannot open: not a regular file: it is a FIFO"
check "tokpipe-plan: error: cost table pipe.json: $fifo" "$bin/tokpipe-plan" --cost-table pipe.json
check "tokpipe-plan: error: profile pipe.json: $fifo" "$bin/tokpipe-plan" $model --calibrate pipe.json
check "tokpipe-plan: error: hardware profile ./pipe.json: $fifo" "$bin/tokpipe-plan" $model --hardware ./pipe.json
mkdir -p profiles && mkfifo profiles/pipe.json # found by name in --profiles
check "tokpipe-plan: error: hardware profile profiles/pipe.json: $fifo" "$bin/tokpipe-plan" $model --hardware pipe --profiles profiles
check "tokpipe-compare: error: cannot read 'pipe.jsonl': not a regular file: it is a FIFO" \
  "$bin/tokpipe-compare" --losses pipe.jsonl log.jsonl
check "tokpipe-compare: error: cannot read 'pipe.jsonl': not a regular file: it is a FIFO" \
  "$bin/tokpipe-compare" --losses log.jsonl pipe.jsonl
exit $status
