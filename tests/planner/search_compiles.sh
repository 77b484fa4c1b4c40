#!/bin/sh
# search_compiles.sh BIN_DIR MODEL.onnx WORK: tokpipe-plan's layout search on a fixture
# (4 devices: tensor 2 is open to it), then its tokpipec command line run as it is printed
# (-o plan.c in WORK): the plan the search picks compiles. Skipped (77) while tokpipec
# has no --tensor.
bin=$1 model=$2 work=$3
"$bin/tokpipec" --help | grep -q -- '--tensor' || { echo "skip: this tokpipec has no --tensor"; exit 77; }
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 2
"$bin/tokpipe-plan" "$model" --hardware cpu --gpus 4 --batch 4 --granularity 4 >plan.txt 2>&1 ||
  { echo "FAIL: tokpipe-plan: $(cat plan.txt)"; exit 1; }
command=$(sed -n 's/^  compile it with: //p' plan.txt)
[ -n "$command" ] || { echo "FAIL: no command line in: $(cat plan.txt)"; exit 1; }
echo "$command"
eval "PATH=\"$bin:\$PATH\" $command" >tokpipec.txt 2>&1 || { echo "FAIL: it does not compile: $(cat tokpipec.txt)"; exit 1; }
[ -s plan.c ] || { echo "FAIL: no plan.c"; exit 1; }
tensor=$(echo "$command" | sed -n 's/.* --tensor \([0-9]*\) .*/\1/p')
[ "$tensor" -le 1 ] || grep -q "^ *\.tensor = $tensor,$" plan.c || { echo "FAIL: plan.c is not of --tensor $tensor"; exit 1; }
echo "ok: compiled ($(wc -l <plan.c) lines of C)"
