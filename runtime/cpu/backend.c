/* The CPU compute backend (../compute.h): device memory is host memory, a stream runs its
 * work when it is queued (so every event has happened by the time it is recorded and every
 * wait is over), the math is the kernels of optim.c. */
#include "../compute.h"

#include <stdlib.h>
#include <string.h>

#include "../../base/half.h"
#include "optim.h"

#define PARALLEL_MIN_ELEMS 32768

/* Streams and events carry nothing; one static object each stands for all of them. */
static char the_stream, the_event;

static void cpu_close(TpCompute *c) { (void)c; }

static void *cpu_alloc(TpCompute *c, size_t bytes) {
  (void)c;
  size_t rounded = bytes <= SIZE_MAX - 64 ? (bytes + 63) / 64 * 64 : 0;
  if (!rounded && bytes) return NULL;
  void *p = aligned_alloc(64, rounded ? rounded : 64);
  return p ? memset(p, 0, rounded ? rounded : 64) : NULL;
}

static void cpu_free(TpCompute *c, void *p) {
  (void)c;
  free(p);
}

static void cpu_memset(TpCompute *c, TpStream *s, void *p, int value, size_t bytes) {
  (void)c, (void)s;
  if (bytes) memset(p, value, bytes);
}

static void cpu_copy(TpCompute *c, TpStream *s, void *dst, const void *src, size_t bytes) {
  (void)c, (void)s;
  if (bytes) memcpy(dst, src, bytes);
}

static TpStream *cpu_stream_new(TpCompute *c) {
  (void)c;
  return (TpStream *)&the_stream;
}

static void cpu_stream_free(TpCompute *c, TpStream *s) { (void)c, (void)s; }
static void cpu_stream_sync(TpCompute *c, TpStream *s) { (void)c, (void)s; }

static TpEvent *cpu_event_new(TpCompute *c) {
  (void)c;
  return (TpEvent *)&the_event;
}

static void cpu_event_free(TpCompute *c, TpEvent *e) { (void)c, (void)e; }
static void cpu_event_record(TpCompute *c, TpEvent *e, TpStream *s) { (void)c, (void)e, (void)s; }
static void cpu_stream_wait(TpCompute *c, TpStream *s, TpEvent *e) { (void)c, (void)s, (void)e; }
static void cpu_event_sync(TpCompute *c, TpEvent *e) { (void)c, (void)e; }

static void cpu_run_unit(TpCompute *c, TpStream *s, TpUnitFn fn, TpStepIO *io) {
  io->compute = c;
  io->stream = s;
  fn(io);
}

static void cpu_add_into(TpCompute *c, TpStream *s, float *dst, const float *src, int64_t n) {
  (void)c, (void)s;
#pragma omp parallel for simd schedule(static) if (n >= PARALLEL_MIN_ELEMS)
  for (int64_t i = 0; i < n; i++) dst[i] += src[i];
}

static void cpu_add_half_into(TpCompute *c, TpStream *s, float *dst, const void *src, int64_t n, int half) {
  (void)c, (void)s;
  const uint16_t *h = src;
  if (half == TP_PLAN_BF16) {
#pragma omp parallel for simd schedule(static) if (n >= PARALLEL_MIN_ELEMS)
    for (int64_t i = 0; i < n; i++) dst[i] += tp_half_bf16_to_f32(h[i]);
  } else {
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN_ELEMS)
    for (int64_t i = 0; i < n; i++) dst[i] += tp_half_f16_to_f32(h[i]);
  }
}

static void cpu_round_to_half(TpCompute *c, TpStream *s, void *dst, const float *src, int64_t n, int half) {
  (void)c, (void)s;
  uint16_t *h = dst;
  if (half == TP_PLAN_BF16) {
#pragma omp parallel for simd schedule(static) if (n >= PARALLEL_MIN_ELEMS)
    for (int64_t i = 0; i < n; i++) h[i] = tp_half_f32_to_bf16(src[i]);
  } else {
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN_ELEMS)
    for (int64_t i = 0; i < n; i++) h[i] = tp_half_f32_to_f16(src[i]);
  }
}

