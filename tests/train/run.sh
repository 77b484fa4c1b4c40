#!/bin/sh
# run.sh CASE BIN_DIR SRC_DIR WORK_DIR: one trainer-runtime test case on the hand-written
# tiny plan (tiny_trainer, built from tiny_plan.c). Each case prints "ok ..." lines and
# exits 0, or prints "FAIL ..." and exits 1. The cases are the functions below.
case=$1 bin=$2 src=$3 work=$4/$1
trainer=$bin/tiny_trainer
. "$src/../case.sh"

# expect_error DESCRIPTION EXPECTED-TEXT CMD...: exit 1, exactly one stderr line holding TEXT.
expect_error() { expect_message 1 "$@"; }

# A deterministic text of about 3 KB (byte tokens 0..255), and its token files.
make_text() {
  i=0
  while [ $i -lt 60 ]; do
    echo "the quick brown fox $i jumps over the lazy dog; pack my box with five dozen jugs."
    i=$((i + 1))
  done >text.txt
  "$bin/tokpipe-tokens" text.txt -o train.bin --val-fraction 0.25 --val-out val.bin 2>/dev/null ||
    { fail "tokpipe-tokens failed"; exit 1; }
}

# The log without the timing fields, which differ from run to run.
untimed() { sed -E 's/, "ms": [^,]*, "tokens_per_s": [^,}]*//' "$1"; }

# field FILE STEP NAME: a number of the JSON log line of STEP.
field() { grep "^{\"step\": $2," "$1" | sed -E "s/.*\"$3\": ([^,}]*).*/\\1/"; }

same_files() { # same_files WHAT A B
  if cmp -s "$2" "$3"; then ok "$1"; else fail "$1: $2 and $3 differ"; fi
}

# expect_run_error DESCRIPTION TEXT CMD...: exit 1 within 60 s (a FIFO must not block), and
# of the progress lines on stderr exactly one error line, holding TEXT.
expect_run_error() {
  what=$1 text=$2
  shift 2
  expect_exit 1 "$what" timeout 60 "$@" || return 1
  if [ "$(grep -c 'error' err.txt)" -ne 1 ] || ! grep 'error' err.txt | grep -qF -- "$text"; then
    fail "$what: expected one error line with '$text', got: $(cat err.txt)"
    return 1
  fi
  ok "$what: $(grep error err.txt)"
}

# edited FOLDER EDIT...: FOLDER/checkpoint.safetensors, good.safetensors with the edits.
edited() {
  dir=$1
  shift
  rm -rf "$dir" && mkdir "$dir" && "$bin/train_edit_safetensors" good.safetensors "$dir/checkpoint.safetensors" "$@" ||
    fail "edit $*"
}

# flip_last_bit FILE: the lowest bit of FILE's last byte inverted.
flip_last_bit() {
  size=$(wc -c <"$1") byte=$(tail -c 1 "$1" | od -A n -t u1 | tr -d ' ')
  printf "\\$(printf %o $((byte ^ 1)))" | dd of="$1" bs=1 seek=$((size - 1)) conv=notrunc 2>/dev/null
}

case $case in
tokens)
  make_text
  n=$(wc -c <text.txt)
  nval=$(awk -v n="$n" 'BEGIN { printf "%d", n * 0.25 }')
  [ "$(wc -c <train.bin)" -eq $((1024 + 2 * (n - nval))) ] && [ "$(wc -c <val.bin)" -eq $((1024 + 2 * nval)) ] &&
    ok "sizes: $n bytes -> $((n - nval)) + $nval tokens" || fail "token file sizes"
  header=$(od -A n -t d4 -N 12 train.bin | tr -s ' ')
  [ "$header" = " 20240520 1 $((n - nval))" ] && ok "header:$header" || fail "header:$header"
  first=$(od -A n -t u2 -j 1024 -N 6 train.bin | tr -s ' ')
  [ "$first" = " 116 104 101" ] && ok "tokens are the bytes ('the' ->$first)" || fail "first tokens:$first"
  "$bin/tokpipe-tokens" text.txt -o all.bin 2>/dev/null && [ "$(wc -c <all.bin)" -eq $((1024 + 2 * n)) ] &&
    ok "no split" || fail "no split"
  expect_exit 2 "no -o" "$bin/tokpipe-tokens" text.txt && ok "no -o: exit 2"
  expect_exit 2 "--val-fraction alone" "$bin/tokpipe-tokens" text.txt -o x.bin --val-fraction 0.1 && ok "--val-fraction alone: exit 2"
  expect_exit 2 "bad fraction" "$bin/tokpipe-tokens" text.txt -o x.bin --val-fraction 1.5 --val-out v.bin && ok "bad fraction: exit 2"
  expect_error "missing input" "cannot read 'nope.txt'" "$bin/tokpipe-tokens" nope.txt -o x.bin
  [ ! -e x.bin ] && ok "nothing written" || fail "x.bin written"
  ;;

usage)
  expect_exit 0 "--help" "$trainer" --help && grep -q "^Usage: tiny_trainer --data FILE" out.txt &&
    grep -q -- "--export-onnx" out.txt && ok "--help" || fail "--help text: $(head -2 out.txt)"
  expect_exit 0 "--version" "$trainer" --version && grep -q "tokpipe trainer runtime" out.txt && ok "--version"
  make_text
  expect_exit 2 "no --data" "$trainer" --steps 3 && grep -q "error: --data FILE is required" err.txt && ok "no --data: exit 2"
  expect_exit 2 "unknown option" "$trainer" --data train.bin --stepz 3 && grep -q "unknown option '--stepz'" err.txt && ok "unknown option: exit 2"
  esc=$(printf '\033') # arguments echoed in messages keep no control bytes: ESC is written \x1b
  for tool in "$trainer" "$bin/tokpipe-tokens" "$bin/tokpipe-compare"; do
    expect_exit 2 "$tool: an unknown option with an ESC byte" "$tool" "--x${esc}[2J" &&
      if grep -qF -- 'x\x1b[2J' err.txt && ! grep -q "$esc" err.txt; then ok "escaped: $(head -1 err.txt)"; else fail "not escaped: $(cat -v err.txt)"; fi
  done
  expect_exit 2 "bad number" "$trainer" --data train.bin --lr fast && grep -q -- "--lr needs a number" err.txt && ok "bad number: exit 2"
  expect_exit 2 "negative steps" "$trainer" --data=train.bin --steps=-1 && ok "negative steps: exit 2"
  expect_exit 2 "missing value" "$trainer" --data train.bin --log && grep -q -- "--log needs a value" err.txt && ok "missing value: exit 2"
  expect_exit 2 "bad schedule" "$trainer" --data train.bin --lr-schedule linear && ok "bad schedule: exit 2"
  expect_exit 2 "--init with --resume" "$trainer" --data train.bin --init "$src/tiny.onnx" --resume ck && ok "--init with --resume: exit 2"
  expect_exit 2 "--val-every without --val-data" "$trainer" --data train.bin --val-every 2 && ok "--val-every alone: exit 2"
  ;;

