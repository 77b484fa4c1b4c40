# Sourced by the tests' run.sh scripts after they set $case and $work: a fresh work folder
# to run in, and the checks they share. A script ends with `exit $status`.
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 2
status=0

fail() { echo "FAIL $case: $*"; status=1; }
ok() { echo "ok $case: $*"; }

# expect_exit CODE DESCRIPTION CMD...: CMD exits CODE (its output in out.txt, err.txt).
expect_exit() {
  want=$1 what=$2
  shift 2
  "$@" >out.txt 2>err.txt
  rc=$?
  if [ "$rc" -ne "$want" ]; then
    fail "$what: exit code $rc, expected $want; stderr: $(cat err.txt)"
    return 1
  fi
  return 0
}

# expect_message CODE DESCRIPTION TEXT CMD...: exit CODE, one stderr line holding TEXT.
expect_message() {
  want=$1 what=$2 text=$3
  shift 3
  expect_exit "$want" "$what" "$@" || return 1
  if [ "$(wc -l <err.txt)" -ne 1 ] || ! grep -qF -- "$text" err.txt; then
    fail "$what: expected one line with '$text', got: $(cat err.txt)"
    return 1
  fi
  ok "$what: $(cat err.txt)"
}

# byte_tokens VOCAB N FILE: a token file FILE of N tokens, each in 1..VOCAB-1 (a text of
# those bytes, varied), for models whose vocabulary is smaller than the bytes'.
byte_tokens() {
  i=0
  while [ $i -lt "$2" ]; do
    printf "\\$(printf %03o $(((i * 7 + i / 3) % ($1 - 1) + 1)))"
    i=$((i + 1))
  done >byte_tokens.txt
  "$bin/tokpipe-tokens" byte_tokens.txt -o "$3" 2>/dev/null || { fail "tokpipe-tokens byte_tokens.txt"; return 1; }
}
