#!/bin/sh
# run.sh CASE BIN_DIR SRC_DIR BUILD_DIR WORK_DIR CC: one code-generation test case. Prints
# "ok ..." lines and exits 0, or "FAIL ..." lines and exits 1. The cases:
#   golden    tiny_gpt.onnx's plan is byte for byte tiny_gpt.plan.c, and twice the same
#             (TOKPIPE_UPDATE_GOLDEN=1 rewrites the golden file instead)
#   werror    every fixture's plan compiles with -std=c11 -Wall -Wextra -Werror -pedantic
#   shared    code that units run alike is written once: a 4-layer model on 4 stages in 2
#             slices has one forward and one backward body per slice, which every unit
#             calls (a middle stage's unit is one call), with its own parameters and
#             arena offsets (one list for stages laid out alike); on 2 stages each unit calls its layers' body twice; it compiles
#             with -Werror and is deterministic (that it trains alike: tests/pipeline's
#             generated-deep, tests/slicing, tests/parity)
#   errors    what codegen and --exe cannot do fails with one clear message and exit code
#   memory    --emit=memory's report
#   exe       tokpipec --exe (build tree): the trainer learns (loss finite, falling)
#   limits    token ids are checked against every table they index (an embedding smaller
#             than the vocabulary, a loss with fewer classes), at load, naming the table;
#             plans beyond this machine's memory: tokpipec refuses them, and a trainer
#             compiled anyway (--max-memory) says what it cannot allocate
#   pkgconfig cc plan.c $(pkg-config --cflags --libs tokpipe) with the build tree's .pc; a
#             plan of an older ABI is refused
#   install   cmake --install into a temporary prefix; the installed tokpipec --exe and the
#             installed tokpipe.pc both build trainers that learn
case=$1 bin=$2 src=$3 build=$4 work=$5/$1 cc=$6
root=$src/../..
fixtures=$root/tests/fixtures
tokpipec=$bin/tokpipec
. "$src/../case.sh"

# A deterministic ASCII text (token ids < 128, the fixtures' vocabulary) as a token file.
make_data() {
  i=0
  while [ $i -lt 200 ]; do
    echo "the quick brown fox $i jumps over the lazy dog; pack my box with five dozen jugs."
    i=$((i + 1))
  done >text.txt
  "$bin/tokpipe-tokens" text.txt -o train.bin 2>/dev/null || { fail "tokpipe-tokens failed"; exit 1; }
}

# learns WHAT TRAINER: 40 steps; every loss finite, the last five lower than the first five.
learns() {
  what=$1 trainer=$2
  expect_exit 0 "$what: training" "$trainer" --data train.bin --steps 40 --lr 0.003 --log log.jsonl || return
  sed -E 's/.*"loss": ([^,}]*).*/\1/' log.jsonl >losses.txt
  awk -v what="$what" '
    $1 != $1 + 0 || $1 == "nan" || $1 == "inf" { print "not finite: " $1; bad = 1 }
    NR <= 5 { first += $1 } { n = NR; last[NR % 5] = $1 }
    END {
      for (i in last) tail += last[i]
      if (n != 40) { print "expected 40 steps, got " n; bad = 1 }
      printf "first five %.4f, last five %.4f\n", first / 5, tail / 5
      if (!(tail < first - 0.25)) { print "the loss did not fall"; bad = 1 }
      exit bad
    }' losses.txt >verdict.txt
  if [ $? -eq 0 ]; then ok "$what learns: $(tail -1 verdict.txt)"; else fail "$what: $(tr '\n' ' ' <verdict.txt)"; fi
}

# A fixture with static shapes and vocabulary 128.
model=$fixtures/gpt_o17_erf_tied_bias_static/model.onnx

case $case in
golden)
  cd "$src" || exit 2 # the plan records the model path as given
  "$tokpipec" tiny_gpt.onnx --emit=c -o "$work/plan.c" || { echo "FAIL golden: tokpipec failed"; exit 1; }
  "$tokpipec" tiny_gpt.onnx --emit=c -o "$work/again.c"
  if [ "${TOKPIPE_UPDATE_GOLDEN:-}" = 1 ]; then
    cp "$work/plan.c" tiny_gpt.plan.c && ok "rewrote tiny_gpt.plan.c"
  elif diff -u tiny_gpt.plan.c "$work/plan.c" >"$work/diff.txt"; then
    ok "the plan of tiny_gpt.onnx is tiny_gpt.plan.c ($(wc -l <tiny_gpt.plan.c) lines)"
  else
    fail "the plan differs from tiny_gpt.plan.c (TOKPIPE_UPDATE_GOLDEN=1 to accept):"
    head -40 "$work/diff.txt"
  fi
  if cmp -s "$work/plan.c" "$work/again.c"; then ok "deterministic"; else fail "two runs differ"; fi
  ;;

