/* Unit tests of the compute backend table (runtime/compute.h): every entry of the CPU
 * backend and of its strict variant, against plain host loops and the optim.c kernels
 * (bit for bit: the trainer's losses and gradients must not change through the table),
 * with device values seen only through copies; message packing with zero-byte buffers
 * and empty messages; the strict variant crashing on a direct host access.
 *
 * Built again as test_compute_cuda (tests/cuda, TEST_CUDA_BACKEND) for the CUDA backend
 * (runtime/cuda/backend.cu) on the emulated CUDA runtime: the same checks, bit for bit but
 * the sum of squares (the same 64 pieces as the CPU's, summed inside each in another order:
 * within 1e-12), its multi-tensor entries against its per-tensor ones (bit for bit), plus
 * the device's opening (GPU choice, no GPU), its pinned host memory (no pageable copy
 * counted) and a bad index found at a stream synchronization. run_unit's unit reads its parameter directly: emulated device
 * memory is host memory. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/compute.h"
#include "runtime/cpu/optim.h"
#include "../check.h"
#ifdef TEST_CUDA_BACKEND
#include "runtime/cuda/ops.h"
#include "runtime/cuda/stats.h"
#endif

enum { N = 40000 }; /* above the kernels' threshold for OpenMP */

static TpCompute *open_backend(const TpComputeBackend *be) {
  TpCompute *c = calloc(1, sizeof *c);
  c->be = be;
  return c;
}

static void close_backend(TpCompute *c) {
  c->be->close(c);
  free(c);
}

/* The device buffer's n floats, on the host (malloc'ed). */
static float *to_host(TpCompute *c, TpStream *s, const float *dev, int64_t n) {
  float *h = malloc((size_t)(n ? n : 1) * sizeof *h);
  c->be->copy_d2h(c, s, h, dev, (size_t)n * sizeof *h);
  c->be->stream_sync(c, s);
  return h;
}

static float *to_device(TpCompute *c, TpStream *s, const float *host, int64_t n) {
  float *d = c->be->alloc(c, (size_t)n * sizeof *d);
  c->be->copy_h2d(c, s, d, host, (size_t)n * sizeof *d);
  return d;
}

/* Bitwise equality of n floats; the first difference reported. */
static void same_bits(const char *be, const char *what, const float *got, const float *want, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (memcmp(&got[i], &want[i], sizeof *got) != 0) {
      fail("%s: %s: element %lld is %.9g, expected %.9g", be, what, (long long)i, got[i], want[i]);
      return;
    }
}

static void test_memory(TpCompute *c, TpStream *s) {
  const char *name = c->be->name;
  float *d = c->be->alloc(c, N * sizeof(float));
  if (!d || (uintptr_t)d % 64) fail("%s: alloc: %p is not a 64-byte aligned buffer", name, (void *)d);
  float *h = to_host(c, s, d, N), *zero = calloc(N, sizeof *zero);
  same_bits(name, "alloc zeroes", h, zero, N);
  free(h);
  void *empty = c->be->alloc(c, 0);
  if (!empty) fail("%s: alloc(0) is NULL", name);
  c->be->free(c, empty);
  c->be->free(c, NULL);

  /* memset of a middle part: bytes 0x3f make 0.746... floats */
  c->be->memset(c, s, d + 100, 0x3f, 50 * sizeof(float));
  h = to_host(c, s, d, N);
  float want[3];
  memset(want, 0x3f, sizeof want);
  if (h[99] != 0 || memcmp(&h[100], want, sizeof(float)) || memcmp(&h[149], want, sizeof(float)) || h[150] != 0)
    fail("%s: memset: elements 99, 100, 149, 150 are %g %g %g %g", name, h[99], h[100], h[149], h[150]);
  free(h);

  /* host -> device -> device -> host */
  float *x = rand_array(N, 3);
  float *a = to_device(c, s, x, N), *b = c->be->alloc(c, N * sizeof(float));
  c->be->copy_d2d(c, s, b, a, N * sizeof(float));
  h = to_host(c, s, b, N);
  same_bits(name, "copies host to device to device to host", h, x, N);
  c->be->copy_d2h(c, s, h, a, 0); /* zero bytes: nothing */
  free(h), free(x), free(zero);
  c->be->free(c, a), c->be->free(c, b), c->be->free(c, d);
}