static void cpu_divide(TpCompute *c, TpStream *s, float *x, int64_t n, float by) {
  (void)c, (void)s;
#pragma omp parallel for simd schedule(static) if (n >= PARALLEL_MIN_ELEMS)
  for (int64_t i = 0; i < n; i++) x[i] /= by;
}

_Static_assert((int)TP_NORM_PIECES == TP_SUM_PIECES, "the norm's pieces are tp_sum_squares_f32's");

static void cpu_sum_squares_pieces(TpCompute *c, TpStream *s, const float *x, int64_t n, int first, int count,
                                   double *out) {
  (void)c, (void)s;
  tp_sum_squares_pieces_f32(x, n, first, count, out);
}

static void cpu_clip(TpCompute *c, TpStream *s, float *x, int64_t n, float factor) {
  (void)c, (void)s;
  tp_scale_f32(x, n, factor);
}

static void cpu_adamw(TpCompute *c, TpStream *s, float *w, const float *g, float *m, float *v, int64_t n,
                      const TpAdamW *h) {
  (void)c, (void)s;
  tp_adamw_step(w, g, m, v, n, h->lr, h->beta1, h->beta2, h->eps, h->weight_decay, h->step);
}

/* A message's buffers between the arena and the contiguous message, in message order. */
static void move_buffers(char *msg, char *arena, const TpPlanBuffer *buffers, int n, bool pack) {
  size_t at = 0;
  for (int j = 0; j < n; j++) {
    char *in_arena = arena + buffers[j].offset;
    size_t bytes = (size_t)buffers[j].bytes;
    if (pack) memcpy(msg + at, in_arena, bytes);
    else memcpy(in_arena, msg + at, bytes);
    at += bytes;
  }
}

static void cpu_pack(TpCompute *c, TpStream *s, void *dst, const void *arena, const TpPlanBuffer *buffers, int n) {
  (void)c, (void)s;
  move_buffers(dst, (char *)arena, buffers, n, true);
}

static void cpu_unpack(TpCompute *c, TpStream *s, void *arena, const void *src, const TpPlanBuffer *buffers, int n) {
  (void)c, (void)s;
  move_buffers((char *)src, arena, buffers, n, false);
}

const TpComputeBackend tp_compute_cpu = {
    .name = "cpu",
    .host_addressable = true,
    .close = cpu_close,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .memset = cpu_memset,
    .copy_h2d = cpu_copy,
    .copy_d2h = cpu_copy,
    .copy_d2d = cpu_copy,
    .stream_new = cpu_stream_new,
    .stream_free = cpu_stream_free,
    .stream_sync = cpu_stream_sync,
    .event_new = cpu_event_new,
    .event_free = cpu_event_free,
    .event_record = cpu_event_record,
    .stream_wait = cpu_stream_wait,
    .event_sync = cpu_event_sync,
    .run_unit = cpu_run_unit,
    .add_into = cpu_add_into,
    .add_half_into = cpu_add_half_into,
    .round_to_half = cpu_round_to_half,
    .divide = cpu_divide,
    .sum_squares_pieces = cpu_sum_squares_pieces,
    .clip = cpu_clip,
    .adamw = cpu_adamw,
    .pack = cpu_pack,
    .unpack = cpu_unpack,
};

int tp_compute_open(TpCompute **out, TpDiag *d) {
  (void)d;
  TpCompute *c = calloc(1, sizeof *c);
  TP_ASSERT(c);
  const char *strict = getenv("TOKPIPE_TEST_STRICT_DEVICE");
  c->be = strict && strcmp(strict, "1") == 0 ? &tp_compute_cpu_strict : &tp_compute_cpu;
  *out = c;
  return TP_OK;
}

void tp_compute_close(TpCompute *c) {
  if (!c) return;
  c->be->close(c);
  free(c);
}
