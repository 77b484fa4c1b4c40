/* The CUDA compute backend (../compute.h) and the device of CUDA plans (ops.h's
 * tp_plan_device_cuda): device memory from cudaMalloc, streams are stream.h's TpStream
 * (a CUDA stream with what the plan's kernels need), events are CUDA events, copies and
 * sets are queued on the stream (cudaMemcpyAsync, cudaMemsetAsync), and the runtime's math
 * runs as kernels on the stream. Device memory is not host memory (host_addressable is
 * false): the runtime moves values with explicit copies and synchronizes before it reads
 * them. Every call is checked (check.h: one line and exit 1 on failure), and a stream
 * synchronization that finds an index a kernel met out of range stops the same way. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" { /* C headers */
#include "compute.h"
}
#include "comm_nccl.h"
#include "common.cuh"
#include "../kernels/element.h" /* tp_adamw_element */
#include "dtype.cuh"            /* base/half.h's conversions */
#include "stream.h"

static cudaStream_t cuda_of(TpStream *s) { return s->cuda; }

static void cuda_close(TpCompute *c) {
  (void)c;
  TP_CUDA_WAIT(cudaDeviceSynchronize()); /* nothing queued outlives the backend */
}

/* ---- memory ---- */

static void *cuda_alloc(TpCompute *c, size_t bytes) {
  (void)c;
  void *p = NULL;
  TP_CUDA_COUNT(allocs, 1);
  cudaError_t err = cudaMalloc(&p, bytes ? bytes : 1); /* cudaMalloc(0) gives NULL */
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError(); /* not sticky: the caller reports it and the context stays usable */
    return NULL;
  }
  TP_CUDA_CHECK(err);
  /* zeroed before any stream can use it: on the legacy default stream, waited for */
  TP_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, 0));
  TP_CUDA_WAIT(cudaStreamSynchronize(0));
  return p;
}

static void cuda_free(TpCompute *c, void *p) {
  (void)c;
  if (p) TP_CUDA_CHECK(cudaFree(p));
}

/* Pinned: cudaMemcpyAsync from or to it is queued like any other copy (from pageable
 * memory the host waits for it). NULL if the host has no room. */
static void *cuda_host_alloc(TpCompute *c, size_t bytes) {
  (void)c;
  void *p = NULL;
  TP_CUDA_COUNT(allocs, 1);
  cudaError_t err = cudaMallocHost(&p, bytes ? bytes : 1);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return NULL;
  }
  TP_CUDA_CHECK(err);
  memset(p, 0, bytes);
  return p;
}

static void cuda_host_free(TpCompute *c, void *p) {
  (void)c;
  if (p) TP_CUDA_CHECK(cudaFreeHost(p));
}

static void cuda_memset(TpCompute *c, TpStream *s, void *p, int value, size_t bytes) {
  (void)c;
  if (bytes) TP_CUDA_CHECK(cudaMemsetAsync(p, value, bytes, cuda_of(s)));
}

static void copy(TpStream *s, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
  if (bytes) TP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, cuda_of(s)));
}

static void cuda_copy_h2d(TpCompute *c, TpStream *s, void *dst, const void *src, size_t bytes) {
  (void)c;
  tp_cuda_count_host_copy(src);
  copy(s, dst, src, bytes, cudaMemcpyHostToDevice);
}

static void cuda_copy_d2h(TpCompute *c, TpStream *s, void *dst, const void *src, size_t bytes) {
  (void)c;
  tp_cuda_count_host_copy(dst);
  copy(s, dst, src, bytes, cudaMemcpyDeviceToHost);
}

static void cuda_copy_d2d(TpCompute *c, TpStream *s, void *dst, const void *src, size_t bytes) {
  (void)c;
  copy(s, dst, src, bytes, cudaMemcpyDeviceToDevice);
}

/* ---- streams and events ---- */

static TpStream *cuda_stream_new(TpCompute *c) {
  (void)c;
  TpStream *s = tp_cuda_stream_new();
  if (!s) {
    fprintf(stderr, "tokpipe: error: the CUDA device cannot make another stream\n");
    exit(1);
  }
  return s;
}

static void cuda_stream_free(TpCompute *c, TpStream *s) {
  (void)c;
  if (!s) return;
  TP_CUDA_WAIT(cudaStreamSynchronize(s->cuda));
  tp_cuda_stream_free(s);
}

