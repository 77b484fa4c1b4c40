#!/bin/sh
# exe_readonly.sh BIN_DIR MODEL WORK: tokpipec --exe into a folder it cannot write is a bad
# path (exit 1, one line naming it), found before anything is compiled. Skipped (exit 77)
# as root, whom permission bits do not stop.
bin=$1 model=$2 work=$3
[ "$(id -u)" -ne 0 ] || { echo "skipped: running as root"; exit 77; }
rm -rf "$work" && mkdir -p "$work/ro" && chmod 555 "$work/ro" || exit 2
err=$("$bin/tokpipec" "$model" --exe "$work/ro/trainer" 2>&1 >/dev/null)
rc=$?
chmod 755 "$work/ro"
want="tokpipec: error: --exe '$work/ro/trainer': folder '$work/ro' is not writable: Permission denied"
[ $rc -eq 1 ] && [ "$err" = "$want" ] && { echo "ok: $err"; exit 0; }
printf 'FAIL: exit %s\n  got:      %s\n  expected: %s\n' $rc "$err" "$want"
exit 1
