/* The NCCL transport (comm_nccl.h): device buffers between the GPUs of a pipeline through
 * NCCL, everything in host memory through the host transport it is built on (as a
 * CUDA-aware MPI takes both: cudaPointerGetAttributes tells them apart).
 *
 * Communicators, all created at start-up in one fixed order that every process computes
 * from the plan (a communicator made on first use is how pipeline trainers deadlock). The
 * ranks are plan.h's layout: rank (d * S + k) * N + t is tensor rank t of stage k of
 * replica d (N = plan->tensor; an interleaved plan's S pipeline ranks run its S * V virtual
 * stages, k running k, k + S, ...):
 *   world     every rank (ncclCommInitRank; rank 0's unique id broadcast over the host
 *             transport), the parent the others are split from
 *   link      one per boundary and direction of a replica and tensor rank, where the
 *             schedules send (sender, receiver): activations j -> j+1, gradients j+1 -> j,
 *             both at tensor rank t. Not interleaved, boundary j lies between stages j and
 *             j+1, so a link per direction between neighbouring stages; interleaved, between
 *             virtual stages j and j+1, on pipeline ranks j % S and (j+1) % S, so one pair of
 *             ranks has a link for each boundary it carries (S = 2: ranks 0 -> 1 carry the
 *             activations of boundaries 0, 2, ... and the gradients of 1, 3, ...), and a
 *             message's tag, which names its boundary (plan.h), picks the link
 *   tensor    (N > 1) one per stage of each replica: its N tensor ranks, for the units'
 *             all-reduces (io->tensor_allreduce, allreduce_sum_on)
 *   replicas  (D > 1) one per stage with ALLREDUCE and tensor rank: (d', k, t) for every d'
 *             (with --zero 1 also the reduce-scatter of the gradients and the all-gather of
 *             the updated parameters)
 *   pieces    one per stage with ALLREDUCE, replica and piece of a parameter split in
 *             fewer parts than N (shard.parts < N): the tensor ranks holding that piece,
 *             whose partial gradients ALLREDUCE sums
 *   tied      one per replica and tensor rank with ALLREDUCE_TIED: (d, 0, t), (d, S-1, t),
 *             the ranks of the first and the last (virtual) stage
 * A collective group with the members of one made before (a tensor group that is the
 * world, pieces of one part: the tensor group) is not made twice, nor one of one rank
 * (nothing to sum: the collectives return at once). Every ncclCommSplit is collective over
 * the world, so the groups are split in rounds of disjoint groups (one split call each,
 * every rank in the same order). Then one byte goes over every link and one all-reduce of
 * a byte over every other group, all in one NCCL group, which connects them all (NCCL
 * would on their first use, mid-step).
 *
 * Why a communicator per direction rather than the world for every message: NCCL runs the
 * operations of one communicator one after another, and a send waits for its receive. With
 * one communicator, 1F1B deadlocks: stage 0 queues the activation of microbatch 1 and then
 * the receive of gradient 0, while stage 1 queues the send of gradient 0 and then the
 * receive of activation 1; each waits for the other's second operation. On a communicator
 * of its own, a direction's messages pair up in order on both sides, whatever the other
 * direction does, as MPI's non-blocking sends do. NCCL has no tags: it matches a
 * direction's messages in the order they are posted, so tp_cuda_comm_open checks that each
 * receiving stage's schedule takes them in the order the sender sends them. The same holds
 * between boundaries: an interleaved rank interleaves the messages of its virtual stages
 * (1F1B's argument, with more streams of messages), so each boundary has links of its own
 * and the check is per boundary, as MPI's tags keep them apart.
 *
 * Streams and events: a link has its own CUDA stream, a collective group one from its first
 * collective the host waits for (Group.stream says why no sooner). (An interleaved rank is
 * in about 4V links, 2 ranks x 2 chunks: 6; past CUDA_DEVICE_MAX_CONNECTIONS, 8 by default,
 * their streams share the device's hardware queues.) A send (or receive) of a
 * device buffer first makes that stream wait for the compute stream the request names
 * (TpCommRequest.stream, an event recorded on it: the pack that filled the buffer), then
 * queues ncclSend, then records an event, which test() queries (cudaEventQuery: never
 * blocks). The runtime reads a received buffer only after test() saw that event complete,
 * so every later kernel on any stream finds the data there. The runtime's pipeline receives
 * (recv_on) are not tested: the compute stream waits for the receive's event, as a kernel
 * would, and the host runs ahead. An all-reduce or broadcast
 * returns when its event is complete (the host waits, polling under the host transport's
 * watchdog).
 *
 * A tensor group's all-reduce inside a unit (allreduce_sum_on) is queued on the unit's
 * compute stream itself, after the kernels that produced the buffer and before those that
 * read the sum: no event, no host wait (the host runs ahead, as with the kernels). Every
 * member queues the same all-reduces in the same order (the units are SPMD). A failure
 * inside it (a peer's) shows where the host next waits for the stream, which ends the job
 * through check.h; a peer that died has ended it already (MPI_Abort). */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern "C" { /* C headers */
#include "comm/comm.h"
#include "train/plan.h"
}
#include "check.h"
#include "comm_nccl.h"
#include "stream.h"

