/* What the cuda-emulated test drivers share: comparing a CUDA entry point's results with
 * the CPU kernel's within a tolerance, and the driver's main (`DRIVER NAME` runs one row of
 * its TESTS table; tests/cuda/CMakeLists.txt makes one ctest per row). Included by one test
 * file each (static definitions). */
#ifndef TOKPIPE_TESTS_CUDA_COMPARE_H
#define TOKPIPE_TESTS_CUDA_COMPARE_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "../check.h"

/* |gpu - cpu| <= atol + rtol * |cpu| per element */
typedef struct {
  double atol, rtol;
} Tolerance;

/* Compares n results; reports the worst element (relative to its tolerance) on failure. */
static void check_close(const char *what, const float *got, const float *want, int64_t n, Tolerance tol) {
  int64_t worst = -1;
  double worst_ratio = 1;
  for (int64_t i = 0; i < n; i++) {
    double err = fabs((double)got[i] - want[i]), allowed = tol.atol + tol.rtol * fabs((double)want[i]);
    bool same = got[i] == want[i] || (isnan(got[i]) && isnan(want[i]));
    if (same) continue;
    double ratio = err <= allowed ? 0 : allowed > 0 ? err / allowed : INFINITY;
    if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = i;
  }
  if (worst >= 0)
    fail("%s: abs_err=%.3g at [%lld] (gpu %.9g, cpu %.9g; atol %g, rtol %g)", what,
         fabs((double)got[worst] - want[worst]), (long long)worst, got[worst], want[worst], tol.atol, tol.rtol);
}

typedef struct {
  const char *name;
  void (*run)(void);
} CudaTest;

/* The driver's main: runs the test named by argv[1] (or lists them with --list). */
static int run_cuda_test(int argc, char **argv, const CudaTest *tests, size_t ntests) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s TEST (or --list)\n", argv[0]);
    return 2;
  }
  for (size_t i = 0; i < ntests; i++) {
    if (!strcmp(argv[1], "--list")) printf("%s\n", tests[i].name);
    else if (!strcmp(argv[1], tests[i].name)) {
      tests[i].run();
      if (failures) fprintf(stderr, "%s: %d failure(s)\n", argv[1], failures);
      else printf("%s: ok\n", argv[1]);
      return failures ? 1 : 0;
    }
  }
  if (!strcmp(argv[1], "--list")) return 0;
  fprintf(stderr, "%s: no test '%s'\n", argv[0], argv[1]);
  return 2;
}

#endif