data)
  make_text
  cp train.bin magic.bin && printf 'XXXX' | dd of=magic.bin conv=notrunc 2>/dev/null
  expect_error "wrong magic" "magic.bin: not a token file: magic 1482184792, expected 20240520" "$trainer" --data magic.bin --log log.jsonl
  cp train.bin version.bin && printf '\002' | dd of=version.bin bs=1 seek=4 conv=notrunc 2>/dev/null
  expect_error "wrong version" "token file version 2 is not supported" "$trainer" --data version.bin --log log.jsonl
  head -c $(($(wc -c <train.bin) - 2)) train.bin >short.bin
  expect_error "truncated" "short.bin: the header says" "$trainer" --data short.bin --log log.jsonl
  head -c 15 text.txt >few.txt && "$bin/tokpipe-tokens" few.txt -o few.bin 2>/dev/null
  expect_error "too few tokens" "few.bin: 15 tokens are too few: a batch needs 17 (batch * seq + 1)" "$trainer" --data few.bin --log log.jsonl
  cp train.bin vocab.bin && printf '\000\001' | dd of=vocab.bin bs=1 seek=1044 conv=notrunc 2>/dev/null
  expect_error "token out of range" "vocab.bin: token 256 at position 10 is outside the model's vocabulary of 256" "$trainer" --data vocab.bin --log log.jsonl
  expect_error "bad --val-data" "magic.bin: not a token file" "$trainer" --data train.bin --val-data magic.bin --log log.jsonl
  expect_error "missing data" "nope.bin: cannot read: No such file or directory" "$trainer" --data nope.bin --log log.jsonl
  [ ! -e log.jsonl ] && ok "nothing written on bad input" || fail "log.jsonl written on bad input"
  ;;

log)
  make_text
  expect_exit 0 "train" "$trainer" --data train.bin --val-data val.bin --val-every 2 --steps 5 --log log.jsonl --seed 3 || { cat err.txt; exit 1; }
  [ "$(wc -l <log.jsonl)" -eq 5 ] && ok "5 log lines" || fail "log lines: $(wc -l <log.jsonl)"
  pat='^\{"step": [1-5], "loss": [0-9.]+, "lr": 0.001, "grad_norm": [0-9.]+, "ms": [0-9.]+, "tokens_per_s": [0-9.]+(, "val_loss": [0-9.]+)?\}$'
  [ "$(grep -cE "$pat" log.jsonl)" -eq 5 ] && ok "every line has step, loss, lr, grad_norm, ms, tokens_per_s" || fail "log format: $(cat log.jsonl)"
  [ "$(grep -c val_loss log.jsonl)" -eq 2 ] && grep -q '^{"step": 2,.*"val_loss"' log.jsonl && grep -q '^{"step": 4,.*"val_loss"' log.jsonl &&
    ok "val_loss at steps 2 and 4 (--val-every 2)" || fail "val_loss lines: $(cat log.jsonl)"
  "$trainer" --data train.bin --val-data val.bin --steps 3 --log last.jsonl 2>/dev/null
  [ "$(grep -c val_loss last.jsonl)" -eq 1 ] && grep -q '^{"step": 3,.*"val_loss"' last.jsonl && ok "without --val-every: val_loss after the last step" || fail "val_loss default: $(cat last.jsonl)"
  [ "$(sed -n 1p log.jsonl | cut -c1-11)" = '{"step": 1,' ] && ok "the first step is 1" || fail "first step"
  [ "$(grep -c '^step [1-5]/5 | loss [0-9.]* | lr 1.000e-03 | norm [0-9.]* | [0-9.]* ms | [0-9]* tok/s' err.txt)" -eq 5 ] &&
    ok "a progress line per step on stderr" || fail "progress lines: $(cat err.txt)"
  l1=$(field log.jsonl 1 loss)
  awk -v l="$l1" 'BEGIN { exit !(l > 5.4 && l < 5.7) }' && ok "first loss $l1 ~ ln(256) from random init" || fail "first loss $l1"
  ;;

schedule)
  make_text
  "$trainer" --data train.bin --steps 6 --lr 0.01 --warmup 2 --lr-schedule cosine --log log.jsonl 2>/dev/null || fail "cosine run"
  lrs=$(for s in 1 2 3 4 5 6; do field log.jsonl $s lr; done | tr '\n' ' ')
  # warmup 0.01*1/2, 0.01*2/2; then 0.01*(1+cos(pi*k/4))/2 for k = 0..3
  [ "$lrs" = "0.005 0.01 0.01 0.008535533905932738 0.005 0.0014644660940672626 " ] &&
    ok "warmup then cosine: $lrs" || fail "lr values: $lrs"
  # AdamW's update hardly depends on the gradients' scale, so clipping shows with a large eps
  for clip in none 1e-3 1e9; do
    arg=""; [ $clip = none ] || arg="--grad-clip $clip"
    "$trainer" --data train.bin --steps 3 --eps 1 --lr 0.1 $arg --log clip_$clip.jsonl 2>/dev/null || fail "clip $clip run"
  done
  [ "$(field clip_none.jsonl 1 grad_norm)" = "$(field clip_1e-3.jsonl 1 grad_norm)" ] && ok "grad_norm is logged before clipping" || fail "grad_norm differs"
  [ "$(field clip_none.jsonl 3 loss)" != "$(field clip_1e-3.jsonl 3 loss)" ] && ok "--grad-clip 1e-3 changes the training" || fail "clipping had no effect"
  [ "$(untimed clip_none.jsonl)" = "$(untimed clip_1e9.jsonl)" ] && ok "--grad-clip above the norm changes nothing" || fail "clip 1e9 changed the run"
  ;;