namespace {

enum GroupKind { GROUP_WORLD, GROUP_LINK, GROUP_TENSOR, GROUP_REPLICAS, GROUP_PIECES, GROUP_TIED };
const char *const group_names[] = {"world", "link", "tensor", "replicas", "pieces", "tied"};

struct Group {
  GroupKind kind;
  int n;
  int *members;    /* world ranks; NCCL rank i is members[i] (a link: sender, receiver) */
  int boundary;    /* a link's: between virtual stages j and j + 1 (not interleaved: stages) */
  bool grad;       /* a link's direction: gradients (j + 1 to j), or activations (j to j + 1) */
  int round;       /* the split that made it (world: 0) */
  ncclComm_t comm; /* NULL where this rank is not a member */
  /* Its own stream: a link's from the start (its messages), any other group's from its
   * first collective that the host waits for (--zero 1's over the replicas); NULL until
   * then. The world only parents the splits and the runtime's all-reduces run on the
   * compute streams (allreduce_sum_on), so most groups never get one: each would take one
   * of the device's few hardware queues (CUDA_DEVICE_MAX_CONNECTIONS) for nothing. */
  cudaStream_t stream;
};

struct Nccl {
  TpComm *host;
  const TpPlan *plan; /* the trainer's, which outlives the transport: the tags' layout */
  int ngroups;
  Group *groups;
  cudaEvent_t ready;   /* marks a compute stream's work for a group's stream to wait for */
  cudaEvent_t arrived; /* marks a receive on a link's stream for a compute stream to wait for */
};

/* A request's impl: an NCCL operation's event, or the host transport's request. */
struct Request {
  cudaEvent_t done; /* NULL: host */
  ncclComm_t comm;  /* the operation's, whose asynchronous errors test() polls */
  TpCommRequest host;
};

/* check.h's failure hook while a transport is open: one rank's failed CUDA or NCCL call
 * ends the whole job through the host transport (MPI_Abort), rather than leaving the other
 * ranks blocked in a collective (ncclCommSplit) until their timeout. */
TpComm *failing_host;

[[noreturn]] void abort_job(const char *what) {
  TpComm *host = failing_host;
  failing_host = NULL;
  tp_cuda_failure_hook = NULL; /* a failure inside the abort exits as usual */
  host->be->abort(host, 1, what);
  abort(); /* not reached */
}

Nccl *nccl_of(const TpComm *c) { return static_cast<Nccl *>(c->impl); }

void *xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size);
  TP_ASSERT(p);
  return p;
}

/* ---- the communicators a plan needs ---- */

bool same_members(const Group *g, const int *members, int n) {
  return g->kind != GROUP_LINK && g->n == n && !memcmp(g->members, members, (size_t)n * sizeof *members);
}

/* A collective group of one rank, or of the members of one already listed, is left out
 * (see the top). A link's boundary and direction: Group's. */
void add_group(Nccl *N, GroupKind kind, int n, const int *members, int boundary = 0, bool grad = false) {
  if (kind != GROUP_LINK && n < 2) return;
  for (int i = 0; kind != GROUP_LINK && i < N->ngroups; i++)
    if (same_members(&N->groups[i], members, n)) return;
  N->groups = static_cast<Group *>(realloc(N->groups, (size_t)(N->ngroups + 1) * sizeof *N->groups));
  TP_ASSERT(N->groups);
  Group *g = &N->groups[N->ngroups++];
  *g = Group{kind, n, static_cast<int *>(xcalloc((size_t)n, sizeof(int))), boundary, grad, 0, NULL, NULL};
  memcpy(g->members, members, (size_t)n * sizeof *members);
}

/* Whether a rank's schedule has an instruction of `kind` (of chunk `chunk`; -1: any). */
bool stage_has(const TpPlanStage *st, int kind, int chunk = -1) {
  for (int j = 0; j < st->ninsns; j++)
    if (st->insns[j].kind == kind && (chunk < 0 || st->insns[j].chunk == chunk)) return true;
  return false;
}