static void cuda_stream_sync(TpCompute *c, TpStream *s) {
  (void)c;
  int64_t bad = tp_cuda_stream_sync(s);
  if (bad >= 0) {
    /* the trainer checked every token id against the tables, so this is a plan's bug */
    fprintf(stderr,
            "tokpipe: error: a kernel on the GPU met an index out of range (at position %lld of its "
            "ids or targets)\n",
            (long long)bad);
    exit(1);
  }
}

static cudaEvent_t event_of(TpEvent *e) { return reinterpret_cast<cudaEvent_t>(e); }

static TpEvent *cuda_event_new(TpCompute *c) {
  (void)c;
  cudaEvent_t e;
  TP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return reinterpret_cast<TpEvent *>(e);
}

static void cuda_event_free(TpCompute *c, TpEvent *e) {
  (void)c;
  if (e) TP_CUDA_CHECK(cudaEventDestroy(event_of(e)));
}

static void cuda_event_record(TpCompute *c, TpEvent *e, TpStream *s) {
  (void)c;
  TP_CUDA_CHECK(cudaEventRecord(event_of(e), cuda_of(s)));
}

static void cuda_stream_wait(TpCompute *c, TpStream *s, TpEvent *e) {
  (void)c;
  TP_CUDA_CHECK(cudaStreamWaitEvent(cuda_of(s), event_of(e), 0));
}

static void cuda_event_sync(TpCompute *c, TpEvent *e) {
  (void)c;
  TP_CUDA_WAIT(cudaEventSynchronize(event_of(e)));
}

/* ---- units ---- */

static void cuda_run_unit(TpCompute *c, TpStream *s, TpUnitFn fn, TpStepIO *io) {
  io->compute = c;
  io->stream = s;
  fn(io); /* queues its kernels on s->cuda */
}

/* ---- the runtime's math: elementwise, so each element's result is the CPU loop's ---- */

__global__ void add_into_kernel(float *dst, const float *src, int64_t n) {
  TP_GRID_STRIDE_LOOP(i, n) dst[i] += src[i];
}

/* 16-bit storage (TpPlan.precision bf16 or fp16): a microbatch's 16-bit gradients into the
 * f32 step sum, and the f32 masters rounded (to nearest even) to the units' working copies,
 * with base/half.h's conversions, as the CPU backend does. */
__global__ void add_half_into_kernel(float *dst, const uint16_t *src, int64_t n, bool bf16) {
  TP_GRID_STRIDE_LOOP(i, n) dst[i] += bf16 ? tp_half_bf16_to_f32(src[i]) : tp_half_f16_to_f32(src[i]);
}

__global__ void round_to_half_kernel(uint16_t *dst, const float *src, int64_t n, bool bf16) {
  TP_GRID_STRIDE_LOOP(i, n) dst[i] = bf16 ? tp_half_f32_to_bf16(src[i]) : tp_half_f32_to_f16(src[i]);
}

__global__ void divide_kernel(float *x, int64_t n, float by) { TP_GRID_STRIDE_LOOP(i, n) x[i] /= by; }

__global__ void clip_kernel(float *x, int64_t n, float factor) { TP_GRID_STRIDE_LOOP(i, n) x[i] *= factor; }

static void cuda_add_into(TpCompute *c, TpStream *s, float *dst, const float *src, int64_t n) {
  (void)c;
  if (n > 0)
    TP_LAUNCH(add_into_kernel, tp_elementwise_grid(n), dim3(TP_CUDA_ELEMENTWISE_THREADS), cuda_of(s), dst, src, n);
}

static void cuda_add_half_into(TpCompute *c, TpStream *s, float *dst, const void *src, int64_t n, int half) {
  (void)c;
  if (n > 0)
    TP_LAUNCH(add_half_into_kernel, tp_elementwise_grid(n), dim3(TP_CUDA_ELEMENTWISE_THREADS), cuda_of(s), dst,
              static_cast<const uint16_t *>(src), n, half == TP_PLAN_BF16);
}

static void cuda_round_to_half(TpCompute *c, TpStream *s, void *dst, const float *src, int64_t n, int half) {
  (void)c;
  TP_CUDA_COUNT(convert_bytes, 2 * (uint64_t)n);
  if (n > 0)
    TP_LAUNCH(round_to_half_kernel, tp_elementwise_grid(n), dim3(TP_CUDA_ELEMENTWISE_THREADS), cuda_of(s),
              static_cast<uint16_t *>(dst), src, n, half == TP_PLAN_BF16);
}

static void cuda_divide(TpCompute *c, TpStream *s, float *x, int64_t n, float by) {
  (void)c;
  if (n > 0)
    TP_LAUNCH(divide_kernel, tp_elementwise_grid(n), dim3(TP_CUDA_ELEMENTWISE_THREADS), cuda_of(s), x, n, by);
}

