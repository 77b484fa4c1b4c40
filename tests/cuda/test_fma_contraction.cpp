// The emulated build's floating-point contract (tests/cuda/CMakeLists.txt's
// emulated_fp_options, with which this file is compiled as the emulated kernels are):
//   - a product and the sum that reads it are fused into one FMA, as nvcc fuses them
//     (when TOKPIPE_EMULATED_FMA: the CPU has FMA), so a kernel that must give the CPU's
//     bits and relies on separate roundings fails its emulated test as it would on a GPU;
//     (not checked in a Debug build, TOKPIPE_EMULATED_FMA_UNCHECKED: at -O0 GCC fuses nothing);
//   - kernels/element.h's TP_FMUL_RN and TP_FADD_RN round each operation all the same.
// a = 1 + 2^-12: a * a = 1 + 2^-11 + 2^-24 rounds (a tie, to even) to 1 + 2^-11, so
// a * a - (1 + 2^-11) is 0 rounded twice and 2^-24 fused.
#include <math.h>
#include <stdio.h>

#include "kernels/element.h"

static volatile float in_a = 1.0f + 0x1p-12f, in_c = -(1.0f + 0x1p-11f); // not constant-folded

// apart (noinline): inlined into one function, the two products would be one, which a
// fused sum could no longer replace
__attribute__((noinline)) static float plain(float a, float c) { return a * a + c; }
__attribute__((noinline)) static float rounded(float a, float c) { return TP_FADD_RN(TP_FMUL_RN(a, a), c); }

int main() {
  const float a = in_a, c = in_c, fused = 0x1p-24f, unfused = 0.0f;
  int failures = 0;
#ifdef TOKPIPE_EMULATED_FMA
  const float want_plain = fused;
#else
  const float want_plain = unfused;
#endif
#ifdef TOKPIPE_EMULATED_FMA_UNCHECKED
  const bool check_plain = false;
#else
  const bool check_plain = true;
#endif
  if (check_plain && plain(a, c) != want_plain) {
    fprintf(stderr, "FAIL a * a + c is %a, expected %a (%s)\n", plain(a, c), want_plain,
            want_plain == fused ? "fused, as nvcc would" : "unfused: the CPU has no FMA");
    failures++;
  }
  if (rounded(a, c) != unfused) {
    fprintf(stderr, "FAIL TP_FADD_RN(TP_FMUL_RN(a, a), c) is %a, expected %a (each rounded)\n", rounded(a, c),
            unfused);
    failures++;
  }
  if (fmaf(a, a, c) != fused) { // the premise of the check above
    fprintf(stderr, "FAIL fmaf(a, a, c) is %a, expected %a\n", fmaf(a, a, c), fused);
    failures++;
  }
  printf("%s: a * a + c = %a (%s), each rounded = %a\n", failures ? "FAIL" : "ok", plain(a, c),
         plain(a, c) == fused ? "fused" : "unfused", rounded(a, c));
  return failures != 0;
}
