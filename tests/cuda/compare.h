/* What the cuda-emulated test drivers share (one of them includes it, after tests/check.h):
 * comparing a kernel's results with the CPU kernel's within a stated tolerance, and running
 * the test of the driver's TESTS table that the command line names (one ctest each). */
#ifndef TOKPIPE_TESTS_CUDA_COMPARE_H
#define TOKPIPE_TESTS_CUDA_COMPARE_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Memory a kernel under test reads or writes, zeroed. Host memory in the emulated build;
 * when the drivers run on a GPU (tests/device/run.sh builds them against the real kernels
 * with TOKPIPE_CUDA_TESTS_ON_GPU) managed memory, which host and device both address, and
 * test_sync() makes the host wait for the kernels before it reads their results. Every
 * driver allocates its kernels' buffers here and calls test_sync() before comparing. */
static inline void *test_alloc(size_t bytes) {
  void *p = calloc(1, bytes ? bytes : 1);
  if (!p) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  return p;
}
static inline void test_sync(void) {}

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

/* `driver TEST` runs that test (exit 0 or 1), `driver --list` lists them; else exit 2. */
static int run_named_test(const char *driver, const CudaTest *tests, size_t ntests, int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s TEST (or --list)\n", driver);
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
  fprintf(stderr, "%s: no test '%s'\n", driver, argv[1]);
  return 2;
}

#endif
