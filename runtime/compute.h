/* The compute backend of the trainer runtime: a table of functions per device, as
 * TpCommBackend (comm/comm.h) is for communication. Everything the runtime does to the
 * memory that units compute in (parameters, gradients, AdamW state, arenas, token ids,
 * messages) goes through it:
 *
 *   memory   device buffers: allocated zeroed, freed, set, copied to, from and within
 *   streams  queues of work in order; events mark a point of a stream, which another
 *            stream or the host waits for
 *   units    the generated unit functions, run on a stream (TpStepIO.compute/.stream)
 *   math     the runtime's own: gradient sums and averages, the norm's sum of squares,
 *            clipping, AdamW, and packing a message's arena buffers into one send buffer
 *
 * The contract: the runtime never dereferences a pointer the backend allocated. It moves
 * values with explicit copies (copy_d2h, copy_h2d), and an entry may still be running when
 * it returns: a result is the host's after the stream it was queued on is synchronized (or
 * an event recorded after it). Communication buffers are device buffers: a transport that
 * cannot read device memory (MPI without CUDA awareness) gets them through host copies
 * unless the backend is host_addressable.
 *
 *   cpu        runtime/cpu/backend.c: device memory is host memory, streams run their work
 *              at once (every wait is already over), the math is the CPU kernels
 *   cpu-strict the same, test-only (TOKPIPE_TEST_STRICT_DEVICE=1): device memory is
 *              inaccessible (PROT_NONE) except while its own entries or a unit run, so a
 *              direct host access by the runtime crashes
 *   cuda       runtime/cuda/backend.cu (tp_compute_cuda): cudaMalloc, cudaMemcpyAsync,
 *              stream.h's TpStream and CUDA events, kernels on the stream; host_addressable
 *              is false. A CUDA plan's device (TpPlan.device = &tp_plan_device_cuda) opens it
 *              on the process's GPU; its units queue their kernels on io->stream. */
#ifndef TOKPIPE_COMPUTE_H
#define TOKPIPE_COMPUTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../base/diag.h"
#include "train/plan.h"

typedef struct TpStream TpStream; /* the backend's */

/* Pieces of a gradient's sum of squares (sum_squares_pieces below); a --zero 1 shard
 * starts and ends on them. */
enum { TP_NORM_PIECES = 64 };
typedef struct TpEvent TpEvent;
typedef struct TpCompute TpCompute;

/* AdamW's hyperparameters for one step (tp_adamw_step in cpu/optim.h says how). */
typedef struct {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step; /* 1 on the first */
} TpAdamW;

/* One piece of sum_squares_many: piece `piece` of the n floats at x (device), as
 * sum_squares_pieces cuts them, into out[at]. */
typedef struct {
  const float *x;
  int64_t n, piece, at;
} TpNormPiece;

/* One tensor of adamw_many: n elements of values w, gradients g, moments m and v (device),
 * with its own weight decay. */
typedef struct {
  float *w, *g, *m, *v;
  int64_t n;
  double weight_decay;
} TpAdamWTensor;

