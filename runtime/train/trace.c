/* --trace FILE.json: every rank's instructions (compute and communication) and updates as
 * a Chrome trace (the JSON "Trace Event Format": chrome://tracing, ui.perfetto.dev), one
 * process id per rank. Each process keeps its hosted ranks' events in memory; at the end
 * process 0 gathers them and writes the file. Times are microseconds since the start of
 * training, which every process takes right after a barrier. */
#include "train.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../base/atomic.h"

enum { TRACE_TAG = 31998, MAX_EVENTS = 1 << 20 }; /* per process; later events are dropped */

typedef struct {
  double start, end; /* us */
  int32_t rank, kind, mb, slice, peer;
  int32_t stage; /* an interleaved plan's virtual stage of a unit's instruction; else -1 */
} TraceEvent;

struct TraceLog {
  TraceEvent *ev;
  int64_t n, cap, dropped;
  double t0;
};

static double mono_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

TraceLog *trace_new(void) {
  TraceLog *l = calloc(1, sizeof *l);
  TP_ASSERT(l);
  l->t0 = mono_us();
  return l;
}

void trace_free(TraceLog *l) {
  if (!l) return;
  free(l->ev);
  free(l);
}

double trace_now_us(const TraceLog *l) { return mono_us() - l->t0; }

void trace_add(TraceLog *l, int rank, int kind, int mb, int slice, int peer, int stage, double start_us,
               double end_us) {
  if (l->n == MAX_EVENTS) {
    l->dropped++;
    return;
  }
  if (l->n == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 1024;
    l->ev = realloc(l->ev, (size_t)l->cap * sizeof *l->ev);
    TP_ASSERT(l->ev);
  }
  l->ev[l->n++] = (TraceEvent){start_us, end_us, rank, kind, mb, slice, peer, stage};
}

static const char *kind_name(int kind) {
  static const char *const names[] = {"forward",        "backward",       "send-act",       "recv-act",
                                      "send-grad",      "recv-grad",      "allreduce-tied", "allreduce",
                                      "optimizer-step", "backward-input", "backward-weight"};
  if (kind == TRACE_UPDATE) return "optimizer-step";
  return kind >= 0 && kind < (int)(sizeof names / sizeof *names) ? names[kind] : "?";
}

/* One event as a JSON object: a complete event ("ph": "X") on thread 0 of process `rank`. */
static int format_event(char *buf, size_t n, const TraceEvent *e) {
  bool compute = e->kind == TP_PLAN_FORWARD || e->kind == TP_PLAN_BACKWARD || e->kind == TP_PLAN_BACKWARD_INPUT ||
                 e->kind == TP_PLAN_BACKWARD_WEIGHT || e->kind == TRACE_UPDATE;
  char name[112], stage[32] = "";
  if (e->stage >= 0) snprintf(stage, sizeof stage, ", \"stage\": %d", (int)e->stage);
  int len = snprintf(name, sizeof name, "%s", kind_name(e->kind));
  if (e->mb >= 0) len += snprintf(name + len, sizeof name - (size_t)len, " mb%d/s%d", (int)e->mb, (int)e->slice);
  if (e->stage >= 0) len += snprintf(name + len, sizeof name - (size_t)len, " of stage %d", (int)e->stage);
  bool send = e->kind == TP_PLAN_SEND_ACT || e->kind == TP_PLAN_SEND_GRAD;
  bool recv = e->kind == TP_PLAN_RECV_ACT || e->kind == TP_PLAN_RECV_GRAD;
  if (e->peer >= 0 && (send || recv || e->kind == TP_PLAN_ALLREDUCE_TIED))
    snprintf(name + len, sizeof name - (size_t)len, " %s stage %d",
             send   ? "to"
             : recv ? "from"
                    : "with",
             (int)e->peer);
  return snprintf(buf, n,
                  "{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": 0, "
                  "\"ts\": %.3f, \"dur\": %.3f, \"args\": {\"mb\": %d, \"slice\": %d%s}}",
                  name, compute ? "compute" : "comm", (int)e->rank, e->start, e->end - e->start, (int)e->mb,
                  (int)e->slice, stage);
}

