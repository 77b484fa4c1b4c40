/* The NCCL transport (runtime/cuda/comm_nccl.cu) on the emulated NCCL (NCCL calls run on
 * MPI, emulate/nccl_emu.h), as `test_cuda_nccl MODE [STAGES [TENSOR]]` under mpirun -np P
 * (nccl.sh runs each case): a plan of STAGES stages x TENSOR tensor ranks (default 1) x
 * P / (STAGES x TENSOR) replicas, its ranks in plan.h's layout (rank (d * S + k) * N + t).
 * Each process takes GPU local_rank % devices, as the CUDA backend's open_compute does
 * (TOKPIPE_CUDA_EMULATE_DEVICES: the devices per node).
 *   p2p        messages of 0, 1, 4093 and 2^20 bytes in device memory between
 *              neighbouring stages (tensor rank t to tensor rank t), both directions at once
 *              (a single communicator would deadlock on NCCL), received under other tags
 *              than sent (NCCL has none, so only NCCL delivers them); receives posted before
 *              their sends, test() returns false, without blocking, for a receive whose
 *              send is not posted yet; host buffers through the same transport (they go by
 *              the host transport)
 *   allreduce  all-reduces of f32, f64 and int64 device buffers over each replicas group
 *              and tied pair equal to the host transport's sums (the same bits for two
 *              ranks; NCCL's order of addition is its own, so within 1e-6 relative for
 *              more), broadcasts, and host memory
 *   tensor     all-reduces over each tensor group on the compute stream (allreduce_sum_on):
 *              after the work queued before them there (a copy, a kernel), before the
 *              kernel queued after, which reads the sum; the host does not wait (rank 0's
 *              all-reduce is still pending while the others have not started theirs); equal
 *              to the host transport's sum as above; host memory: the host transport's
 *   order      the communicators and their creation order for the plan (the same list on
 *              every rank); a plan whose receiver takes messages in another order than the
 *              sender sends them: an internal error
 *   interleaved  (2 pipeline ranks x 2 virtual stages each x P / 2 replicas) a link per
 *              virtual boundary and direction, in plan order (the same list on every
 *              rank); messages of every boundary, of a size of their own, received in the
 *              reverse order of their sends, arrive whole: the tag picks the boundary's link
 *              (on one link per pair of ranks NCCL would match them in posting order); a
 *              receiver taking one boundary's messages in another order than its sender
 *              sends them: an internal error naming the virtual stages
 *   fallback   the transport is the host's (NULL): one process, or ranks sharing a GPU
 *              (a note from rank 0 then)
 *   missing    an all-reduce over a group the plan never uses: one internal error line,
 *              the job ends */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "comm/comm.h"
#include "train/plan.h"
}
#include "cuda/check.h"
#include "cuda/comm_nccl.h"
#include "cuda/stream.h"
#include "../comm/expect.h"

/* ---- a plan's schedules (GPipe, one slice) and parameters: what the transport reads ---- */

struct TestPlan {
  TpPlan plan;
  TpPlanStage *stages;
  TpPlanInsn *insns;
  TpPlanParam params[2];
};

/* S stages x N tensor ranks x D replicas, M microbatches; `parts`: a trainable parameter
 * of stage 0 split in that many pieces (0: none), which makes stage 0 ALLREDUCE. */
static void make_plan(TestPlan *t, int S, int N, int D, int M, bool tied, const int *parts = NULL, int nparts = 0) {
  memset(t, 0, sizeof *t);
  t->stages = static_cast<TpPlanStage *>(calloc((size_t)S, sizeof *t->stages));
  t->insns = static_cast<TpPlanInsn *>(calloc((size_t)S * (6 * M + 3), sizeof *t->insns));
  TpPlanInsn *x = t->insns;
  for (int k = 0; k < S; k++) {
    t->stages[k].insns = x;
    for (int mb = 0; mb < M; mb++) {
      if (k > 0) *x++ = {TP_PLAN_RECV_ACT, mb, 0, k - 1, 0};
      *x++ = {TP_PLAN_FORWARD, mb, 0, -1, 0};
      if (k + 1 < S) *x++ = {TP_PLAN_SEND_ACT, mb, 0, k + 1, 0};
    }
    for (int mb = M - 1; mb >= 0; mb--) {
      if (k + 1 < S) *x++ = {TP_PLAN_RECV_GRAD, mb, 0, k + 1, 0};
      *x++ = {TP_PLAN_BACKWARD, mb, 0, -1, 0};
      if (k > 0) *x++ = {TP_PLAN_SEND_GRAD, mb, 0, k - 1, 0};
    }
    if (tied && S > 1 && (k == 0 || k == S - 1)) *x++ = {TP_PLAN_ALLREDUCE_TIED, -1, -1, k == 0 ? S - 1 : 0, 0};
    if (D > 1 || (k == 0 && nparts)) *x++ = {TP_PLAN_ALLREDUCE, -1, -1, -1, 0};
    *x++ = {TP_PLAN_OPTIMIZER_STEP, -1, -1, -1, 0};
    t->stages[k].ninsns = (int)(x - t->stages[k].insns);
  }
  for (int i = 0; i < nparts; i++) {
    TpPlanParam *p = &t->params[i];
    p->name = p->source = i ? "w1" : "w0";
    p->rank = 1, p->dims[0] = 8, p->trainable = 1;
    p->shard = {0, parts[i], 1};
  }
  t->plan.abi = TP_PLAN_ABI;
  t->plan.nstages = S;
  t->plan.dp = D;
  t->plan.tensor = N;
  t->plan.microbatches = M;
  t->plan.nslices = 1;
  t->plan.stages = t->stages;
  t->plan.nparams = nparts;
  t->plan.params = t->params;
}