grads)
  make_text
  expect_exit 0 "dump" "$trainer" --init "$src/tiny.onnx" --data train.bin --steps 1 --dump-grads grads.safetensors || exit 1
  "$bin/train_check_grads" "$src/tiny.onnx" train.bin grads.safetensors || status=1
  expect_error "no step to dump" "--dump-grads: no step is left to run (steps 1..0)" "$trainer" --steps 0 --dump-grads g0.safetensors
  [ ! -e g0.safetensors ] && ok "nothing dumped" || fail "g0.safetensors written"
  ;;

init)
  make_text
  "$trainer" --init "$src/tiny.onnx" --steps 0 --dump-weights raw.safetensors 2>/dev/null || fail "init from tiny.onnx"
  "$trainer" --init "$src/tiny_ext/model.onnx" --steps 0 --dump-weights ext.safetensors 2>/dev/null || fail "init from tiny_ext"
  same_files "external data gives the same weights" raw.safetensors ext.safetensors
  "$trainer" --init raw.safetensors --steps 0 --dump-weights again.safetensors 2>/dev/null || fail "init from safetensors"
  same_files "--init FILE.safetensors" raw.safetensors again.safetensors
  "$trainer" --steps 0 --seed 5 --dump-weights r5.safetensors 2>/dev/null && "$trainer" --steps 0 --seed 5 --dump-weights r5b.safetensors 2>/dev/null &&
    "$trainer" --steps 0 --seed 6 --dump-weights r6.safetensors 2>/dev/null || fail "random init runs"
  same_files "random init is deterministic" r5.safetensors r5b.safetensors
  cmp -s r5.safetensors r6.safetensors && fail "seeds 5 and 6 give the same weights" || ok "another seed, other weights"
  expect_error "shape mismatch" "bad_shape.onnx: initializer 'wpe' has shape [16, 8]; the compiled plan needs [8, 8]" "$trainer" --init "$src/bad_shape.onnx" --data train.bin --log log.jsonl
  expect_error "dtype mismatch" "bad_dtype.onnx: initializer 'frozen.shift' is f16; the compiled plan needs f32" "$trainer" --init "$src/bad_dtype.onnx" --data train.bin --log log.jsonl
  expect_error "missing initializer" "missing.onnx: initializer 'shared.bias' is missing (the compiled plan needs it)" "$trainer" --init "$src/missing.onnx" --data train.bin --log log.jsonl
  expect_error "not a model" "text.txt: cannot decode the file as an ONNX model" "$trainer" --init text.txt --data train.bin --log log.jsonl
  mkfifo fifo.onnx # refused, not waited on (timeout: a hang fails)
  expect_error "--init FIFO" "cannot open 'fifo.onnx': not a regular file: it is a FIFO" timeout 20 "$trainer" --init fifo.onnx --data train.bin --log log.jsonl
  "$trainer" --init "$src/tiny.onnx" --data train.bin --steps 1 --dump-grads grads.safetensors 2>/dev/null || fail "dump-grads run"
  expect_error "tensor missing from a .safetensors" "grads.safetensors: tensor 'frozen.shift' is missing (the compiled plan needs it)" "$trainer" --init grads.safetensors --data train.bin --log log.jsonl
  [ ! -e log.jsonl ] && ok "nothing written on bad --init" || fail "log.jsonl written on bad --init"
  ;;

init-external)
  # --init reads external data as the importer does (runtime/onnx decodes for both): each
  # bad weights.bin of tiny_ext gives the trainer tokpipec's message, word for word
  for bad in truncated missing fifo outside absolute dotdot; do
    mkdir "$bad" && cp "$src/tiny_ext/model.onnx" "$bad/" || fail "copy tiny_ext"
    case $bad in
    truncated) head -c 100 "$src/tiny_ext/weights.bin" >"$bad/weights.bin"
      want="initializer 'wte': external data [0, +8192) lies beyond the end of 'weights.bin' (100 bytes)" ;;
    missing) want="initializer 'wte': external data location 'weights.bin' cannot be opened: No such file or directory" ;;
    fifo) mkfifo "$bad/weights.bin" # refused, not waited on (timeout: a hang fails)
      want="initializer 'wte': external data location 'weights.bin' cannot be opened: not a regular file: it is a FIFO" ;;
    outside) cp "$src/tiny_ext/weights.bin" outside.bin && ln -s ../outside.bin "$bad/weights.bin"
      want="initializer 'wte': external data location 'weights.bin' resolves outside the model's folder" ;;
    absolute) LC_ALL=C sed 's|weights\.bin|/etc/passwd|g' "$src/tiny_ext/model.onnx" >"$bad/model.onnx" # same length
      want="initializer 'wte': external data location '/etc/passwd' is an absolute path" ;;
    dotdot) cp "$src/tiny_ext/weights.bin" outside.bin && LC_ALL=C sed 's|weights\.bin|../outs.bin|g' "$src/tiny_ext/model.onnx" >"$bad/model.onnx"
      want="initializer 'wte': external data location '../outs.bin' leaves the model's folder" ;;
    esac
    expect_error "--init, $bad external data" "$bad/model.onnx: $want" timeout 20 "$trainer" --init "$bad/model.onnx" --steps 0 || continue
    sed 's/^[^:]*: error: //' err.txt >trainer.txt
    timeout 20 "$bin/tokpipec" "$bad/model.onnx" --emit=ir >/dev/null 2>err.txt
    sed 's/^[^:]*: error: //' err.txt >tokpipec.txt
    same_files "--init and tokpipec say the same of $bad external data" trainer.txt tokpipec.txt
  done
  ;;