/* N of a plan: ABI 5's tensor (hand-written plans may leave it 0). */
int tensor_ranks(const TpPlan *P) { return P->tensor > 1 ? P->tensor : 1; }
/* V: the virtual stages of a pipeline rank (1 unless interleaved). */
int chunks_of(const TpPlan *P) { return P->chunks > 1 ? P->chunks : 1; }
/* S: the pipeline ranks of a replica, which run the plan's nstages = S * V virtual stages. */
int pipeline_ranks(const TpPlan *P) { return P->nstages / chunks_of(P); }

/* The world rank of tensor rank t of pipeline rank k < S of replica d (plan.h). */
int rank_of(const TpPlan *P, int d, int k, int t) { return (d * pipeline_ranks(P) + k) * tensor_ranks(P) + t; }

/* Whether pipeline rank k holds a trainable parameter split in `parts` pieces (0 < parts < N). */
bool stage_has_parts(const TpPlan *P, int k, int parts) {
  int S = pipeline_ranks(P);
  for (int i = 0; i < P->nparams; i++) {
    const TpPlanParam *p = &P->params[i];
    if (p->trainable && p->shard.parts == parts && (p->stage % S == k || (p->tied_stage && p->tied_stage % S == k)))
      return true;
  }
  return false;
}

/* Every group, in creation order, from the plan's schedules and parameters. The links: per
 * replica, boundary j between virtual stages j and j + 1 (pipeline ranks j % S and
 * (j + 1) % S, whose schedules hold them as chunks j / S and (j + 1) / S) and tensor rank,
 * its activations and its gradients; not interleaved, j is a stage and the list is a link
 * per direction between neighbouring stages. */
void plan_groups(Nccl *N, const TpPlan *P, int size) {
  int S = pipeline_ranks(P), D = P->dp, T = tensor_ranks(P);
  int *ranks = static_cast<int *>(xcalloc((size_t)size, sizeof(int)));
  for (int r = 0; r < size; r++) ranks[r] = r;
  add_group(N, GROUP_WORLD, size, ranks);
  for (int d = 0; d < D; d++)
    for (int j = 0; j + 1 < P->nstages; j++)
      for (int t = 0; t < T; t++) {
        int k = j % S, next = (j + 1) % S;
        int act[2] = {rank_of(P, d, k, t), rank_of(P, d, next, t)}, grad[2] = {act[1], act[0]};
        if (stage_has(&P->stages[k], TP_PLAN_SEND_ACT, j / S)) add_group(N, GROUP_LINK, 2, act, j, false);
        if (stage_has(&P->stages[next], TP_PLAN_SEND_GRAD, (j + 1) / S)) add_group(N, GROUP_LINK, 2, grad, j, true);
      }
  for (int d = 0; d < D; d++)
    for (int k = 0; k < S; k++) {
      for (int t = 0; t < T; t++) ranks[t] = rank_of(P, d, k, t);
      add_group(N, GROUP_TENSOR, T, ranks);
    }
  for (int k = 0; k < S; k++) {
    if (!stage_has(&P->stages[k], TP_PLAN_ALLREDUCE)) continue;
    for (int t = 0; t < T; t++) {
      for (int d = 0; d < D; d++) ranks[d] = rank_of(P, d, k, t);
      add_group(N, GROUP_REPLICAS, D, ranks);
    }
    /* tensor rank t holds piece t * parts / T: the T / parts ranks from piece * T / parts */
    for (int parts = 1; parts < T; parts++) {
      if (!stage_has_parts(P, k, parts)) continue;
      for (int d = 0; d < D; d++)
        for (int piece = 0; piece < parts; piece++) {
          int n = 0;
          for (int t = 0; t < T; t++)
            if (t * parts / T == piece) ranks[n++] = rank_of(P, d, k, t);
          add_group(N, GROUP_PIECES, n, ranks);
        }
    }
  }
  free(ranks);
  if (S > 1 && stage_has(&P->stages[0], TP_PLAN_ALLREDUCE_TIED)) /* the first and last virtual stages' ranks */
    for (int d = 0; d < D; d++)
      for (int t = 0; t < T; t++) {
        int pair[2] = {rank_of(P, d, 0, t), rank_of(P, d, S - 1, t)};
        add_group(N, GROUP_TIED, 2, pair);
      }
}

/* The groups after the world into split rounds: each round takes, in order, every group
 * not yet made that shares no rank with one it took already. */
