#!/bin/sh
# run.sh CASE BIN_DIR SRC_DIR WORK_DIR CC: one test of profiling (tokpipec --profile-grid, the
# trainer's --profile). Prints "ok ..." lines and exits 0, or "FAIL ..." and exits 1. Times
# are never judged (the machine is shared); check_profile checks the file's format and that
# it holds every grid point x stage.
case=$1 bin=$2 src=$3 work=$4/$1 cc=$5
fixtures=$src/../fixtures
mpi="sh $src/../comm/mpirun.sh"
. "$src/../case.sh"
export OMP_NUM_THREADS=1

# The static fixture: batch 2, seq 16, 2 layers (tied embedding and head). Its auto grid:
# l in 2, 4, 8, 16 and c in 0, 4, 8, 12 with l + c <= 16.
static=$fixtures/gpt_o17_erf_tied_bias_static/model.onnx
auto16="2:0,2:4,2:8,2:12,4:0,4:4,4:8,4:12,8:0,8:4,8:8,16:0"

# build NAME MODEL OPTIONS..: tokpipec --exe NAME (plan in NAME.c)
build() {
  n=$1 model=$2
  shift 2
  "$bin/tokpipec" "$model" --exe "$n" -o "$n.c" "$@" >"$n.log" 2>&1 || { fail "tokpipec $*: $(cat "$n.log")"; return 1; }
}

# check WHAT FILE CHECK_PROFILE_ARGS..
check() {
  what=$1
  shift
  if "$bin/check_profile" "$@" >check.txt 2>&1; then ok "$what: $(cat check.txt)"; else fail "$what: $(cat check.txt)"; fi
}

case $case in
one-stage) # the whole model on one stage, in one process; its file name is not UTF-8 (Latin-1
  # e-acute), which the profile still records in a file the planner's strict reader takes
  latin1=$(printf 'mod\351le.onnx')
  ln -sf "$static" "$latin1"
  build t1 "$latin1" --profile-grid auto || exit 1
  grep -q "Profiling probes (--profile-grid), (l, c):" t1.c && grep -q "(2, 0), (2, 4)" t1.c &&
    ok "the program's header lists the grid" || fail "header: $(head -8 t1.c)"
  ./t1 --profile p.json >run.txt 2>&1 || fail "--profile: $(cat run.txt)"
  check "1 stage" p.json 1 2 16 1 "$auto16"
  grep -Eq "wrote p.json: 12 samples in [0-9.]+ s; ([5-9]|[1-9][0-9]+) timed passes over the grid, [0-9.e-]+ s each \(median\), drift [0-9]+%" run.txt && ok "$(tail -1 run.txt)" || fail "summary: $(cat run.txt)"
  # the probes ending the sequence compute the plan's loss
  flags=$(PKG_CONFIG_PATH=$bin/.. pkg-config --cflags --libs tokpipe) || { fail "pkg-config tokpipe"; exit 1; }
  # shellcheck disable=SC2086
  "$cc" -O1 -std=c11 -Wall -Wextra -Werror -pedantic -DPLAN_C="\"$work/t1.c\"" "$src/probe_loss.c" $flags -o probe_loss 2>cc.txt || fail "cc probe_loss.c: $(cat cc.txt)"
  ./probe_loss >loss.txt 2>&1 && ok "probe losses: $(tr '\n' ';' <loss.txt)" || fail "probe losses: $(cat loss.txt)"
  ;;

two-stage) # 2 stages under mpirun -np 2 (both ranks at once), and in one process
  build t2 "$static" --stages 2 --profile-grid auto || exit 1
  $mpi 300 2 ./t2 --profile p2.json --init "$static" >run.txt 2>&1 || fail "mpirun --profile: $(cat run.txt)"
  check "2 stages, 2 ranks" p2.json 2 2 16 2 "$auto16"
  ./t2 --profile p1.json --seed 7 >run1.txt 2>&1 || fail "--profile in one process: $(cat run1.txt)"
  check "2 stages, one process" p1.json 2 2 16 1 "$auto16"
  ;;

