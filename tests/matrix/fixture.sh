# Sourced by tests/matrix/matrix.sh and tests/tensor/tensor.sh after they set compare
# (tokpipe-compare), work, ref (a fixture's train/ folder) and fail: checks tokpipe-compare
# is built, makes a fresh work folder and reads the fixture's train/args: compile_flags
# (tokpipec's) and train_flags (the trainer's), its batch B and sequence T, and `uneven`,
# three uneven slices of T (as tests/slicing: 7,5,4 for T = 16).
[ -x "$compare" ] || { fail "tokpipe-compare is not built ($compare)"; exit 1; }
{ rm -rf "$work" && mkdir -p "$work"; } || { fail "cannot make $work"; exit 1; }
read -r -a compile_flags <<<"$(sed -n 's/^tokpipec //p' "$ref/args")"
read -r -a train_flags <<<"$(sed -n 's/^trainer //p' "$ref/args")"
B=$(sed -n 's/^tokpipec .*--batch \([0-9]*\).*/\1/p' "$ref/args")
T=$(sed -n 's/^tokpipec .*--seq \([0-9]*\).*/\1/p' "$ref/args")
[ -n "$B" ] && [ -n "$T" ] && [ "$T" -ge 3 ] || { fail "no --batch B and --seq T >= 3 in $ref/args"; exit 1; }
a=$((T * 45 / 100)) r=$((T - T * 45 / 100))
b=$((r * 56 / 100))
uneven="$a,$b,$((r - b))"
