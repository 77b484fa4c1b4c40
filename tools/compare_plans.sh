#!/usr/bin/env bash
# compare_plans.sh BASE_TOKPIPEC NEW_TOKPIPEC [WORK_DIR]: writes the plan (C) of every
# fixture and plan shape that the matrix, tensor and CUDA-plan tests compile, with both
# tokpipecs, and compares them: byte for byte, else after renaming the outlined bodies
# (block_forward_l16_c7, ...) by their order of first appearance. It prints a summary line
# and exits 1 on any difference (plans that differ, or a plan one tokpipec writes and the
# other refuses), 2 on bad usage.
#
# The shapes are not listed here: the tests' own scripts run against a stand-in tokpipec
# that records its arguments (and writes a stand-in trainer for --exe, so the scripts go on
# without building or training anything; mpirun is stood in for too):
#   tests/matrix/matrix.sh      every training fixture, mode all; the opset fixtures with the
#                               shape tests/matrix/CMakeLists.txt gives them
#   tests/tensor/tensor.sh      every training fixture, mode full for those of the `full`
#                               list in tests/tensor/CMakeLists.txt, else alone
#   tests/codegen-cuda/run.sh   compile: every fixture's CUDA plans (fp32 and bf16)
#   the `COMMAND tokpipec ${model} ...` CUDA plans of tests/tensor/ and tests/cuda/CMakeLists.txt
# Every recorded invocation that writes a plan (--exe, or -o *.c) is then run again with
# both tokpipecs, -o in WORK_DIR (default: a temporary folder, removed on success).
# TOKPIPE_COMPARE_FIXTURES, a shell pattern, limits the fixtures by name (default: all), for
# a quick look; the whole comparison takes about ten minutes on two cores.
set -uo pipefail
if [ $# -lt 2 ] || [ $# -gt 3 ]; then
  echo "usage: compare_plans.sh BASE_TOKPIPEC NEW_TOKPIPEC [WORK_DIR]" >&2
  exit 2
fi
base=$(realpath "$1") new=$(realpath "$2")
for t in "$base" "$new"; do
  [ -x "$t" ] || { echo "compare_plans: error: $t is not an executable" >&2; exit 2; }
done
root=$(cd "$(dirname "$0")/.." && pwd)
keep=${3:-}
work=${3:-$(mktemp -d)}
if ! { rm -rf "$work/shim" "$work/run" "$work/plans" && mkdir -p "$work/shim" "$work/run" "$work/plans" "$work/pc"; }
then
  echo "compare_plans: error: cannot make $work" >&2
  exit 2
fi
log=$work/invocations
: >"$log"

# ---- the stand-ins ----
cat >"$work/shim/tokpipec" <<EOF
#!/usr/bin/env bash
# records its arguments; with --exe writes a trainer that does nothing, else runs tokpipec
printf '%q ' "\$@" >>"$log"
echo >>"$log"
args=() exe=
while [ \$# -gt 0 ]; do
  case \$1 in
  --exe) exe=\$2 && shift 2 ;;
  *) args+=("\$1") && shift ;;
  esac
done
if [ -n "\$exe" ]; then
  printf '#!/bin/sh\nexit 0\n' >"\$exe" && chmod +x "\$exe"
  exit 0
