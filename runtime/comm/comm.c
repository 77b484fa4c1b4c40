/* The backend-independent half of the communication layer: choosing a backend, waiting
 * with a watchdog, and collectives built on point-to-point messages with a fixed
 * reduction order. */
#include "comm.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Above every pipeline tag; MPI guarantees tags < 32768. Headers and data have tags of their
 * own, so that a header is never taken for data or the reverse. */
enum { HEADER_TAG = 32000, DATA_TAG = 32001 };

struct TpCommGroupSeq {
  uint64_t key;
  int n;
  int *members;
  uint64_t done;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

bool tp_comm_launched_by_mpi(void) {
  return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_SIZE");
}

int tp_comm_open(TpComm **out, const char *tool, int *argc, char ***argv, TpDiag *d) {
  TpComm *c = calloc(1, sizeof *c);
  TP_ASSERT(c);
  c->tool = tool;
  c->size = 1;
  c->timeout_s = 300;
  const char *t = getenv("TOKPIPE_COMM_TIMEOUT");
  if (t && atof(t) > 0) c->timeout_s = atof(t);
  *out = c;
  if (!tp_comm_launched_by_mpi()) {
    c->be = &tp_comm_local;
    return TP_OK;
  }
#ifdef TOKPIPE_HAVE_MPI
  c->be = &tp_comm_mpi;
  int rc = tp_comm_mpi_init(c, argc, argv, d);
  if (rc) c->be = &tp_comm_local; /* nothing to finalize */
  return rc;
#else
  (void)argc, (void)argv;
  c->be = &tp_comm_local;
  const char *n = getenv("OMPI_COMM_WORLD_SIZE") ? getenv("OMPI_COMM_WORLD_SIZE") : getenv("PMI_SIZE");
  if (n && strcmp(n, "1") == 0) return TP_OK; /* mpirun -np 1: one process anyway */
  return tp_error(d, "started by an MPI launcher, but this trainer was built without MPI: "
                     "install libopenmpi-dev and build tokpipec again, or run it without mpirun");
#endif
}

void tp_comm_close(TpComm *c) {
  if (!c) return;
  if (c->be) c->be->finalize(c);
  for (int i = 0; i < c->ngroup_seqs; i++) free(c->group_seqs[i].members);
  free(c->group_seqs);
  free(c);
}

_Noreturn void tp_comm_abort(TpComm *c, int code, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  c->be->abort(c, code, msg);
  abort(); /* not reached: every backend's abort ends the process */
}

/* Polls without burning a core that another rank may need: spin briefly, then sleep up to
 * a millisecond between tests; a transport of device memory (NCCL) up to 20 us, since a
 * GPU's transfer ends far sooner than a host message and the step waits on it. */
void tp_comm_wait(TpComm *c, TpCommRequest *r) {
  double start = now_s();
  long sleep_ns = 0, max_sleep_ns = c->be->device_memory ? 20000 : 1000000;
  for (int polls = 0; !c->be->test(c, r); polls++) {
    if (polls < 100) continue;
    sleep_ns = sleep_ns ? sleep_ns * 2 : 1000;
    if (sleep_ns > max_sleep_ns) sleep_ns = max_sleep_ns;
    nanosleep(&(struct timespec){0, sleep_ns}, NULL);
    if ((polls & 63) == 0 && now_s() - start > c->timeout_s) {
      char peer[32] = "";
      if (r->peer >= 0) snprintf(peer, sizeof peer, " (peer: rank %d)", r->peer);
      tp_comm_abort(c, TP_ERR_INTERNAL,
                    "no progress for %g s waiting for %s%s (did a rank die or "
                    "hang? the limit is TOKPIPE_COMM_TIMEOUT seconds)",
                    c->timeout_s, r->what ? r->what : "a message", peer);
    }
  }
}

void tp_comm_send(TpComm *c, const void *buf, size_t bytes, int peer, int tag, const char *what) {
  TpCommRequest r = {.what = what};
  c->be->isend(c, buf, bytes, peer, tag, &r);
  tp_comm_wait(c, &r);
}

void tp_comm_recv(TpComm *c, void *buf, size_t bytes, int peer, int tag, const char *what) {
  TpCommRequest r = {.what = what};
  c->be->irecv(c, buf, bytes, peer, tag, &r);
  tp_comm_wait(c, &r);
}

static size_t dtype_bytes(TpDType t) {
  switch (t) {
  case TP_F32: return 4;
  case TP_BF16:
  case TP_F16: return 2; /* gathered, never summed */
  case TP_F64:
  case TP_I64: return 8;
  default: TP_ASSERT(!"a collective of an unsupported dtype");
  }
  return 0;
}

void tp_comm_sum_into(void *dst, const void *src, size_t count, TpDType dtype) {
  switch (dtype) {
  case TP_F32:
    for (size_t i = 0; i < count; i++) ((float *)dst)[i] += ((const float *)src)[i];
    break;
  case TP_F64:
    for (size_t i = 0; i < count; i++) ((double *)dst)[i] += ((const double *)src)[i];
    break;
  default:
    TP_ASSERT(dtype == TP_I64);
    for (size_t i = 0; i < count; i++) ((int64_t *)dst)[i] += ((const int64_t *)src)[i];
  }
}

static int group_index(const TpComm *c, const int *group, int n) {
  for (int i = 0; i < n; i++)
    if (group[i] == c->rank) return i;
  TP_ASSERT(!"a collective over a group without this rank");
  return -1;
}

/* ---- collectives with a header: sequence number, kind and size checked at the root ---- */

typedef enum { COLL_ALLREDUCE, COLL_BROADCAST, COLL_BARRIER, COLL_REDUCE_SCATTER, COLL_ALL_GATHER } CollKind;
static const char *const coll_names[] = {"an all-reduce", "a broadcast", "a barrier", "a reduce-scatter",
                                         "an all-gather"};

/* What every member sends the root before a collective's data (fixed size, so a header
 * never truncates another). */
typedef struct {
  uint64_t seq;   /* the group's collective number, from 1 */
  uint64_t bytes; /* of the data */
  uint64_t group; /* hash of the member list */
  int32_t kind, dtype, root, n;
} CollHeader;

static uint64_t group_key(const int *group, int n) {
  uint64_t h = 1469598103934665603ull ^ (uint64_t)n; /* FNV-1a */
  for (int i = 0; i < n; i++) h = (h ^ (uint64_t)(uint32_t)group[i]) * 1099511628211ull;
  return h;
}

/* The next collective number of the group (1 for its first). */
static uint64_t group_next_seq(TpComm *c, const int *group, int n, uint64_t key) {
  for (int i = 0; i < c->ngroup_seqs; i++) {
    TpCommGroupSeq *g = &c->group_seqs[i];
    if (g->key == key && g->n == n && memcmp(g->members, group, sizeof *group * (size_t)n) == 0) return ++g->done;
  }
  c->group_seqs = realloc(c->group_seqs, sizeof *c->group_seqs * (size_t)(c->ngroup_seqs + 1));
  TP_ASSERT(c->group_seqs);
  TpCommGroupSeq *g = &c->group_seqs[c->ngroup_seqs++];
  *g = (TpCommGroupSeq){key, n, malloc(sizeof *group * (size_t)n), 1};
  TP_ASSERT(g->members);
  memcpy(g->members, group, sizeof *group * (size_t)n);
  return 1;
}

static void describe(char *out, size_t size, int rank, const CollHeader *h) {
  char root[32] = "";
  if (h->kind == COLL_BROADCAST) snprintf(root, sizeof root, " from rank %d", (int)h->root);
  snprintf(out, size, "rank %d's collective #%llu over %d ranks is %s of %llu bytes%s", rank,
           (unsigned long long)h->seq, (int)h->n,
           h->kind >= 0 && h->kind <= COLL_ALL_GATHER ? coll_names[h->kind] : "an unknown collective",
           (unsigned long long)h->bytes, root);
}

/* At the root: a member's header against the root's own; a difference ends the job naming
 * both ranks and the field. */
static void check_header(TpComm *c, const CollHeader *mine, const CollHeader *theirs, int peer) {
  const char *field = theirs->group != mine->group || theirs->n != mine->n ? "the group"
                      : theirs->seq != mine->seq                           ? "the sequence number"
                      : theirs->kind != mine->kind                         ? "the kind"
                      : theirs->root != mine->root                         ? "the root"
                      : theirs->dtype != mine->dtype                       ? "the element type"
                      : theirs->bytes != mine->bytes                       ? "the size"
                                                                           : NULL;
  if (!field) return;
  char a[160], b[160];
  describe(a, sizeof a, c->rank, mine);
  describe(b, sizeof b, peer, theirs);
  tp_comm_abort(c, TP_ERR_INTERNAL,
                "ranks %d and %d are out of step (%s differs): %s; %s (every rank must run "
                "the same steps: were they given other options?)",
                c->rank, peer, field, a, b);
}

/* One collective over group (ascending, with this rank) rooted at root: every other member
 * sends its header (and for an all-reduce or a reduce-scatter its data, for an all-gather its
 * segment) to the root, which checks the headers before it takes any data; then the root
 * sends buf (the sum, the broadcast or gathered data, or nothing for a barrier) to every
 * member, or for a reduce-scatter each member its segment of the sum. counts: the members'
 * segments (reduce-scatter, all-gather; else NULL), which count sums. */
static void collective(TpComm *c, CollKind kind, TpDType dtype, void *buf, size_t count, const size_t *counts,
                       int root, const int *group, int n) {
  int me = group_index(c, group, n);
  if (n < 2) return;
  bool sums = kind == COLL_ALLREDUCE || kind == COLL_REDUCE_SCATTER;
  size_t elem = kind == COLL_BROADCAST || kind == COLL_BARRIER ? 1 : dtype_bytes(dtype);
  size_t bytes = count * elem;
  size_t *at = counts ? calloc((size_t)n + 1, sizeof *at) : NULL; /* each segment's first byte */
  for (int i = 0; counts && i < n; i++) at[i + 1] = at[i] + counts[i] * elem;
  TP_ASSERT(!counts || at[n] == bytes);
  uint64_t key = group_key(group, n);
  CollHeader h = {group_next_seq(c, group, n, key), bytes, key, (int32_t)kind,
                  elem > 1 ? (int32_t)dtype : -1,   root,  n};
  const char *what = coll_names[kind];
  char *data = buf;
  if (c->rank != root) {
    TpCommRequest hr = {.what = what}, dr = {.what = what};
    c->be->isend(c, &h, sizeof h, root, HEADER_TAG, &hr);
    if (sums) c->be->isend(c, buf, bytes, root, DATA_TAG, &dr);
    if (kind == COLL_ALL_GATHER) c->be->isend(c, data + at[me], at[me + 1] - at[me], root, DATA_TAG, &dr);
    tp_comm_wait(c, &hr);
    if (dr.impl) tp_comm_wait(c, &dr); /* buf is sent before the result lands in it */
    if (kind == COLL_REDUCE_SCATTER) tp_comm_recv(c, data + at[me], at[me + 1] - at[me], root, DATA_TAG, what);
    else tp_comm_recv(c, buf, bytes, root, DATA_TAG, what);
    free(at);
    return;
  }
  CollHeader *hs = calloc((size_t)n, sizeof *hs);
  TpCommRequest *rs = calloc((size_t)n, sizeof *rs);
  TP_ASSERT(hs && rs);
  for (int i = 0; i < n; i++) {
    rs[i].what = what;
    if (group[i] != root) c->be->irecv(c, &hs[i], sizeof hs[i], group[i], HEADER_TAG, &rs[i]);
  }
  for (int i = 0; i < n; i++) {
    if (group[i] == root) continue;
    tp_comm_wait(c, &rs[i]);
    check_header(c, &h, &hs[i], group[i]);
  }
  if (sums) {
    /* receive everything first (in any order of arrival), then add in group order */
    TP_ASSERT(root == group[0]);
    void *parts = malloc(bytes * (size_t)(n - 1) + 1);
    TP_ASSERT(parts);
    for (int i = 1; i < n; i++)
      c->be->irecv(c, (char *)parts + bytes * (size_t)(i - 1), bytes, group[i], DATA_TAG, &rs[i]);
    for (int i = 1; i < n; i++) tp_comm_wait(c, &rs[i]);
    for (int i = 1; i < n; i++) tp_comm_sum_into(buf, (char *)parts + bytes * (size_t)(i - 1), count, dtype);
    free(parts);
  }
  if (kind == COLL_ALL_GATHER) {
    for (int i = 0; i < n; i++)
      if (group[i] != root) c->be->irecv(c, data + at[i], at[i + 1] - at[i], group[i], DATA_TAG, &rs[i]);
    for (int i = 0; i < n; i++)
      if (rs[i].impl) tp_comm_wait(c, &rs[i]);
  }
  for (int i = 0; i < n; i++) {
    if (group[i] == root) continue;
    if (kind == COLL_REDUCE_SCATTER) c->be->isend(c, data + at[i], at[i + 1] - at[i], group[i], DATA_TAG, &rs[i]);
    else c->be->isend(c, buf, bytes, group[i], DATA_TAG, &rs[i]);
  }
  for (int i = 0; i < n; i++)
    if (rs[i].impl) tp_comm_wait(c, &rs[i]);
  free(hs);
  free(rs);
  free(at);
}

void tp_comm_broadcast_p2p(TpComm *c, void *buf, size_t bytes, int root, const int *group, int n) {
  collective(c, COLL_BROADCAST, TP_F32, buf, bytes, NULL, root, group, n);
}

void tp_comm_allreduce_p2p(TpComm *c, void *buf, size_t count, TpDType dtype, const int *group, int n) {
  collective(c, COLL_ALLREDUCE, dtype, buf, count, NULL, group[0], group, n);
}

static size_t total(const size_t *counts, int n) {
  size_t sum = 0;
  for (int i = 0; i < n; i++) sum += counts[i];
  return sum;
}

void tp_comm_reduce_scatter_p2p(TpComm *c, void *buf, const size_t *counts, TpDType dtype, const int *group, int n) {
  collective(c, COLL_REDUCE_SCATTER, dtype, buf, total(counts, n), counts, group[0], group, n);
}

void tp_comm_all_gather_p2p(TpComm *c, void *buf, const size_t *counts, TpDType dtype, const int *group, int n) {
  collective(c, COLL_ALL_GATHER, dtype, buf, total(counts, n), counts, group[0], group, n);
}

void tp_comm_barrier_p2p(TpComm *c) {
  int *all = malloc(sizeof *all * (size_t)c->size);
  TP_ASSERT(all);
  for (int i = 0; i < c->size; i++) all[i] = i;
  collective(c, COLL_BARRIER, TP_F32, NULL, 0, NULL, 0, all, c->size);
  free(all);
}

int tp_comm_agree(TpComm *c, int rc, int *first) {
  if (c->size == 1) {
    *first = rc ? 0 : -1;
    return rc;
  }
  int *all = malloc(sizeof *all * (size_t)c->size);
  int64_t *rcs = calloc((size_t)c->size, sizeof *rcs);
  TP_ASSERT(all && rcs);
  for (int i = 0; i < c->size; i++) all[i] = i;
  rcs[c->rank] = rc; /* every rank's rc in its own slot: the sum is a gather */
  tp_comm_allreduce_sum(c, rcs, (size_t)c->size, TP_I64, all, c->size);
  int worst = 0;
  *first = -1;
  for (int i = 0; i < c->size; i++) {
    if (rcs[i] > worst) worst = (int)rcs[i];
    if (rcs[i] && *first < 0) *first = i;
  }
  free(all);
  free(rcs);
  return worst;
}