void plan_rounds(Nccl *N, int size) {
  bool *taken = static_cast<bool *>(xcalloc((size_t)size, sizeof(bool)));
  for (int left = N->ngroups - 1, round = 1; left > 0; round++) {
    memset(taken, 0, (size_t)size * sizeof *taken);
    for (int i = 1; i < N->ngroups; i++) {
      Group *g = &N->groups[i];
      bool free_ranks = g->round == 0;
      for (int m = 0; m < g->n && free_ranks; m++) free_ranks = !taken[g->members[m]];
      if (!free_ranks) continue;
      g->round = round;
      for (int m = 0; m < g->n; m++) taken[g->members[m]] = true;
      left--;
    }
  }
  free(taken);
}

int index_in(const int *members, int n, int rank) {
  for (int m = 0; m < n; m++)
    if (members[m] == rank) return m;
  return -1;
}

/* The sequence of (mb, slice) of the instructions of `kind` and chunk `chunk` in a schedule
 * equals another's. */
bool same_units(const TpPlanStage *a, int kind_a, int chunk_a, const TpPlanStage *b, int kind_b, int chunk_b) {
  int i = 0, j = 0;
  for (;;) {
    while (i < a->ninsns && !(a->insns[i].kind == kind_a && a->insns[i].chunk == chunk_a)) i++;
    while (j < b->ninsns && !(b->insns[j].kind == kind_b && b->insns[j].chunk == chunk_b)) j++;
    if (i == a->ninsns || j == b->ninsns) return i == a->ninsns && j == b->ninsns;
    if (a->insns[i].mb != b->insns[j].mb || a->insns[i].slice != b->insns[j].slice) return false;
    i++, j++;
  }
}

/* Each link carries one boundary's messages of one direction: the receiver must take them in
 * the order the sender sends them. */
int check_message_order(const TpPlan *P, TpDiag *d) {
  int S = pipeline_ranks(P);
  const char *stage = chunks_of(P) > 1 ? "virtual stage" : "stage";
  for (int j = 0; j + 1 < P->nstages; j++) {
    const TpPlanStage *from = &P->stages[j % S], *to = &P->stages[(j + 1) % S];
    if (!same_units(from, TP_PLAN_SEND_ACT, j / S, to, TP_PLAN_RECV_ACT, (j + 1) / S))
      return tp_internal(d,
                         "%s %d receives its activations in another order than %s %d sends them "
                         "(NCCL matches the messages of a direction in order)",
                         stage, j + 1, stage, j);
    if (!same_units(to, TP_PLAN_SEND_GRAD, (j + 1) / S, from, TP_PLAN_RECV_GRAD, j / S))
      return tp_internal(d,
                         "%s %d receives its gradients in another order than %s %d sends them "
                         "(NCCL matches the messages of a direction in order)",
                         stage, j, stage, j + 1);
  }
  return TP_OK;
}

/* Whether two processes would share a GPU: every rank's (host name, PCI bus id of its
 * device) gathered over the host transport, compared as 64-bit hashes. */
bool shares_gpu(TpComm *host) {
  int device = 0;
  char id[256] = "";
  TP_CUDA_CHECK(cudaGetDevice(&device));
  if (gethostname(id, 128) != 0) snprintf(id, 128, "?");
  id[127] = 0;
  size_t at = strlen(id) + 1;
  TP_CUDA_CHECK(cudaDeviceGetPCIBusId(id + at, (int)(sizeof id - at), device));
  uint64_t hash = 14695981039346656037u; /* FNV-1a over both strings */
  for (size_t i = 0; i < at + strlen(id + at); i++) hash = (hash ^ (unsigned char)id[i]) * 1099511628211u;
  int64_t *keys = static_cast<int64_t *>(xcalloc((size_t)host->size, sizeof(int64_t)));
  int *all = static_cast<int *>(xcalloc((size_t)host->size, sizeof(int)));
  for (int r = 0; r < host->size; r++) all[r] = r;
  keys[host->rank] = (int64_t)(hash >> 1); /* every rank's key in its own slot: the sum is a gather */
  tp_comm_allreduce_sum(host, keys, (size_t)host->size, TP_I64, all, host->size);
  bool shared = false;
  for (int i = 0; i < host->size && !shared; i++)
    for (int j = 0; j < i && !shared; j++) shared = keys[i] == keys[j];
  free(keys);
  free(all);
  return shared;
}

/* One byte over every link and an all-reduce of a byte over every other group of this
 * rank but the world, all at once: NCCL connects a pair on its first message (the host
 * waiting for the peer's side) and a collective's members on its first use, which is
 * better done here than mid-schedule, and a group that cannot work fails at start-up. */