/* The pieces are tp_sum_squares_f32's; only the order of the sums inside a piece differs. */
static_assert((int)TP_NORM_PIECES == (int)TP_CUDA_SUM_PIECES, "the norm's pieces are the kernel's");
static void cuda_sum_squares_pieces(TpCompute *c, TpStream *s, const float *x, int64_t n, int first, int count,
                                    double *out) {
  (void)c;
  tp_cuda_launch_sum_squares_pieces_f32(x, n, first, count, out, cuda_of(s));
}

static void cuda_clip(TpCompute *c, TpStream *s, float *x, int64_t n, float factor) {
  (void)c;
  if (n > 0)
    TP_LAUNCH(clip_kernel, tp_elementwise_grid(n), dim3(TP_CUDA_ELEMENTWISE_THREADS), cuda_of(s), x, n, factor);
}

/* ---- multi-tensor forms: one launch over a table (stream.h's tp_cuda_table) ---- */

/* Block b: piece pieces[b], sum_squares_pieces_kernel's sum. */
__global__ void sum_squares_many_kernel(const TpNormPiece *pieces, double *out) {
  TpNormPiece q = pieces[blockIdx.x];
  double s = tp_piece_sum_squares(q.x, q.n, q.piece);
  if (threadIdx.x == 0) out[q.at] = s;
}

static void cuda_sum_squares_many(TpCompute *c, TpStream *s, const TpNormPiece *pieces, int count, double *out) {
  (void)c;
  if (count <= 0) return;
  const void *table = tp_cuda_table(s, TP_CUDA_TABLE_NORM, pieces, (size_t)count * sizeof *pieces);
  TP_LAUNCH(sum_squares_many_kernel, dim3((unsigned)count), dim3(TP_CUDA_ELEMENTWISE_THREADS), cuda_of(s),
            static_cast<const TpNormPiece *>(table), out);
}

/* A tensor of the multi-tensor AdamW on the device: its factors (computed on the host in
 * double, as tp_cuda_launch_adamw_step's) and its blocks of the launch. */
struct AdamWTensor {
  float *w, *g, *m, *v;
  int64_t n, first_block;
  TpAdamWFactors f;
};

/* Elements per block of the multi-tensor AdamW (a block's threads stride over them). */
enum { ADAMW_BLOCK_ELEMENTS = 16 * TP_CUDA_ELEMENTWISE_THREADS };

/* Block b: its part of the tensor whose blocks hold b (a binary search of first_block);
 * each element clip_kernel's then adamw_kernel's operations. */
__global__ void adamw_many_kernel(const AdamWTensor *tensors, int count, float clip) {
  int lo = 0, hi = count - 1;
  int64_t b = blockIdx.x;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (tensors[mid].first_block <= b) lo = mid;
    else hi = mid - 1;
  }
  const AdamWTensor &t = tensors[lo];
  int64_t start = (b - t.first_block) * ADAMW_BLOCK_ELEMENTS, end = start + ADAMW_BLOCK_ELEMENTS;
  if (end > t.n) end = t.n;
  for (int64_t i = start + threadIdx.x; i < end; i += blockDim.x) {
    if (clip != 1) t.g[i] *= clip;
    tp_adamw_element(t.w, t.g, t.m, t.v, i, t.f);
  }
}

static void cuda_adamw_many(TpCompute *c, TpStream *s, const TpAdamWTensor *tensors, int count, const TpAdamW *h,
                            float clip) {
  (void)c;
  AdamWTensor *table = static_cast<AdamWTensor *>(calloc((size_t)(count > 0 ? count : 1), sizeof *table));
  TP_ASSERT(table);
  int kept = 0;
  int64_t blocks = 0;
  for (int j = 0; j < count; j++) {
    const TpAdamWTensor *x = &tensors[j];
    if (x->n <= 0) continue; /* no blocks: never found by the search */
    TpAdamWFactors f = tp_adamw_factors(h->lr, h->beta1, h->beta2, h->eps, x->weight_decay, h->step);
    table[kept++] = AdamWTensor{x->w, x->g, x->m, x->v, x->n, blocks, f};
    blocks += (x->n + ADAMW_BLOCK_ELEMENTS - 1) / ADAMW_BLOCK_ELEMENTS;
  }
  if (kept) {
    const void *dev = tp_cuda_table(s, TP_CUDA_TABLE_ADAMW, table, (size_t)kept * sizeof *table);
    TP_LAUNCH(adamw_many_kernel, dim3((unsigned)blocks), dim3(TP_CUDA_ELEMENTWISE_THREADS), cuda_of(s),
              static_cast<const AdamWTensor *>(dev), kept, clip);
  }
  free(table);
}

