# Sourced by the bench scripts: `openblas_core CMD [ARGS]` (a quick run of a program linked
# with OpenBLAS) names the CPU core for OpenBLAS.
# Debian 12's OpenBLAS 0.3.21 takes CPUs it does not know (new or virtualised Xeons) for a
# Prescott and runs SSE3 kernels, 3-4x slower; then it exports OPENBLAS_CORETYPE (unless
# set) from the CPU's flags, and it prints the core used.
openblas_core() {
  local core
  core=$(OPENBLAS_VERBOSE=2 "$@" 2>&1 | sed -n 's/^Core: //p' || true)
  if [ -z "${OPENBLAS_CORETYPE:-}" ] && [ "$core" = Prescott ]; then
    if grep -qw avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX
    elif grep -qw avx2 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Haswell
    fi
  fi
  echo "OpenBLAS core: ${OPENBLAS_CORETYPE:-$core (detected)}"
}
