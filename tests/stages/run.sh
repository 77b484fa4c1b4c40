#!/bin/sh
# One pipeline configuration against the one-stage plan of the same model and batch:
#   run.sh NAME BIN SRC BUILD WORK CC MODEL 'REF OPTS' 'TEST OPTS' [break-arenas|break-transient|MODES]
# compiles both plans with tokpipec, links them with exec_plans.c (a one-process executor
# of the plan ABI) and the runtime (the build tree's tokpipe.pc), and runs it: loss and
# every gradient must agree to 1e-5 relative. With break-arenas the test plan's first
# stage gets one microbatch arena fewer than it needs (the kept bytes of a microbatch in
# flight are overwritten), with break-transient every unit puts its transient buffers in
# its microbatch's arena instead of the rank's transient region (over kept bytes), and the
# run must fail instead. MODES: exact (the same bits: a reference of the same configuration
# under another schedule), and defer-weights or eager-weights (a split backward's weight
# parts as late as they may run, or each right after its input part), joined by +.
name=$1 bin=$2 src=$3 build=$4 work=$5/$1 cc=$6 model=$7 ref=$8 test=$9 mode=${10}
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 2
# shellcheck disable=SC2086
"$bin/tokpipec" "$model" $ref -o ref.c || { echo "FAIL $name: tokpipec $ref"; exit 1; }
# shellcheck disable=SC2086
"$bin/tokpipec" "$model" $test -o test.c || { echo "FAIL $name: tokpipec $test"; exit 1; }
if [ "$mode" = break-arenas ]; then
  arenas=$(sed -n 's/^     \.arenas = \([0-9]*\),$/\1/p' test.c | head -1)
  [ "${arenas:-1}" -gt 1 ] || { echo "FAIL $name: stage 0 keeps $arenas arenas; nothing to break"; exit 1; }
  sed -i "0,/^     \.arenas = $arenas,\$/s//     .arenas = $((arenas - 1)),/" test.c
fi
if [ "$mode" = break-transient ]; then
  grep -q '^  char \*transient = io->transient;$' test.c || { echo "FAIL $name: no unit uses a transient region"; exit 1; }
  sed -i 's/^  char \*transient = io->transient;$/  char *transient = io->arena;/' test.c
fi
flags=$(PKG_CONFIG_PATH=$build pkg-config --cflags --libs tokpipe) || { echo "FAIL $name: pkg-config"; exit 1; }
cflags=$(PKG_CONFIG_PATH=$build pkg-config --cflags tokpipe)
# shellcheck disable=SC2086
"$cc" -std=c11 -O1 -Dtp_plan=plan_ref -Dmain=main_ref $cflags -c ref.c -o ref.o &&
  "$cc" -std=c11 -O1 -Dtp_plan=plan_test -Dmain=main_test $cflags -c test.c -o test.o &&
  "$cc" -std=c11 -O1 $cflags "$src/exec_plans.c" ref.o test.o $flags -o exec_plans ||
  { echo "FAIL $name: cannot build the executor"; exit 1; }
# modes exact, defer-weights and eager-weights (joined by +) are exec_plans options
args=
for m in $(echo "$mode" | tr + ' '); do
  case $m in exact | defer-weights | eager-weights) args="$args --$m" ;; esac
done
# shellcheck disable=SC2086
./exec_plans $args >out.txt 2>&1
status=$?
cat out.txt
if [ "$mode" = break-arenas ]; then
  [ $status -ne 0 ] || { echo "FAIL $name: a plan with too few arenas still agrees"; exit 1; }
  echo "ok $name: too few arenas are caught"
  exit 0
fi
if [ "$mode" = break-transient ]; then
  [ $status -ne 0 ] || { echo "FAIL $name: a plan whose units work over kept bytes still agrees"; exit 1; }
  echo "ok $name: transient buffers over kept bytes are caught"
  exit 0
fi
[ $status -eq 0 ] || { echo "FAIL $name: tokpipec $test"; exit 1; }
echo "ok $name: tokpipec $test"
