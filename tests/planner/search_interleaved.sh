#!/bin/sh
# search_interleaved.sh BIN_DIR MODEL.onnx WORK: the joint search on a 4-layer model (2
# ranks, batch 16, the cpu profile) picks the interleaved schedule with 2 chunks per rank,
# and its tokpipec command line, run as printed (-o plan.c in WORK), compiles a plan of 2
# ranks x 2 virtual stages. Skipped (77) while the model or tokpipec's --chunks is missing.
bin=$1 model=$2 work=$3
[ -f "$model" ] || { echo "skip: no $model"; exit 77; }
"$bin/tokpipec" --help | grep -q -- '--chunks' || { echo "skip: this tokpipec has no --chunks"; exit 77; }
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 2
"$bin/tokpipe-plan" "$model" --seq 8 --hardware cpu --pipeline 2 --batch 16 --granularity 1 >plan.txt 2>&1 ||
  { echo "FAIL: tokpipe-plan: $(cat plan.txt)"; exit 1; }
command=$(sed -n 's/^  compile it with: //p' plan.txt)
echo "$command"
case $command in
*" --stages 2 --stage-cuts "*,*,*" "*" --schedule interleaved --chunks 2 "*) ;;
*) echo "FAIL: the joint plan is not interleaved x 2 with 3 cuts: $(cat plan.txt)"; exit 1 ;;
esac
eval "PATH=\"$bin:\$PATH\" $command" >tokpipec.txt 2>&1 || { echo "FAIL: it does not compile: $(cat tokpipec.txt)"; exit 1; }
grep -q '^ *\.chunks = 2,$' plan.c || { echo "FAIL: plan.c has no .chunks = 2"; exit 1; }
echo "ok: compiled ($(wc -l <plan.c) lines of C)"
