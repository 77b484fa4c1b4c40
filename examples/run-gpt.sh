#!/usr/bin/env bash
# The main job on a bundled model: install dependencies, build, import a small GPT exported
# by PyTorch (2 layers, C=32, vocab 128, opset 17, dynamic batch and sequence), check its
# forward pass against PyTorch, compile it into a token-level pipelined C training program
# (2 pipeline stages, each sequence cut into 3 token slices, 2 microbatches, 1F1B order),
# turn a text into byte-level tokens, and train for a few hundred steps as 2 MPI ranks,
# showing the loss fall and writing a Perfetto trace of the pipeline.
#   bash examples/run-gpt.sh [TEXT]     (default: the GPL-3 text every Debian system has;
#                                        the model's vocabulary is 128, so ASCII text)
#   env: TOKPIPE_STEPS (default 300), TOKPIPE_JOBS (build parallelism), TOKPIPE_BUILD
#        (build folder, default build)
set -euo pipefail
cd "$(dirname "$0")/.."
model=tests/fixtures/gpt_o17_erf_untied_bias_dyn_trilu
text=${1:-/usr/share/common-licenses/GPL-3}
steps=${TOKPIPE_STEPS:-300}
build=${TOKPIPE_BUILD:-build}
bin=$build/bin
out=$build/example

bash tools/install-deps.sh
cmake -S . -B "$build"
cmake --build "$build" -j"${TOKPIPE_JOBS:-$(nproc)}"
mkdir -p "$out"

echo "== import $model/model.onnx at batch 8, seq 32 (training IR: $out/gpt.tir)"
"$bin/tokpipec" "$model/model.onnx" --batch 8 --seq 32 --emit=ir -o "$out/gpt.tir"
echo "ops after raising, loss and autodiff:"
grep -oE '= [A-Za-z]+\(' "$out/gpt.tir" | tr -d '=( ' | sort | uniq -c | sort -rn |
  awk '{ printf "%s%s %s", (NR > 1 ? ", " : "  "), $2, $1 } END { print "" }' | fold -s -w 92
echo "== forward pass vs PyTorch (reference interpreter)"
read -r -a dims <"$model/dims"   # the sizes PyTorch's reference logits were made with
"$bin/tokpipe-run" "$model/model.onnx" --test-dir "$model" "${dims[@]}" --atol 1e-4 --rtol 1e-4

pipeline=(--batch 8 --seq 32 --stages 2 --slices 12,11,9 --microbatches 2 --schedule 1f1b)
echo "== compile a pipelined trainer: $out/trainer (generated C: $out/trainer.c)"
echo "   ${pipeline[*]}"
"$bin/tokpipec" "$model/model.onnx" "${pipeline[@]}" -o "$out/trainer.c" --exe "$out/trainer"
"$bin/tokpipec" "$model/model.onnx" "${pipeline[@]}" --emit=memory
echo "rank 1's instruction list starts (tokpipec --emit=schedule):"
"$bin/tokpipec" "$model/model.onnx" "${pipeline[@]}" --emit=schedule | sed -n '/^rank 1:/,$p' | head -8

echo "== tokens: the bytes of $text, the last 10% for validation"
"$bin/tokpipe-tokens" "$text" -o "$out/train.bin" --val-fraction 0.1 --val-out "$out/val.bin"

echo "== train $steps steps on 2 ranks from the model's weights (every 25th step shown; log: $out/train.jsonl)"
mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 \
  "$out/trainer" --init "$model/model.onnx" --data "$out/train.bin" --val-data "$out/val.bin" \
  --val-every 100 --steps "$steps" --lr 1e-3 --log "$out/train.jsonl" \
  --trace "$out/trace.json" --export-onnx "$out/trained.onnx" 2>&1 |
  awk '/^step/ && ($2 + 0) % 25 != 0 && ($2 + 0) != 1 { next } { print }'
echo "== $out/trace.json: every rank's compute and communication (open it in ui.perfetto.dev)"
echo "== $out/trained.onnx: the model with the trained weights, for any ONNX runtime"