resume)
  make_text
  common="--init $src/tiny.onnx --data train.bin --val-data val.bin --val-every 3 --lr 0.01 --steps 12 --save-every 4"
  "$trainer" $common --save full --log full.jsonl --dump-weights full.safetensors 2>/dev/null || fail "uninterrupted run"
  # stopped: a run of 8 steps, resumed to 12
  "$trainer" $common --steps 8 --save stop --log stop.jsonl 2>/dev/null || fail "8-step run"
  "$trainer" $(echo "$common" | sed 's|--init [^ ]*||') --resume stop --save stop --log stop.jsonl --dump-weights stop.safetensors 2>/dev/null || fail "resume of the 8-step run"
  [ "$(untimed full.jsonl)" = "$(untimed stop.jsonl)" ] && ok "8 steps + 4 resumed: the same log (losses, val losses, lr, grad norms)" || fail "logs differ: $(untimed full.jsonl >a.txt; untimed stop.jsonl | diff a.txt -)"
  same_files "8 steps + 4 resumed: the same weights" full.safetensors stop.safetensors
  same_files "the same checkpoint" full/checkpoint.safetensors stop/checkpoint.safetensors
  # killed after step 6 (checkpoint of step 4): the log's steps 5, 6 are dropped and rerun
  TOKPIPE_TEST_KILL_AFTER_STEP=6 "$trainer" $common --save kill --log kill.jsonl 2>/dev/null
  rc=$?
  [ $rc -eq 137 ] && [ "$(wc -l <kill.jsonl)" -eq 6 ] && ok "killed after step 6 (exit $rc)" || fail "kill: exit $rc"
  "$trainer" $(echo "$common" | sed 's|--init [^ ]*||') --resume kill --save kill --log kill.jsonl --dump-weights kill.safetensors 2>err.txt || fail "resume after kill"
  grep -q "steps 5..12" err.txt && ok "resumed at step 5" || fail "resume start: $(head -1 err.txt)"
  [ "$(untimed full.jsonl)" = "$(untimed kill.jsonl)" ] && ok "killed + resumed: the same log" || fail "logs differ after kill"
  same_files "killed + resumed: the same weights" full.safetensors kill.safetensors
  TOKPIPE_TEST_KILL_AFTER_STEP=6 "$trainer" $common --save kill0 --log kill0.jsonl 2>/dev/null
  "$trainer" --data train.bin --resume kill0 --steps 4 --log kill0.jsonl 2>/dev/null &&
    [ "$(untimed kill0.jsonl)" = "$(untimed full.jsonl | head -4)" ] && ok "resumed with no step to run: the log ends at the checkpoint" ||
    fail "log of a resume with nothing to run: $(cat kill0.jsonl)"
  expect_error "resume from nothing" "nothing/checkpoint.safetensors: cannot read" "$trainer" --data train.bin --resume nothing
  expect_error "resume beyond --steps" "the checkpoint is at step 12, beyond --steps 10" "$trainer" --data train.bin --resume full --steps 10
  ;;

interrupted-save)
  make_text
  common="--init $src/tiny.onnx --data train.bin --lr 0.01 --steps 12 --save-every 4"
  "$trainer" $common --save full --log full.jsonl --dump-weights full.safetensors 2>/dev/null || fail "uninterrupted run"
  TOKPIPE_TEST_KILL_IN_SAVE=8 "$trainer" $common --save ck --log ck.jsonl 2>/dev/null
  rc=$?
  [ $rc -eq 137 ] && ls ck/checkpoint.safetensors.tmp.* >/dev/null 2>&1 && ok "killed while writing the step-8 checkpoint (exit $rc)" || fail "kill in save: exit $rc"
  "$trainer" $(echo "$common" | sed 's|--init [^ ]*||') --resume ck --save ck --log ck.jsonl --dump-weights ck.safetensors 2>err.txt || fail "resume: $(cat err.txt)"
  grep -q "steps 5..12" err.txt && ok "the step-4 checkpoint was still there and loaded" || fail "resume start: $(head -1 err.txt)"
  [ "$(ls ck)" = checkpoint.safetensors ] && ok "the killed writer's temporary and the lock file are gone" || fail "left in ck: $(ls ck)"
  [ "$(untimed full.jsonl)" = "$(untimed ck.jsonl)" ] && ok "the same log as without the interruption" || fail "logs differ"
  same_files "the same final weights" full.safetensors ck.safetensors
  ;;

outputs)
  make_text
  touch afile
  expect_error "--save under a file" "--save folder 'afile/ck': Not a directory" "$trainer" --data train.bin --save afile/ck --log log.jsonl
  expect_error "--save is a file" "--save 'afile' is not a folder" "$trainer" --data train.bin --save afile --log log.jsonl
  expect_error "--save in a missing folder" "--save folder 'no/ck': folder 'no': No such file or directory" "$trainer" --data train.bin --save no/ck --log log.jsonl
  expect_error "--dump-weights in a missing folder" "--dump-weights 'no/w.safetensors': folder 'no'" "$trainer" --data train.bin --dump-weights no/w.safetensors --log log.jsonl
  expect_error "--log in a missing folder" "--log 'no/log.jsonl': folder 'no'" "$trainer" --data train.bin --log no/log.jsonl
  mkdir ro && chmod 555 ro
  if [ "$(id -u)" -ne 0 ]; then
    expect_error "--save read-only" "--save folder 'ro' is not writable" "$trainer" --data train.bin --save ro --log log.jsonl
  else
    ok "(running as root: the read-only folder case is skipped)"
  fi
  [ ! -e log.jsonl ] && [ ! -e afile/ck ] && [ ! -e no ] && ok "nothing written" || fail "files written on bad outputs"
  ;;

export)
  make_text
  "$trainer" --init "$src/tiny.onnx" --data train.bin --val-data train.bin --val-batches 1 --steps 5 --lr 0.01 \
    --log log.jsonl --dump-weights w.safetensors --export-onnx trained.onnx 2>/dev/null || fail "train + export"
  loss=$(field log.jsonl 5 val_loss)
  "$bin/train_check_export" trained.onnx w.safetensors train.bin "$loss" || status=1
  mkdir ext && "$trainer" --init "$src/tiny_ext/model.onnx" --steps 0 --export-onnx ext/trained.onnx 2>/dev/null || fail "export from external data"
  [ "$(wc -c <ext/trained.onnx)" -gt 17000 ] && ! grep -q weights.bin ext/trained.onnx && ok "external data is inlined in the export" || fail "export of tiny_ext"
  "$bin/tokpipec" ext/trained.onnx --emit=ir >ir.txt 2>&1 && grep -q "param %head.bias" ir.txt && ok "the export imports; head.bias is its own initializer" || fail "import of the export: $(cat ir.txt | head -3)"
  "$trainer" --steps 0 --export-onnx fromplan.onnx 2>/dev/null && [ -s fromplan.onnx ] && ok "without --init the plan's model is the source" || fail "export with the plan's model"
  expect_error "export to a model without the names" "missing.onnx: the model has no initializer 'head.bias' (nor an Identity of one)" "$trainer" --steps 0 --export-onnx x.onnx --init "$src/missing.onnx"
  ;;

learns)
  make_text
  "$trainer" --data train.bin --val-data val.bin --val-every 100 --steps 300 --lr 0.02 --log log.jsonl 2>/dev/null || fail "training"
  first=$(field log.jsonl 1 loss) last=$(field log.jsonl 300 val_loss)
  awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 2.5) }' && ok "the loss falls: $first at step 1, validation $last at step 300" ||
    fail "the loss did not fall enough: $first -> $last"
  ;;