fi
exec "$base" "\${args[@]}"
EOF
printf '#!/bin/sh\nexit 0\n' >"$work/shim/mpirun"
chmod +x "$work/shim/tokpipec" "$work/shim/mpirun"
# codegen-cuda's compile case reads tokpipe-cuda.pc of a build tree; it compiles nothing here
printf 'Name: tokpipe-cuda\nDescription: stand-in\nVersion: 0\nCflags:\n' >"$work/pc/tokpipe-cuda.pc"
export PATH="$work/shim:$PATH"
pattern=${TOKPIPE_COMPARE_FIXTURES:-*}
# The fixture folders of the files given (FOLDER/model.onnx, FOLDER/train/args) whose
# names the pattern takes.
pick() {
  local file dir
  for file in "$@"; do
    [ -e "$file" ] || continue
    dir=${file%/model.onnx}
    dir=${dir%/train/args}
    # shellcheck disable=SC2053 # the pattern is a glob
    [[ ${dir##*/} = $pattern ]] && echo "$dir"
  done
}

# ---- recording the tests' invocations ----
echo "compare_plans: recording the plans the tests compile ..."
mapfile -t training < <(pick "$root"/tests/fixtures/*/train/args)
mapfile -t opsets < <(pick "$root"/tests/fixtures/opsets/*/train/args)
mapfile -t models < <(pick "$root"/tests/fixtures/*/model.onnx)
opset_shape=$(grep -o '} all "[^"]*")' "$root/tests/matrix/CMakeLists.txt" | sed 's/^} all "\(.*\)")$/\1/')
full=" $(sed -n 's/^set(full \(.*\))$/\1/p' "$root/tests/tensor/CMakeLists.txt") "
for dir in "${training[@]}"; do
  name=$(basename "$dir")
  bash "$root/tests/matrix/matrix.sh" "$work/shim/tokpipec" /bin/true "$dir" "$work/run/matrix-$name" all \
    >/dev/null 2>&1
  mode=alone
  [[ "$full" = *" $name "* ]] && mode=full
  bash "$root/tests/tensor/tensor.sh" "$work/shim/tokpipec" /bin/true "$dir" "$work/run/tensor-$name" $mode \
    >/dev/null 2>&1
done
for dir in "${opsets[@]}"; do
  name=$(basename "$dir")
  bash "$root/tests/matrix/matrix.sh" "$work/shim/tokpipec" /bin/true "$dir" "$work/run/matrix-o-$name" all \
    "$opset_shape" >/dev/null 2>&1
  bash "$root/tests/tensor/tensor.sh" "$work/shim/tokpipec" /bin/true "$dir" "$work/run/tensor-o-$name" alone \
    >/dev/null 2>&1
done
for dir in "${models[@]}"; do
  sh "$root/tests/codegen-cuda/run.sh" compile "$work/shim" "$root/tests/codegen-cuda" "$work/pc" \
    "$work/run/cuda-$(basename "$dir")" /bin/true "$dir" >/dev/null 2>&1
done
# the CUDA plans the CMake files write at build time: COMMAND tokpipec ${model} [${options}] FLAGS -o ${plan}
# shellcheck disable=SC2016,SC2001 # the ${...} are CMake's, matched as text
for cmake in "$root/tests/tensor/CMakeLists.txt" "$root/tests/cuda/CMakeLists.txt"; do
  model='' options=''
  while IFS= read -r line; do
    case $line in
    *'set(model '*)
      model=$(sed 's/.*set(model \(.*\))$/\1/' <<<"$line")
      model=${model//'${PROJECT_SOURCE_DIR}'/$root}
      ;;
    *'set(options '*) options=$(sed 's/.*set(options \(.*\))$/\1/' <<<"$line") ;;
    *'COMMAND tokpipec ${model} '*'-o ${plan}'*)
      flags=$(sed 's/.*COMMAND tokpipec ${model} \(.*\) -o ${plan}.*/\1/' <<<"$line")
      flags=${flags//'${options}'/$options}
      # shellcheck disable=SC2086 # flags is a list of words
      [ -n "$model" ] && [ -n "$(pick "$model")" ] &&
        tokpipec "$model" $flags -o "$work/run/cmake.c" >/dev/null 2>&1
      ;;
    esac
  done <"$cmake"
done

# ---- comparing ----
# The plan invocations, each once: --exe, -o and -v dropped.
mapfile -t lines < <(sort -u "$log")
declare -A seen=()
plans=()
for line in "${lines[@]}"; do
  words=()
  eval "words=($line)"
  args=() plan=no
  for ((i = 0; i < ${#words[@]}; i++)); do
    case ${words[i]} in
    --exe) plan=yes && i=$((i + 1)) ;;
    -o) [[ ${words[i + 1]} = *.c ]] && plan=yes
      i=$((i + 1)) ;;
    -v) ;;
    *) args+=("${words[i]}") ;;
    esac
  done
  [ $plan = yes ] || continue
  key=$(printf '%q ' "${args[@]}")
  [ -n "${seen[$key]:-}" ] && continue
  seen[$key]=1
  plans+=("$key")
done
[ ${#plans[@]} -gt 0 ] || { echo "compare_plans: error: the tests compiled no plan (see $work/run)" >&2; exit 1; }

# The outlined bodies renamed BODY1, BODY2, ... in order of first appearance (their offset
# tables BODYn_atK).
normalise() {
  local name='(?:probe\d+_)?block_(?:forward|backward)_l\d+(?:_c\d+)?(?:_\d+)?'
  perl -pe 's/\b('"$name"')(?=_at\d+\b|\b)/$m{$1} \/\/= "BODY" . ++$n/ge' "$1"
}

echo "compare_plans: comparing ${#plans[@]} plans ..."
n=0 same=0 renamed=0 refused=0 differ=0
for key in "${plans[@]}"; do
  eval "args=($key)"
  n=$((n + 1))
  out=$work/plans/$n
  "$base" "${args[@]}" -o "$out.base.c" 2>"$out.base.err"
  rb=$?
  "$new" "${args[@]}" -o "$out.new.c" 2>"$out.new.err"
  rn=$?
  if [ $rb != $rn ]; then
    echo "DIFF: exit $rb (base) vs $rn (new): tokpipec ${key}" && differ=$((differ + 1))
  elif [ $rb != 0 ]; then
    if cmp -s "$out.base.err" "$out.new.err"; then
      refused=$((refused + 1))
    else
      echo "DIFF: both refuse, saying different things: tokpipec ${key}" && differ=$((differ + 1))
    fi
  elif cmp -s "$out.base.c" "$out.new.c"; then
    same=$((same + 1))
  elif cmp -s <(normalise "$out.base.c") <(normalise "$out.new.c"); then
    renamed=$((renamed + 1))
  else
    echo "DIFF: tokpipec ${key}($out.base.c vs $out.new.c)"
    diff <(normalise "$out.base.c") <(normalise "$out.new.c") | head -n 10
    differ=$((differ + 1))
  fi
done
echo "compare_plans: $((n - refused)) plans compared: $same identical byte for byte, $renamed identical after" \
  "renaming the outlined bodies, $differ different; $refused refused alike by both"
if [ $differ -gt 0 ]; then
  echo "compare_plans: the plans are in $work/plans" >&2
  exit 1
fi
[ -n "$keep" ] || rm -rf "$work"
exit 0
