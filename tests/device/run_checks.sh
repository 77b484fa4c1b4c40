#!/usr/bin/env bash
# run_checks.sh CASE BUNDLE WORK: run.sh's time and log handling, without a GPU, on the
# emulated bundle (bundle.sh --emulated) BUNDLE:
#   budget     a budget that ends inside the kernels stage: the loop stops there (a SKIP
#              line counting the tests not run), no test fails, the run passes. 36s: the
#              stage starts with >= 30s left, and each test needs 15s left, so ~21s of
#              tests run; the emulated kernel tests take ~27s on one core of this machine,
#              and more under load (should they ever run within 21s, lower it)
#   exit-pack  under the device tool's convention ($OUT set, no --out) a run that stops
#              on an error (a bundle for emulated runs given to a GPU run): the logs are
#              packed into $OUT/logs.tar.gz all the same, and the transcript says it stopped
#   term-pack  a run TERMinated mid-stage as the device tool's timeout would: the logs
#              (the kernel tests' so far) packed into $OUT/logs.tar.gz
#   no-driver  a GPU run (an empty bundle for gpu runs) on this machine, which has no CUDA
#              driver: the CUDA probe fails once, saying why (no compat libcuda helps), and
#              the GPU stages are skipped instead of failing check by check (exit 77, a
#              ctest skip, where a GPU answers)
set -uo pipefail
case=$1 bundle=$2 work=$3/$1
src=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work" || exit 1
fail() { echo "FAIL $case: $*"; exit 1; }

case $case in
budget)
  bash "$src/tests/device/run.sh" --emulated --bundle "$bundle" --only kernels --budget 36 --out "$work/out" >"$work/run.txt" 2>&1
  rc=$?
  cat "$work/run.txt"
  [ $rc = 0 ] || fail "run.sh exited $rc (a budget that runs out skips, it does not fail)"
  grep -Eq '^SKIP kernels/test_cuda_[a-z_]+: [0-9]+ tests not run or cut: 15s needed for each' "$work/run.txt" ||
    fail "no SKIP line for the kernel tests the budget left out"
  ls "$work/out"/kernel-*.log >/dev/null 2>&1 || fail "no kernel test ran before the budget ran out"
  ;;
exit-pack)
  OUT=$work bash "$src/tests/device/run.sh" --bundle "$bundle" >/dev/null 2>&1
  rc=$?
  [ $rc = 1 ] || fail "run.sh exited $rc, expected 1 (a bundle for emulated runs on a GPU run)"
  grep -q "a bundle for 'emulated' runs" "$work/run.txt" || fail "run.txt does not say why: $(cat "$work/run.txt")"
  grep -q '^== run.sh stopped at [0-9]*s (status 1)' "$work/run.txt" || fail "run.txt does not say it stopped"
  tar -tzf "$work/logs.tar.gz" >/dev/null || fail "no packed logs in $work/logs.tar.gz"
  ;;
term-pack)
  OUT=$work timeout -s TERM 4 bash "$src/tests/device/run.sh" --emulated --bundle "$bundle" --only kernels >/dev/null 2>&1
  rc=$?
  [ $rc = 124 ] || fail "run.sh ended (status $rc) before the TERM at 4s"
  # the running test ends before the trap runs (it has a process group of its own); the
  # listing goes to a file (grep -q leaving a pipe early fails it under pipefail)
  for _ in $(seq 60); do
    tar -tzf "$work/logs.tar.gz" >"$work/packed.txt" 2>/dev/null && grep -q 'kernel-.*\.log' "$work/packed.txt" && break
    sleep 1
  done
  grep -q 'kernel-.*\.log' "$work/packed.txt" || fail "no kernel test logs packed into $work/logs.tar.gz after the TERM"
  ;;
no-driver)
  if nvidia-smi -L >/dev/null 2>&1; then echo "a GPU answers here: no-driver is for machines without one"; exit 77; fi
  mkdir -p "$work/bundle/bin" "$work/bundle/trainers" && echo "mode gpu" >"$work/bundle/MANIFEST" || exit 1
  bash "$src/tests/device/run.sh" --bundle "$work/bundle" --only kernels,parity,pipeline,tensor --out "$work/out" \
    >"$work/run.txt" 2>&1
  rc=$?
  cat "$work/run.txt"
  [ $rc = 1 ] || fail "run.sh exited $rc, expected 1 (the CUDA check fails)"
  grep -q '^FAIL cuda: no working CUDA runtime.*the GPU checks are skipped$' "$work/run.txt" ||
    fail "no FAIL line for the CUDA runtime"
  [ "$(grep -c '^FAIL' "$work/run.txt")" = 1 ] || fail "more than the one FAIL line of the CUDA check"
  for stage in kernels parity pipeline tensor; do
    grep -q "^SKIP $stage: no working CUDA runtime" "$work/run.txt" || fail "the $stage stage is not skipped"
  done
  ;;
*) echo "usage: run_checks.sh budget|exit-pack|term-pack|no-driver BUNDLE WORK" >&2; exit 2 ;;
esac
echo "ok $case"