/* Streams and events: work queued on one stream, waited for by another and the host. */
static void test_streams(TpCompute *c) {
  const char *name = c->be->name;
  TpStream *s1 = c->be->stream_new(c), *s2 = c->be->stream_new(c);
  TpEvent *e = c->be->event_new(c);
  float one = 1, *d = c->be->alloc(c, sizeof(float)), *copy = c->be->alloc(c, sizeof(float)), got = 0;
  c->be->copy_h2d(c, s1, d, &one, sizeof one);
  c->be->event_record(c, e, s1);
  c->be->stream_wait(c, s2, e); /* s2's copy after s1's */
  c->be->copy_d2d(c, s2, copy, d, sizeof one);
  c->be->event_sync(c, e);
  c->be->copy_d2h(c, s2, &got, copy, sizeof got);
  c->be->stream_sync(c, s2);
  if (got != 1) fail("%s: streams: a copy ordered by an event read %g, expected 1", name, got);
  c->be->free(c, d), c->be->free(c, copy);
  c->be->event_free(c, e);
  c->be->stream_free(c, s1), c->be->stream_free(c, s2);
}

static void unit_doubles_param(TpStepIO *io) {
  float *w = io->param[0];
  for (int i = 0; i < 4; i++) w[i] *= 2;
  io->loss = w[3];
}

static void test_run_unit(TpCompute *c, TpStream *s) {
  const char *name = c->be->name;
  float x[4] = {1, 2, 3, 4}, *w = to_device(c, s, x, 4);
  float *params[1] = {w};
  TpStepIO io = {.param = params, .loss = 0};
  c->be->run_unit(c, s, unit_doubles_param, &io);
  c->be->stream_sync(c, s);
  float *h = to_host(c, s, w, 4);
  if (h[0] != 2 || h[3] != 8 || io.loss != 8)
    fail("%s: run_unit: w = %g..%g, loss %g; expected 2..8, 8", name, h[0], h[3], io.loss);
  if (io.compute != c || io.stream != s) fail("%s: run_unit: io's compute and stream are not the unit's", name);
  free(h);
  c->be->free(c, w);
}

