#!/usr/bin/env bash
# The GPU backend checked on a real GPU, in one prepared run (device time is scarce): on the
# device machine (one H100 or H200, CUDA 13, PyTorch 2.11, 16 cores, no network), from the folder
# tests/device/bundle.sh built here beforehand and the device tool carried:
#   kernels   every tests/cuda driver's tests, the CUDA kernels on the GPU against the CPU
#             kernels (the drivers built with TOKPIPE_CUDA_TESTS_ON_GPU: managed memory)
#   parity    the GPT fixtures' parity with PyTorch (tests/parity/parity.sh: step-1 loss,
#             every step-1 gradient, 10 AdamW losses) by trainers of tokpipec --target cuda,
#             fp32 with the CPU trainer's tolerances and bf16 with bf16's (below)
#   pipeline  2 stages, 3 slices, 1F1B in one process on one GPU against the unsliced run
#   tensor    a tensor group's all-reduce on the compute stream through NCCL (two ranks
#             under mpirun); skipped, saying why, with fewer than 2 GPUs or no mpirun
#   bench     GPT-2 124M shape in bf16: tokens/s and MFU of the trainer and of PyTorch
#             (eager, torch.compile) on the same GPU, model and batch (bench/gpu_gpt2.py)
# Each check prints one PASS/FAIL line with its figures, each stage its time; the script
# ends with 'N passed, N failed' and exits 1 if any check failed. First the CUDA runtime is
# probed (cudaGetDeviceCount through the bundle's libcudart): CUDA 13 needs a driver of the
# 580 series or later, and with an older one the toolkit's forward-compatibility libcuda
# (/usr/local/cuda/compat) is tried; if neither works, that is one FAIL and the GPU checks
# are skipped, rather than every kernel failing alike.
#
#   bash tests/device/run.sh [--emulated] [--bundle DIR] [--only STAGES] [--skip STAGES]
#                            [--budget SECONDS] [--out DIR]
#   STAGES: a comma list of kernels,parity,pipeline,tensor,bench; --budget (default 450: a device
#   session's 8 minutes less a margin) drops stages, and torch.compile, that would not fit,
#   and is checked again inside the stages' loops (before each kernel test, trainer, run),
#   each command's timeout cut to what is left.
#   --emulated runs the same flow on this machine (bundle.sh --emulated): the cuda-emulated
#   drivers, CPU trainers in fp32 (bf16 and the benchmark need the GPU and are skipped).
#   The logs go to --out (default build/device-run). Under the device tool ($OUT set, of
#   which at most 8 files come back), the transcript goes to $OUT/run.txt and the logs,
#   packed however the run ends (an EXIT trap: the end, an error, a TERM), to
#   $OUT/logs.tar.gz.
#
# On the device machine (bundle made here first with bash tests/device/bundle.sh):
#   run(command="bash tests/device/run.sh", carry=["build-device/carry"], timeout_s=540)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
if [ -n "${OUT:-}" ] && [ -z "${TOKPIPE_DEVICE_RUN_TEED:-}" ]; then # the transcript to $OUT too
  TOKPIPE_DEVICE_RUN_TEED=1 bash tests/device/run.sh "$@" 2>&1 | tee "$OUT/run.txt"
  exit "${PIPESTATUS[0]}"
fi
start=$SECONDS
emulated=0 bundle="" only="kernels,parity,pipeline,tensor,bench" skip="" budget=450 out=""
usage() { echo "usage: run.sh [--emulated] [--bundle DIR] [--only STAGES] [--skip STAGES] [--budget S] [--out DIR]" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
  --emulated) emulated=1 ;;
  --bundle | --only | --skip | --budget | --out)
    [ $# -ge 2 ] || usage
    v=$2
    case $1 in --bundle) bundle=$v ;; --only) only=$v ;; --skip) skip=$v ;; --budget) budget=$v ;; --out) out=$v ;; esac
    shift ;;
  *) usage ;;
  esac
  shift
done
[[ $budget =~ ^[0-9]+$ ]] || usage
pack_logs=""
if [ -z "$out" ] && [ -n "${OUT:-}" ]; then # a fresh folder: a rerun on a warm machine finds the last one's
  out=/tmp/tokpipe-device-run pack_logs=$OUT/logs.tar.gz
  rm -rf "$out"