void warm_up(Nccl *N) {
  void *bytes = NULL;
  TP_CUDA_ALLOC(cudaMalloc(&bytes, 3));
  char *byte = static_cast<char *>(bytes);
  cudaStream_t spare; /* for the groups without a stream of their own */
  TP_CUDA_CHECK(cudaStreamCreateWithFlags(&spare, cudaStreamNonBlocking));
  TP_NCCL_CHECK(ncclGroupStart());
  for (int i = 1; i < N->ngroups; i++) {
    Group *g = &N->groups[i];
    cudaStream_t s = g->stream ? g->stream : spare;
    if (!g->comm) continue;
    if (g->kind != GROUP_LINK) TP_NCCL_CHECK(ncclAllReduce(byte + 2, byte + 2, 1, ncclInt8, ncclSum, g->comm, s));
    else if (g->members[0] == N->host->rank) TP_NCCL_CHECK(ncclSend(byte, 1, ncclInt8, 1, g->comm, s));
    else TP_NCCL_CHECK(ncclRecv(byte + 1, 1, ncclInt8, 0, g->comm, s));
  }
  TP_NCCL_CHECK(ncclGroupEnd());
  for (int i = 1; i < N->ngroups; i++)
    if (N->groups[i].stream) TP_CUDA_WAIT(cudaStreamSynchronize(N->groups[i].stream));
  TP_CUDA_WAIT(cudaStreamSynchronize(spare));
  TP_CUDA_CHECK(cudaStreamDestroy(spare));
  TP_CUDA_CHECK(cudaFree(bytes));
}

/* The world from rank 0's unique id, then every other group, round by round. */
void create_groups(Nccl *N) {
  TpComm *host = N->host;
  Group *world = &N->groups[0];
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  if (host->rank == 0) TP_NCCL_CHECK(ncclGetUniqueId(&id));
  tp_comm_broadcast(host, &id, sizeof id, 0, world->members, world->n);
  TP_NCCL_CHECK(ncclCommInitRank(&world->comm, world->n, id, host->rank));
  int rounds = 0;
  for (int i = 1; i < N->ngroups; i++)
    if (N->groups[i].round > rounds) rounds = N->groups[i].round;
  for (int round = 1; round <= rounds; round++) {
    Group *mine = NULL; /* the group of this round with this rank, if any: color = its index */
    int color = NCCL_SPLIT_NOCOLOR, key = 0;
    for (int i = 1; i < N->ngroups; i++) {
      Group *g = &N->groups[i];
      int at = index_in(g->members, g->n, host->rank);
      if (g->round == round && at >= 0) mine = g, color = i, key = at;
    }
    ncclComm_t comm = NULL;
    TP_NCCL_CHECK(ncclCommSplit(world->comm, color, key, &comm, NULL));
    if (mine) mine->comm = comm;
  }
  for (int i = 0; i < N->ngroups; i++)
    if (N->groups[i].comm && N->groups[i].kind == GROUP_LINK)
      TP_CUDA_CHECK(cudaStreamCreateWithFlags(&N->groups[i].stream, cudaStreamNonBlocking));
  warm_up(N);
}

/* ---- the backend ---- */

