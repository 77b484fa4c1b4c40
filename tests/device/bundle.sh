#!/usr/bin/env bash
# Makes the folder that tests/device/run.sh runs on the GPU machine, on a machine without a
# GPU: the GPU machine has the CUDA toolkit, its driver and PyTorch, but not Debian's
# protobuf-c, OpenBLAS, gfortran or OpenMPI, and nothing can be installed there. So
# everything is built here and carried (the device tool's `carry`, 64 MiB with the working
# tree, which is ~11 MB):
#   bin/        tokpipe-compare and the tests/cuda drivers (built against tokpipe_cuda with
#               TOKPIPE_CUDA_TESTS_ON_GPU: their buffers in managed memory); nccl-test, the
#               NCCL transport's test (tests/cuda/test_cuda_nccl.cpp, run under mpirun)
#   trainers/   trainers compiled here with tokpipec --target cuda, stripped:
#               parity-fp32/FIXTURE, parity-bf16/FIXTURE (every GPT fixture with train/),
#               pipeline/ref and pipeline/piped (2 stages, 3 slices, 1F1B, one process),
#               bench/trainer (GPT-2 124M shape, bf16, B 16, T 1024), bench/train.bin and
#               bench/gpu-step-{h100,h200}.txt (tokpipe-plan --gpu-step: the predicted step)
#   lib/        the shared libraries those binaries need that the GPU machine lacks (ldd:
#               everything but glibc's, the C++ runtime's, and the CUDA driver's,
#               cuBLAS's and NCCL's, which the GPU machine has and which are too large
#               to carry);
#               run.sh puts lib/ on LD_LIBRARY_PATH for the bundle's binaries alone
#   MANIFEST    what was built, from which commit, and what could not be
#
#   bash tests/device/bundle.sh [--emulated] [--build DIR] [--out DIR]
#     default: configures and builds DIR (build-device: Release, TOKPIPE_CUDA=ON,
#     TOKPIPE_CUDA_TESTS_ON_GPU=ON), writes the folder DIR/bundle and packs it into
#     DIR/carry/bundle.tar.xz, what travels (OpenBLAS alone is 36 MB; packed, the whole
#     bundle is a few MB)
#     --emulated: the folder alone, for run.sh --emulated on this machine, from the tree DIR
#     (default build) as built: the cuda-emulated drivers, CPU trainers (fp32), no bench
#
# A trainer that tokpipec cannot build is listed in MANIFEST as missing (and run.sh fails
# that check); the sizes are printed, and a pack over 52 MiB (64 less the working tree) is
# an error. Then on the GPU machine: run(command="bash tests/device/run.sh",
# carry=["build-device/carry"]).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
emulated=0 build="" out=""
while [ $# -gt 0 ]; do
  case $1 in
  --emulated) emulated=1 ;;
  --build) build=$2 && shift ;;
  --out) out=$2 && shift ;;
  *) echo "usage: bundle.sh [--emulated] [--build DIR] [--out DIR]" >&2 && exit 2 ;;
  esac
  shift
done
if [ $emulated = 1 ]; then build=${build:-build}; else build=${build:-build-device}; fi
out=${out:-$build/bundle}
die() { echo "bundle: error: $*" >&2; exit 1; }
limit_mib=52

if [ $emulated = 0 ]; then
  echo "== configure and build $build (Release, CUDA, the drivers against tokpipe_cuda)"
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DTOKPIPE_CUDA=ON -DTOKPIPE_CUDA_TESTS_ON_GPU=ON >/dev/null ||
    die "cmake could not configure $build"
fi
# the tests/cuda drivers (tests/cuda/CMakeLists.txt's add_cuda_emulated_driver), built
# against the real kernels as DRIVER_gpu
targets=$(cmake --build "$build" --target help 2>/dev/null)
drivers=()
for c in tests/cuda/test_cuda_*.c; do
  d=$(basename "$c" .c)
  [ $emulated = 1 ] || d=${d}_gpu
  # (the help of Makefiles, then of Ninja)
  if grep -Eq "^(\.\.\. )?$d(:|\$)" <<<"$targets"; then drivers+=("$d"); else echo "bundle: $c has no target $d: not bundled" >&2; fi
