/* What the C kernel tests share: counting failures and reproducible random inputs.
 * Included by one test file each (static definitions). */
#ifndef TOKPIPE_TESTS_CHECK_H
#define TOKPIPE_TESTS_CHECK_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static int failures;

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "FAIL ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  failures++;
}

static uint64_t rng_state = 0x2545F4914F6CDD1Du;

/* Uniform in [-1, 1), the same sequence on every run (unused by tests without random data). */
__attribute__((unused)) static float frand(void) {
  rng_state = rng_state * 6364136223846793005u + 1442695040888963407u;
  return (float)((rng_state >> 40) * (1.0 / (1u << 24))) * 2 - 1;
}

__attribute__((unused)) static float *rand_array(int64_t n, float scale) {
  float *a = malloc((size_t)(n ? n : 1) * sizeof *a);
  for (int64_t i = 0; i < n; i++) a[i] = frand() * scale;
  return a;
}

#endif