/* exact_sums: the sum of squares is tp_sum_squares_f32's bits (else within 1e-12). */
static void test_math(TpCompute *c, TpStream *s, bool exact_sums) {
  const char *name = c->be->name;
  float *x = rand_array(N, 2), *y = rand_array(N, 2), *want = malloc(N * sizeof *want);
  float *dx = to_device(c, s, x, N), *dy = to_device(c, s, y, N);

  c->be->add_into(c, s, dx, dy, N);
  for (int i = 0; i < N; i++) want[i] = x[i] + y[i];
  float *h = to_host(c, s, dx, N);
  same_bits(name, "add_into", h, want, N);
  free(h);

  c->be->divide(c, s, dx, N, 3.0f);
  for (int i = 0; i < N; i++) want[i] /= 3.0f;
  h = to_host(c, s, dx, N);
  same_bits(name, "divide", h, want, N);
  free(h);

  c->be->clip(c, s, dx, N, 0.37f);
  tp_scale_f32(want, N, 0.37f);
  h = to_host(c, s, dx, N);
  same_bits(name, "clip", h, want, N);
  free(h);

  /* the norm's pieces into device doubles, read back explicitly and added in order; a range
   * of pieces alone gives the same bits */
  double got = 0, pieces[TP_NORM_PIECES], some[3];
  double *dp = c->be->alloc(c, sizeof pieces), *ds = c->be->alloc(c, sizeof some);
  c->be->sum_squares_pieces(c, s, dx, N, 0, TP_NORM_PIECES, dp);
  c->be->sum_squares_pieces(c, s, dx, N, 7, 3, ds);
  c->be->sum_squares_pieces(c, s, dy, N, 0, 0, ds); /* nothing asked: nothing written */
  c->be->copy_d2h(c, s, pieces, dp, sizeof pieces);
  c->be->copy_d2h(c, s, some, ds, sizeof some);
  c->be->stream_sync(c, s);
  for (int p = 0; p < TP_NORM_PIECES; p++) got += pieces[p];
  double expect = tp_sum_squares_f32(want, N);
  if (exact_sums ? memcmp(&got, &expect, sizeof got) != 0 : !(fabs(got - expect) <= 1e-12 * expect))
    fail("%s: sum_squares_pieces: %.17g, expected %.17g", name, got, expect);
  if (memcmp(some, pieces + 7, sizeof some) != 0) fail("%s: sum_squares_pieces 7..9 alone differ", name);
  c->be->free(c, dp), c->be->free(c, ds);

  /* two AdamW steps, against the kernel on host copies */
  float *g = rand_array(N, 1), *m = calloc(N, sizeof *m), *v = calloc(N, sizeof *v);
  float *dw = to_device(c, s, x, N), *dg = to_device(c, s, g, N), *dm = to_device(c, s, m, N),
        *dv = to_device(c, s, v, N);
  for (int64_t step = 1; step <= 2; step++) {
    TpAdamW h2 = {1e-3, 0.9, 0.95, 1e-8, 0.1, step};
    c->be->adamw(c, s, dw, dg, dm, dv, N, &h2);
    tp_adamw_step(x, g, m, v, N, h2.lr, h2.beta1, h2.beta2, h2.eps, h2.weight_decay, step);
  }
  float *hw = to_host(c, s, dw, N), *hm = to_host(c, s, dm, N), *hv = to_host(c, s, dv, N);
  same_bits(name, "adamw w", hw, x, N);
  same_bits(name, "adamw m", hm, m, N);
  same_bits(name, "adamw v", hv, v, N);
  free(hw), free(hm), free(hv), free(g), free(m), free(v);
  c->be->free(c, dw), c->be->free(c, dg), c->be->free(c, dm), c->be->free(c, dv);
  c->be->free(c, dx), c->be->free(c, dy);
  free(x), free(y), free(want);
}

/* The multi-tensor entries (where the backend has them) against the per-tensor ones, bit
 * for bit: the norm's pieces of three tensors of odd sizes (of one only some pieces, as a
 * --zero 1 shard asks; one tensor shorter than the piece count, whose pieces are partly
 * empty), and two clipped AdamW steps over them with a weight decay each, an empty tensor
 * among them. */
