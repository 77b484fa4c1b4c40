#!/bin/sh
# peak_agrees.sh BIN_DIR MODEL.onnx WORK WANT [tokpipe-plan options]: tokpipe-plan's joint
# plan for MODEL, its tokpipec command (which holds the text WANT, e.g. "--zero 1"; "" for
# any) run as it is printed (-o plan.c in WORK) compiles, and the planner's largest
# per-rank peak is within 10% of tokpipec's --emit=memory for the same options (both
# count through codegen/rank_memory.h).
bin=$1 model=$2 work=$3 want=$4
shift 4
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 2
"$bin/tokpipe-plan" "$model" --json "$@" >plan.json 2>&1 || { echo "FAIL: tokpipe-plan: $(cat plan.json)"; exit 1; }
command=$(sed -n 's/.*"tokpipec": "\([^"]*\)".*/\1/p' plan.json)
planned=$(sed -n 's/.*"memory": {[^}]*"peak": \([0-9]*\)}.*/\1/p' plan.json)
[ -n "$command" ] && [ -n "$planned" ] || { echo "FAIL: no command line or peak in: $(cat plan.json)"; exit 1; }
echo "$command"
case $command in *"$want"*) ;; *) echo "FAIL: the command lacks '$want'"; exit 1 ;; esac
eval "PATH=\"$bin:\$PATH\" $command" >tokpipec.txt 2>&1 || { echo "FAIL: it does not compile: $(cat tokpipec.txt)"; exit 1; }
[ -s plan.c ] || { echo "FAIL: no plan.c"; exit 1; }
memory=$(echo "$command" | sed 's/ -o plan\.c$/ --emit=memory/')
eval "PATH=\"$bin:\$PATH\" $memory" >memory.txt 2>&1 || { echo "FAIL: --emit=memory: $(cat memory.txt)"; exit 1; }
awk -v planned="$planned" '$1 == "peak" { if ($2 > max) max = $2 } END {
  r = max / planned
  printf "tokpipec %d bytes, tokpipe-plan %d: ratio %.4f\n", max, planned, r
  exit !(r >= 0.9 && r <= 1.1) }' memory.txt || { echo "FAIL: the peaks differ by more than 10%"; exit 1; }