done
nccl_test=test_cuda_nccl
[ $emulated = 1 ] || nccl_test=${nccl_test}_gpu
if [ $emulated = 0 ]; then
  cmake --build "$build" -j2 --target tokpipec tokpipe-compare "${drivers[@]}" $nccl_test >"$build/bundle-build.log" 2>&1 ||
    { tail -20 "$build/bundle-build.log" >&2; die "the build failed (log: $build/bundle-build.log)"; }
fi
bin=$build/bin

{ rm -rf "$out" && mkdir -p "$out/bin" "$out/lib" "$out/trainers"; } || die "cannot make $out"
manifest=$out/MANIFEST
{
  echo "mode $([ $emulated = 1 ] && echo emulated || echo gpu)"
  echo "commit $(git rev-parse HEAD)$(git diff --quiet HEAD || echo ' (with uncommitted changes)')"
  echo "made $(date -u +%FT%TZ) on $(uname -n)"
} >"$manifest"
cp "$bin/tokpipe-compare" "$out/bin/" || die "no $bin/tokpipe-compare"
for d in "${drivers[@]}"; do cp "$bin/$d" "$out/bin/${d%_gpu}" || die "no $bin/$d"; done
# not test_cuda_*: run.sh's kernels stage runs those one test per name
cp "$bin/$nccl_test" "$out/bin/nccl-test" 2>/dev/null || echo "missing nccl-test: no $bin/$nccl_test" | tee -a "$manifest" >&2

# The trainers: every one tokpipec builds is listed, every one it cannot is listed missing.
if [ $emulated = 1 ]; then precisions=(fp32) target=(); else precisions=(fp32 bf16) target=(--target cuda); fi
trainer() { # trainer NAME MODEL TOKPIPEC-FLAGS...
  local name=$1 model=$2
  shift 2
  mkdir -p "$(dirname "$out/trainers/$name")"
  if "$bin/tokpipec" "$model" --exe "$out/trainers/$name" "${target[@]}" "$@" >"$build/bundle-tokpipec.log" 2>&1; then
    strip "$out/trainers/$name"
    echo "trainer $name: tokpipec ${target[*]} $*" >>"$manifest"
  else
    echo "missing $name: tokpipec ${target[*]} $* failed: $(grep -m1 error "$build/bundle-tokpipec.log")" | tee -a "$manifest" >&2
  fi
}
echo "== trainers ($([ $emulated = 1 ] && echo CPU, for the emulated run || echo tokpipec --target cuda))"
for dir in tests/fixtures/gpt_*/ tests/fixtures/hf_gpt2/; do
  fixture=$(basename "$dir")
  [ -f "$dir/train/args" ] || continue
  read -r -a flags <<<"$(sed -n 's/^tokpipec //p' "$dir/train/args")"
  for p in "${precisions[@]}"; do
    if [ $emulated = 1 ]; then trainer "parity-$p/$fixture" "$dir/model.onnx" "${flags[@]}"
    else trainer "parity-$p/$fixture" "$dir/model.onnx" "${flags[@]}" --precision "$p"; fi
  done
