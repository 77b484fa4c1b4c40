#!/bin/sh
# Formats the tracked C and CUDA sources (.c .h .cu .cuh .cpp) in place with the repository's
# .clang-format. The X-macro tables (*.def) are not C statements and are left alone, as are
# the golden plans (*.plan.c: tokpipec's output, compared byte for byte) and everything
# generated into build folders (not tracked).
#   tools/format.sh           format them
#   tools/format.sh --check   change nothing: print how many lines would change, per file and
#                             in all, and exit 1 if any would
set -eu
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "format.sh: clang-format is not installed" >&2; exit 2; }
list() { git ls-files -z -- '*.c' '*.h' '*.cu' '*.cuh' '*.cpp' ':!*.plan.c'; }
case "${1:-}" in
  "") list | xargs -0 clang-format -i --style=file ;;
  --check)
    total=0
    for f in $(git ls-files -- '*.c' '*.h' '*.cu' '*.cuh' '*.cpp' ':!*.plan.c'); do
      n=$(clang-format --style=file "$f" | diff "$f" - | grep -c '^<' || true)
      [ "$n" -gt 0 ] && echo "$f: $n lines" && total=$((total + n))
    done
    echo "$total lines would change"
    [ "$total" -eq 0 ] ;;
  *) echo "usage: tools/format.sh [--check]" >&2; exit 2 ;;
esac
