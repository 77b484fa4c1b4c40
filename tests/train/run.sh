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
  "$trainer" --init "$src/tiny.onnx" --data train.bin --steps 1 --dump-grads grads.safetensors 2>/dev/null || fail "dump-grads run"
  expect_error "tensor missing from a .safetensors" "grads.safetensors: tensor 'frozen.shift' is missing (the compiled plan needs it)" "$trainer" --init grads.safetensors --data train.bin --log log.jsonl
  [ ! -e log.jsonl ] && ok "nothing written on bad --init" || fail "log.jsonl written on bad --init"
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
  expect_error "resume from nothing" "nothing/checkpoint.safetensors: cannot read" "$trainer" --data train.bin --resume nothing
  expect_error "resume beyond --steps" "the checkpoint is at step 12, beyond --steps 10" "$trainer" --data train.bin --resume full --steps 10
  ;;

interrupted-save)
  make_text
  common="--init $src/tiny.onnx --data train.bin --lr 0.01 --steps 12 --save-every 4"
  "$trainer" $common --save full --log full.jsonl --dump-weights full.safetensors 2>/dev/null || fail "uninterrupted run"
  TOKPIPE_TEST_KILL_IN_SAVE=8 "$trainer" $common --save ck --log ck.jsonl 2>/dev/null
  rc=$?
  [ $rc -eq 137 ] && [ -e ck/checkpoint.safetensors.tmp ] && ok "killed while writing the step-8 checkpoint (exit $rc)" || fail "kill in save: exit $rc"
  "$trainer" $(echo "$common" | sed 's|--init [^ ]*||') --resume ck --save ck --log ck.jsonl --dump-weights ck.safetensors 2>err.txt || fail "resume: $(cat err.txt)"
  grep -q "steps 5..12" err.txt && ok "the step-4 checkpoint was still there and loaded" || fail "resume start: $(head -1 err.txt)"
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

fifo)
  make_text
  mkfifo fifo.bin
  # refused at once: without the check the open waits for a writer (timeout's exit 124)
  expect_error "--data FIFO" "fifo.bin: cannot read: not a regular file: it is a FIFO" timeout 10 "$trainer" --data fifo.bin --steps 1
  expect_error "--val-data FIFO" "fifo.bin: cannot read: not a regular file: it is a FIFO" timeout 10 "$trainer" --data train.bin --val-data fifo.bin --steps 1
  expect_error "tokpipe-tokens FIFO input" "cannot read 'fifo.bin': not a regular file: it is a FIFO" timeout 10 "$bin/tokpipe-tokens" fifo.bin -o x.bin
  "$bin/tokpipe-tokens" text.txt -o all.bin 2>/dev/null
  expect_exit 0 "tokpipe-tokens stdin" "$bin/tokpipe-tokens" - -o stdin.bin <text.txt &&
    same_files "'-' reads stdin (not refused as a non-regular file)" all.bin stdin.bin
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

*)
  echo "unknown case $case"
  exit 2
  ;;
esac
exit $status