ranges)
  make_text
  # non-finite or out-of-range hyperparameters: a usage error naming the flag, nothing run
  for arg in "--lr inf" "--lr nan" "--lr -inf" "--lr 1e39" "--beta1 nan" "--beta2 inf" "--eps inf" "--eps 0" \
    "--eps nan" "--weight-decay inf" "--weight-decay nan" "--grad-clip inf" "--grad-clip nan"; do
    flag=${arg%% *}
    # shellcheck disable=SC2086 # arg is a flag and its value
    expect_exit 2 "$arg" "$trainer" --data train.bin --steps 1 --log log.jsonl $arg &&
      if grep -q -- "error: $flag needs a number in \[" err.txt; then ok "$arg: $(head -1 err.txt)"; else fail "$arg: $(cat err.txt)"; fi
  done
  [ ! -e log.jsonl ] && ok "nothing trained" || fail "a run trained"
  expect_exit 0 "--lr at the float maximum" "$trainer" --data train.bin --steps 1 --lr 3e38 --eps 1e-30 --weight-decay 0 &&
    ok "--lr 3e38 --eps 1e-30: accepted"
  # --val-batches: at most the whole batches of batch * seq + 1 = 17 tokens the validation file holds
  held=$(( ($(od -A n -t d4 -j 8 -N 4 val.bin) - 1) / 16 ))
  expect_error "--val-batches beyond the file" "--val-batches 1000000000000 is more than 'val.bin' holds: $held batches of 17 tokens" \
    "$trainer" --data train.bin --val-data val.bin --val-batches 1000000000000 --steps 1 --log log.jsonl
  expect_error "--val-batches one beyond" "--val-batches $((held + 1)) is more than 'val.bin' holds" \
    "$trainer" --data train.bin --val-data val.bin --val-batches $((held + 1)) --steps 1 --log log.jsonl
  expect_exit 0 "--val-batches all of it" "$trainer" --data train.bin --val-data val.bin --val-batches $held --steps 1 --log log.jsonl &&
    grep -q '"val_loss"' log.jsonl && ok "--val-batches $held: evaluated"
  expect_exit 2 "--val-batches 0" "$trainer" --data train.bin --val-data val.bin --val-batches 0 --steps 1 && ok "--val-batches 0: exit 2"
  ;;

truncated)
  make_text
  # a data file truncated while the trainer reads it: one error naming it, not SIGBUS (the
  # mapped reader died of it at the next batch past the new end)
  cp train.bin trunc.bin
  timeout 120 "$trainer" --data trunc.bin --steps 100000000 >out.txt 2>err.txt & # a reader that misses it runs on
  pid=$!
  i=0
  while ! grep -q '^step ' err.txt && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
  truncate -s 1100 trunc.bin
  wait $pid
  rc=$?
  last=$(tail -1 err.txt)
  if [ $rc -eq 1 ] && echo "$last" | grep -qF "error: trunc.bin: the file was truncated while in use"; then
    ok "truncated while training: exit 1, $last"
  else
    fail "truncated while training: exit $rc, last line: $last"
  fi
  ;;

aliases)
  make_text
  # no output replaces the input or the other output: same path, another spelling, a
  # symlink, a hard link
  expect_exit 2 "-o = --val-out" "$bin/tokpipe-tokens" text.txt -o out.bin --val-fraction 0.1 --val-out out.bin &&
    grep -qF "error: -o 'out.bin' and --val-out 'out.bin' are the same file" err.txt && ok "-o = --val-out: $(head -1 err.txt)"
  expect_exit 2 "-o = ./--val-out" "$bin/tokpipe-tokens" text.txt -o out.bin --val-fraction 0.1 --val-out ./out.bin &&
    grep -qF "error: -o 'out.bin' and --val-out './out.bin' are the same file" err.txt && ok "another spelling: $(head -1 err.txt)"
  cp train.bin keep.bin
  expect_exit 2 "--val-out = existing -o" "$bin/tokpipe-tokens" text.txt -o train.bin --val-fraction 0.1 --val-out train.bin &&
    cmp -s train.bin keep.bin && ok "the training file is kept"
  expect_exit 2 "input = -o" "$bin/tokpipe-tokens" text.txt -o text.txt &&
    grep -qF "error: the input 'text.txt' and -o 'text.txt' are the same file" err.txt && ok "input = -o: $(head -1 err.txt)"
  ln -s text.txt link.txt && ln text.txt hard.txt
  expect_exit 2 "symlink input = -o" "$bin/tokpipe-tokens" link.txt -o text.txt && ok "symlink: $(head -1 err.txt)"
  expect_exit 2 "input = --val-out via a hard link" "$bin/tokpipe-tokens" text.txt -o o.bin --val-fraction 0.1 --val-out hard.txt &&
    ok "hard link: $(head -1 err.txt)"
  [ ! -e out.bin ] && [ ! -e o.bin ] && [ "$(head -c 3 text.txt)" = "the" ] && ok "nothing written" || fail "a refused run wrote"
  ;;

