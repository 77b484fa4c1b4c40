/* The kernels a CUDA plan calls (tokpipec --target cuda): for every row of bind/kernels.def,
 * whose CPU function is tp_X, the function tp_cuda_X with the CPU function's parameters
 * and one more, the unit's stream (io->stream, runtime/cuda/stream.h). Each computes what
 * tp_X computes, on the device, queued on the stream (it returns before the work is done):
 *   - pointers (a DATA argument, a view's data, p->mask, o->weight) are device pointers;
 *     a view's dims, int64 lists (perm, starts, axes) and the structs themselves are host
 *     memory, as the generated code writes them;
 *   - the one exception to "the same parameters": a SCALAR argument (the loss gradient
 *     of tp_cross_entropy_backward_f32) is a device pointer to the float, not its value;
 *   - an index out of range is reported through stream->bad (checked when the host next
 *     synchronizes) by its flat position in the ids, targets or indices (the smallest
 *     one), not through `bad`, which is the host's and is not written;
 *   - the status is the CPU function's for what can be checked on the host (dtypes,
 *     shapes), TP_KERNEL_BAD_DTYPE for a case the CPU kernel takes and these do not.
 * With --precision bf16 the plans call tp_cuda_bf16_X for the matrix products (GEMM,
 * MATMUL, LINEAR and their backwards): the same parameters; operands rounded to bf16,
 * products accumulated in fp32 (cuBLASLt), results fp32.
 *
 * kernels.h and blas.h hold the kernels' launchers under these; tests/cuda checks both
 * against the CPU kernels, through the emulation of the CUDA execution model. */
#ifndef TOKPIPE_CUDA_OPS_H
#define TOKPIPE_CUDA_OPS_H