static void test_many(TpCompute *c, TpStream *s) {
  const char *name = c->be->name;
  if (!c->be->sum_squares_many || !c->be->adamw_many) return;
  enum { T = 4 };
  const int64_t n[T] = {9999, 37, 0, 4097 * 3 + 5};
  const double decay[T] = {0.1, 0, 0.3, 0.05};
  float *w[T], *g[T], *dw[2][T], *dg[2][T], *dm[2][T], *dv[2][T]; /* [0]: per tensor, [1]: many */
  for (int i = 0; i < T; i++) {
    w[i] = rand_array(n[i] ? n[i] : 1, 2), g[i] = rand_array(n[i] ? n[i] : 1, 1);
    float *zeros = calloc((size_t)n[i] + 1, sizeof *zeros);
    for (int k = 0; k < 2; k++)
      dw[k][i] = to_device(c, s, w[i], n[i]), dg[k][i] = to_device(c, s, g[i], n[i]),
      dm[k][i] = to_device(c, s, zeros, n[i]), dv[k][i] = to_device(c, s, zeros, n[i]);
    free(zeros);
  }
  size_t count = (size_t)T * TP_NORM_PIECES;
  double *want = calloc(count, sizeof *want), *got = calloc(count, sizeof *got);
  double *dwant = c->be->alloc(c, count * sizeof *want), *dgot = c->be->alloc(c, count * sizeof *got);
  TpNormPiece *list = calloc(count, sizeof *list);
  int listed = 0;
  for (int i = 0; i < T; i++) {
    int first = i == 3 ? 5 : 0, pieces = i == 3 ? 11 : TP_NORM_PIECES;
    c->be->sum_squares_pieces(c, s, dg[0][i], n[i], first, pieces, dwant + i * TP_NORM_PIECES + first);
    for (int p = first; p < first + pieces; p++)
      list[listed++] = (TpNormPiece){dg[1][i], n[i], p, (int64_t)i * TP_NORM_PIECES + p};
  }
  c->be->sum_squares_many(c, s, list, listed, dgot);
  c->be->copy_d2h(c, s, want, dwant, count * sizeof *want);
  c->be->copy_d2h(c, s, got, dgot, count * sizeof *got);
  c->be->stream_sync(c, s);
  if (memcmp(got, want, count * sizeof *got)) fail("%s: sum_squares_many differs from sum_squares_pieces", name);

  TpAdamWTensor tensors[T];
  for (int step = 1; step <= 2; step++) {
    float clip = step == 1 ? 0.37f : 1;
    TpAdamW h = {1e-3, 0.9, 0.95, 1e-8, 0, step};
    for (int i = 0; i < T; i++) {
      TpAdamW hi = h;
      hi.weight_decay = decay[i];
      if (clip != 1) c->be->clip(c, s, dg[0][i], n[i], clip);
      c->be->adamw(c, s, dw[0][i], dg[0][i], dm[0][i], dv[0][i], n[i], &hi);
      tensors[i] = (TpAdamWTensor){dw[1][i], dg[1][i], dm[1][i], dv[1][i], n[i], decay[i]};
    }
    c->be->adamw_many(c, s, tensors, T, &h, clip);
  }
  const char *what[4] = {"adamw_many w", "adamw_many g (clipped)", "adamw_many m", "adamw_many v"};
  for (int i = 0; i < T; i++)
    for (int k = 0; k < 4; k++) {
      float *const *pair[4][2] = {{dw[0], dw[1]}, {dg[0], dg[1]}, {dm[0], dm[1]}, {dv[0], dv[1]}};
      float *a = to_host(c, s, pair[k][0][i], n[i]), *b = to_host(c, s, pair[k][1][i], n[i]);
      same_bits(name, what[k], b, a, n[i]);
      free(a), free(b);
    }
  for (int i = 0; i < T; i++) {
    for (int k = 0; k < 2; k++)
      c->be->free(c, dw[k][i]), c->be->free(c, dg[k][i]), c->be->free(c, dm[k][i]), c->be->free(c, dv[k][i]);
    free(w[i]), free(g[i]);
  }
  c->be->free(c, dwant), c->be->free(c, dgot);
  free(want), free(got), free(list);
}

/* pack: the arena's buffers (in message order, not arena order; one of zero bytes) into one
 * send buffer; unpack into another arena; an empty message packs nothing. */
static void test_pack(TpCompute *c, TpStream *s) {
  const char *name = c->be->name;
  enum { ARENA = 256 };
  unsigned char src[ARENA], got[ARENA], want[ARENA] = {0}, sent[40];
  for (int i = 0; i < ARENA; i++) src[i] = (unsigned char)(i * 7 + 1);
  const TpPlanBuffer bufs[] = {{200, 16}, {8, 0}, {10, 20}, {255, 1}};
  const int nb = 4, total = 37;
  unsigned char *arena = c->be->alloc(c, ARENA), *arena2 = c->be->alloc(c, ARENA), *msg = c->be->alloc(c, total);
  c->be->copy_h2d(c, s, arena, src, ARENA);
  c->be->pack(c, s, msg, arena, bufs, nb);
  c->be->copy_d2h(c, s, sent, msg, total);
  c->be->stream_sync(c, s);
  unsigned char expect[40];
  memcpy(expect, src + 200, 16), memcpy(expect + 16, src + 10, 20), expect[36] = src[255];
  if (memcmp(sent, expect, total)) fail("%s: pack: the send buffer is not the buffers in message order", name);

  c->be->unpack(c, s, arena2, msg, bufs, nb);
  c->be->copy_d2h(c, s, got, arena2, ARENA);
  c->be->stream_sync(c, s);
  memcpy(want + 200, src + 200, 16), memcpy(want + 10, src + 10, 20), want[255] = src[255];
  if (memcmp(got, want, ARENA)) fail("%s: unpack: the arena differs from the buffers sent", name);

  /* an empty message: no buffers, a zero-byte send buffer, the arena untouched */
  void *none = c->be->alloc(c, 0);
  c->be->pack(c, s, none, arena, NULL, 0);
  c->be->unpack(c, s, arena2, none, NULL, 0);
  const TpPlanBuffer zero[] = {{0, 0}, {ARENA, 0}}; /* zero bytes, even at the arena's end */
  c->be->pack(c, s, none, arena, zero, 2);
  c->be->unpack(c, s, arena2, none, zero, 2);
  c->be->copy_d2h(c, s, got, arena2, ARENA);
  c->be->stream_sync(c, s);
  if (memcmp(got, want, ARENA)) fail("%s: an empty message changed the arena", name);
  c->be->free(c, none), c->be->free(c, arena), c->be->free(c, arena2), c->be->free(c, msg);
}

