#!/bin/sh
# The one-way layering of tokpipec (README, Layout):
#   check.sh includes SRC WORK
#     base/ includes only base/; runtime/ only base/ and runtime/; ir/ only base/, ir/ and
#     ops/ (the op rules: ir/infer.c calls their shape rules); ops/ only those, runtime/ and
#     bind/ (IR ops to kernel arguments: the binders are op rules), bind/ only those;
#     interp/ base/, ir/, runtime/, bind/ and interp/;
#     protobuf-c (onnx.pb-c.h) only in frontend/ and runtime/onnx/. Every #include "..." or <...> is
#     resolved as the compiler would (the including file's folder, then the include roots:
#     the source root and runtime/), so "../../ir/ir.h" and any other spelling are caught.
#   check.sh trainer SRC BUILD TOKPIPEC WORK
#     a trainer tokpipec --exe generates from a fixture defines none of the symbols of
#     libtokpipe_compiler.a (nm), and neither the link line tokpipec uses nor tokpipe.pc
#     names tokpipe_compiler.
mode=$1 src=$(realpath "$2")
case=layering/$mode
if [ "$mode" = trainer ]; then
  build=$(realpath "$3") tokpipec=$(realpath "$4") work=$5
else
  work=$3
fi
[ -n "$work" ] || { echo "usage: check.sh includes SRC WORK | trainer SRC BUILD TOKPIPEC WORK" >&2; exit 2; }
. "$src/tests/case.sh"

# The layer (first folder under the source root) of an absolute path in the tree, or "".
layer_of() {
  case "$1" in
    "$src"/*) rel=${1#"$src"/}; [ "$rel" = "${rel%%/*}" ] && echo "" || echo "${rel%%/*}" ;;
    *) echo "" ;;
  esac
}

# The file an include names, as found from the including file's folder (quoted only) and
# then the include roots; the spelled path when no file exists (a header not yet written,
# or a generated one: still judged by where it points).
resolve() { # FILE KIND SPELLING
  dir=$(dirname "$1")
  [ "$2" = '"' ] && roots="$dir $src $src/runtime" || roots="$src $src/runtime"
  for root in $roots; do
    if [ -f "$root/$3" ]; then realpath "$root/$3"; return; fi
  done
  [ "$2" = '"' ] && realpath -m "$dir/$3" || echo "$3"
}

# check_layer LAYER ALLOWED FORBIDDEN: every include of a file under LAYER resolves into
# ALLOWED (a list of layers; "*" for any) and into none of FORBIDDEN.
check_layer() {
  layer=$1 allowed=$2 forbidden=$3 n=0
  for f in $(find "$src/$layer" -type f \( -name '*.c' -o -name '*.h' -o -name '*.def' -o -name '*.cu' -o -name '*.cuh' -o -name '*.cpp' \) | sort); do
    sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*\(["<]\)\([^">]*\)[">].*/\1 \2/p' "$f" > includes.txt
    while read -r kind spelled; do
      n=$((n + 1))
      target=$(resolve "$f" "$kind" "$spelled")
      to=$(layer_of "$target")
      [ -z "$to" ] && continue # a system or generated header outside the tree
      bad=false
      for l in $forbidden; do [ "$to" = "$l" ] && bad=true; done
      if [ "$allowed" != "*" ]; then
        bad=true
        for l in $allowed; do [ "$to" = "$l" ] && bad=false; done
      fi
      $bad && fail "${f#"$src"/} includes '$spelled', which is ${target#"$src"/}: $layer/ may not depend on $to/"
    done < includes.txt
  done
  [ "$n" -gt 0 ] || fail "no includes found under $layer/ (is the source root right?)"
  echo "checked $n includes under $layer/"
}

# Which files include protobuf-c's generated ONNX header or protobuf-c itself.
check_protobuf() {
  for dir in base ir passes codegen interp runtime frontend tools; do
    grep -rlE '^[[:space:]]*#[[:space:]]*include[[:space:]]*["<](onnx/onnx\.pb-c\.h|protobuf-c/)' "$src/$dir" |
      while read -r f; do
        case "${f#"$src"/}" in
          frontend/* | runtime/onnx/*) ;;
          *) echo "${f#"$src"/}" ;;
        esac
      done
  done > protobuf.txt
  [ -s protobuf.txt ] && fail "protobuf-c outside frontend/ and runtime/onnx/: $(tr '\n' ' ' < protobuf.txt)"
  grep -rlq 'onnx/onnx\.pb-c\.h' "$src/runtime/onnx" || fail "runtime/onnx/ does not include onnx.pb-c.h (the check looks for the wrong name)"
}

case $mode in
includes)
  check_layer base "base" ""
  check_layer runtime "base runtime" ""
  check_layer ir "base ir ops" ""
  check_layer ops "base ir runtime bind ops" ""
  check_layer bind "base ir runtime bind ops" ""
  check_layer interp "base ir runtime bind interp" ""
  check_protobuf
  [ $status -eq 0 ] && ok "base/, runtime/, ir/, ops/, bind/ and interp/ include only the layers below them"
  ;;
trainer)
  model=$src/tests/fixtures/hf_gpt2/model.onnx
  lib=$build/lib/libtokpipe_compiler.a
  expect_exit 0 "tokpipec --exe" "$tokpipec" "$model" --batch 2 --seq 16 -o plan.c --exe trainer -v || exit 1
  grep -q -- '-ltokpipe_train' err.txt || fail "no link line in tokpipec -v's output: $(cat err.txt)"
  grep -q 'tokpipe_compiler' err.txt && fail "the trainer's link line names tokpipe_compiler: $(cat err.txt)"
  for pc in "$build/tokpipe.pc" "$build/install/tokpipe.pc"; do
    grep -q '^Libs:.*-ltokpipe_train' "$pc" || fail "$pc has no Libs line with -ltokpipe_train"
    grep -q 'tokpipe_compiler' "$pc" && fail "$pc names tokpipe_compiler"
  done
  nm --defined-only -g "$lib" 2>/dev/null | awk 'NF == 3 && $2 ~ /[TDBR]/ { print $3 }' | sort -u > compiler.syms
  for s in tp_module_new tp_parse_module pass_autodiff tp_import_onnx_file; do
    grep -qx "$s" compiler.syms || fail "$lib does not define $s (the symbol list is wrong)"
  done
  nm --defined-only trainer | awk 'NF == 3 { print $3 }' | sort -u > trainer.syms
  for s in tp_onnx_weights_open tp_onnx_tensor_decode; do # the trainer's own ONNX reader
    grep -qx "$s" trainer.syms || fail "the trainer does not define $s (nm read nothing?)"
  done
  # the plan's own symbols are not the compiler's, whatever their names (the plan's data
  # tp_plan and the planner's function tp_plan share one)
  ${CC:-cc} -c -I"$src/runtime" plan.c -o plan.o || fail "plan.c does not compile alone"
  nm --defined-only plan.o | awk 'NF == 3 { print $3 }' | sort -u > plan.syms
  comm -23 trainer.syms plan.syms | comm -12 compiler.syms - > both.syms
  [ -s both.syms ] && fail "the trainer defines $(wc -l < both.syms) symbols of the compiler: $(head -5 both.syms | tr '\n' ' ')"
  [ $status -eq 0 ] && ok "the trainer defines none of the compiler's $(wc -l < compiler.syms) symbols; its link line and tokpipe.pc do not name it"
  ;;
*)
  echo "usage: check.sh includes SRC WORK | trainer SRC BUILD TOKPIPEC WORK" >&2
  exit 2
  ;;
esac
exit $status