werror)
  for dir in "$fixtures"/*/; do
    name=$(basename "$dir")
    [ -f "$dir/model.onnx" ] || continue
    dims=$(cat "$dir/dims" 2>/dev/null)
    # shellcheck disable=SC2086 # dims is a list of flags
    if ! "$tokpipec" "$dir/model.onnx" $dims -o "$name.c" 2>err.txt; then
      fail "$name: tokpipec: $(cat err.txt)"
      continue
    fi
    if "$cc" -std=c11 -Wall -Wextra -Werror -pedantic -I"$root/runtime" -c "$name.c" -o "$name.o" 2>err.txt; then
      ok "$name: $(wc -l <"$name.c") lines compile cleanly"
    else
      fail "$name: $(head -5 err.txt)"
    fi
  done
  ;;

shared)
  deep=$root/tests/stages/deep_gpt.onnx # 4 layers
  # bodies PLAN: the names of its shared bodies, one a line
  bodies() { sed -n 's/^static void \(block_[a-z0-9_]*\)(TpStepIO \*io, const int64_t \*at, const int \*p) {$/\1/p' "$1"; }
  "$tokpipec" "$deep" --batch 4 --seq 8 --stages 4 --slices 2 -o plan.c || { fail "tokpipec --stages 4 failed"; exit 1; }
  "$tokpipec" "$deep" --batch 4 --seq 8 --stages 4 --slices 2 -o again.c
  if cmp -s plan.c again.c; then ok "deterministic"; else fail "two runs differ"; fi
  want="block_forward_l4_c0 block_forward_l4_c4 block_backward_l4_c4 block_backward_l4_c0"
  got=$(bodies plan.c | tr '\n' ' ' | sed 's/ $//')
  if [ "$got" = "$want" ]; then ok "4 stages x 2 slices: bodies $got"; else fail "4 stages x 2 slices: bodies '$got', expected '$want'"; fi
  for unit in stage1_forward_slice0 stage1_forward_slice1 stage2_backward_slice0 stage2_backward_slice1; do
    sed -n "/^static void $unit(TpStepIO \*io) {\$/,/^}/p" plan.c >unit.txt
    calls=$(grep -c '^  block_[a-z0-9_]*(io, ' unit.txt) kernels=$(grep -c 'CHECK(' unit.txt)
    if [ "$calls" = 1 ] && [ "$kernels" = 0 ]; then ok "$unit is one call"
    else fail "$unit: $calls calls of a shared body and $kernels kernel calls, expected one call: $(cat unit.txt)"; fi
  done
  # stages 1 and 2 lay out their arenas alike: one list of offsets
  t1=$(sed -n '/^static void stage1_forward_slice1(/,/^}/s/^  block_forward_l4_c4(io, \(block_forward_l4_c4_at[0-9]*\),.*/\1/p' plan.c)
  t2=$(sed -n '/^static void stage2_forward_slice1(/,/^}/s/^  block_forward_l4_c4(io, \(block_forward_l4_c4_at[0-9]*\),.*/\1/p' plan.c)
  if [ -n "$t1" ] && [ "$t1" = "$t2" ]; then ok "stages 1 and 2 share the arena offsets $t1"
  else fail "stages 1 and 2 call block_forward_l4_c4 with offsets '$t1' and '$t2', expected one list"; fi
  # the first and last stages run their own ops around the shared layer
  for unit in stage0_forward_slice0 stage3_backward_slice1; do
    sed -n "/^static void $unit(TpStepIO \*io) {\$/,/^}/p" plan.c >unit.txt
    calls=$(grep -c '^  block_[a-z0-9_]*(io, ' unit.txt) kernels=$(grep -c 'CHECK(' unit.txt)
    if [ "$calls" = 1 ] && [ "$kernels" -gt 0 ]; then ok "$unit: its own $kernels kernel calls and the layer's body"
    else fail "$unit: $calls calls of a shared body and $kernels kernel calls, expected one and some"; fi
  done
  "$tokpipec" "$deep" --batch 4 --seq 8 --stages 2 -o two.c || { fail "tokpipec --stages 2 failed"; exit 1; }
  got=$(bodies two.c | tr '\n' ' ' | sed 's/ $//')
  [ "$got" = "block_forward_l8 block_backward_l8" ] && ok "2 stages: bodies $got" || fail "2 stages: bodies '$got'"
  sed -n '/^static void stage1_forward(TpStepIO \*io) {$/,/^}/p' two.c >unit.txt
  calls=$(grep -c '^  block_forward_l8(io, ' unit.txt)
  [ "$calls" = 2 ] && ok "2 layers a stage: its unit calls the layer's body twice" || fail "stage1_forward calls block_forward_l8 $calls times, expected 2"
  for plan in plan.c two.c; do
    if "$cc" -std=c11 -Wall -Wextra -Werror -pedantic -I"$root/runtime" -c $plan -o plan.o 2>err.txt; then
      ok "$plan compiles cleanly ($(wc -l <$plan) lines)"
    else
      fail "$plan does not compile: $(head -5 err.txt)"
    fi
  done
  ;;