/* An interleaved plan: S ranks x V virtual stages (rank k runs k, k + S, ...) x D
 * replicas, M microbatches, one slice, GPipe per virtual stage in chunk order (forwards of
 * chunks 0..V-1, then backwards of V-1..0), tied first and last virtual stages. */
static void make_interleaved_plan(TestPlan *t, int S, int V, int D, int M) {
  memset(t, 0, sizeof *t);
  int J = S * V;
  t->stages = static_cast<TpPlanStage *>(calloc((size_t)J, sizeof *t->stages));
  t->insns = static_cast<TpPlanInsn *>(calloc((size_t)S * (6 * M * V + 3), sizeof *t->insns));
  TpPlanInsn *x = t->insns;
  for (int k = 0; k < S; k++) {
    t->stages[k].insns = x;
    for (int c = 0; c < V; c++)
      for (int mb = 0, j = c * S + k; mb < M; mb++) {
        if (j > 0) *x++ = {TP_PLAN_RECV_ACT, mb, 0, j - 1, c};
        *x++ = {TP_PLAN_FORWARD, mb, 0, -1, c};
        if (j + 1 < J) *x++ = {TP_PLAN_SEND_ACT, mb, 0, j + 1, c};
      }
    for (int c = V - 1; c >= 0; c--)
      for (int mb = M - 1, j = c * S + k; mb >= 0; mb--) {
        if (j + 1 < J) *x++ = {TP_PLAN_RECV_GRAD, mb, 0, j + 1, c};
        *x++ = {TP_PLAN_BACKWARD, mb, 0, -1, c};
        if (j > 0) *x++ = {TP_PLAN_SEND_GRAD, mb, 0, j - 1, c};
      }
    if (k == 0 || k == S - 1) *x++ = {TP_PLAN_ALLREDUCE_TIED, -1, -1, k == 0 ? J - 1 : 0, k == 0 ? 0 : V - 1};
    if (D > 1) *x++ = {TP_PLAN_ALLREDUCE, -1, -1, -1, 0};
    *x++ = {TP_PLAN_OPTIMIZER_STEP, -1, -1, -1, 0};
    t->stages[k].ninsns = (int)(x - t->stages[k].insns);
  }
  t->plan.abi = TP_PLAN_ABI;
  t->plan.nstages = J;
  t->plan.chunks = V;
  t->plan.dp = D;
  t->plan.tensor = 1;
  t->plan.microbatches = M;
  t->plan.nslices = 1;
  t->plan.stages = t->stages;
}

static void free_plan(TestPlan *t) {
  free(t->stages);
  free(t->insns);
}

/* ---- helpers ---- */

static void pick_gpu(void) {
  int count = 0;
  TP_CUDA_CHECK(cudaGetDeviceCount(&count));
  const char *local = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  TP_CUDA_CHECK(cudaSetDevice((local ? atoi(local) : 0) % count));
}

static TpComm *open_nccl(TpComm *host, const TpPlan *plan) {
  TpDiag d;
  tp_diag_init(&d, "test_cuda_nccl", NULL, stderr);
  TpComm *c = NULL;
  if (tp_cuda_comm_open(host, NULL, plan, &c, &d) != TP_OK || !c) {
    fprintf(stderr, "rank %d: no NCCL transport\n", host->rank);
    exit(1);
  }
  return c;
}

static void *device_alloc(size_t bytes) {
  void *p = NULL;
  TP_CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 1));
  return p;
}

static unsigned char byte_of(int rank, int dir, size_t i) { return (unsigned char)(rank * 37 + dir * 101 + i * 7); }

/* ---- p2p ---- */