checkpoint-checks) # what a resume must match, and what may change
  make_text
  "$trainer" --data train.bin --lr 0.01 --steps 2 --save ck 2>/dev/null || fail "2 steps of batch 2"
  "$bin/tiny_trainer_b4" --data train.bin --lr 0.01 --steps 2 --save ck4 2>/dev/null || fail "2 steps of batch 4"
  expect_error "another batch" "ck/checkpoint.safetensors: the checkpoint was trained with batch 2 x seq 8, vocab 256; this trainer has batch 4 x seq 8, vocab 256 (the data order would differ)" \
    "$bin/tiny_trainer_b4" --data train.bin --resume ck --steps 4
  expect_error "another batch, the other way" "ck4/checkpoint.safetensors: the checkpoint was trained with batch 4 x seq 8" \
    "$trainer" --data train.bin --resume ck4 --steps 4
  sed 's/fox/cat/' text.txt >same_size.txt && "$bin/tokpipe-tokens" same_size.txt -o same_size.bin --val-fraction 0.25 --val-out v.bin 2>/dev/null
  head -c 2000 text.txt >shorter.txt && "$bin/tokpipe-tokens" shorter.txt -o shorter.bin 2>/dev/null
  tokens=$(($(wc -c <train.bin) / 2 - 512))
  expect_error "other tokens of the same count" "ck/checkpoint.safetensors: the checkpoint was trained on $tokens tokens of CRC-32C " \
    "$trainer" --data same_size.bin --resume ck --steps 4
  grep -qF -- "--data 'same_size.bin' has $tokens tokens of CRC-32C" err.txt && ok "the message names the data file" || fail "$(cat err.txt)"
  expect_error "another data file" "--data 'shorter.bin' has 2000 tokens" "$trainer" --data shorter.bin --resume ck --steps 4
  expect_error "another model" "ck4/checkpoint.safetensors: tensor 'gain' is missing" "$bin/pipe_trainer" --data train.bin --resume ck4 --steps 4
  "$trainer" --data train.bin --resume ck --steps 3 --lr 0.001 --warmup 1 --grad-clip 1 2>/dev/null &&
    ok "the optimizer's options may change" || fail "resume with other optimizer options"
  # the pipeline plan may change: stages, microbatches, replicas, slices, schedule (the
  # global batch stays); the result agrees to rounding (sums in another order)
  pipe=$bin/pipe_trainer tiny2=$src/../pipeline/tiny2.onnx
  export PIPE_STAGES=2 PIPE_MICROBATCHES=2 PIPE_DP=2 PIPE_SLICES=5,3 PIPE_SCHEDULE=gpipe
  "$pipe" --init "$tiny2" --data train.bin --lr 0.01 --steps 4 --dump-weights full.weights 2>/dev/null &&
    "$pipe" --init "$tiny2" --data train.bin --lr 0.01 --steps 2 --save pck 2>/dev/null || fail "pipeline runs"
  export PIPE_STAGES=1 PIPE_MICROBATCHES=2 PIPE_DP=1 PIPE_SLICES=8 PIPE_SCHEDULE=1f1b
  "$pipe" --data train.bin --lr 0.01 --steps 4 --resume pck --dump-weights resumed.weights 2>err.txt || fail "resume in another plan: $(cat err.txt)"
  "$bin/tokpipe-compare" resumed.weights full.weights --tol 1e-5 >cmp.txt 2>&1 &&
    ok "2 stages x 2 replicas, 2 microbatches of 1 row, 2 slices, gpipe -> 1 stage, 2 microbatches of 2 rows, 1f1b: the weights agree ($(tail -1 cmp.txt))" ||
    fail "resume across plans: $(cat cmp.txt)"
  unset PIPE_STAGES PIPE_MICROBATCHES PIPE_DP PIPE_SLICES PIPE_SCHEDULE
  ;;

corrupt) # checksums, strict metadata, bounded steps
  make_text
  "$trainer" --data train.bin --steps 2 --save ck 2>/dev/null || fail "2 steps"
  cp ck/checkpoint.safetensors good.safetensors
  mkdir flip && cp good.safetensors flip/checkpoint.safetensors && flip_last_bit flip/checkpoint.safetensors
  expect_error "a flipped bit in the data" "flip/checkpoint.safetensors: tensor 'wte' fails its CRC-32C check (stored " \
    "$trainer" --data train.bin --resume flip --steps 4
  mkdir meta && cp good.safetensors meta/checkpoint.safetensors
  at=$(grep -abo '"step":"2"' meta/checkpoint.safetensors | cut -d: -f1)
  printf 3 | dd of=meta/checkpoint.safetensors bs=1 seek=$((at + 8)) conv=notrunc 2>/dev/null
  expect_error "a changed metadata value" "meta/checkpoint.safetensors: the metadata fails its CRC-32C check" \
    "$trainer" --data train.bin --resume meta --steps 4
  # each metadata field strictly (the edited files have right checksums)
  for edit in "rng=banana|checkpoint metadata 'rng' is 'banana', not a whole number in [0, 18446744073709551615]" \
      "rng=18446744073709551616|checkpoint metadata 'rng' is '18446744073709551616', not a whole number" \
      "step=02|checkpoint metadata 'step' is '02', not a whole number" "step=+2|checkpoint metadata 'step' is '+2'" "step= 2|checkpoint metadata 'step' is ' 2'" "step=|checkpoint metadata 'step' is ''" \
      "step=9223372036854775807|checkpoint metadata 'step' is '9223372036854775807', not a whole number in [0, 9007199254740992]" \
      "step=-1|checkpoint metadata 'step' is '-1'" "-seed|checkpoint metadata 'seed' is missing" \
      "extra=1|checkpoint metadata has an unknown key 'extra'" \
      "format=other|not a tokpipe checkpoint (metadata 'format' is not 'tokpipe-checkpoint')" \
      "version=1|checkpoint version 1 is not supported (expected 2): it was written by an older trainer, without checksums" \
      "version=3|checkpoint version 3 is not supported (expected 2)" \
      "data_position=$(($(wc -c <train.bin) / 2 - 512))|checkpoint metadata 'data_position' is '$(($(wc -c <train.bin) / 2 - 512))', not a whole number in [0, $(($(wc -c <train.bin) / 2 - 513))]" \
      "data_crc32c=BANANA00|checkpoint metadata 'data_crc32c' is 'BANANA00', not 8 lowercase hex digits" \
      "batch=0|checkpoint metadata 'batch' is '0', not a whole number in [1, " \
      "-tensor:optimizer/v/wte|tensor 'optimizer/v/wte' is missing (the compiled plan needs it)" \
      "copy:frozen.shift=optimizer/m/frozen.shift|tensor 'optimizer/m/frozen.shift' is not an AdamW moment of a trainable parameter" \
      "copy:wpe=wpe2|tensor 'wpe2' is not a parameter of the compiled plan (a checkpoint of another model?)"; do
    edited bad "${edit%%|*}"
    expect_error "${edit%%|*}" "bad/checkpoint.safetensors: ${edit#*|}" "$trainer" --data train.bin --resume bad --steps 4
  done
  # steps are bounded (2^53): no overflow however large the numbers
  edited top step=9007199254740992
  expect_exit 0 "a checkpoint at step 2^53, --steps 2^53" "$trainer" --data train.bin --resume top --steps 9007199254740992 &&
    grep -q "steps 9007199254740993..9007199254740992" err.txt && ok "step 2^53: nothing left to run" || fail "step 2^53: $(cat err.txt)"
  expect_exit 2 "--steps beyond 2^53" "$trainer" --data train.bin --resume top --steps 9223372036854775807 &&
    grep -q -- "--steps needs an integer in \[0, 9007199254740992\], not .9223372036854775807." err.txt && ok "--steps INT64_MAX: exit 2" || fail "$(cat err.txt)"
  ;;

