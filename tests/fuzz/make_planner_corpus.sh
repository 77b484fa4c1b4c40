#!/bin/sh
# Writes the planner JSON fuzzer's seed corpus (committed): each file is the reader's
# selector byte (h hardware, p profile, t cost table) followed by a committed document.
# Regenerate from the repository root: sh tests/fuzz/make_planner_corpus.sh
set -e
out=tests/fuzz/corpus_planner
rm -rf "$out"
mkdir -p "$out"
for f in tools/profiles/*.json; do { printf h; cat "$f"; } > "$out/h_$(basename "$f")"; done
for f in tests/planner/profiles/*.json; do { printf p; cat "$f"; } > "$out/p_$(basename "$f")"; done
for f in tests/planner/cost_table_small.json; do { printf t; cat "$f"; } > "$out/t_$(basename "$f")"; done
