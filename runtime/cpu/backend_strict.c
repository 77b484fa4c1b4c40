/* The CPU backend's strict variant, for tests only (TOKPIPE_TEST_STRICT_DEVICE=1): the
 * same entries, but device memory is mapped PROT_NONE except while one of its entries or a
 * unit runs, so the runtime's breaking the contract of ../compute.h (touching device memory
 * other than through the backend) is a SIGSEGV at the access instead of a GPU trainer that
 * reads garbage. Not host_addressable: transports get host copies, as they would of a
 * GPU's memory. One thread calls it (the kernels' OpenMP threads run inside an entry). */
#include "../compute.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct {
  void *p;
  size_t len;
} Mapping;

typedef struct {
  Mapping *maps;
  int n, cap;
  int depth; /* entries running (one calls another): memory is open while above 0 */
} Strict;

static Strict *strict_of(TpCompute *c) {
  if (!c->impl) {
    c->impl = calloc(1, sizeof(Strict));
    TP_ASSERT(c->impl);
  }
  return c->impl;
}

static void protect_all(Strict *s, int prot) {
  for (int i = 0; i < s->n; i++) TP_ASSERT(mprotect(s->maps[i].p, s->maps[i].len, prot) == 0);
}

static void enter(TpCompute *c) {
  Strict *s = strict_of(c);
  if (s->depth++ == 0) protect_all(s, PROT_READ | PROT_WRITE);
}

static void leave(TpCompute *c) {
  Strict *s = strict_of(c);
  if (--s->depth == 0) protect_all(s, PROT_NONE);
}

static void strict_close(TpCompute *c) {
  Strict *s = c->impl;
  if (!s) return;
  for (int i = 0; i < s->n; i++) munmap(s->maps[i].p, s->maps[i].len);
  free(s->maps);
  free(s);
  c->impl = NULL;
}