writers) # links are never followed; two writers of one file each write a whole one; one trainer per --save
  make_text
  echo precious >precious.txt
  mkdir tmplink finallink locklink
  ln -s ../precious.txt tmplink/checkpoint.safetensors.tmp.planted # as a killed writer's temporary
  ln -s ../precious.txt finallink/checkpoint.safetensors
  ln -s ../precious.txt locklink/checkpoint.safetensors.lock
  "$trainer" --data train.bin --steps 2 --save tmplink 2>/dev/null && "$trainer" --data train.bin --steps 2 --save finallink 2>/dev/null ||
    fail "runs with links in the --save folder"
  [ -f finallink/checkpoint.safetensors ] && [ ! -L finallink/checkpoint.safetensors ] &&
    "$trainer" --data train.bin --resume finallink --steps 2 2>/dev/null && ok "the checkpoint replaced the link, which was not followed" ||
    fail "links: $(ls -l finallink)"
  [ ! -L tmplink/checkpoint.safetensors.tmp.planted ] && [ -f tmplink/checkpoint.safetensors ] &&
    ok "a link left as a temporary was removed (itself, not its target)" || fail "temporaries: $(ls -l tmplink)"
  expect_error "a link at the lock file" "--save checkpoint 'locklink/checkpoint.safetensors': cannot create the lock file 'locklink/checkpoint.safetensors.lock'" \
    "$trainer" --data train.bin --steps 2 --save locklink
  [ "$(cat precious.txt)" = precious ] && ok "no link's target was written" || fail "precious.txt was overwritten"
  # two trainers saving to one folder: the second stops at start-up
  "$trainer" --data train.bin --steps 100000000 --save ck --save-every 1000 2>first.txt &
  first=$!
  i=0
  while ! grep -q "^step" first.txt && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
  expect_error "a second trainer on the same --save" "--save checkpoint 'ck/checkpoint.safetensors' is in use by another process, which writes or reads it (it holds 'ck/checkpoint.safetensors.lock')" \
    "$trainer" --data train.bin --steps 2 --save ck
  expect_error "a second trainer resuming from it: the lock comes first" "--save checkpoint 'ck/checkpoint.safetensors' is in use by another process, which writes or reads it (it holds 'ck/checkpoint.safetensors.lock')" \
    "$trainer" --data train.bin --steps 2 --resume ck --save ck
  kill $first && wait $first 2>/dev/null
  # two processes writing one file at once, many times: always one whole version
  sed 's/dog/cat/' text.txt >other.txt
  "$bin/tokpipe-tokens" text.txt -o a.bin 2>/dev/null && "$bin/tokpipe-tokens" other.txt -o b.bin 2>/dev/null
  mixed=0 i=0
  while [ $i -lt 40 ]; do
    "$bin/tokpipe-tokens" text.txt -o out.bin 2>/dev/null & p1=$!
    "$bin/tokpipe-tokens" other.txt -o out.bin 2>/dev/null & p2=$!
    wait $p1 $p2
    cmp -s out.bin a.bin || cmp -s out.bin b.bin || mixed=$((mixed + 1))
    i=$((i + 1))
  done
  [ $mixed -eq 0 ] && [ "$(ls | grep -c '\.tmp')" -eq 0 ] && ok "40 rounds of two concurrent writers: always one whole file, no temporaries left" ||
    fail "$mixed of 40 outputs were mixed; $(ls)"
  mkfifo pipe.bin
  expect_error "an output that is a FIFO" "cannot write 'pipe.bin': it exists and is not a regular file" "$bin/tokpipe-tokens" text.txt -o pipe.bin
  [ -p pipe.bin ] && ok "the FIFO is still there" || fail "pipe.bin was replaced"
  ;;

diverge) # a non-finite loss or weight stops the run, naming the step; no checkpoint of it
  make_text
  "$trainer" --data train.bin --steps 2 --save ck 2>/dev/null || fail "2 good steps"
  cp ck/checkpoint.safetensors good.safetensors
  expect_run_error "weights overflow (--lr 3e38)" "the value of 'wte' after step 1 is -inf at element 0: training diverged (lower --lr, or --grad-clip); nothing was written" \
    "$trainer" --data train.bin --steps 4 --lr 3e38 --save ck --save-every 1
  same_files "the last good checkpoint is kept" good.safetensors ck/checkpoint.safetensors
  expect_run_error "the loss overflows (--lr 1e30)" "at step 4: training diverged (lower --lr, or --grad-clip)" \
    "$trainer" --data train.bin --resume ck --steps 6 --lr 1e30 --save ck
  grep "error" err.txt | grep -q "the loss is .*nan at step" && ok "the loss is named" || fail "$(cat err.txt)"
  same_files "the last good checkpoint is kept after a resume" good.safetensors ck/checkpoint.safetensors
  expect_run_error "--dump-weights of overflowed weights" "the value of 'wte' after step 1 is -inf" \
    "$trainer" --data train.bin --steps 1 --lr 3e38 --dump-weights w.safetensors --export-onnx w.onnx
  [ ! -e w.safetensors ] && [ ! -e w.onnx ] && ok "no weights written" || fail "weights written"
  # a failed run leaves no empty --save folder, no lock, no empty log
  "$trainer" --steps 0 --dump-weights init.safetensors 2>/dev/null && "$bin/train_edit_safetensors" init.safetensors inf.safetensors tensor:wpe=inf ||
    fail "weights with inf"
  expect_run_error "a non-finite loss at step 1" "nan at step 1: training diverged" \
    "$trainer" --init inf.safetensors --data train.bin --steps 2 --save new --log new.jsonl
  [ ! -e new ] && [ ! -e new.jsonl ] && ok "no --save folder, no log" || fail "left behind: $(ls)"
  expect_run_error "fails at the first save" "after step 1 is -inf" "$trainer" --data train.bin --steps 2 --lr 3e38 --save new --save-every 1 --log new.jsonl
  [ ! -e new ] && [ "$(wc -l <new.jsonl)" -eq 1 ] && ok "no --save folder; the log has step 1's line" || fail "left behind: $(ls new; cat new.jsonl)"
  ;;

