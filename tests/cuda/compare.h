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

/* Memory a kernel under test reads or writes, zeroed, freed with test_free(). Host memory in
 * the emulated build. When the drivers run on a real GPU (the CMake option
 * TOKPIPE_CUDA_TESTS_ON_GPU builds them against tokpipe_cuda, for tests/device/run.sh),
 * managed memory, which the host and the device both address, and test_sync() makes the
 * host wait for the kernels before it reads their results (check_close() calls it). Every
 * driver allocates what its kernels touch here (test_rand for random inputs), never with
 * malloc: a kernel on a GPU cannot read plain host memory. */
#ifdef TOKPIPE_CUDA_TESTS_ON_GPU
#include <cuda_runtime_api.h>
/* a failed CUDA call: one line naming it and the runtime's message, exit 1 */
static inline void test_cuda_check(cudaError_t e, const char *call) {
  if (e == cudaSuccess) return;
  fprintf(stderr, "%s: %s\n", call, cudaGetErrorString(e));
  exit(1);
}
static inline void *test_alloc(size_t bytes) {
  void *p = NULL;
  test_cuda_check(cudaMallocManaged(&p, bytes ? bytes : 1, cudaMemAttachGlobal), "cudaMallocManaged");
  memset(p, 0, bytes ? bytes : 1); /* no kernel runs yet: the host may write it */
  return p;
}
static inline void test_sync(void) {
  test_cuda_check(cudaGetLastError(), "kernel launch");
  test_cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}
/* managed memory back to CUDA, anything else (the host's own buffers) to free() */
static inline void test_free(void *p) {
  struct cudaPointerAttributes at;
  test_sync(); /* a kernel may still be using it */
  test_cuda_check(cudaPointerGetAttributes(&at, p), "cudaPointerGetAttributes");
  if (at.type == cudaMemoryTypeManaged) test_cuda_check(cudaFree(p), "cudaFree");
  else free(p);
}
/* Drivers written before test_free and test_rand existed free test_alloc memory with
 * free() and make random kernel inputs with tests/check.h's rand_array (plain host memory,
 * which a kernel on a GPU cannot read): on a GPU both go through the functions above. */
#define free(p) test_free(p)
#define rand_array(n, scale) test_rand(n, scale)
#else
static inline void *test_alloc(size_t bytes) {
  void *p = calloc(1, bytes ? bytes : 1);
  if (!p) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  return p;
}
static inline void test_sync(void) {}
static inline void test_free(void *p) { free(p); }
#endif

/* n floats uniform in [-scale, scale) (tests/check.h's frand), in test_alloc memory */
__attribute__((unused)) static float *test_rand(int64_t n, float scale) {
  float *a = test_alloc((size_t)(n ? n : 1) * sizeof *a);
  for (int64_t i = 0; i < n; i++) a[i] = frand() * scale;
  return a;
}

/* |gpu - cpu| <= atol + rtol * |cpu| per element */
typedef struct {
  double atol, rtol;
} Tolerance;

/* Compares n results; reports the worst element (relative to its tolerance) on failure. */
/* The stream of the entry points of runtime/cuda/ops.h (a driver that calls them includes
 * it first), made on first use. */
#ifdef TOKPIPE_CUDA_OPS_H
static TpStream *the_stream;

static inline TpStream *stream(void) {
  if (!the_stream) the_stream = tp_cuda_stream_new();
  if (!the_stream) {
    fprintf(stderr, "no CUDA stream\n");
    exit(1);
  }
  return the_stream;
}
#endif

static void check_close(const char *what, const float *got, const float *want, int64_t n, Tolerance tol) {
  test_sync();
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

/* Compares n results bit for bit (so +0 against -0 fails, and NaNs must match); reports the
 * first difference. */
__attribute__((unused)) static void check_bits(const char *what, const float *got, const float *want, int64_t n) {
  test_sync();
  for (int64_t i = 0; i < n; i++)
    if (memcmp(&got[i], &want[i], sizeof got[i]) != 0) {
      fail("%s: not the CPU's bits at [%lld] (gpu %.9g, cpu %.9g; abs_err=%.3g)", what, (long long)i, got[i],
           want[i], fabs((double)got[i] - want[i]));
      return;
    }
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