static void *strict_alloc(TpCompute *c, size_t bytes) {
  Strict *s = strict_of(c);
  size_t page = (size_t)sysconf(_SC_PAGESIZE), len = bytes ? (bytes + page - 1) / page * page : page;
  if (len < bytes) return NULL;
  void *p = mmap(NULL, len, s->depth ? PROT_READ | PROT_WRITE : PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL; /* zeroed, page-aligned */
  if (s->n == s->cap) {
    s->cap = s->cap ? 2 * s->cap : 64;
    s->maps = realloc(s->maps, (size_t)s->cap * sizeof *s->maps);
    TP_ASSERT(s->maps);
  }
  s->maps[s->n++] = (Mapping){p, len};
  return p;
}

static void strict_free(TpCompute *c, void *p) {
  Strict *s = strict_of(c);
  if (!p) return;
  int i = 0;
  while (i < s->n && s->maps[i].p != p) i++;
  TP_ASSERT(i < s->n); /* freeing what this backend did not allocate */
  munmap(p, s->maps[i].len);
  s->maps[i] = s->maps[--s->n];
}

/* The CPU backend's entry, with device memory open while it runs. */
#define OPEN(call)                                                                                                  \
  do {                                                                                                              \
    enter(c);                                                                                                       \
    call;                                                                                                           \
    leave(c);                                                                                                       \
  } while (0)

static void strict_memset(TpCompute *c, TpStream *s, void *p, int value, size_t bytes) {
  OPEN(tp_compute_cpu.memset(c, s, p, value, bytes));
}
static void strict_copy_h2d(TpCompute *c, TpStream *s, void *dst, const void *src, size_t bytes) {
  OPEN(tp_compute_cpu.copy_h2d(c, s, dst, src, bytes));
}
static void strict_copy_d2h(TpCompute *c, TpStream *s, void *dst, const void *src, size_t bytes) {
  OPEN(tp_compute_cpu.copy_d2h(c, s, dst, src, bytes));
}
static void strict_copy_d2d(TpCompute *c, TpStream *s, void *dst, const void *src, size_t bytes) {
  OPEN(tp_compute_cpu.copy_d2d(c, s, dst, src, bytes));
}
static void strict_run_unit(TpCompute *c, TpStream *s, TpUnitFn fn, TpStepIO *io) {
  OPEN(tp_compute_cpu.run_unit(c, s, fn, io));
}
static void strict_add_into(TpCompute *c, TpStream *s, float *dst, const float *src, int64_t n) {
  OPEN(tp_compute_cpu.add_into(c, s, dst, src, n));
}
static void strict_add_half_into(TpCompute *c, TpStream *s, float *dst, const void *src, int64_t n, int half) {
  OPEN(tp_compute_cpu.add_half_into(c, s, dst, src, n, half));
}
static void strict_round_to_half(TpCompute *c, TpStream *s, void *dst, const float *src, int64_t n, int half) {
  OPEN(tp_compute_cpu.round_to_half(c, s, dst, src, n, half));
}
static void strict_divide(TpCompute *c, TpStream *s, float *x, int64_t n, float by) {
  OPEN(tp_compute_cpu.divide(c, s, x, n, by));
}
static void strict_sum_squares_pieces(TpCompute *c, TpStream *s, const float *x, int64_t n, int first, int count,
                                      double *out) {
  OPEN(tp_compute_cpu.sum_squares_pieces(c, s, x, n, first, count, out));
}
static void strict_clip(TpCompute *c, TpStream *s, float *x, int64_t n, float factor) {
  OPEN(tp_compute_cpu.clip(c, s, x, n, factor));
}
static void strict_adamw(TpCompute *c, TpStream *s, float *w, const float *g, float *m, float *v, int64_t n,
                         const TpAdamW *h) {
  OPEN(tp_compute_cpu.adamw(c, s, w, g, m, v, n, h));
}
static void strict_pack(TpCompute *c, TpStream *s, void *dst, const void *arena, const TpPlanBuffer *buffers,
                        int n) {
  OPEN(tp_compute_cpu.pack(c, s, dst, arena, buffers, n));
}
static void strict_unpack(TpCompute *c, TpStream *s, void *arena, const void *src, const TpPlanBuffer *buffers,
                          int n) {
  OPEN(tp_compute_cpu.unpack(c, s, arena, src, buffers, n));
}

/* Streams and events hold no memory: the CPU's. */
static TpStream *strict_stream_new(TpCompute *c) { return tp_compute_cpu.stream_new(c); }
static void strict_stream_free(TpCompute *c, TpStream *s) { tp_compute_cpu.stream_free(c, s); }
static void strict_stream_sync(TpCompute *c, TpStream *s) { tp_compute_cpu.stream_sync(c, s); }
static TpEvent *strict_event_new(TpCompute *c) { return tp_compute_cpu.event_new(c); }
static void strict_event_free(TpCompute *c, TpEvent *e) { tp_compute_cpu.event_free(c, e); }
static void strict_event_record(TpCompute *c, TpEvent *e, TpStream *s) { tp_compute_cpu.event_record(c, e, s); }
static void strict_stream_wait(TpCompute *c, TpStream *s, TpEvent *e) { tp_compute_cpu.stream_wait(c, s, e); }
static void strict_event_sync(TpCompute *c, TpEvent *e) { tp_compute_cpu.event_sync(c, e); }

const TpComputeBackend tp_compute_cpu_strict = {
    .name = "cpu-strict",
    .host_addressable = false,
    .close = strict_close,
    .alloc = strict_alloc,
    .free = strict_free,
    .memset = strict_memset,
    .copy_h2d = strict_copy_h2d,
    .copy_d2h = strict_copy_d2h,
    .copy_d2d = strict_copy_d2d,
    .stream_new = strict_stream_new,
    .stream_free = strict_stream_free,
    .stream_sync = strict_stream_sync,
    .event_new = strict_event_new,
    .event_free = strict_event_free,
    .event_record = strict_event_record,
    .stream_wait = strict_stream_wait,
    .event_sync = strict_event_sync,
    .run_unit = strict_run_unit,
    .add_into = strict_add_into,
    .add_half_into = strict_add_half_into,
    .round_to_half = strict_round_to_half,
    .divide = strict_divide,
    .sum_squares_pieces = strict_sum_squares_pieces,
    .clip = strict_clip,
    .adamw = strict_adamw,
    .pack = strict_pack,
    .unpack = strict_unpack,
};