static void append(char **out, size_t *len, size_t *cap, const char *s, size_t n) {
  if (*len + n + 1 > *cap) {
    *cap = (*len + n + 1) * 2;
    *out = realloc(*out, *cap);
    TP_ASSERT(*out);
  }
  memcpy(*out + *len, s, n);
  *len += n;
}

static int write_json(Trainer *t, const char *path, const TraceEvent *ev, int64_t n, int64_t dropped) {
  const TpPlan *P = t->plan;
  char *out = NULL, line[512];
  size_t len = 0, cap = 0;
  int S = P->stages ? train_pipeline(P) : 1, N = P->stages ? train_tensor(P) : 1, V = train_chunks(P);
  char chunks[32] = "";
  if (V > 1) snprintf(chunks, sizeof chunks, "\"chunks\": %d, ", V);
  int k =
      snprintf(line, sizeof line,
               "{\"displayTimeUnit\": \"ms\", \"otherData\": {\"stages\": %d, %s"
               "\"tensor\": %d, \"replicas\": %d, \"microbatches\": %d, \"slices\": %d, \"dropped_events\": %" PRId64
               "}, \"traceEvents\": [\n",
               S, chunks, N, P->stages ? P->dp : 1, P->stages ? P->microbatches : 1, P->stages ? P->nslices : 1,
               dropped);
  append(&out, &len, &cap, line, (size_t)k);
  for (int r = 0; r < t->nranks; r++) { /* rank r = (replica * S + stage) * N + tensor rank (plan.h) */
    char tensor[32] = "";
    if (N > 1) snprintf(tensor, sizeof tensor, ", tensor rank %d", r % N);
    k = snprintf(line, sizeof line,
                 "%s{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": "
                 "{\"name\": \"rank %d: stage %d%s, replica %d\"}},\n{\"name\": \"process_sort_index\", "
                 "\"ph\": \"M\", \"pid\": %d, \"args\": {\"sort_index\": %d}}",
                 r ? ",\n" : "", r, r, r / N % S, tensor, r / (N * S), r, r);
    append(&out, &len, &cap, line, (size_t)k);
  }
  for (int64_t i = 0; i < n; i++) {
    k = snprintf(line, sizeof line, ",\n");
    k += format_event(line + k, sizeof line - (size_t)k, &ev[i]);
    append(&out, &len, &cap, line, (size_t)k);
  }
  append(&out, &len, &cap, "\n]}\n", 4);
  int rc = tp_write_file_atomic(path, out, len, t->d);
  free(out);
  return rc;
}

int trace_write(Trainer *t, const char *path) {
  TraceLog *l = t->trace;
  TpComm *c = t->comm;
  if (c->size == 1) return write_json(t, path, l->ev, l->n, l->dropped);
  int64_t head[2] = {l->n, l->dropped};
  if (c->rank != 0) {
    tp_comm_send(c, head, sizeof head, 0, TRACE_TAG, "rank 0 to gather the trace");
    tp_comm_send(c, l->ev, (size_t)l->n * sizeof *l->ev, 0, TRACE_TAG, "rank 0 to gather the trace");
    return TP_OK;
  }
  int64_t total = l->n, dropped = l->dropped;
  TraceEvent *all = malloc((size_t)(l->n ? l->n : 1) * sizeof *all);
  TP_ASSERT(all);
  memcpy(all, l->ev, (size_t)l->n * sizeof *all);
  for (int r = 1; r < c->size; r++) {
    tp_comm_recv(c, head, sizeof head, r, TRACE_TAG, "the trace of a rank");
    all = realloc(all, (size_t)(total + head[0] + 1) * sizeof *all);
    TP_ASSERT(all);
    tp_comm_recv(c, all + total, (size_t)head[0] * sizeof *all, r, TRACE_TAG, "the trace of a rank");
    total += head[0];
    dropped += head[1];
  }
  int rc = write_json(t, path, all, total, dropped);
  free(all);
  return rc;
}