done
# the pipeline check: tied embedding and head across the 2 stages, 3 uneven slices
pipe_model=tests/fixtures/gpt_o14_tanh_tied_bias_dyn_conv1d/model.onnx pipe_bt=(--batch 4 --seq 32)
pipe_precision=()
[ $emulated = 0 ] && pipe_precision=(--precision fp32)
trainer pipeline/ref "$pipe_model" "${pipe_bt[@]}" "${pipe_precision[@]}"
trainer pipeline/piped "$pipe_model" "${pipe_bt[@]}" "${pipe_precision[@]}" --stages 2 --slices 3 --schedule 1f1b
if [ $emulated = 0 ]; then
  # the benchmark: the graph exported here (Debian's python3-torch), weights left behind
  bench=$build/bench-gpt2
  if [ -f "$bench/model.onnx" ] || /usr/bin/python3 bench/gpu_gpt2.py export "$bench" >"$build/bundle-export.log" 2>&1; then
    read -r B T < <(/usr/bin/python3 -c "import sys; sys.path.insert(0, 'bench'); import gpu_gpt2 as g; print(g.BATCH, g.SEQ)")
    trainer bench/trainer "$bench/model.onnx" --batch "$B" --seq "$T" --precision bf16
    cp "$bench/train.bin" "$out/trainers/bench/train.bin" 2>/dev/null || echo "missing bench/train.bin" >>"$manifest"
    # the step model priced here (tokpipe-plan --gpu-step), for run.sh to print beside the measurement
    for hw in h100 h200; do
      "$bin/tokpipe-plan" "$bench/model.onnx" --batch "$B" --seq "$T" --hardware $hw --gpu-step \
        >"$out/trainers/bench/gpu-step-$hw.txt" 2>&1 || echo "missing bench/gpu-step-$hw.txt: $(tail -1 "$out/trainers/bench/gpu-step-$hw.txt")" >>"$manifest"
    done
  else
    echo "missing bench/trainer: the export failed: $(tail -1 "$build/bundle-export.log")" | tee -a "$manifest" >&2
  fi
fi

# The shared libraries the GPU machine lacks. Left out: glibc's and the dynamic loader,
# the C++ runtime (newer there), the CUDA driver, cuBLAS and NCCL (there, in the toolkit or
# PyTorch's wheels, where run.sh finds them; cuBLASLt is ~540 MB, NCCL ~220 MB). cudart is
# carried: it is small and the one the binaries were built with.
keep_out='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libresolv\.|libstdc\+\+|libgcc_s|libcuda\.|libcublas|libnccl)'
find "$out/bin" "$out/trainers" -type f -perm -u+x -print0 | xargs -0 ldd 2>/dev/null |
  awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u | while read -r name path; do
  echo "$name" | grep -Eq "$keep_out" && continue
  cp -L "$path" "$out/lib/$name" || exit 1
done || die "cannot copy the shared libraries"
# what ldd could not find here would not be found there either
missing=$(find "$out/bin" "$out/trainers" -type f -perm -u+x -print0 | xargs -0 ldd 2>/dev/null | grep 'not found' | sort -u)
[ -z "$missing" ] || die "unresolved libraries: $missing"
echo "libs $(cd "$out/lib" && echo *)" >>"$manifest"

bytes=$(du -sb "$out" | cut -f1)
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "size $bytes bytes" >>"$manifest"
echo "== bundle $out: $(mib "$bytes") ($(find "$out/trainers" -type f -perm -u+x | wc -l) trainers, \
${#drivers[@]} drivers, $(find "$out/lib" -type f | wc -l) libraries)"
du -sh "$out"/bin "$out"/lib "$out"/trainers | sed 's/^/   /'
if [ $emulated = 0 ]; then
  pack=$build/carry/bundle.tar.xz
  { mkdir -p "$build/carry" && tar -C "$out" -cJf "$pack.tmp" . && mv "$pack.tmp" "$pack"; } || die "cannot pack $pack"
  packed=$(stat -c %s "$pack")
  echo "== packed: $pack, $(mib "$packed") (carry=[\"$build/carry\"])"
  [ "$packed" -le $((limit_mib << 20)) ] || die "$pack is over $limit_mib MiB: the device tool carries 64 MiB with the working tree"
fi
n_missing=$(grep -c '^missing' "$manifest")
[ "$n_missing" = 0 ] || echo "bundle: $n_missing trainers are missing (MANIFEST, above): run.sh fails their checks" >&2
exit 0
