#!/bin/sh
# readback.sh TOKPIPEC MODEL "OPTIONS" [--forward-only]: the IR tokpipec prints for MODEL
# with OPTIONS (--forward-only: without the training passes), read back, compiles to the C
# program MODEL compiles to with OPTIONS; the two differ only where they name their input
# (and in the comment listing the slice lengths, which the IR does not print); trained IR
# read back prints the same IR.
set -eu
tokpipec=$1 model=$2 opts=$3 fwd=${4:-}
seq=${SEQ:-8}
run="$(echo "$opts" | grep -o -- '--microbatches [0-9]*' || true) $(echo "$opts" | grep -o -- '--dp [0-9]*' || true)"
run="$run $(echo "$opts" | grep -o -- '--schedule [a-z0-9]*' || true)"
$tokpipec "$model" --batch 4 --seq $seq $opts $fwd --emit=ir -o rb.tir
$tokpipec "$model" --batch 4 --seq $seq $opts -o direct.c
$tokpipec rb.tir $run -o readback.c
strip() { sed -e "s|$1|INPUT|g" -e '/ \* Token slices (/d' "$2"; }
strip "$model" direct.c >a.c
strip rb.tir readback.c >b.c
if ! cmp -s a.c b.c; then
  echo "FAIL: '$opts${fwd:+ $fwd}': the read-back IR compiles to another program:"
  diff a.c b.c | head -20
  exit 1
fi
# trained IR read back prints the same IR again
if [ -z "$fwd" ]; then
  $tokpipec rb.tir --emit=ir -o again.tir
  cmp -s rb.tir again.tir || { echo "FAIL: '$opts': the read-back IR prints otherwise"; diff rb.tir again.tir | head; exit 1; }
fi
echo "ok: '$opts${fwd:+ $fwd}' reads back"