static void test_backend(const TpComputeBackend *be, bool exact_sums) {
  TpCompute *c = open_backend(be);
  TpStream *s = be->stream_new(c);
  test_memory(c, s);
  test_streams(c);
  test_run_unit(c, s);
  test_math(c, s, exact_sums);
  test_many(c, s);
  test_pack(c, s);
  be->stream_free(c, s);
  close_backend(c);
}

#ifdef TEST_CUDA_BACKEND
/* tp_plan_device_cuda's open_compute: GPU local_rank % count, and one error without a GPU. */
static void test_cuda_open(void) {
  TpDiag d;
  tp_diag_init(&d, "test_compute", NULL, NULL);
  TpCompute *c = NULL;
  setenv("TOKPIPE_CUDA_EMULATE_DEVICES", "2", 1);
  if (tp_plan_device_cuda.open_compute(&c, 3, &d) || !c || c->be != &tp_compute_cuda)
    fail("cuda: open_compute on local rank 3 of 2 GPUs: %s", d.last);
  tp_compute_close(c);
  setenv("TOKPIPE_CUDA_EMULATE_DEVICES", "0", 1);
  c = NULL;
  int rc = tp_plan_device_cuda.open_compute(&c, 0, &d);
  const char *want = "no CUDA GPU: cudaGetDeviceCount: no CUDA-capable device is detected";
  if (rc != TP_ERR_INPUT || c || strcmp(d.last, want))
    fail("cuda: open_compute without a GPU: rc %d, '%s'; expected %d, '%s'", rc, d.last, TP_ERR_INPUT, want);
  unsetenv("TOKPIPE_CUDA_EMULATE_DEVICES");
}

/* In a child: an embedding kernel meets id 300 of a 4-row table at position 2; the stream's
 * synchronization must end the process with one error line naming it, exit code 1. */
static void test_cuda_bad_index(void) {
  char path[] = "/tmp/test_compute_cuda_XXXXXX";
  int fd = mkstemp(path);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fd, 2);
    /* static: still reachable when the synchronization exits (no leak report) */
    static TpCompute *c;
    static TpStream *s;
    static float *table, *out;
    static int64_t *dev_ids;
    int64_t ids[3] = {0, 3, 300};
    c = open_backend(&tp_compute_cuda);
    s = c->be->stream_new(c);
    table = c->be->alloc(c, 4 * 2 * sizeof(float)), out = c->be->alloc(c, 3 * 2 * sizeof(float));
    dev_ids = c->be->alloc(c, sizeof ids);
    c->be->copy_h2d(c, s, dev_ids, ids, sizeof ids);
    tp_cuda_launch_embedding_f32(table, dev_ids, 3, 4, 2, out, s->bad, s->cuda);
    c->be->stream_sync(c, s);
    _exit(0); /* must not get here */
  }
  int status = 0;
  waitpid(pid, &status, 0);
  char text[512] = "";
  ssize_t n = pread(fd, text, sizeof text - 1, 0);
  text[n > 0 ? n : 0] = 0;
  close(fd);
  unlink(path);
  const char *want = "tokpipe: error: a kernel on the GPU met an index out of range (at position 2 of its ids or "
                     "targets)\n";
  /* (its first line: a sanitizer may note things at exit after it) */
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 1 || strncmp(text, want, strlen(want)))
    fail("cuda: a bad index at a stream synchronization: status %#x, stderr '%s'; expected exit 1, '%s'", status,
         text, want);
}

