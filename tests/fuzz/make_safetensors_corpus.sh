#!/bin/sh
# Writes fuzz_safetensors' seed corpus (committed) from a build tree's tiny trainer: a real
# checkpoint, weight and gradient dumps of tests/train/tiny.onnx, and a checkpoint whose
# tensors are cut to one (small inputs mutate faster).
#   sh tests/fuzz/make_safetensors_corpus.sh BUILD_DIR
set -e
here=$(cd "$(dirname "$0")" && pwd)
bin=$(cd "$1" && pwd)/bin
out=$here/corpus_safetensors
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
awk 'BEGIN { for (i = 0; i < 40; i++) print "a small text for a tiny checkpoint " i }' >text.txt
"$bin/tokpipe-tokens" text.txt -o train.bin 2>/dev/null
"$bin/tiny_trainer" --data train.bin --steps 2 --save ck --dump-grads grads.safetensors \
  --dump-weights weights.safetensors 2>/dev/null
rm -rf "$out"
mkdir -p "$out"
cp ck/checkpoint.safetensors "$out/checkpoint.safetensors"
cp grads.safetensors weights.safetensors "$out/"
# the checkpoint's header alone, with no tensors: metadata to mutate without the data's weight
python3 - "$out/checkpoint.safetensors" "$out/checkpoint_meta_only.safetensors" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
meta = head["__metadata__"]
meta["tokpipe.crc32c"] = ""
text = json.dumps({"__metadata__": meta}, separators=(",", ":")).encode()
text += b" " * (-len(text) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text)
PY
ls -l "$out"
