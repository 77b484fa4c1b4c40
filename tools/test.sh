#!/usr/bin/env bash
# The whole test suite, as CI runs it: warnings-as-errors build + ctest (again under each
# OpenBLAS core type the CPU runs), the same suite under AddressSanitizer +
# UndefinedBehaviorSanitizer, then the libFuzzer smoke run (clang).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${TOKPIPE_JOBS:-$(nproc)}
ctest_flags=(--output-on-failure -j"$jobs")

bash tools/install-deps.sh

echo "== build (-Werror) and test"
cmake -S . -B build -DTOKPIPE_WERROR=ON
cmake --build build -j"$jobs"
ctest --test-dir build "${ctest_flags[@]}"

# OpenBLAS picks its kernels by CPU, or by OPENBLAS_CORETYPE, and the bits of a product can
# differ between them: the suite runs again under each core type this CPU can run that the
# run above did not use ("" = unset: OpenBLAS's own choice). What is CPU-specific runs
# again: kernels, conformance, the fixtures against PyTorch, training and checkpoints. The
# pipeline-shape families (matrix, tensor, slicing: a plan against the one-process run,
# both on the same kernels; recompute: a plan against itself without recomputation) and the
# emulated CUDA runtime (no OpenBLAS) run once.
rerun_skip='^(matrix|tensor|slicing|recompute|cuda-emulated|codegen-cuda)$'

for core in "" Haswell SkylakeX; do
  [ "$core" = "${OPENBLAS_CORETYPE:-}" ] && continue
  [ "$core" = Haswell ] && ! grep -qw avx2 /proc/cpuinfo && continue
  [ "$core" = SkylakeX ] && ! grep -qw avx512f /proc/cpuinfo && continue
  echo "== test with OPENBLAS_CORETYPE=${core:-(unset)}"
  if [ -n "$core" ]; then
    OPENBLAS_CORETYPE=$core ctest --test-dir build "${ctest_flags[@]}" -LE "$rerun_skip"
  else
    env -u OPENBLAS_CORETYPE ctest --test-dir build "${ctest_flags[@]}" -LE "$rerun_skip"
  fi
done

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