static void p2p(TpComm *host, int S, int N) {
  TestPlan tp;
  make_plan(&tp, S, N, host->size / (S * N), 1, false);
  TpComm *c = open_nccl(host, &tp.plan);
  TpStream *stream = tp_cuda_stream_new();
  /* the same tensor rank of the neighbouring stages of this replica */
  int k = c->rank, stage = c->rank / N % S, prev = stage > 0 ? k - N : -1, next = stage + 1 < S ? k + N : -1;
  const size_t sizes[] = {0, 1, 4093, (size_t)1 << 20};
  for (size_t z = 0; z < sizeof sizes / sizeof *sizes; z++) {
    size_t n = sizes[z];
    unsigned char *host_buf = static_cast<unsigned char *>(malloc(n + 1));
    void *act_out = device_alloc(n), *act_in = device_alloc(n), *grad_out = device_alloc(n),
         *grad_in = device_alloc(n);
    TpCommRequest ra = {NULL, -1, "activation", NULL}, rg = {NULL, -1, "gradient", NULL};
    TpCommRequest sa = {NULL, -1, "activation sent", stream}, sg = {NULL, -1, "gradient sent", stream};
    /* the receives first; nothing is sent before every rank checked that they are pending.
     * Their tags differ from the sends': NCCL has none (it matches a direction's messages in
     * order), so only device buffers that went through NCCL arrive; MPI would wait. */
    if (prev >= 0) c->be->irecv(c, act_in, n, prev, 7, &ra);
    if (next >= 0) c->be->irecv(c, grad_in, n, next, 8, &rg);
    if (prev >= 0) EXPECT(c, !c->be->test(c, &ra) && ra.impl);
    if (next >= 0) EXPECT(c, !c->be->test(c, &rg) && rg.impl);
    tp_comm_barrier(c);
    for (size_t i = 0; i < n; i++) host_buf[i] = byte_of(k, 0, i);
    TP_CUDA_CHECK(cudaMemcpyAsync(act_out, host_buf, n, cudaMemcpyHostToDevice, stream->cuda));
    for (size_t i = 0; i < n; i++) host_buf[i] = byte_of(k, 1, i);
    TP_CUDA_CHECK(cudaMemcpy(grad_out, host_buf, n, cudaMemcpyHostToDevice));
    /* both directions at once: the activation out, then the gradient back */
    if (next >= 0) c->be->isend(c, act_out, n, next, 0, &sa);
    if (prev >= 0) c->be->isend(c, grad_out, n, prev, 1, &sg);
    TpCommRequest *all[] = {&ra, &rg, &sa, &sg};
    for (TpCommRequest *r : all)
      if (r->impl) tp_comm_wait(c, r);
    size_t bad = 0;
    if (prev >= 0) {
      TP_CUDA_CHECK(cudaMemcpy(host_buf, act_in, n, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < n; i++) bad += host_buf[i] != byte_of(prev, 0, i);
    }
    if (next >= 0) {
      TP_CUDA_CHECK(cudaMemcpy(host_buf, grad_in, n, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < n; i++) bad += host_buf[i] != byte_of(next, 1, i);
    }
    if (bad) fprintf(stderr, "rank %d: %zu of %zu bytes differ\n", k, bad, n);
    EXPECT(c, bad == 0);
    /* host memory through the same transport: the host transport carries it */
    if (next >= 0) {
      for (size_t i = 0; i < n; i++) host_buf[i] = byte_of(k, 2, i);
      tp_comm_send(c, host_buf, n, next, 2, "a host buffer");
    }
    if (prev >= 0) {
      tp_comm_recv(c, host_buf, n, prev, 2, "a host buffer");
      for (size_t i = 0; i < n; i++) bad += host_buf[i] != byte_of(prev, 2, i);
      EXPECT(c, bad == 0);
    }
    void *bufs[] = {act_out, act_in, grad_out, grad_in};
    for (void *b : bufs) TP_CUDA_CHECK(cudaFree(b));
    free(host_buf);
  }
  tp_cuda_stream_free(stream);
  tp_comm_close(c);
  free_plan(&tp);
}

/* ---- collectives ---- */

/* An all-reduce and a broadcast over `group` through the NCCL transport c, against the
 * host transport's. */
static void reduce_group(TpComm *c, TpComm *host, const int *group, int n) {
  enum { COUNT = 1000 };
  size_t bytes = COUNT * sizeof(float);
  float *x = static_cast<float *>(malloc(bytes)), *want = static_cast<float *>(malloc(bytes));
  float *dev = static_cast<float *>(device_alloc(bytes));
  for (size_t i = 0; i < COUNT; i++) x[i] = want[i] = value_f32(c->rank, i);
  tp_comm_allreduce_sum(host, want, COUNT, TP_F32, group, n); /* the sum in group order */
  TP_CUDA_CHECK(cudaMemcpy(dev, x, bytes, cudaMemcpyHostToDevice));
  tp_comm_allreduce_sum(c, dev, COUNT, TP_F32, group, n);
  TP_CUDA_CHECK(cudaMemcpy(x, dev, bytes, cudaMemcpyDeviceToHost));
  if (n == 2) {
    EXPECT(c, memcmp(x, want, bytes) == 0); /* a + b == b + a: the same bits */
  } else {
    double worst = 0;
    for (size_t i = 0; i < COUNT; i++) {
      double err = fabs((double)x[i] - want[i]) / fabs((double)want[i]);
      if (err > worst) worst = err;
    }
    if (worst > 1e-6) fprintf(stderr, "rank %d: all-reduce over %d ranks: rel_err=%.3g\n", c->rank, n, worst);
    EXPECT(c, worst <= 1e-6);
  }
  double y[3] = {c->rank * 0.1, 1.0 / (c->rank + 7), -2.5}, ywant[3];
  int64_t z[2] = {c->rank, (int64_t)1 << 40}, zwant[2];
  memcpy(ywant, y, sizeof y), memcpy(zwant, z, sizeof z);
  tp_comm_allreduce_sum(host, ywant, 3, TP_F64, group, n);
  tp_comm_allreduce_sum(host, zwant, 2, TP_I64, group, n);
  void *dy = device_alloc(sizeof y), *dz = device_alloc(sizeof z);
  TP_CUDA_CHECK(cudaMemcpy(dy, y, sizeof y, cudaMemcpyHostToDevice));
  TP_CUDA_CHECK(cudaMemcpy(dz, z, sizeof z, cudaMemcpyHostToDevice));
  tp_comm_allreduce_sum(c, dy, 3, TP_F64, group, n);
  tp_comm_allreduce_sum(c, dz, 2, TP_I64, group, n);
  TP_CUDA_CHECK(cudaMemcpy(y, dy, sizeof y, cudaMemcpyDeviceToHost));
  TP_CUDA_CHECK(cudaMemcpy(z, dz, sizeof z, cudaMemcpyDeviceToHost));
  for (int i = 0; i < 3; i++) EXPECT(c, fabs(y[i] - ywant[i]) <= 1e-15 * fabs(ywant[i]));
  EXPECT(c, z[0] == zwant[0] && z[1] == zwant[1]);
  /* host memory through the NCCL transport: the host transport's sum, bit for bit */
  double h[3] = {c->rank * 0.1, 1.0 / (c->rank + 7), -2.5};
  tp_comm_allreduce_sum(c, h, 3, TP_F64, group, n);
  EXPECT(c, memcmp(h, ywant, sizeof h) == 0);
  /* a broadcast from the group's last rank */
  for (size_t i = 0; i < COUNT; i++) x[i] = value_f32(c->rank, i);
  TP_CUDA_CHECK(cudaMemcpy(dev, x, bytes, cudaMemcpyHostToDevice));
  tp_comm_broadcast(c, dev, bytes, group[n - 1], group, n);
  TP_CUDA_CHECK(cudaMemcpy(x, dev, bytes, cudaMemcpyDeviceToHost));
  size_t bad = 0;
  for (size_t i = 0; i < COUNT; i++) bad += x[i] != value_f32(group[n - 1], i);
  EXPECT(c, bad == 0);
  void *bufs[] = {dev, dy, dz};
  for (void *b : bufs) TP_CUDA_CHECK(cudaFree(b));
  free(x), free(want);
}

static void allreduce(TpComm *host, int S, int N) {
  int D = host->size / (S * N);
  TestPlan tp;
  make_plan(&tp, S, N, D, 2, true);
  TpComm *c = open_nccl(host, &tp.plan);
  int t = c->rank % N, k = c->rank / N % S, d = c->rank / (N * S);
  if (D > 1) { /* the stage's replicas at this tensor rank, as collectives.c's ALLREDUCE */
    int *group = static_cast<int *>(calloc((size_t)D, sizeof(int)));
    for (int r = 0; r < D; r++) group[r] = (r * S + k) * N + t;
    reduce_group(c, host, group, D);
    free(group);
  }
  if (S > 1 && (k == 0 || k == S - 1)) { /* the tied pair, as ALLREDUCE_TIED */
    int pair[2] = {d * S * N + t, (d * S + S - 1) * N + t};
    reduce_group(c, host, pair, 2);
  }
  tp_comm_close(c);
  free_plan(&tp);
}

/* ---- tensor groups: all-reduces on the compute stream ---- */

static void tensor(TpComm *host, int S, int N) {
  TestPlan tp;
  make_plan(&tp, S, N, host->size / (S * N), 1, false);
  TpComm *c = open_nccl(host, &tp.plan);
  EXPECT(c, c->be->allreduce_sum_on != NULL);
  int first = c->rank - c->rank % N, *group = static_cast<int *>(calloc((size_t)N, sizeof(int)));
  for (int t = 0; t < N; t++) group[t] = first + t;
  TpStream *stream = tp_cuda_stream_new();
  const float two = 2;
  float *factor = static_cast<float *>(device_alloc(sizeof(float)));
  TP_CUDA_CHECK(cudaMemcpy(factor, &two, sizeof two, cudaMemcpyHostToDevice));
  const size_t counts[] = {1, 1000, (size_t)1 << 18};
  enum { NBUF = 3 };
  float *x[NBUF], *want[NBUF], *dev[NBUF];
  for (int b = 0; b < NBUF; b++) {
    size_t n = counts[b];
    x[b] = static_cast<float *>(malloc(n * sizeof(float))),
    want[b] = static_cast<float *>(malloc(n * sizeof(float)));
    dev[b] = static_cast<float *>(device_alloc(n * sizeof(float)));
    for (size_t i = 0; i < n; i++) x[b][i] = value_f32(c->rank + b, i), want[b][i] = 2 * x[b][i];
    tp_comm_allreduce_sum(host, want[b], n, TP_F32, group, N); /* the sum in group order */
    for (size_t i = 0; i < n; i++) want[b][i] = 1.0f / want[b][i];
  }
  /* Before the all-reduces, on the stream: a copy and a kernel (x 2) per buffer. Rank 0
   * queues its all-reduces while the others wait at the barrier: they cannot be done, and
   * the host did not wait for them (a transport that waited would hang here). After them:
   * a kernel reading each sum (1 / x: it does not commute with the sum, as a scaling
   * would). The emulation runs a stream's work when it is queued, so it waits there for
   * pending all-reduces, where a GPU's host would run ahead: hence every all-reduce is
   * queued before the kernels after them. */
  for (int b = 0; b < NBUF; b++) {
    TP_CUDA_CHECK(cudaMemcpyAsync(dev[b], x[b], counts[b] * sizeof(float), cudaMemcpyHostToDevice, stream->cuda));
    tp_cuda_launch_scale_f32(dev[b], (int64_t)counts[b], factor, stream->cuda);
  }
  if (c->rank != 0) tp_comm_barrier(host);
  for (int b = 0; b < NBUF; b++) c->be->allreduce_sum_on(c, dev[b], counts[b], TP_F32, group, N, stream);
  if (c->rank == 0) {
    cudaEvent_t queued;
    TP_CUDA_CHECK(cudaEventCreateWithFlags(&queued, cudaEventDisableTiming));
    TP_CUDA_CHECK(cudaEventRecord(queued, stream->cuda));
    EXPECT(c, cudaEventQuery(queued) == cudaErrorNotReady);
    TP_CUDA_CHECK(cudaEventDestroy(queued));
    tp_comm_barrier(host);
  }
  for (int b = 0; b < NBUF; b++)
    tp_cuda_launch_unary_f32(TP_UNARY_RECIPROCAL, dev[b], (int64_t)counts[b], dev[b], stream->cuda);
  EXPECT(c, tp_cuda_stream_sync(stream) == -1);
  for (int b = 0; b < NBUF; b++) {
    size_t n = counts[b];
    TP_CUDA_CHECK(cudaMemcpy(x[b], dev[b], n * sizeof(float), cudaMemcpyDeviceToHost));
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
      double err = fabs((double)x[b][i] - want[b][i]) / fabs((double)want[b][i]);
      if (err > worst) worst = err, at = i;
    }
    /* two ranks: a + b == b + a, the same bits; more: NCCL's order, within 1e-6 */
    if (worst > (N == 2 ? 0 : 1e-6))
      fprintf(stderr,
              "rank %d: tensor all-reduce of %zu floats over %d ranks: rel_err=%.3g at [%zu] "
              "(%.9g, want %.9g)\n",
              c->rank, n, N, worst, at, x[b][at], want[b][at]);
    EXPECT(c, worst <= (N == 2 ? 0 : 1e-6));
    TP_CUDA_CHECK(cudaFree(dev[b]));
    free(want[b]);
  }
  /* host memory: the stream's work first, then the host transport's sum, bit for bit */
  float h[3] = {c->rank * 0.1f, 1.0f / (float)(c->rank + 7), -2.5f}, hwant[3];
  memcpy(hwant, h, sizeof h);
  tp_comm_allreduce_sum(host, hwant, 3, TP_F32, group, N);
  c->be->allreduce_sum_on(c, h, 3, TP_F32, group, N, stream);
  EXPECT(c, memcmp(h, hwant, sizeof h) == 0);
  for (int b = 0; b < NBUF; b++) free(x[b]);
  TP_CUDA_CHECK(cudaFree(factor));
  tp_cuda_stream_free(stream);
  free(group);
  tp_comm_close(c);
  free_plan(&tp);
}

/* ---- start-up ---- */

static void order(TpComm *host, int S, int N) {
  int D = host->size / (S * N);
  /* with N > 2: parameters of stage 0 split in N / 2 pieces and in one (its ALLREDUCE sums
   * their partial gradients over the ranks holding a piece) */
  const int parts[2] = {N / 2, 1};
  TestPlan tp;
  make_plan(&tp, S, N, D, 2, true, parts, N > 2 ? 2 : 0);
  TpComm *c = open_nccl(host, &tp.plan);
  char got[2048], want[2048] = "";
  tp_cuda_comm_describe(c, got, sizeof got);
  /* the list every rank must have made, in this order, with this rank's groups starred;
   * " +": a stream of its own, which only the links have from the start (a collective
   * group gets one from its first collective that the host waits for) */
  const char *expected = NULL;
  if (S == 2 && N == 1 && D == 1) /* the tied pair is the world: its communicator serves */
    expected = "world 0 1\nround 1: link 0 1 +\nround 2: link 1 0 +\n";
  else if (S == 2 && N == 1 && D == 2)
    expected = "world 0 1 2 3\nround 1: link 0 1 +\nround 2: link 1 0 +\nround 1: link 2 3 +\n"
               "round 2: link 3 2 +\nround 3: replicas 0 2\nround 3: replicas 1 3\nround 4: tied 0 1\n"
               "round 4: tied 2 3\n";
  else if (S == 4 && N == 1 && D == 1)
    expected = "world 0 1 2 3\nround 1: link 0 1 +\nround 2: link 1 0 +\nround 3: link 1 2 +\n"
               "round 4: link 2 1 +\nround 1: link 2 3 +\nround 2: link 3 2 +\nround 3: tied 0 3\n";
  else if (S == 2 && N == 2 && D == 1) /* peers and tied pairs at the same tensor rank */
    expected = "world 0 1 2 3\nround 1: link 0 2 +\nround 2: link 2 0 +\nround 1: link 1 3 +\n"
               "round 2: link 3 1 +\nround 3: tensor 0 1\nround 3: tensor 2 3\nround 4: tied 0 2\n"
               "round 4: tied 1 3\n";
  else if (S == 1 && N == 2 && D == 2) /* replicas: (d, k, t) for every d */
    expected = "world 0 1 2 3\nround 1: tensor 0 1\nround 1: tensor 2 3\nround 2: replicas 0 2\n"
               "round 2: replicas 1 3\n";
  else if (S == 1 && N == 4 && D == 1) /* the tensor group and the one-piece group are the world */
    expected = "world 0 1 2 3\nround 1: pieces 0 1\nround 1: pieces 2 3\n";
  EXPECT(c, expected != NULL);
  for (const char *line = expected; line && *line;) {
    const char *end = strchr(line, '\n');
    char text[128];
    snprintf(text, sizeof text, "%.*s", (int)(end - line), line);
    size_t len = strlen(text);
    bool traffic = len > 2 && !strcmp(text + len - 2, " +");
    if (traffic) text[len - 2] = 0;
    const char *ranks = strrchr(text, ':') ? strrchr(text, ':') + 1 : strchr(text, ' ');
    char mine[16];
    snprintf(mine, sizeof mine, " %d", c->rank);
    bool member = false;
    for (const char *p = ranks; (p = strstr(p, mine)); p += strlen(mine))
      member |= p[strlen(mine)] == 0 || p[strlen(mine)] == ' ';
    snprintf(want + strlen(want), sizeof want - strlen(want), "%s%s%s\n", text, member ? " *" : "",
             member && traffic ? " stream" : "");
    line = end + 1;
  }
  if (strcmp(got, want)) fprintf(stderr, "rank %d: communicators:\n%swanted:\n%s", c->rank, got, want);
  EXPECT(c, strcmp(got, want) == 0);
  tp_comm_close(c);
  if (S == 1) {
    free_plan(&tp);
    return;
  }
  /* stage 1 takes microbatch 1's activation before microbatch 0's: NCCL could not match it */
  TpPlanInsn *stage1 = tp.insns + (tp.stages[1].insns - tp.insns);
  for (int j = 0; j < tp.stages[1].ninsns; j++)
    if (stage1[j].kind == TP_PLAN_RECV_ACT) stage1[j].mb = 1 - stage1[j].mb;
  TpDiag d;
  tp_diag_init(&d, "test_cuda_nccl", NULL, NULL);
  TpComm *none = NULL;
  EXPECT(host, tp_cuda_comm_open(host, NULL, &tp.plan, &none, &d) == TP_ERR_INTERNAL && !none);
  EXPECT(host, strstr(d.last, "stage 1 receives its activations in another order than stage 0 sends them"));
  free_plan(&tp);
}

/* ---- interleaved plans ---- */

static void interleaved(TpComm *host) {
  enum { S = 2, V = 2, J = S * V, M = 2 };
  int D = host->size / S;
  TestPlan tp;
  make_interleaved_plan(&tp, S, V, D, M);
  TpComm *c = open_nccl(host, &tp.plan);
  char got[4096], want[4096] = "", line[128];
  tp_cuda_comm_describe(c, got, sizeof got);
  /* per replica d, boundary j: activations j % S -> (j + 1) % S, gradients back; every link
   * of a replica shares its two ranks, so one per round; the tied pair is the replica's two
   * ranks: the world for D == 1, else a group of its own */
  int k = c->rank % S, d = c->rank / S, round_of[8] = {0};
  snprintf(want, sizeof want, "world");
  for (int r = 0; r < host->size; r++) snprintf(want + strlen(want), sizeof want - strlen(want), " %d", r);
  strcat(want, " *\n");
  for (int r = 0; r < D; r++)
    for (int j = 0; j + 1 < J; j++)
      for (int grad = 0; grad < 2; grad++) {
        int a = r * S + j % S, b = r * S + (j + 1) % S;
        if (grad) a ^= b, b ^= a, a ^= b;
        snprintf(line, sizeof line, "round %d: link %d %d (%s %d)%s\n", ++round_of[r], a, b,
                 grad ? "gradients" : "activations", j, r == d ? " * stream" : "");
        strcat(want, line);
      }
  for (int r = 0; D > 1 && r < S; r++) { /* the replicas of pipeline rank r */
    snprintf(line, sizeof line, "round %d: replicas", round_of[0] + 1);
    for (int q = 0; q < D; q++) snprintf(line + strlen(line), sizeof line - strlen(line), " %d", q * S + r);
    strcat(line, r == k ? " *\n" : "\n");
    strcat(want, line);
  }
  for (int r = 0; D > 1 && r < D; r++) {
    snprintf(line, sizeof line, "round %d: tied %d %d%s\n", round_of[0] + 2, r * S, r * S + S - 1,
             r == d ? " *" : "");
    strcat(want, line);
  }
  if (strcmp(got, want)) fprintf(stderr, "rank %d: communicators:\n%swanted:\n%s", c->rank, got, want);
  EXPECT(c, strcmp(got, want) == 0);

  /* every boundary's message of microbatch 0 into and out of this rank, boundary j's
   * activation of 1000 + 16 j bytes and its gradient of 2000 + 16 j: receives posted in
   * reverse boundary order, then the sends in boundary order (the buffers allocated first:
   * an allocation waits for the whole device, pending receives included) */
  TpStream *stream = tp_cuda_stream_new();
  void *out[J][2] = {{NULL}}, *in[J][2] = {{NULL}};
  TpCommRequest sends[J][2], recvs[J][2];
  memset(sends, 0, sizeof sends), memset(recvs, 0, sizeof recvs);
  size_t size[J][2];
  for (int j = 0; j + 1 < J; j++)
    for (int grad = 0; grad < 2; grad++) {
      int from = (grad ? j + 1 : j) % S, to = (grad ? j : j + 1) % S;
      size_t n = size[j][grad] = (size_t)(1000 * (grad + 1) + 16 * j);
      if (to == k) in[j][grad] = device_alloc(n);
      if (from != k) continue;
      unsigned char *bytes = static_cast<unsigned char *>(malloc(n));
      for (size_t i = 0; i < n; i++) bytes[i] = byte_of(c->rank, 2 * j + grad, i);
      out[j][grad] = device_alloc(n);
      TP_CUDA_CHECK(cudaMemcpy(out[j][grad], bytes, n, cudaMemcpyHostToDevice));
      free(bytes);
    }
  for (int j = J - 2; j >= 0; j--)
    for (int grad = 0; grad < 2; grad++) {
      int from = (grad ? j + 1 : j) % S;
      if (!in[j][grad]) continue;
      recvs[j][grad].what = "a boundary's message";
      c->be->irecv(c, in[j][grad], size[j][grad], d * S + from, tp_plan_message_tag(&tp.plan, j / S, 0, 0, grad),
                   &recvs[j][grad]);
    }
  tp_comm_barrier(c);
  for (int j = 0; j + 1 < J; j++)
    for (int grad = 0; grad < 2; grad++) {
      int to = (grad ? j : j + 1) % S;
      size_t n = size[j][grad];
      if (!out[j][grad]) continue;
      sends[j][grad] = {NULL, -1, "a boundary's message sent", stream};
      c->be->isend(c, out[j][grad], n, d * S + to, tp_plan_message_tag(&tp.plan, j / S, 0, 0, grad),
                   &sends[j][grad]);
    }
  for (int j = 0; j + 1 < J; j++)
    for (int grad = 0; grad < 2; grad++) {
      if (sends[j][grad].impl) tp_comm_wait(c, &sends[j][grad]);
      if (!in[j][grad]) continue;
      tp_comm_wait(c, &recvs[j][grad]);
      size_t n = size[j][grad], bad = 0;
      unsigned char *bytes = static_cast<unsigned char *>(malloc(n));
      TP_CUDA_CHECK(cudaMemcpy(bytes, in[j][grad], n, cudaMemcpyDeviceToHost));
      int from = d * S + (grad ? j + 1 : j) % S;
      for (size_t i = 0; i < n; i++) bad += bytes[i] != byte_of(from, 2 * j + grad, i);
      if (bad)
        fprintf(stderr, "rank %d: boundary %d's %s: %zu of %zu bytes differ\n", c->rank, j,
                grad ? "gradient" : "activation", bad, n);
      EXPECT(c, bad == 0);
      free(bytes);
    }
  for (int j = 0; j < J; j++)
    for (int grad = 0; grad < 2; grad++) {
      if (out[j][grad]) TP_CUDA_CHECK(cudaFree(out[j][grad]));
      if (in[j][grad]) TP_CUDA_CHECK(cudaFree(in[j][grad]));
    }
  tp_cuda_stream_free(stream);
  tp_comm_close(c);

  /* rank 0 takes boundary 2's gradients (virtual stage 3 to 2) of microbatch 1 before
   * microbatch 0's: a link of their own, whose order no longer holds */
  TpPlanInsn *list = tp.insns;
  for (int j = 0; j < tp.stages[0].ninsns; j++)
    if (list[j].kind == TP_PLAN_RECV_GRAD && list[j].chunk == 1) list[j].mb = M - 1 - list[j].mb;
  TpDiag diag;
  tp_diag_init(&diag, "test_cuda_nccl", NULL, NULL);
  TpComm *none = NULL;
  EXPECT(host, tp_cuda_comm_open(host, NULL, &tp.plan, &none, &diag) == TP_ERR_INTERNAL && !none);
  EXPECT(host, strstr(diag.last,
                      "virtual stage 2 receives its gradients in another order than virtual stage 3 sends them"));
  free_plan(&tp);
}

/* The host transport serves: one process, or processes sharing a GPU. */
static void fallback(TpComm *host) {
  TestPlan tp;
  make_plan(&tp, host->size, 1, 1, 1, false);
  TpDiag d;
  tp_diag_init(&d, "test_cuda_nccl", NULL, stderr);
  TpComm *c = host; /* overwritten */
  EXPECT(host, tp_cuda_comm_open(host, NULL, &tp.plan, &c, &d) == TP_OK && c == NULL);
  free_plan(&tp);
}

/* An all-reduce over stages 0 and 1 of replica 0 of a 2 x 2 plan without tied parameters
 * (the world, the replicas and the links have communicators; not that pair). */
static void missing(TpComm *host) {
  TestPlan tp;
  make_plan(&tp, 2, 1, host->size / 2, 1, false);
  TpComm *c = open_nccl(host, &tp.plan);
  int pair[2] = {0, 1};
  float *x = static_cast<float *>(device_alloc(4 * sizeof(float)));
  if (c->rank < 2) tp_comm_allreduce_sum(c, x, 4, TP_F32, pair, 2); /* ends the job */
  tp_comm_barrier(c);
  EXPECT(c, !"reached");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr,
            "usage: test_cuda_nccl p2p|allreduce|tensor|order|interleaved|fallback|missing [STAGES [TENSOR]]\n");
    return 2;
  }
  TpDiag d;
  tp_diag_init(&d, "test_cuda_nccl", NULL, stderr);
  TpComm *host;
  if (tp_comm_open(&host, "test_cuda_nccl", &argc, &argv, &d)) return 1;
  pick_gpu();
  int S = argc > 2 ? atoi(argv[2]) : host->size, N = argc > 3 ? atoi(argv[3]) : 1;
  if (S < 1 || N < 1 || host->size % (S * N)) {
    fprintf(stderr, "test_cuda_nccl: %d processes are not STAGES=%d x TENSOR=%d x replicas\n", host->size, S, N);
    return 2;
  }
  const char *mode = argv[1];
  if (!strcmp(mode, "p2p")) p2p(host, S, N);
  else if (!strcmp(mode, "allreduce")) allreduce(host, S, N);
  else if (!strcmp(mode, "tensor")) tensor(host, S, N);
  else if (!strcmp(mode, "order")) order(host, S, N);
  else if (!strcmp(mode, "interleaved")) interleaved(host);
  else if (!strcmp(mode, "fallback")) fallback(host);
  else if (!strcmp(mode, "missing")) missing(host);
  else {
    fprintf(stderr, "test_cuda_nccl: no mode '%s'\n", mode);
    return 2;
  }
  int first = -1, rc = tp_comm_agree(host, failures ? 1 : 0, &first);
  if (host->rank == 0) printf("%s: %s\n", mode, rc ? "FAILED" : "ok");
  tp_comm_close(host);
  return rc;
}