pipeline-grid) # a given grid on a sliced plan of 2 stages x 2 microbatches of 2 rows
  model=$fixtures/gpt_o14_tanh_tied_bias_dyn_conv1d/model.onnx
  build t3 "$model" --batch 4 --seq 8 --microbatches 2 --stages 2 --slices 3,5 --schedule 1f1b \
    --profile-grid 4,1,2:0,4,2 || exit 1
  $mpi 300 2 ./t3 --profile p3.json >run.txt 2>&1 || fail "mpirun --profile: $(cat run.txt)"
  check "given grid, microbatch rows" p3.json 2 2 8 2 "1:0,1:2,1:4,2:0,2:2,2:4,4:0,4:2,4:4"
  # the probes change nothing in the plan's own step: same training as without them
  build t4 "$model" --batch 4 --seq 8 --microbatches 2 --stages 2 --slices 3,5 --schedule 1f1b || exit 1
  i=0
  while [ $i -lt 40 ]; do echo "pack my box with five dozen liquor jugs $i."; i=$((i + 1)); done >text.txt
  "$bin/tokpipe-tokens" text.txt -o train.bin 2>/dev/null || fail "tokpipe-tokens"
  for n in t3 t4; do
    $mpi 300 2 ./$n --init "$model" --data train.bin --steps 2 --dump-grads $n.grads >$n.out 2>&1 || fail "$n trains: $(cat $n.out)"
  done
  cmp -s t3.grads t4.grads && ok "the same gradients with and without probes" || fail "gradients differ with probes"
  ;;

errors) # one clear error each
  build plain "$static" || exit 1
  ./plain --profile p.json >out.txt 2>&1
  rc=$?
  [ $rc -eq 2 ] && [ "$(wc -l <out.txt)" -eq 1 ] &&
    grep -q "plain: error: this trainer has no profiling units: compile it with tokpipec --profile-grid auto" out.txt &&
    ok "no probes: exit $rc: $(cat out.txt)" || fail "no probes: exit $rc: $(cat out.txt)"
  build t1 "$static" --profile-grid 4,8:0,4,8 || exit 1
  ./t1 --profile p.json --data x.bin >out.txt 2>&1
  rc=$?
  [ $rc -eq 2 ] && grep -q "error: --profile measures the stages and does not train: it cannot go with --data" out.txt &&
    ok "--profile --data: exit $rc: $(head -1 out.txt)" || fail "--profile --data: exit $rc: $(cat out.txt)"
  ./t1 --profile /nonexistent/dir/p.json >out.txt 2>&1
  rc=$?
  [ $rc -eq 1 ] && [ "$(wc -l <out.txt)" -eq 1 ] && ok "unwritable: $(cat out.txt)" || fail "unwritable: exit $rc: $(cat out.txt)"
  # expect_grid GRID TEXT [OPTIONS]: tokpipec exits 2 with one error line holding TEXT
  expect_grid() {
    g=$1 text=$2
    shift 2
    "$bin/tokpipec" "$gridmodel" --exe bad --profile-grid "$g" "$@" >out.txt 2>&1
    rc=$?
    if [ $rc -eq 2 ] && grep -q "tokpipec: error: .*$text" out.txt && [ "$(grep -c error out.txt)" -eq 1 ] && [ ! -e bad ]; then
      ok "--profile-grid '$g' $*: $(head -1 out.txt)"
    else
      fail "--profile-grid '$g' $*: exit $rc: $(cat out.txt)"
    fi
  }
  gridmodel=$static
  expect_grid "9,10:8,9" "no point has l + c <= 16"
  expect_grid "0,4:0,4" "length 0 is not in \[1, 16\]"
  expect_grid "4,8:0,16" "context 16 is not in \[0, 15\]"
  expect_grid "garbage" "expects auto or L1,L2,..:C1,C2,.."
  expect_grid "4,8" "expects auto or L1,L2,..:C1,C2,.."
  expect_grid "4,x:0,4" "expects auto or L1,L2,..:C1,C2,.."
  expect_grid "4,8:0" "the fit needs 1 with c = 0 and 4 with c > 0"
  expect_grid "4,8:4,8" "the fit needs 1 with c = 0"
  # auto on a sequence of 2: (1, 0), (1, 1), (2, 0) are too few for the fit
  gridmodel=$fixtures/gpt_o14_tanh_tied_bias_dyn_conv1d/model.onnx
  expect_grid auto "give 2 with c = 0 and 1 with c > 0" --batch 2 --seq 2
  "$bin/tokpipec" "$static" --emit=ir --profile-grid auto >out.txt 2>&1
  rc=$?
  [ $rc -eq 2 ] && grep -q "error: --profile-grid builds profiling units into the C program: use it with --exe or --emit=c" out.txt &&
    ok "--emit=ir: $(head -1 out.txt)" || fail "--emit=ir: exit $rc: $(cat out.txt)"
  ;;

*)
  echo "unknown case $case"
  exit 2
  ;;
esac
exit $status