bool on_device(const void *p) {
  if (!p) return false;
  cudaPointerAttributes a;
  TP_CUDA_CHECK(cudaPointerGetAttributes(&a, p));
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

/* printf into out[*at..size), never past its end. */
__attribute__((format(printf, 4, 5))) void append(char *out, size_t size, size_t *at, const char *fmt, ...) {
  if (*at >= size) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(out + *at, size - *at, fmt, ap);
  va_end(ap);
  *at = n < 0 ? size : *at + (size_t)n;
}

/* The link of a message from `from` to `to` under `tag`; none is an internal error ending
 * the job. Not interleaved, the pair names it (one link per direction: the tag is ignored,
 * as NCCL has none); interleaved, a pair carries several boundaries, and the tag's chunk
 * and direction pick one (plan.h's tp_plan_message_tag). */
Group *link_group(TpComm *c, int from, int to, int tag) {
  Nccl *N = nccl_of(c);
  const TpPlan *P = N->plan;
  bool interleaved = chunks_of(P) > 1;
  int chunk = interleaved ? tp_plan_tag_chunk(P, tag) : 0, grad = interleaved && tp_plan_tag_grad(tag);
  for (int i = 0; i < N->ngroups; i++) {
    Group *g = &N->groups[i];
    if (g->kind == GROUP_LINK && g->members[0] == from && g->members[1] == to &&
        (!interleaved || (g->boundary / pipeline_ranks(P) == chunk && g->grad == grad)))
      return g;
  }
  tp_comm_abort(c, TP_ERR_INTERNAL,
                "internal error: no NCCL communicator for messages from rank %d to rank %d (tag %d) "
                "was created at start-up (the plan's schedules send none)",
                from, to, tag);
}

/* The communicator of a collective over `group` (ascending world ranks); likewise. */
Group *collective_group(TpComm *c, const int *group, int n, const char *what) {
  Nccl *N = nccl_of(c);
  TP_ASSERT(index_in(group, n, c->rank) >= 0);
  for (int i = 0; i < N->ngroups; i++)
    if (same_members(&N->groups[i], group, n)) return &N->groups[i];
  char ranks[256] = "";
  size_t at = 0;
  for (int i = 0; i < n; i++) append(ranks, sizeof ranks, &at, "%s%d", i ? ", " : "", group[i]);
  tp_comm_abort(c, TP_ERR_INTERNAL,
                "internal error: no NCCL communicator for %s over ranks {%s} was created at "
                "start-up (the plan's schedules use none)",
                what, ranks);
}

Request *new_request(TpCommRequest *r, int peer) {
  Request *q = static_cast<Request *>(xcalloc(1, sizeof *q));
  q->host.what = r->what;
  r->impl = q;
  r->peer = peer;
  return q;
}

/* g's stream waits for the work queued so far on a compute stream (NULL: nothing). */
void wait_for_stream(Nccl *N, Group *g, TpStream *s) {
  if (!s) return;
  TP_CUDA_CHECK(cudaEventRecord(N->ready, s->cuda));
  TP_CUDA_CHECK(cudaStreamWaitEvent(g->stream, N->ready, 0));
}

void record_done(Request *q, Group *g) {
  q->comm = g->comm;
  TP_CUDA_CHECK(cudaEventCreateWithFlags(&q->done, cudaEventDisableTiming));
  TP_CUDA_CHECK(cudaEventRecord(q->done, g->stream));
}

bool nccl_test(TpComm *c, TpCommRequest *r) {
  Request *q = static_cast<Request *>(r->impl);
  if (!q) return true;
  if (q->done) {
    cudaError_t err = cudaEventQuery(q->done);
    if (err == cudaErrorNotReady) {
      /* a peer's failure (or a broken link) shows here with NCCL's reason, rather than as
       * the waiting's timeout */
      ncclResult_t async = ncclSuccess;
      TP_NCCL_CHECK(ncclCommGetAsyncError(q->comm, &async));
      if (async != ncclSuccess && async != ncclInProgress) {
        char msg[512];
        tp_comm_abort(c, TP_ERR_INTERNAL, "NCCL failed waiting for %s: %s", r->what ? r->what : "a message",
                      tp_nccl_message(async, msg, sizeof msg));
      }
      return false;
    }
    TP_CUDA_CHECK(err);
    TP_CUDA_CHECK(cudaEventDestroy(q->done));
  } else {
    TpComm *host = nccl_of(c)->host;
    if (!host->be->test(host, &q->host)) return false;
  }
  free(q);
  r->impl = NULL;
  return true;
}

/* g's stream, made on first use (Group.stream). */
cudaStream_t stream_of(Group *g) {
  if (!g->stream) TP_CUDA_CHECK(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
  return g->stream;
}

/* Queues the operation's end on g's stream and waits for it (a collective's return). */
void finish(TpComm *c, Group *g, const char *what) {
  TpCommRequest r = {NULL, -1, what, NULL};
  record_done(new_request(&r, -1), g);
  tp_comm_wait(c, &r);
}

void nccl_finalize(TpComm *c) {
  Nccl *N = nccl_of(c);
  for (int i = N->ngroups - 1; i >= 0; i--) {
    Group *g = &N->groups[i];
    if (g->stream) {
      TP_CUDA_WAIT(cudaStreamSynchronize(g->stream));
      TP_CUDA_CHECK(cudaStreamDestroy(g->stream));
    }
    if (g->comm) TP_NCCL_CHECK(ncclCommDestroy(g->comm));
    free(g->members);
  }
  TP_CUDA_CHECK(cudaEventDestroy(N->ready));
  TP_CUDA_CHECK(cudaEventDestroy(N->arrived));
  failing_host = NULL; /* the host transport may close after this */
  tp_cuda_failure_hook = NULL;
  free(N->groups);
  free(N);
  c->impl = NULL;
}

void nccl_isend(TpComm *c, const void *buf, size_t bytes, int peer, int tag, TpCommRequest *r) {
  Nccl *N = nccl_of(c);
  Request *q = new_request(r, peer);
  if (!on_device(buf)) {
    N->host->be->isend(N->host, buf, bytes, peer, tag, &q->host);
    return;
  }
  Group *g = link_group(c, c->rank, peer, tag);
  wait_for_stream(N, g, r->stream);
  TP_NCCL_CHECK(ncclSend(buf, bytes, ncclInt8, 1, g->comm, g->stream));
  record_done(q, g);
}

void nccl_irecv(TpComm *c, void *buf, size_t bytes, int peer, int tag, TpCommRequest *r) {
  Nccl *N = nccl_of(c);
  Request *q = new_request(r, peer);
  if (!on_device(buf)) {
    N->host->be->irecv(N->host, buf, bytes, peer, tag, &q->host);
    return;
  }
  Group *g = link_group(c, peer, c->rank, tag);
  wait_for_stream(N, g, r->stream);
  TP_NCCL_CHECK(ncclRecv(buf, bytes, ncclInt8, 0, g->comm, g->stream));
  record_done(q, g);
}

/* On the link's stream, and the compute stream waits for it there (an event, no host wait):
 * its later kernels, the message's unpack first, run once it arrived. The buffer is the
 * receiver's own for the step (messages.c), so the receive need not wait for the compute
 * stream's earlier work. */
void nccl_recv_on(TpComm *c, void *buf, size_t bytes, int peer, int tag, TpStream *stream) {
  /* the tag picks the link (interleaved plans); on it, NCCL matches the messages in order
   * (checked at start-up) */
  Nccl *N = nccl_of(c);
  TP_ASSERT(on_device(buf));
  Group *g = link_group(c, peer, c->rank, tag);
  TP_NCCL_CHECK(ncclRecv(buf, bytes, ncclInt8, 0, g->comm, g->stream));
  TP_CUDA_CHECK(cudaEventRecord(N->arrived, g->stream));
  TP_CUDA_CHECK(cudaStreamWaitEvent(stream->cuda, N->arrived, 0));
}

ncclDataType_t nccl_type(TpDType t) {
  switch (t) {
  case TP_F32: return ncclFloat32;
  case TP_F64: return ncclFloat64;
  case TP_I64: return ncclInt64;
  default: TP_ASSERT(!"a collective of an unsupported dtype");
  }
  return ncclInt8;
}

/* A group of one rank has nothing to sum or send (and no communicator: add_group). */
void nccl_allreduce_sum(TpComm *c, void *buf, size_t count, TpDType dtype, const int *group, int n) {
  Nccl *N = nccl_of(c);
  if (!on_device(buf)) {
    N->host->be->allreduce_sum(N->host, buf, count, dtype, group, n);
    return;
  }
  if (n < 2) return;
  Group *g = collective_group(c, group, n, "an all-reduce");
  TP_NCCL_CHECK(ncclAllReduce(buf, buf, count, nccl_type(dtype), ncclSum, g->comm, stream_of(g)));
  finish(c, g, "an all-reduce");
}

/* On the compute stream itself (see the top); host memory: the stream's work first, then
 * the host transport's sum, as a caller of a transport without allreduce_sum_on does. */
void nccl_allreduce_sum_on(TpComm *c, void *buf, size_t count, TpDType dtype, const int *group, int n,
                           TpStream *stream) {
  Nccl *N = nccl_of(c);
  if (!on_device(buf)) {
    TP_CUDA_WAIT(cudaStreamSynchronize(stream->cuda));
    N->host->be->allreduce_sum(N->host, buf, count, dtype, group, n);
    return;
  }
  if (n < 2) return;
  Group *g = collective_group(c, group, n, "an all-reduce");
  TP_NCCL_CHECK(ncclAllReduce(buf, buf, count, nccl_type(dtype), ncclSum, g->comm, stream->cuda));
}

void nccl_broadcast(TpComm *c, void *buf, size_t bytes, int root, const int *group, int n) {
  Nccl *N = nccl_of(c);
  if (!on_device(buf)) {
    N->host->be->broadcast(N->host, buf, bytes, root, group, n);
    return;
  }
  if (n < 2) return;
  Group *g = collective_group(c, group, n, "a broadcast");
  int at = index_in(g->members, g->n, root);
  TP_ASSERT(at >= 0);
  TP_NCCL_CHECK(ncclBroadcast(buf, buf, bytes, ncclInt8, at, g->comm, stream_of(g)));
  finish(c, g, "a broadcast");
}

/* --zero 1's shards are cut on the gradient norm's pieces, so they differ in size by up to a
 * piece: ncclReduceScatter and ncclAllGather take equal ones. Each segment is instead an
 * ncclReduce to its member and an ncclBroadcast from it, all of a collective in one NCCL
 * group (the same traffic as a ring's reduce-scatter or all-gather). */
void nccl_reduce_scatter_sum(TpComm *c, void *buf, const size_t *counts, TpDType dtype, const int *group, int n) {
  Nccl *N = nccl_of(c);
  if (!on_device(buf)) {
    N->host->be->reduce_scatter_sum(N->host, buf, counts, dtype, group, n);
    return;
  }
  if (n < 2) return;
  Group *g = collective_group(c, group, n, "a reduce-scatter");
  char *at = static_cast<char *>(buf);
  TP_NCCL_CHECK(ncclGroupStart());
  for (int i = 0; i < n; i++) {
    TP_NCCL_CHECK(ncclReduce(at, at, counts[i], nccl_type(dtype), ncclSum, i, g->comm, stream_of(g)));
    at += counts[i] * tp_dtype_size(dtype);
  }
  TP_NCCL_CHECK(ncclGroupEnd());
  finish(c, g, "a reduce-scatter");
}

void nccl_all_gather(TpComm *c, void *buf, const size_t *counts, TpDType dtype, const int *group, int n) {
  Nccl *N = nccl_of(c);
  if (!on_device(buf)) {
    N->host->be->all_gather(N->host, buf, counts, dtype, group, n);
    return;
  }
  if (n < 2) return;
  Group *g = collective_group(c, group, n, "an all-gather");
  char *at = static_cast<char *>(buf);
  TP_NCCL_CHECK(ncclGroupStart());
  for (int i = 0; i < n; i++) {
    size_t bytes = counts[i] * tp_dtype_size(dtype);
    TP_NCCL_CHECK(ncclBroadcast(at, at, bytes, ncclInt8, i, g->comm, stream_of(g)));
    at += bytes;
  }
  TP_NCCL_CHECK(ncclGroupEnd());
  finish(c, g, "an all-gather");
}

void nccl_barrier(TpComm *c) { tp_comm_barrier(nccl_of(c)->host); }

[[noreturn]] void nccl_abort(TpComm *c, int code, const char *msg) {
  TpComm *host = nccl_of(c)->host;
  host->be->abort(host, code, msg);
  abort(); /* not reached */
}

const TpCommBackend tp_comm_nccl = {
    "nccl",
    true, /* device_memory */
    nccl_finalize,
    nccl_isend,
    nccl_irecv,
    nccl_test,
    nccl_allreduce_sum,
    nccl_allreduce_sum_on,
    nccl_recv_on,
    nccl_broadcast,
    nccl_reduce_scatter_sum,
    nccl_all_gather,
    nccl_barrier,
    nccl_abort,
};

} // namespace

extern "C" int tp_cuda_comm_open(TpComm *host, TpCompute *compute, const TpPlan *plan, TpComm **out, TpDiag *d) {
  (void)compute; /* the GPU is the current device: open_compute chose it */
  *out = NULL;
  if (host->size == 1 || !plan->stages || host->size != pipeline_ranks(plan) * plan->dp * tensor_ranks(plan))
    return TP_OK;
  int rc = check_message_order(plan, d);
  if (rc) return rc;
  if (shares_gpu(host)) {
    if (host->rank == 0)
      fprintf(stderr,
              "%s: note: processes share a GPU, which NCCL does not allow: messages go through %s with "
              "host copies\n",
              host->tool, host->be->name);
    return TP_OK;
  }
  failing_host = host;
  tp_cuda_failure_hook = abort_job;
  Nccl *N = static_cast<Nccl *>(xcalloc(1, sizeof *N));
  N->host = host;
  N->plan = plan;
  plan_groups(N, plan, host->size);
  plan_rounds(N, host->size);
  create_groups(N);
  TP_CUDA_CHECK(cudaEventCreateWithFlags(&N->ready, cudaEventDisableTiming));
  TP_CUDA_CHECK(cudaEventCreateWithFlags(&N->arrived, cudaEventDisableTiming));
  TpComm *c = static_cast<TpComm *>(xcalloc(1, sizeof *c));
  *c = TpComm{&tp_comm_nccl, host->tool, host->rank, host->size, host->timeout_s, N, nullptr, 0};
  *out = c;
  return TP_OK;
}

extern "C" void tp_cuda_comm_describe(const TpComm *c, char *out, size_t size) {
  const Nccl *N = nccl_of(c);
  size_t at = 0;
  out[0] = 0;
  for (int i = 0; i < N->ngroups; i++) {
    const Group *g = &N->groups[i];
    if (g->round) append(out, size, &at, "round %d: ", g->round);
    append(out, size, &at, "%s", group_names[g->kind]);
    for (int m = 0; m < g->n; m++) append(out, size, &at, " %d", g->members[m]);
    if (g->kind == GROUP_LINK && chunks_of(N->plan) > 1) /* which of the pair's boundaries */
      append(out, size, &at, " (%s %d)", g->grad ? "gradients" : "activations", g->boundary);
    append(out, size, &at, "%s%s\n", g->comm ? " *" : "", g->comm && g->stream ? " stream" : "");
  }
}