static void cuda_adamw(TpCompute *c, TpStream *s, float *w, const float *g, float *m, float *v, int64_t n,
                       const TpAdamW *h) {
  (void)c;
  tp_cuda_launch_adamw_step(w, g, m, v, n, h->lr, h->beta1, h->beta2, h->eps, h->weight_decay, h->step, cuda_of(s));
}

/* A message's buffers between the arena and the contiguous message, in message order. */
static void move_buffers(TpStream *s, char *msg, char *arena, const TpPlanBuffer *buffers, int n, bool pack) {
  size_t at = 0;
  for (int j = 0; j < n; j++) {
    char *in_arena = arena + buffers[j].offset;
    size_t bytes = (size_t)buffers[j].bytes;
    if (pack) copy(s, msg + at, in_arena, bytes, cudaMemcpyDeviceToDevice);
    else copy(s, in_arena, msg + at, bytes, cudaMemcpyDeviceToDevice);
    at += bytes;
  }
}

static void cuda_pack(TpCompute *c, TpStream *s, void *dst, const void *arena, const TpPlanBuffer *buffers, int n) {
  (void)c;
  move_buffers(s, static_cast<char *>(dst), const_cast<char *>(static_cast<const char *>(arena)), buffers, n, true);
}

static bool cuda_step_counts(TpCompute *c, char *line, size_t size) {
  (void)c;
  if (!tp_cuda_stats_on) return false;
  tp_cuda_stats_take(line, size);
  return true;
}

static void cuda_unpack(TpCompute *c, TpStream *s, void *arena, const void *src, const TpPlanBuffer *buffers,
                        int n) {
  (void)c;
  move_buffers(s, const_cast<char *>(static_cast<const char *>(src)), static_cast<char *>(arena), buffers, n, false);
}

extern "C" const TpComputeBackend tp_compute_cuda = {
    "cuda",
    false, /* host_addressable */
    cuda_close,
    cuda_alloc,
    cuda_free,
    cuda_memset,
    cuda_copy_h2d,
    cuda_copy_d2h,
    cuda_copy_d2d,
    cuda_stream_new,
    cuda_stream_free,
    cuda_stream_sync,
    cuda_event_new,
    cuda_event_free,
    cuda_event_record,
    cuda_stream_wait,
    cuda_event_sync,
    cuda_run_unit,
    cuda_add_into,
    cuda_divide,
    cuda_sum_squares_pieces,
    cuda_clip,
    cuda_adamw,
    cuda_pack,
    cuda_unpack,
    cuda_add_half_into,
    cuda_round_to_half,
    cuda_step_counts,
    cuda_host_alloc,
    cuda_host_free,
    cuda_sum_squares_many,
    cuda_adamw_many,
};

/* ---- the device of CUDA plans (declared in ops.h, which is C only) ---- */

/* GPU local_rank % the node's GPUs, so the processes of a node spread over its GPUs. */
static int cuda_open_compute(TpCompute **out, int local_rank, TpDiag *d) {
  *out = NULL;
  /* Before the context exists: each NCCL link has a stream (an interleaved rank about 4 V of
   * them, beside compute and collectives), and streams beyond the device's hardware queues
   * (8 by default) share them, serialising a link's blocking receive ahead of another's send.
   * A user's own setting stays. */
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count <= 0) {
    (void)cudaGetLastError();
    return tp_error(d, "no CUDA GPU: cudaGetDeviceCount: %s",
                    err != cudaSuccess ? cudaGetErrorString(err) : "no device");
  }
  int device = local_rank % count;
  if ((err = cudaSetDevice(device)) != cudaSuccess) {
    (void)cudaGetLastError();
    return tp_error(d, "CUDA GPU %d (local rank %d of %d GPUs): cudaSetDevice: %s", device, local_rank, count,
                    cudaGetErrorString(err));
  }
  TpCompute *c = static_cast<TpCompute *>(calloc(1, sizeof *c));
  TP_ASSERT(c);
  c->be = &tp_compute_cuda;
  *out = c;
  return TP_OK;
}

extern "C" const TpPlanDevice tp_plan_device_cuda = {
    "cuda", cuda_open_compute, tp_cuda_comm_open, /* NCCL, or the host transport with host copies (comm_nccl.h) */
};