errors)
  cat >f16param.tir <<'EOF'
tir 1 opset 17 source "f16param.tir"
input %ids : i64[2, 4]
param %scale : f16[4] = dense<[1, 1, 1, 1]>
%x : f16[2, 4] = Cast(%ids)
%y : f16[2, 4] = LayerNorm(%x, %scale) {axis = 1, epsilon = 1e-05} loc("/ln" LayerNormalization)
output %y
EOF
  expect_message 3 "f16 parameter" "codegen: parameter 'scale' is f16" \
    "$bin/tokpipe-opt" f16param.tir --emit=c
  cat >f16op.tir <<'EOF'
tir 1 opset 17 source "f16op.tir"
input %ids : i64[2, 4]
const %scale : f16[4] = dense<[1, 1, 1, 1]>
%x : f16[2, 4] = Cast(%ids)
%y : f16[2, 4] = LayerNorm(%x, %scale) {axis = 1, epsilon = 1e-05} loc("/ln" LayerNormalization)
output %y
EOF
  expect_message 3 "unsupported op" "codegen: op LayerNorm (node '/ln') is not supported: 'x' is f16" \
    "$bin/tokpipe-opt" f16op.tir --emit=c
  cat >stages.tir <<'EOF'
tir 1 opset 17 source "stages.tir"
input %ids : i64[2, 4]
%x : f32[2, 4] = Cast(%ids) loc("/cast" Cast)
%y : f32[2, 4] = Neg(%x) @stage(1) loc("/neg" Neg)
output %y
EOF
  expect_message 3 "value crossing stages" "'x' is computed in stage 0 and read in stage 1" \
    "$bin/tokpipe-opt" stages.tir --emit=c
  mkdir folder
  # a C compiler failing by itself (told by its environment to write a dependency file it
  # cannot create) is an internal error: its own complaints, then tokpipec's line with the command
  expect_exit 3 "compiler failure" env DEPENDENCIES_OUTPUT=/nonexistent/plan.d "$tokpipec" "$model" --exe folder/t &&
    if tail -1 err.txt | grep -F "the C compiler failed" | grep -qF -- "-o folder/t"; then
      ok "compiler failure: $(tail -1 err.txt)"
    else
      fail "compiler failure: no line with the command in: $(cat err.txt)"
    fi
  [ "$(ls)" = "$(printf 'err.txt\nf16op.tir\nf16param.tir\nfolder\nout.txt\nstages.tir')" ] && [ -z "$(ls folder)" ] &&
    ok "no temporary left behind"
  # a path the executable cannot be written to is bad input, found before compiling
  expect_message 1 "--exe into a missing folder" "--exe 'no/such/trainer': folder 'no/such': No such file or directory" \
    "$tokpipec" "$model" --exe no/such/trainer
  expect_message 1 "--exe onto a folder" "--exe 'folder' is a folder" "$tokpipec" "$model" --exe folder
  expect_exit 2 "--exe with --emit=ir" "$tokpipec" "$model" --exe t --emit=ir &&
    ok "--exe with --emit=ir: $(head -1 err.txt)"
  # (another --batch re-batches a static model: tests/rebatch; its sequence stays fixed)
  expect_message 1 "--seq against a static model" "token input 'idx' dim 1 is 16 in the model but --seq is 5" \
    "$tokpipec" "$model" --seq 5 --emit=memory
  expect_exit 2 "--freeze with a bad regex" "$tokpipec" "$model" --freeze "(" &&
    ok "--freeze with a bad regex: $(head -1 err.txt)"
  ;;