#include <math.h> /* before extern "C": C++ declares templates in it */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus /* the C headers below, included first here, declare C functions */
extern "C" {
#endif
#include "../cpu/elementwise.h"
#include "../kernels/status.h"
#include "../cpu/layout.h"
#include "../cpu/loss.h"
#include "../cpu/matmul.h"
#include "../cpu/nn.h"
#include "../cpu/reduce.h"
#include "../train/plan.h"
#include "stream.h"

/* The device of a CUDA plan (TpPlan.device): backend.cu's compute backend, the NCCL
 * transport (comm_nccl.cu). */
extern const TpPlanDevice tp_plan_device_cuda;

/* Queues a copy of `bytes` from the device to the host on s (a unit's loss into
 * io->loss): the host reads it after it synchronizes with s. */
TpKernelStatus tp_cuda_copy_to_host(void *host, const void *device, size_t bytes, TpStream *stream);

/* Queues storing `value` at the device's *dst on s (a unit's TensorRank: io->tensor_rank). */
TpKernelStatus tp_cuda_fill_i64(int64_t *dst, int64_t value, TpStream *stream);


/* ---- cpu/elementwise.h ---- */
TpKernelStatus tp_cuda_unary(TpUnaryOp op, const TpTensor *x, TpTensor *y, TpStream *stream);
TpKernelStatus tp_cuda_binary(TpBinaryOp op, const TpTensor *a, const TpTensor *b, TpTensor *y,
                              TpStream *stream);
TpKernelStatus tp_cuda_where(const TpTensor *cond, const TpTensor *a, const TpTensor *b, TpTensor *y,
                             TpStream *stream);
TpKernelStatus tp_cuda_cast(const TpTensor *x, TpTensor *y, TpStream *stream);

/* ---- cpu/matmul.h ---- */
TpKernelStatus tp_cuda_matmul(const TpTensor *a, const TpTensor *b, TpTensor *y, TpStream *stream);
TpKernelStatus tp_cuda_gemm(const TpTensor *a, const TpTensor *b, const TpTensor *c, bool trans_a,
                            bool trans_b, double alpha, double beta, TpTensor *y, TpStream *stream);

/* ---- cpu/layout.h ---- */
TpKernelStatus tp_cuda_gather(const TpTensor *data, const TpTensor *indices, int axis, TpTensor *y,
                              int64_t *bad, TpStream *stream);
TpKernelStatus tp_cuda_gather_elements(const TpTensor *data, const TpTensor *indices, int axis, TpTensor *y,
                                       int64_t *bad, TpStream *stream);
TpKernelStatus tp_cuda_tile(const TpTensor *x, TpTensor *y, TpStream *stream);

/* ---- cpu/reduce.h ---- */
TpKernelStatus tp_cuda_cumsum(const TpTensor *x, int axis, bool exclusive, bool reverse, TpTensor *y,
                              TpStream *stream);
TpKernelStatus tp_cuda_topk(const TpTensor *x, int axis, TpTensor *y, TpStream *stream);

/* ---- cpu/layout.h ---- */
TpKernelStatus tp_cuda_reshape(const TpTensor *x, TpTensor *y, TpStream *stream);
TpKernelStatus tp_cuda_expand(const TpTensor *x, TpTensor *y, TpStream *stream);
TpKernelStatus tp_cuda_transpose(const TpTensor *x, const int64_t *perm, TpTensor *y, TpStream *stream);
TpKernelStatus tp_cuda_split(const TpTensor *x, int axis, TpTensor *ys, int n, TpStream *stream);
TpKernelStatus tp_cuda_slice(const TpTensor *x, const int64_t *starts, const int64_t *steps, TpTensor *y,
                             TpStream *stream);
TpKernelStatus tp_cuda_concat(const TpTensor *xs, int n, int axis, TpTensor *y, TpStream *stream);
TpKernelStatus tp_cuda_context_append(const TpTensor *x, int axis, int64_t at, int64_t rows, void *buffer,
                                      TpStream *stream);
TpKernelStatus tp_cuda_trilu(const TpTensor *x, bool upper, int64_t k, TpTensor *y, TpStream *stream);

/* ---- cpu/reduce.h ---- */
TpKernelStatus tp_cuda_reduce_sum(const TpTensor *x, const int64_t *axes, int naxes, bool mean, TpTensor *y,
                                  TpStream *stream);

/* ---- cpu/nn.h ---- */
TpKernelStatus tp_cuda_softmax_f32(const float *x, float *y, int64_t outer, int64_t n, int64_t inner,
                                   bool log, TpStream *stream);
TpKernelStatus tp_cuda_layernorm_f32(const float *x, const float *scale, const float *bias, int64_t outer,
                                     int64_t n, float eps, float *y, float *mean, float *inv_std,
                                     TpStream *stream);
TpKernelStatus tp_cuda_attention_f32(const TpAttention *p, const float *q, const float *k, const float *v,
                                     const float *past_k, const float *past_v, float *y, float *present_k,
                                     float *present_v, float *qk_out, TpStream *stream);

/* ---- cpu/loss.h ---- */
TpKernelStatus tp_cuda_nll_loss_f32(const float *logp, const int64_t *target, int64_t N, int64_t C, int64_t D,
                                    const TpLossOptions *o, float *loss, int64_t *bad, TpStream *stream);
TpKernelStatus tp_cuda_softmax_cross_entropy_f32(const float *scores, const int64_t *target, int64_t N,
                                                 int64_t C, int64_t D, const TpLossOptions *o,
                                                 float *log_prob, float *loss, int64_t *bad,
                                                 TpStream *stream);

/* ---- cpu/transformer.h ---- */
TpKernelStatus tp_cuda_linear_f32(const float *x, const float *w, const float *bias, int64_t M, int64_t K,
                                  int64_t N, bool transpose_w, float *y, TpStream *stream);
TpKernelStatus tp_cuda_embedding_f32(const float *table, const int64_t *ids, int64_t n, int64_t V, int64_t C,
                                     float *out, int64_t *bad, TpStream *stream);
TpKernelStatus tp_cuda_cross_entropy_f32(const float *logits, const int64_t *targets, int64_t R, int64_t V,
                                         float denominator, float *loss, int64_t *bad, TpStream *stream);
TpKernelStatus tp_cuda_embedding_part_f32(const float *table, const int64_t *ids, const int64_t *part, int64_t n,
                                          int64_t V, int64_t parts, int64_t C, float *out, int64_t *bad,
                                          TpStream *stream);
TpKernelStatus tp_cuda_embedding_part_backward_f32(const float *dy, const int64_t *ids, const int64_t *part, int64_t n,
                                                   int64_t V, int64_t parts, int64_t C, float *dtable, int64_t *bad,
                                                   TpStream *stream);
TpKernelStatus tp_cuda_cross_entropy_stats_f32(const float *logits, const int64_t *targets, const int64_t *part,
                                               int64_t R, int64_t V, int64_t parts, float *stats, int64_t *bad,
                                               TpStream *stream);
TpKernelStatus tp_cuda_cross_entropy_parts_f32(const float *stats, int64_t R, int64_t parts, float denominator,
                                               float *loss, TpStream *stream);
TpKernelStatus tp_cuda_cross_entropy_parts_backward_f32(const float *dloss, const float *logits,
                                                        const int64_t *targets, const float *stats,
                                                        const int64_t *part, int64_t R, int64_t V, int64_t parts,
                                                        float denominator, float *dlogits, int64_t *bad,
                                                        TpStream *stream);
TpKernelStatus tp_cuda_rmsnorm_f32(const float *x, const float *scale, int64_t rows, int64_t n, float eps,
                                   float *y, TpStream *stream);
TpKernelStatus tp_cuda_rotary_f32(const float *x, const float *cos, const float *sin, int rank,
                                  const int64_t *dims, const int64_t *table_dims, int64_t rotary_dim,
                                  bool interleaved, float *y, TpStream *stream);
TpKernelStatus tp_cuda_swiglu_f32(const float *gate, const float *up, int64_t n, float *y, TpStream *stream);

/* ---- cpu/nn_backward.h ---- */
TpKernelStatus tp_cuda_linear_backward_f32(const float *dy, const float *x, const float *w, int64_t M,
                                           int64_t K, int64_t N, bool transpose_w, float *dx, float *dw,
                                           float *dbias, TpStream *stream);
TpKernelStatus tp_cuda_matmul_backward_f32(const TpTensor *dy, const TpTensor *a, const TpTensor *b,
                                           TpTensor *da, TpTensor *db, TpStream *stream);

/* ---- cpu/layout_backward.h ---- */
TpKernelStatus tp_cuda_gather_backward(const TpTensor *dy, const TpTensor *indices, int axis, int64_t padding_idx,
                                       TpTensor *ddata,
                                       int64_t *bad, TpStream *stream);
TpKernelStatus tp_cuda_gather_elements_backward(const TpTensor *dy, const TpTensor *indices, int axis,
                                                TpTensor *ddata, int64_t *bad, TpStream *stream);
TpKernelStatus tp_cuda_slice_backward(const TpTensor *dy, const int64_t *starts, const int64_t *steps,
                                      TpTensor *dx, TpStream *stream);

/* ---- cpu/nn_backward.h ---- */
TpKernelStatus tp_cuda_layernorm_backward_f32(const float *dy, const float *x, const float *scale,
                                              const float *mean, const float *inv_std, int64_t rows,
                                              int64_t n, float *dx, float *dscale, float *dbias,
                                              TpStream *stream);
TpKernelStatus tp_cuda_gelu_backward_f32(const float *dy, const float *x, int64_t n, bool tanh_approx,
                                         float *dx, TpStream *stream);
TpKernelStatus tp_cuda_softmax_backward_f32(const float *dy, const float *y, int64_t outer, int64_t n,
                                            int64_t inner, bool log, float *dx, TpStream *stream);
TpKernelStatus tp_cuda_attention_backward_f32(const TpAttention *p, const float *dy, const float *q,
                                              const float *k, const float *v, float *dq, float *dk, float *dv,
                                              TpStream *stream);
TpKernelStatus tp_cuda_cross_entropy_backward_f32(const float *dloss, const float *logits,
                                                  const int64_t *targets, int64_t R, int64_t V,
                                                  float denominator, float *dlogits, int64_t *bad,
                                                  TpStream *stream);

/* ---- cpu/transformer.h ---- */
TpKernelStatus tp_cuda_rmsnorm_backward_f32(const float *dy, const float *x, const float *scale, int64_t rows,
                                            int64_t n, float eps, float *dx, float *dscale, TpStream *stream);
TpKernelStatus tp_cuda_rotary_backward_f32(const float *dy, const float *cos, const float *sin, int rank,
                                           const int64_t *dims, const int64_t *table_dims, int64_t rotary_dim,
                                           bool interleaved, float *dx, TpStream *stream);
TpKernelStatus tp_cuda_swiglu_backward_f32(const float *dy, const float *gate, const float *up, int64_t n,
                                           float *dgate, float *dup, TpStream *stream);

/* ---- --precision bf16: the matrix products ---- */
TpKernelStatus tp_cuda_bf16_matmul(const TpTensor *a, const TpTensor *b, TpTensor *y, TpStream *stream);
TpKernelStatus tp_cuda_bf16_gemm(const TpTensor *a, const TpTensor *b, const TpTensor *c, bool trans_a,
                                 bool trans_b, double alpha, double beta, TpTensor *y, TpStream *stream);
TpKernelStatus tp_cuda_bf16_linear_f32(const float *x, const float *w, const float *bias, int64_t M,
                                       int64_t K, int64_t N, bool transpose_w, float *y, TpStream *stream);
TpKernelStatus tp_cuda_bf16_linear_backward_f32(const float *dy, const float *x, const float *w, int64_t M,
                                                int64_t K, int64_t N, bool transpose_w, float *dx, float *dw,
                                                float *dbias, TpStream *stream);
TpKernelStatus tp_cuda_bf16_matmul_backward_f32(const TpTensor *dy, const TpTensor *a, const TpTensor *b,
                                                TpTensor *da, TpTensor *db, TpStream *stream);

#ifdef __cplusplus
}
#endif

#endif
