#!/bin/sh
# mpirun as the tests run it: as root (CI), more ranks than cores, one OpenMP thread per
# rank, and never longer than LIMIT seconds (the test fails instead of hanging).
# Usage: mpirun.sh LIMIT NP PROGRAM [ARGS...]
limit=$1 np=$2
shift 2
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# Under AddressSanitizer: OpenMPI keeps allocations to the end and unloads the components
# that made them, so LeakSanitizer reports them without a way to tell them from ours. The
# same runtime code is leak-checked where it runs in one process (local backend).
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
exec timeout -k 5 "$limit" mpirun --allow-run-as-root --oversubscribe -np "$np" "$@"