memory)
  expect_exit 0 "--emit=memory" "$tokpipec" "$model" --emit=memory || exit 1
  for line in "^stage 0: 90 ops \(44 forward, 46 backward\)" "^  kept +[0-9]+ bytes" "^  transient +[0-9]+ bytes" \
    "^  live peak +[0-9]+ bytes" "^  parameters +120320 bytes" "^  gradients +120320 bytes" \
    "^  optimizer state +240640 bytes" "^  activations +[0-9]+ bytes"; do
    grep -qE -- "$line" out.txt || fail "no '$line' in: $(cat out.txt)"
  done
  [ $status -eq 0 ] && ok "$(tr -s ' ' <out.txt | tr '\n' ';')"
  dims=$(cat "$fixtures/gpt_o14_tanh_untied_nobias_dyn/dims")
  # shellcheck disable=SC2086
  expect_exit 0 "symbolic dims via --batch/--seq" "$tokpipec" "$fixtures/gpt_o14_tanh_untied_nobias_dyn/model.onnx" \
    --batch 3 --seq 11 --emit=memory && "$tokpipec" "$fixtures/gpt_o14_tanh_untied_nobias_dyn/model.onnx" $dims \
    --emit=memory >dims.txt && sed 's/--dim.*//' out.txt | cmp -s - dims.txt &&
    ok "--batch 3 --seq 11 plans like $dims"
  ;;

exe)
  make_data
  expect_exit 0 "tokpipec --exe" "$tokpipec" "$model" --exe trainer -o plan.c -v || exit 1
  grep -qF -- "-I$root/runtime" err.txt || grep -qF -- "runtime" err.txt || fail "not the build tree's headers: $(cat err.txt)"
  ok "compiled: $(cat err.txt)"
  learns "build-tree trainer" ./trainer
  # paths that look like options reach the C compiler as files, not as its flags
  expect_exit 0 "tokpipec --exe -dash" "$tokpipec" "$model" --exe -dash -o -dash.c &&
    [ -x ./-dash ] && [ -s ./-dash.c ] && ok "a trainer named -dash" || fail "-dash: $(cat err.txt)"
  ;;

limits)
  make_data
  # ids < 120 index every table; 'x' (120) is past the embedding's 120 rows, which the
  # kernel found (abort) after the data check against the vocabulary (256) let it through
  cat >small_embed.tir <<'EOF'
tir 1 opset 17 source "small_embed.tir"
input %ids : i64[2, 4]
param %wte : f32[120, 8] = dense<0.01>
param %head : f32[8, 256] = dense<0.02>
%x : f32[2, 4, 8] = Gather(%wte, %ids) {axis = 0} loc("/embed" Gather)
%logits : f32[2, 4, 256] = MatMul(%x, %head) loc("/head" MatMul)
output %logits
EOF
  sed 's/f32\[120, 8\]/f32[300, 8]/; s/8, 256\]/8, 120]/; s/4, 256\]/4, 120]/' small_embed.tir >small_head.tir
  tr -d 'xyz{|}~' <text.txt >below120.txt
  "$bin/tokpipe-tokens" below120.txt -o below120.bin 2>/dev/null
  for m in small_embed small_head; do
    expect_exit 0 "$m: tokpipec --exe" "$tokpipec" $m.tir --exe $m
  done
  expect_message 1 "embedding smaller than the vocabulary" \
    "train.bin: token 120 at position 18 is outside the 120 rows of table 'wte'" ./small_embed --data train.bin --steps 1
  expect_message 1 "loss with fewer classes than the embedding's rows" \
    "train.bin: token 120 at position 18 is outside the 120 classes of the loss on 'logits'" ./small_head --data train.bin --steps 1
  expect_message 1 "--val-data checked too" "train.bin: token 120 at position 18 is outside the 120 rows of table 'wte'" \
    ./small_embed --data below120.bin --val-data train.bin --steps 1
  expect_exit 0 "ids below every table" ./small_embed --data below120.bin --steps 2 && ok "ids below every table: trains"
  # beyond any machine's memory: a microbatch of 1 row x 1000000 tokens (60 TiB of arena)
  dyn=$fixtures/gpt_o14_tanh_untied_nobias_dyn/model.onnx
  expect_message 1 "plan beyond this machine's memory" "more than this machine's memory of" \
    "$tokpipec" "$dyn" --batch 1 --seq 1000000 --exe huge
  grep -qE "rank 0 \(pipeline stage 0\) needs [0-9]{14} bytes at its peak, [0-9]+ more than this machine's memory of [0-9]+: parameters 135808, gradients 135808, optimizer state 271616, activations [0-9]{14} \(1 microbatch arena of [0-9]{14} bytes and a transient region of 0\) \(lower --batch or --seq" err.txt &&
    ok "tokpipec names the rank, the bytes and what takes them" || fail "tokpipec's message: $(cat err.txt)"
  [ ! -e huge ] && ok "no trainer built"
  # 1024 microbatch arenas of 8 PiB: the per-rank sum overflowed int64 (a smaller peak than one arena)
  expect_message 1 "arenas beyond 2^63 bytes" "rank 0 (pipeline stage 0) would need 1024 microbatch arenas of 9028270364295168 bytes and 9007199254740992 transient bytes: more than 2^63 bytes in all" \
    "$tokpipec" "$dyn" --batch 67108864 --microbatches 1024 --seq 65536 --emit=memory
  expect_exit 0 "--max-memory for a bigger machine" "$tokpipec" "$dyn" --batch 1 --seq 1000000 --exe huge --max-memory 100000000000000 &&
    expect_message 1 "trainer beyond this machine's memory" "GiB) for the activations of rank 0 (arena 1 of 1): more than this machine's memory" \
      ./huge --data train.bin --steps 1
  ;;