#else
/* In a child: a direct read of strict device memory must end it with SIGSEGV. */
static void test_strict_traps(void) {
  pid_t pid = fork();
  if (pid == 0) {
    signal(SIGSEGV, SIG_DFL); /* not a sanitizer's report: the signal itself */
    TpCompute *c = open_backend(&tp_compute_cpu_strict);
    volatile float *p = c->be->alloc(c, 4096);
    _exit(p[0] == 0 ? 0 : 1); /* must not get here */
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGSEGV)
    fail("cpu-strict: a direct host read of device memory did not crash (status %#x)", status);
}

static void test_open(void) {
  TpDiag d;
  tp_diag_init(&d, "test_compute", NULL, stderr);
  TpCompute *c;
  unsetenv("TOKPIPE_TEST_STRICT_DEVICE");
  if (tp_compute_open(&c, &d) || c->be != &tp_compute_cpu) fail("tp_compute_open: not the cpu backend");
  tp_compute_close(c);
  setenv("TOKPIPE_TEST_STRICT_DEVICE", "1", 1);
  if (tp_compute_open(&c, &d) || c->be != &tp_compute_cpu_strict)
    fail("tp_compute_open: TOKPIPE_TEST_STRICT_DEVICE=1 did not give the strict backend");
  tp_compute_close(c);
  unsetenv("TOKPIPE_TEST_STRICT_DEVICE");
}

#endif

#ifdef TEST_CUDA_BACKEND
/* host_alloc's memory is zeroed and pinned: the step counters see no pageable copy to or
 * from it (cudaPointerGetAttributes: host memory), and one from malloc'ed memory. */
static void test_cuda_pinned(void) {
  TpCompute *c = open_backend(&tp_compute_cuda);
  TpStream *s = c->be->stream_new(c);
  enum { BYTES = 1000 };
  unsigned char *pinned = c->be->host_alloc(c, BYTES), *pageable = calloc(1, BYTES), zero[BYTES] = {0};
  void *dev = c->be->alloc(c, BYTES);
  if (!pinned || memcmp(pinned, zero, BYTES)) fail("cuda: host_alloc: not zeroed memory");
  char line[256];
  tp_cuda_stats_take(line, sizeof line);
  c->be->copy_h2d(c, s, dev, pinned, BYTES);
  c->be->copy_d2h(c, s, pinned + 10, dev, 20);
  c->be->stream_sync(c, s);
  tp_cuda_stats_take(line, sizeof line);
  if (!strstr(line, " pageable=0 ")) fail("cuda: copies with host_alloc's memory were counted pageable: %s", line);
  c->be->copy_h2d(c, s, dev, pageable, BYTES);
  c->be->stream_sync(c, s);
  tp_cuda_stats_take(line, sizeof line);
  if (!strstr(line, " pageable=1 ")) fail("cuda: a copy from malloc'ed memory was not counted pageable: %s", line);
  c->be->free(c, dev);
  c->be->host_free(c, pinned);
  free(pageable);
  c->be->stream_free(c, s);
  close_backend(c);
}
#endif

int main(void) {
#ifdef TEST_CUDA_BACKEND
  test_cuda_open();
  test_cuda_pinned();
  test_backend(&tp_compute_cuda, false);
  test_cuda_bad_index();
  const char *tested = "cuda (emulated)";
#else
  test_open();
  test_backend(&tp_compute_cpu, true);
  test_backend(&tp_compute_cpu_strict, true);
  test_strict_traps();
  const char *tested = "cpu, cpu-strict";
#endif
  if (failures) {
    fprintf(stderr, "%d failure(s)\n", failures);
    return 1;
  }
  printf("ok compute backends: %s\n", tested);
  return 0;
}
