# Sourced by the bench scripts that train bench/train_pytorch.py's GPT with generated trainers
# (calibrated_step.sh, tensor_step.sh); run from the source root.
# export_bench_gpt WORK: writes WORK/model.onnx (symbolic batch and sequence: microbatches of
# any rows) and its token file WORK/train.bin.
export_bench_gpt() {
  echo "== export the benchmark GPT (symbolic batch and sequence) and its token file ($1)"
  /usr/bin/python3 - "$1" <<'EOF_PY' >/dev/null
import dataclasses, sys
sys.path.insert(0, "bench")
import train_pytorch as bench
bench.MODEL = dataclasses.replace(bench.MODEL, dynamic=True)
bench.export(sys.argv[1])
EOF_PY
}
# median: of the numbers on stdin, one a line.
median() { sort -g | awk '{ x[NR] = $1 } END { print NR % 2 ? x[(NR + 1) / 2] : (x[NR / 2] + x[NR / 2 + 1]) / 2 }'; }
# median_step_ms LOG.jsonl: the median "ms" of a trainer's --log, step 1 (warm-up) left out.
median_step_ms() {
  jq -s '[.[] | select(.step > 1) | .ms] | sort | if length % 2 == 1 then .[length / 2 | floor]
         else (.[length / 2 - 1] + .[length / 2]) / 2 end' "$1"
}