fi
out=${out:-build/device-run}
mkdir -p "$out" || { echo "run.sh: error: cannot make $out" >&2; exit 1; }
# The logs packed whatever ends the run: the last line, an error exit, the device tool's TERM.
finished=0
pack_on_exit() {
  local rc=$? packed=0
  trap '' PIPE # the transcript's tee may be gone (a TERM to the group): pack all the same
  [ -z "$pack_logs" ] || tar -C "$out" -czf "$pack_logs" . || packed=1
  [ $finished = 1 ] || echo "== run.sh stopped at $((SECONDS - start))s (status $rc): the checks so far are in the logs"
  [ $packed = 0 ] || { echo "run.sh: error: cannot pack the logs into $pack_logs"; exit 1; }
}
trap pack_on_exit EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
# the bundle: the folder bundle.sh wrote, or on the GPU machine the pack that travelled
if [ -z "$bundle" ] && [ $emulated = 1 ]; then bundle=build/bundle
elif [ -z "$bundle" ] && [ -f build-device/bundle/MANIFEST ]; then bundle=build-device/bundle
elif [ -z "$bundle" ]; then
  { bundle=$(mktemp -d /tmp/tokpipe-bundle.XXXXXX) && tar -C "$bundle" -xJf build-device/carry/bundle.tar.xz; } ||
    { echo "run.sh: error: cannot unpack build-device/carry/bundle.tar.xz (carry=[\"build-device/carry\"])" >&2; exit 1; }
fi
out=$(cd "$out" && pwd) bundle=$(cd "$bundle" 2>/dev/null && pwd) ||
  { echo "run.sh: error: no bundle folder (make it with tests/device/bundle.sh$([ $emulated = 1 ] && echo ' --emulated'))" >&2; exit 1; }
mode=$(sed -n 's/^mode //p' "$bundle/MANIFEST" 2>/dev/null)
want=$([ $emulated = 1 ] && echo emulated || echo gpu)
[ "$mode" = "$want" ] || { echo "run.sh: error: $bundle/MANIFEST: a bundle for '$mode' runs, this run needs '$want'" >&2; exit 1; }

passed=0 failed=0 skipped=0
pass() { echo "PASS $*"; passed=$((passed + 1)); }
fail() { echo "FAIL $*"; failed=$((failed + 1)); }
skip_check() { echo "SKIP $*"; skipped=$((skipped + 1)); }
elapsed() { echo $((SECONDS - start)); }
left() { echo $((budget - (SECONDS - start))); }
# capped SECONDS: a command's timeout, SECONDS or what the budget has left less 10 (the
# report's margin), whichever is smaller, at least 1
capped() {
  local t=$1 l=$(($(left) - 10))
  [ "$l" -lt "$t" ] && t=$l
  [ "$t" -lt 1 ] && t=1
  echo "$t"
}
# in_time NEED WHAT: the budget still has NEED seconds for WHAT (one trainer, one run), else
# a SKIP line saying so
in_time() {
  [ "$(left)" -ge "$1" ] && return 0
  skip_check "$2: ${1}s needed, $(left)s of the ${budget}s budget left"
  return 1
}
# the bundle's libraries for its own binaries only (never for python3: PyTorch has its own)
bundled() { LD_LIBRARY_PATH="$bundle/lib${cuda_libs:+:$cuda_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"; }
# STAGE runs if --only names it, --skip does not, and the budget still has SECONDS for it
stage() {
  local name=$1 need=$2
  [[ ",$only," == *",$name,"* ]] || return 1
  [[ ",$skip," == *",$name,"* ]] && { skip_check "$name: --skip"; return 1; }
  [ $cuda_ok = 1 ] || [ "$name" = bench ] || { skip_check "$name: no working CUDA runtime (the cuda check above)"; return 1; }
  [ "$(left)" -ge "$need" ] || { skip_check "$name: ${need}s needed, $(left)s of the ${budget}s budget left"; return 1; }
  stage_start=$SECONDS
  echo "== $name (at $(elapsed)s)"
}
stage_end() { echo "== $1 took $((SECONDS - stage_start))s"; }
# the worst errors tokpipe-compare printed to FILE, on one line
figures() { grep -o 'steps 1\.\.[0-9]*, worst rel_err=[^ ]*\|worst [^ ]* max_rel_err=[^ ]*' "$1" | paste -sd ';' | sed 's/;/; /g'; }

