#!/usr/bin/env bash
# The whole test suite, as CI runs it: warnings-as-errors build + ctest, the same suite under
# AddressSanitizer + UndefinedBehaviorSanitizer, then the libFuzzer smoke run (clang).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${TOKPIPE_JOBS:-$(nproc)}
ctest_flags=(--output-on-failure -j"$jobs")

bash tools/install-deps.sh

echo "== build (-Werror) and test"
cmake -S . -B build -DTOKPIPE_WERROR=ON
cmake --build build -j"$jobs"
ctest --test-dir build "${ctest_flags[@]}"

echo "== ASan + UBSan build and test"
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=0:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
cmake -S . -B build-asan -DTOKPIPE_WERROR=ON -DTOKPIPE_SANITIZE=ON
cmake --build build-asan -j"$jobs"
ctest --test-dir build-asan "${ctest_flags[@]}"

echo "== fuzz smoke (clang, libFuzzer)"
CC=clang cmake -S . -B build-fuzz -DTOKPIPE_FUZZ=ON -DTOKPIPE_SANITIZE=ON
cmake --build build-fuzz -j"$jobs"
ctest --test-dir build-fuzz "${ctest_flags[@]}" -R fuzz