pkgconfig)
  make_data
  "$tokpipec" "$model" -o plan.c || { fail "tokpipec failed"; exit 1; }
  flags=$(PKG_CONFIG_PATH=$build pkg-config --cflags --libs tokpipe) || { fail "pkg-config tokpipe failed"; exit 1; }
  # shellcheck disable=SC2086
  expect_exit 0 "cc plan.c \$(pkg-config ...)" "$cc" plan.c $flags -o trainer || exit 1
  ok "cc plan.c $flags"
  learns "pkg-config trainer" ./trainer
  # a plan written for an older runtime (its ABI before this one's): refused before it runs
  sed 's/^    \.abi = TP_PLAN_ABI,$/    .abi = TP_PLAN_ABI - 1,/' plan.c >stale.c
  # shellcheck disable=SC2086
  expect_exit 0 "cc stale.c" "$cc" stale.c $flags -o stale || exit 1
  expect_message 3 "a plan of the ABI before" "compile it again with the tokpipec of this runtime" \
    ./stale --data train.bin --steps 1
  ;;

install)
  make_data
  expect_exit 0 "cmake --install" cmake --install "$build" --prefix "$work/prefix" || exit 1
  for f in bin/tokpipec bin/tokpipe-opt bin/tokpipe-run include/tokpipe/base/tensor.h \
    include/tokpipe/runtime/train/plan.h include/tokpipe/runtime/cpu/nn.h lib/libtokpipe_onnx.a \
    lib/pkgconfig/tokpipe.pc; do
    [ -e "prefix/$f" ] || fail "not installed: $f"
  done
  [ ! -e prefix/lib/libtokpipe_compiler.a ] || fail "the compiler library is installed: trainers do not link it"
  expect_exit 0 "installed tokpipec --exe" prefix/bin/tokpipec "$model" --exe trainer1 -o plan.c -v || exit 1
  grep -qF -- "-I$work/prefix/bin/../include/tokpipe" err.txt || fail "not the install tree's headers: $(cat err.txt)"
  learns "installed tokpipec --exe" ./trainer1
  flags=$(PKG_CONFIG_PATH=$work/prefix/lib/pkgconfig pkg-config --cflags --libs tokpipe) ||
    { fail "pkg-config of the installed tokpipe.pc failed"; exit 1; }
  case $flags in *"$work/prefix/"*) ;; *) fail "the installed .pc does not point into the prefix: $flags" ;; esac
  # shellcheck disable=SC2086
  expect_exit 0 "cc plan.c \$(pkg-config ...) (installed)" "$cc" plan.c $flags -o trainer2 || exit 1
  learns "installed pkg-config" ./trainer2
  ;;

*)
  echo "unknown case '$case'"
  exit 2
  ;;
esac
exit $status