fifo) # inputs that are FIFOs are refused at once, never read (which would block)
  make_text
  "$trainer" --data train.bin --steps 2 --save ck --log log.jsonl 2>/dev/null || fail "2 steps"
  mkdir f && mkfifo f/checkpoint.safetensors fifo.safetensors fifo.jsonl
  expect_run_error "--resume from a FIFO" "f/checkpoint.safetensors: cannot read: not a regular file: it is a FIFO" \
    "$trainer" --data train.bin --resume f --steps 4
  expect_error "--save onto a FIFO" "--save checkpoint 'f/checkpoint.safetensors' exists and is not a regular file" \
    "$trainer" --data train.bin --save f --steps 4
  for flag in --dump-grads --dump-weights --export-onnx --trace; do # refused before training, not after
    expect_error "$flag onto a FIFO" "$flag 'fifo.safetensors' exists and is not a regular file" \
      "$trainer" --data train.bin --steps 2 "$flag" fifo.safetensors
  done
  expect_run_error "--init from a FIFO" "fifo.safetensors: cannot read: not a regular file: it is a FIFO" \
    "$trainer" --init fifo.safetensors --data train.bin --steps 4
  expect_run_error "a FIFO as the --log to continue" "cannot read the --log 'fifo.jsonl' to continue it: not a regular file: it is a FIFO" \
    "$trainer" --data train.bin --resume ck --steps 4 --log fifo.jsonl
  expect_run_error "a FIFO nobody reads as --log" "cannot write 'fifo.jsonl': a FIFO that nobody reads" \
    "$trainer" --data train.bin --steps 2 --log fifo.jsonl
  exec 3<>fifo.jsonl # a reader (this shell) before the trainer opens it
  timeout 60 "$trainer" --data train.bin --steps 2 --log fifo.jsonl 2>/dev/null
  rc=$?
  dd bs=65536 count=1 <&3 >read.jsonl 2>/dev/null # one read: the bytes waiting in the FIFO
  exec 3<&-
  [ $rc -eq 0 ] && [ "$(wc -l <read.jsonl)" -eq 2 ] && ok "a FIFO with a reader takes the log" || fail "log to a read FIFO: exit $rc, $(cat read.jsonl)"
  mkfifo fifo.bin
  # refused at once: without the check the open waits for a writer (timeout's exit 124)
  expect_error "--data FIFO" "fifo.bin: cannot read: not a regular file: it is a FIFO" timeout 10 "$trainer" --data fifo.bin --steps 1
  expect_error "--val-data FIFO" "fifo.bin: cannot read: not a regular file: it is a FIFO" timeout 10 "$trainer" --data train.bin --val-data fifo.bin --steps 1
  expect_error "tokpipe-tokens FIFO input" "cannot read 'fifo.bin': not a regular file: it is a FIFO" timeout 10 "$bin/tokpipe-tokens" fifo.bin -o x.bin
  "$bin/tokpipe-tokens" text.txt -o all.bin 2>/dev/null
  expect_exit 0 "tokpipe-tokens stdin" "$bin/tokpipe-tokens" - -o stdin.bin <text.txt &&
    same_files "'-' reads stdin (not refused as a non-regular file)" all.bin stdin.bin
  ;;

compare) # tokpipe-compare's scale floor: 1% of WANT's largest element, so float32 noise on a
  # gradient that is zero in exact arithmetic passes while a real difference there fails
  "$trainer" --steps 0 --dump-weights init.safetensors 2>/dev/null || fail "initial weights"
  edit() { "$bin/train_edit_safetensors" init.safetensors "$@" || fail "edit $*"; }
  edit want.safetensors tensor:wte=100 tensor:wpe=1e-9 # floor 1: wpe compares absolutely
  edit noise.safetensors tensor:wte=100 tensor:wpe=5e-6
  edit wrong.safetensors tensor:wte=100 tensor:wpe=2e-5
  expect_exit 0 "noise under the floor" "$bin/tokpipe-compare" noise.safetensors want.safetensors --tol 1e-5 &&
    grep -q "worst wpe max_rel_err=5.00e-06" out.txt && ok "noise under the floor passes" || fail "$(cat out.txt err.txt)"
  expect_exit 1 "a difference over the floor" "$bin/tokpipe-compare" wrong.safetensors want.safetensors --tol 1e-5 &&
    grep -q "FAIL wpe: max_rel_err=2.00e-05" err.txt && ok "a difference over the floor fails" || fail "$(cat out.txt err.txt)"
  edit want-inf.safetensors tensor:wte=100 tensor:wpe=1e-9 tensor:head.bias=inf # no floor from inf
  edit wrong-inf.safetensors tensor:wte=100 tensor:wpe=2e-5 tensor:head.bias=inf
  expect_exit 1 "an inf elsewhere" "$bin/tokpipe-compare" wrong-inf.safetensors want-inf.safetensors --tol 1e-5 &&
    grep -q "FAIL wpe: max_rel_err=2.00e-05" err.txt && ok "an inf in WANT sets no floor" || fail "$(cat out.txt err.txt)"
  ;;

no-decay) # --no-decay REGEX: the parameters it matches are not decayed, the others are
  make_text
  step() { # step OUT FLAGS...: one step from the same initial weights, the weights after it
    out=$1
    shift
    "$trainer" --data train.bin --steps 1 --lr 0.01 --dump-weights "$out" "$@" 2>/dev/null || fail "a step with $*"
  }
  only() { "$bin/train_edit_safetensors" "$1" "$2" $(for n in wte wpe head.bias head.weight_t frozen.shift; do
    [ "$n" = "$3" ] || echo "-tensor:$n"; done) || fail "keep $3 of $1"; }
  step plain.safetensors
  step decayed.safetensors --weight-decay 5
  step exempt.safetensors --weight-decay 5 --no-decay '^wpe$'
  for f in plain decayed exempt; do only $f.safetensors $f.wpe wpe; only $f.safetensors $f.wte wte; done
  same_files "--no-decay '^wpe$': wpe as without decay" plain.wpe exempt.wpe
  same_files "--no-decay '^wpe$': wte decayed" decayed.wte exempt.wte
  cmp -s plain.wpe decayed.wpe && fail "--weight-decay 5 does not move wpe" || ok "--weight-decay 5 moves wpe"
  expect_run_error "--no-decay matching nothing" "--no-decay 'wpf' matches no trained parameter" \
    "$trainer" --data train.bin --steps 1 --weight-decay 5 --no-decay wpf
  expect_run_error "--no-decay matching only a frozen parameter" "--no-decay 'frozen' matches no trained parameter" \
    "$trainer" --data train.bin --steps 1 --weight-decay 5 --no-decay frozen
  expect_exit 2 "--no-decay bad regex" "$trainer" --data train.bin --no-decay '(' &&
    grep -q -- "--no-decay: bad regular expression '('" err.txt && ok "bad regex: exit 2" || fail "$(cat err.txt)"
  ;;

*)
  echo "unknown case $case"
  exit 2
  ;;
esac
exit $status
