/* Forward kernels of the raised transformer ops (ir/ops.def: Linear, Embedding,
 * CrossEntropy), f32, over flat row-major arrays; the shapes are in the comments. Their
 * backward kernels are in nn_backward.h (Embedding's is tp_gather_backward). Shared by the
 * reference interpreter and the generated trainer. */
#ifndef TOKPIPE_CPU_TRANSFORMER_H
#define TOKPIPE_CPU_TRANSFORMER_H

#include <stdbool.h>
#include <stdint.h>

#include "elementwise.h" /* TpKernelStatus */

/* y = x @ w + bias, one sgemm over all rows.
 *   x (M, K)   M = the product of the leading dims of X[..., K]
 *   w (K, N), or (N, K) when transpose_w
 *   bias (N) or NULL
 *   y (M, N) */
void tp_linear_f32(const float *x, const float *w, const float *bias, int64_t M, int64_t K,
                   int64_t N, bool transpose_w, float *y);

/* out[i, :] = table[ids[i], :], ids as in ONNX Gather (-V <= id < V, negatives count from
 * the end).
 *   table (V, C), ids (n), out (n, C)
 * An id out of range gives TP_KERNEL_BAD_INDEX with its position in ids in *bad (out is
 * then unspecified). */
TpKernelStatus tp_embedding_f32(const float *table, const int64_t *ids, int64_t n, int64_t V,
                                int64_t C, float *out, int64_t *bad);

/* *loss = sum over rows r of (logsumexp(logits[r, :]) - logits[r, targets[r]]), divided by
 * denominator (rows for a mean). The sum is in double and its order does not depend on
 * the thread count, so the result is reproducible bit for bit.
 *   logits (R, V), targets (R)
 * A target outside [0, V) gives TP_KERNEL_BAD_INDEX with its row in *bad. */
TpKernelStatus tp_cross_entropy_f32(const float *logits, const int64_t *targets, int64_t R,
                                    int64_t V, float denominator, float *loss, int64_t *bad);

#endif