# cuda_probe: the CUDA runtime and driver versions and the device count, on one line, from
# the bundle's libcudart (else the toolkit's); status 1 where no device answers
cuda_probe() {
  bundled python3 - <<'PROBE'
import ctypes, sys
for name in ("libcudart.so.13", "/usr/local/cuda/lib64/libcudart.so.13"):
    try:
        rt = ctypes.CDLL(name)
        break
    except OSError as e:
        err = e
else:
    sys.exit(f"cannot load libcudart.so.13: {err}")
rt.cudaGetErrorString.restype = ctypes.c_char_p
runtime, driver, count = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0)
rt.cudaRuntimeGetVersion(ctypes.byref(runtime))
rt.cudaDriverGetVersion(ctypes.byref(driver))
e = rt.cudaGetDeviceCount(ctypes.byref(count))
v = lambda x: f"{x // 1000}.{x % 1000 // 10}"
print(f"runtime {v(runtime.value)}, driver's CUDA {v(driver.value)}, {count.value} device(s)"
      + (f", cudaGetDeviceCount: {rt.cudaGetErrorString(e).decode()}" if e else ""))
sys.exit(e != 0 or count.value == 0)
PROBE
}

echo "== tests/device/run.sh: $([ $emulated = 1 ] && echo 'emulated, on this CPU' || echo 'on the GPU'), bundle $bundle"
sed 's/^/   /' "$bundle/MANIFEST" | grep -v '^   libs '
cuda_libs="" cuda_ok=1 gpu_name=""
if [ $emulated = 0 ]; then
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>&1 | sed 's/^/   gpu: /'
    gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  else
    echo "   gpu: no nvidia-smi here: the CUDA check below fails on a machine without a GPU (--emulated runs here)"
  fi
  # cuBLASLt (~540 MB) and NCCL (~220 MB) are the GPU machine's, too large to carry: where
  # the loader does not find them, the toolkit's, else PyTorch's wheels' (nvidia/*/lib)
  wheels=$(python3 -c 'import nvidia, os; print(nvidia.__path__[0])' 2>/dev/null)
  for lib in libcublasLt.so.13 libnccl.so.2; do
    grep -q "$lib " <<<"$(ldconfig -p)" && continue
    dir=""
    for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib ${wheels:+"$wheels"/*/lib}; do
      [ -e "$d/$lib" ] && { dir=$d; break; }
    done
    [ -n "$dir" ] || dir=$(dirname "$(find /usr /opt -name "$lib" -print -quit 2>/dev/null)")
    echo "   $lib from ${dir:-nowhere: the binaries that need it will not start}"
    [ -n "$dir" ] && cuda_libs=${cuda_libs:+$cuda_libs:}$dir
  done
  # the CUDA runtime against this driver: CUDA 13 needs the 580 series or later; else the
  # toolkit's forward-compatibility libcuda (data-centre GPUs: the H100, the H200), for the
  # bundle's binaries and PyTorch alike
  driver_version=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
  driver_note=""
  [[ ${driver_version%%.*} =~ ^[0-9]+$ ]] && [ "${driver_version%%.*}" -lt 580 ] &&
    driver_note=" (driver $driver_version: CUDA 13 needs 580 or later)"
  compat=/usr/local/cuda/compat
  if probe=$(cuda_probe 2>&1); then
    pass "cuda: $probe"
  elif [ -e "$compat/libcuda.so.1" ] && probe_compat=$(cuda_libs=$compat${cuda_libs:+:$cuda_libs} cuda_probe 2>&1); then
    cuda_libs=$compat${cuda_libs:+:$cuda_libs}
    export LD_LIBRARY_PATH=$compat${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    pass "cuda: through $compat's libcuda$driver_note: $probe_compat"
  else
    fail "cuda: no working CUDA runtime$driver_note: $probe$([ -e "$compat/libcuda.so.1" ] &&
      echo "; with $compat: $probe_compat" || echo "; no $compat/libcuda.so.1 to try"); the GPU checks are skipped"
    cuda_ok=0
  fi
fi

# every bundled binary must find its libraries here (a missing one fails each check below)
unresolved=$(find "$bundle/bin" "$bundle/trainers" -type f -perm -u+x -print0 | bundled xargs -0 -r ldd 2>/dev/null |
  grep 'not found' | sort -u | tr -s ' \t\n' ' ')
if [ -n "$unresolved" ]; then fail "libraries: not found here: $unresolved"; else pass "libraries: every bundled binary finds its libraries"; fi

# ---- kernels: the drivers' tests, one by one (a crash fails one test, not the stage) ----
if stage kernels 30; then
  for driver in "$bundle"/bin/test_cuda_*; do
    d=$(basename "$driver")
    if ! names=$(bundled "$driver" --list 2>"$out/$d.list.err"); then
      fail "kernels/$d: --list: $(head -c 300 "$out/$d.list.err")"
      continue
    fi
    n_ok=0 n_bad=0 n_late=0
    for t in $names; do
      # a test takes well under a second on a GPU (the first one starts the CUDA context);
      # one that hangs is cut at 120s, or sooner where the budget ends sooner
      [ "$(left)" -ge 15 ] || { n_late=$((n_late + 1)); continue; }
      limit=$(capped 120)
      bundled timeout "$limit" "$driver" "$t" >"$out/kernel-$t.log" 2>&1
      rc=$?
      if [ $rc = 0 ]; then n_ok=$((n_ok + 1))
      elif [ $rc = 124 ] && [ "$limit" -lt 120 ]; then n_late=$((n_late + 1))
      else
        n_bad=$((n_bad + 1))
        fail "kernels/$t: $(grep -m3 -v '^$' "$out/kernel-$t.log" | tr '\n' ' ' | head -c 400)"
      fi
    done
    [ $n_late = 0 ] || skip_check "kernels/$d: $n_late tests not run or cut: 15s needed for each, $(left)s of the ${budget}s budget left"
    if [ $n_bad = 0 ] && [ $n_late = 0 ]; then pass "kernels/$d: $n_ok tests against the CPU kernels"
    else echo "     ($d: $n_ok passed, $n_bad failed, $n_late not run)"; fi
  done
  stage_end kernels
fi

# ---- parity: the GPT fixtures against PyTorch, fp32 and bf16 ----
# fp32: the CPU trainer's tolerances (tests/parity/parity.sh: loss 1e-5 relative, gradients
# 1e-4 of each tensor's largest magnitude, 10 losses 1e-4 relative).
# bf16: operands of the products rounded to bf16 (unit roundoff u = 2^-9 ~ 2e-3), fp32
# accumulation, fp32 master weights and AdamW state. A product of length K whose terms
# carry <= 2u relative error each, with random signs, errs by ~2u ~ 4e-3 of its result; the
# loss (2 layers, logits of a few units, log-softmax cancelling part of it) by ~2e-3
# relative -> 1e-2; a gradient passes two bf16 products per layer back (dX, then dW) ->
# 3e-2 of its largest magnitude; AdamW's normalised steps then carry the step-1 error into
# the 10 losses -> 2e-2. That is 1000x, 300x and 200x the fp32 bounds, for operands
# 2^15 times coarser, so a wrong transpose or a lost term (which moves results by 1e-1 and
# more at bf16, and fails fp32 by 100x) still fails.
declare -A tols=([fp32]="1e-5 1e-4 1e-4" [bf16]="1e-2 3e-2 2e-2")
if stage parity 40; then
  for p in fp32 bf16; do
    if [ ! -d "$bundle/trainers/parity-$p" ]; then
      if [ $emulated = 1 ]; then skip_check "parity $p: the emulated run has CPU trainers in fp32 only"
      else fail "parity $p: no trainers in the bundle (MANIFEST: $(grep -c "^missing parity-$p/" "$bundle/MANIFEST") missing)"; fi
      continue
    fi
    while read -r _ name _; do
      name=${name%:}
      fail "parity $p ${name#parity-"$p"/}: not in the bundle (tokpipec failed: MANIFEST)"
    done < <(grep "^missing parity-$p/" "$bundle/MANIFEST")
    for trainer in "$bundle/trainers/parity-$p"/*; do
      [ -x "$trainer" ] || continue
      fixture=$(basename "$trainer") work=$out/parity-$p-$fixture
      in_time 30 "parity $p $fixture" || continue
      if PARITY_TRAINER=$trainer PARITY_TOLS=${tols[$p]} bundled timeout "$(capped 120)" \
        bash tests/parity/parity.sh - "$bundle/bin/tokpipe-compare" "tests/fixtures/$fixture" "$work" >"$work.log" 2>&1; then
        pass "parity $p $fixture: $(figures "$work.log") (tolerances ${tols[$p]})"
      else
        fail "parity $p $fixture: $(grep -v '^$' "$work.log" | tail -3 | tr '\n' ' ' | head -c 500)"
      fi
    done
  done
  stage_end parity
fi

# ---- pipeline: 2 stages, 3 slices, 1F1B in one process against the unsliced run ----
# Tolerance 1e-4 (losses relative, gradients of each tensor's largest magnitude): the CPU
# test asks 1e-5, but cuBLASLt picks its algorithm (and split-K) by shape, so the slices'
# products sum in another order than the whole sequence's; a lost K/V context row, a wrong
# causal offset or a tied gradient not summed across the stages moves results by 1e-2.
if stage pipeline 20; then
  pipe=$bundle/trainers/pipeline fixture=tests/fixtures/gpt_o14_tanh_tied_bias_dyn_conv1d
  if [ ! -x "$pipe/ref" ] || [ ! -x "$pipe/piped" ]; then
    fail "pipeline: the trainers are not in the bundle ($(grep '^missing pipeline' "$bundle/MANIFEST" | head -c 300))"
  else
    ok=1
    for t in ref piped; do
      in_time 10 "pipeline: the $t trainer" || { ok=0; break; }
      bundled timeout "$(capped 120)" "$pipe/$t" --init "$fixture/model.onnx" --data "$fixture/train/train.bin" --steps 3 \
        --dump-grads "$out/pipeline-$t.grads" --log "$out/pipeline-$t.jsonl" >"$out/pipeline-$t.log" 2>&1 ||
        { fail "pipeline: the $t trainer failed: $(tail -3 "$out/pipeline-$t.log" | tr '\n' ' ')"; ok=0; }
    done
    if [ $ok = 1 ]; then
      grep -m1 -i 'pipeline\|stage' "$out/pipeline-piped.log" | sed 's/^/   /'
      if bundled "$bundle/bin/tokpipe-compare" "$out/pipeline-piped.grads" "$out/pipeline-ref.grads" --tol 1e-4 >"$out/pipeline-cmp.txt" 2>&1 &&
        bundled "$bundle/bin/tokpipe-compare" --losses "$out/pipeline-piped.jsonl" "$out/pipeline-ref.jsonl" --tol 1e-4 >>"$out/pipeline-cmp.txt" 2>&1; then
        pass "pipeline: 2 stages x 3 slices, 1F1B, one process = the unsliced run: $(figures "$out/pipeline-cmp.txt")"
      else
        fail "pipeline: $(tr '\n' ' ' <"$out/pipeline-cmp.txt" | head -c 500)"
      fi
    fi
  fi
  stage_end pipeline
fi

# ---- tensor: a tensor group's all-reduce through NCCL, on the compute stream ----
# tests/cuda/test_cuda_nccl.cpp's tensor mode: two ranks, one GPU each (NCCL takes one
# process per GPU), under mpirun; the emulated run pretends two GPUs. The device machine
# has one H200 and no MPI launcher, so there the check is skipped, saying why; so is a
# --tensor 2 trainer's parity on the GPU, which needs the same (the cuda-emulated tests
# nccl-tensor-* and the emulated --tensor trainer cover both on the CPU).
if stage tensor 15; then
  gpus=2 # the emulated run's TOKPIPE_CUDA_EMULATE_DEVICES below
  [ $emulated = 1 ] || gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  if [ ! -x "$bundle/bin/nccl-test" ]; then fail "tensor: no nccl-test in the bundle ($(grep '^missing nccl-test' "$bundle/MANIFEST"))"
  elif [ "$gpus" -lt 2 ]; then skip_check "tensor: NCCL's tensor-group all-reduce needs 2 GPUs (one process each), this machine has $gpus"
  elif ! command -v mpirun >/dev/null; then skip_check "tensor: no mpirun here to start the 2 ranks"
  elif TOKPIPE_CUDA_EMULATE_DEVICES=2 bundled sh tests/comm/mpirun.sh 120 2 "$bundle/bin/nccl-test" tensor 1 2 >"$out/tensor.log" 2>&1; then
    pass "tensor: all-reduces of 1, 1000 and 2^18 floats over a tensor group of 2 on the stream = the host's sums"
  else
    fail "tensor: $(grep -v '^$' "$out/tensor.log" | tail -3 | tr '\n' ' ' | head -c 500)"
  fi
  stage_end tensor
fi

# ---- bench: GPT-2 124M shape, bf16, the trainer beside PyTorch ----
if [ $emulated = 1 ]; then
  # no GPU: check the benchmark's FLOP count against the model itself, and that the
  # report reads the logs (the trainer's, PyTorch's)
  if stage bench 20; then
    # with onnx made unimportable, as on a GPU machine without it: only export may need it
    if /usr/bin/python3 -c 'import runpy, sys; sys.modules["onnx"] = None; sys.argv[0] = "bench/gpu_gpt2.py"
runpy.run_path(sys.argv[0], run_name="__main__")' check >"$out/bench-check.log" 2>&1; then
      pass "bench: $(tail -1 "$out/bench-check.log") (without onnx)"
    else fail "bench: gpu_gpt2.py check: $(tail -3 "$out/bench-check.log" | tr '\n' ' ')"; fi
    skip_check "bench: the trainer and PyTorch runs need the GPU"
    stage_end bench
  fi
elif stage bench 90; then
  b=$bundle/trainers/bench
  logs=()
  if [ $cuda_ok = 0 ]; then skip_check "bench: the tokpipe trainer: no working CUDA runtime (the cuda check above)"
  elif [ -x "$b/trainer" ]; then
    if bundled timeout "$(capped 180)" "$b/trainer" --data "$b/train.bin" --steps 20 --log "$out/bench-tokpipe.jsonl" >"$out/bench-tokpipe.log" 2>&1; then
      pass "bench: the tokpipe trainer ran 20 bf16 steps (loss $(head -c 300 "$out/bench-tokpipe.jsonl" | grep -o '"loss": [^,]*' | head -1))"
      logs+=("tokpipe-bf16=$out/bench-tokpipe.jsonl")
    else
      fail "bench: the tokpipe trainer failed: $(tail -3 "$out/bench-tokpipe.log" | tr '\n' ' ')"
    fi
  else
    fail "bench: no trainer in the bundle ($(grep '^missing bench' "$bundle/MANIFEST" | head -c 300))"
  fi
  for how in eager compile; do
    need=60
    [ $how = compile ] && need=200 # inductor compiles forward and backward first
    if [ "$(left)" -lt $need ]; then skip_check "bench: pytorch $how: ${need}s needed, $(left)s left"; continue; fi
    flag=()
    [ $how = compile ] && flag=(--compile)
    if PYTHONUNBUFFERED=1 timeout "$(capped $((need + 60)))" python3 bench/gpu_gpt2.py train "$b" "${flag[@]}" --steps 20 \
      --log "$out/bench-pytorch-$how.jsonl" >"$out/bench-pytorch-$how.log" 2>&1; then
      pass "bench: pytorch $how ran 20 bf16 steps"
      logs+=("pytorch-$how=$out/bench-pytorch-$how.jsonl")
    elif [ $how = compile ]; then
      skip_check "bench: torch.compile did not work here: $(tail -2 "$out/bench-pytorch-$how.log" | tr '\n' ' ' | head -c 300)"
    else
      fail "bench: pytorch eager: $(tail -3 "$out/bench-pytorch-$how.log" | tr '\n' ' ' | head -c 400)"
    fi
  done
  [ ${#logs[@]} -gt 0 ] && python3 bench/gpu_gpt2.py report --device "${gpu_name:-unknown}" "${logs[@]}" | tee "$out/bench-report.txt"
  # beside it, the step model's prediction for this GPU (bundle.sh: tokpipe-plan --gpu-step)
  model_hw=h100
  [[ $gpu_name == *H200* ]] && model_hw=h200
  [ -f "$b/gpu-step-$model_hw.txt" ] && tee "$out/bench-model.txt" <"$b/gpu-step-$model_hw.txt"
  stage_end bench
fi

echo "== done in $(elapsed)s (budget ${budget}s); logs in $out${pack_logs:+, packed into $pack_logs}"
echo "device: $passed passed, $failed failed, $skipped skipped"
finished=1
[ $failed = 0 ]