typedef struct {
  const char *name;
  /* Its device memory is host memory: a host transport (MPI) may read and write it. */
  bool host_addressable;
  void (*close)(TpCompute *c);

  /* ---- memory ---- */
  /* bytes (0 allowed) zeroed, 64-byte aligned; NULL if the device has no room. */
  void *(*alloc)(TpCompute *c, size_t bytes);
  void (*free)(TpCompute *c, void *p); /* p may be NULL */
  void (*memset)(TpCompute *c, TpStream *s, void *p, int value, size_t bytes);
  void (*copy_h2d)(TpCompute *c, TpStream *s, void *dst, const void *src, size_t bytes);
  void (*copy_d2h)(TpCompute *c, TpStream *s, void *dst, const void *src, size_t bytes);
  void (*copy_d2d)(TpCompute *c, TpStream *s, void *dst, const void *src, size_t bytes);

  /* ---- streams and events ---- */
  TpStream *(*stream_new)(TpCompute *c);
  void (*stream_free)(TpCompute *c, TpStream *s);
  void (*stream_sync)(TpCompute *c, TpStream *s); /* the host waits for s's work */
  TpEvent *(*event_new)(TpCompute *c);
  void (*event_free)(TpCompute *c, TpEvent *e);
  void (*event_record)(TpCompute *c, TpEvent *e, TpStream *s); /* e: s's work so far */
  void (*stream_wait)(TpCompute *c, TpStream *s, TpEvent *e);  /* s's later work waits for e */
  void (*event_sync)(TpCompute *c, TpEvent *e);                /* the host waits for e */

  /* ---- units ---- */
  /* fn(io) with io->compute == c and io->stream == s. */
  void (*run_unit)(TpCompute *c, TpStream *s, TpUnitFn fn, TpStepIO *io);

  /* ---- the runtime's math, f32 device buffers of n elements ---- */
  void (*add_into)(TpCompute *c, TpStream *s, float *dst, const float *src, int64_t n); /* dst += src */
  void (*divide)(TpCompute *c, TpStream *s, float *x, int64_t n, float by); /* x /= by: a sum into a mean */
  /* The gradient norm's pieces: x's n elements cut into TP_NORM_PIECES pieces (piece p is
   * [n * p / TP_NORM_PIECES, n * (p + 1) / TP_NORM_PIECES)); out[j] (count device doubles)
   * = the sum of squares in double of piece first + j, in an order that depends neither on
   * the thread count nor on which other pieces are asked for (a --zero 1 replica asks for
   * those of its shard). The runtime adds the pieces in order on the host, as
   * tp_sum_squares_f32 does. */
  void (*sum_squares_pieces)(TpCompute *c, TpStream *s, const float *x, int64_t n, int first, int count,
                             double *out);
  void (*clip)(TpCompute *c, TpStream *s, float *x, int64_t n, float factor); /* x *= factor */
  void (*adamw)(TpCompute *c, TpStream *s, float *w, const float *g, float *m, float *v, int64_t n,
                const TpAdamW *h);
  /* A message: the arena's buffers in order into dst (their total bytes), and back. */
  void (*pack)(TpCompute *c, TpStream *s, void *dst, const void *arena, const TpPlanBuffer *buffers, int n);
  void (*unpack)(TpCompute *c, TpStream *s, void *arena, const void *src, const TpPlanBuffer *buffers, int n);
  /* Mixed precision (TpPlan.precision; NULL where the backend has none): half is
   * TP_PLAN_BF16 or TP_PLAN_FP16. dst += src widened to f32 (a microbatch's gradients into
   * the step's sum), and dst = src rounded to nearest even (the working copy of the f32
   * masters). */
  void (*add_half_into)(TpCompute *c, TpStream *s, float *dst, const void *src, int64_t n, int half);
  void (*round_to_half)(TpCompute *c, TpStream *s, void *dst, const float *src, int64_t n, int half);
  /* What the backend counted since the last call (the CUDA backend's step counters,
   * cuda/stats.h) as one line of "key=value" words into line; false (nothing written) where
   * it counts nothing. NULL: never counts. */
  bool (*step_counts)(TpCompute *c, char *line, size_t size);
  /* Host memory for what a step copies to or from the device (token ids, losses, the
   * norm's pieces), zeroed: page-locked, so that a copy is queued without the host waiting
   * (CUDA copies pageable memory through a staging buffer, synchronously); NULL where the
   * backend has none (the runtime allocates host memory as usual). */
  void *(*host_alloc)(TpCompute *c, size_t bytes);
  void (*host_free)(TpCompute *c, void *p);
  /* Multi-tensor forms (NULL where the backend has none: the runtime calls the per-tensor
   * entries in order), each one launch where the per-tensor entries take one per tensor,
   * with their bits: sum_squares_many gives each piece's sum as sum_squares_pieces does
   * (the runtime still adds them on the host in its order); adamw_many is, per tensor in
   * order, clip (when clip != 1) then adamw with the tensor's weight decay (h's is not
   * read). The host's arrays may be reused once the call returns. */
  void (*sum_squares_many)(TpCompute *c, TpStream *s, const TpNormPiece *pieces, int count, double *out);
  void (*adamw_many)(TpCompute *c, TpStream *s, const TpAdamWTensor *tensors, int count, const TpAdamW *h,
                     float clip);
} TpComputeBackend;

struct TpCompute {
  const TpComputeBackend *be;
  void *impl;
};

/* The CPU backend (the strict variant if TOKPIPE_TEST_STRICT_DEVICE=1): a plan without a
 * device. */
int tp_compute_open(TpCompute **out, TpDiag *d);
void tp_compute_close(TpCompute *c);

extern const TpComputeBackend tp_compute_cpu, tp_compute_cpu_strict;
/* runtime/cuda/backend.cu, in the CUDA library (tokpipe_cuda, or tokpipe_cuda_emulated in tests) */
extern const TpComputeBackend tp_compute_cuda;

#endif
