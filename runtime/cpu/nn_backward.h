/* Backward kernels of the products and layers, f32 (ir/ops.def's *Backward ops): each
 * takes the gradient of the forward result (dy) and what the forward read, and WRITES the
 * gradients of the forward operands (it does not accumulate: a gradient used twice is
 * summed by the autodiff with Add). A NULL result pointer skips that gradient. Flat
 * row-major arrays with the shapes in the comments, like the forward kernels (matmul.h,
 * nn.h, transformer.h). Long sums accumulate in double; none depends on the thread count,
 * so results are reproducible bit for bit. */
#ifndef TOKPIPE_CPU_NN_BACKWARD_H
#define TOKPIPE_CPU_NN_BACKWARD_H

#include <stdbool.h>
#include <stdint.h>

#include "../../base/tensor.h"
#include "elementwise.h" /* TpKernelStatus */
#include "nn.h"          /* TpAttention */

/* Of tp_linear_f32 (y = x @ w + bias):
 *   dy (M, N), x (M, K), w (K, N) or (N, K) when transpose_w
 *   dx (M, K) = dy @ w^T
 *   dw like w = x^T @ dy (or dy^T @ x)
 *   dbias (N) = the sum of dy's rows */
TpKernelStatus tp_linear_backward_f32(const float *dy, const float *x, const float *w, int64_t M, int64_t K,
                            int64_t N, bool transpose_w, float *dx, float *dw, float *dbias);

/* Of tp_matmul (y = a @ b, numpy semantics): da = dy @ b^T with a's shape, db = a^T @ dy
 * with b's shape; a 1-D operand is promoted as in the forward, and a batch dim an operand
 * was broadcast along is summed over. f32 views; da or db may be NULL. BAD_DTYPE or BAD_SHAPE if the shapes
 * or dtypes do not fit. */
TpKernelStatus tp_matmul_backward_f32(const TpTensor *dy, const TpTensor *a, const TpTensor *b, TpTensor *da,
                            TpTensor *db);

/* Over the rows of dy (rows, n): sum_dy[j] = sum_r dy[r, j] and, when x is given,
 * sum_dy_xhat[j] = sum_r dy[r, j] * (x[r, j] - mean[r]) * inv_std[r] (mean NULL: 0);
 * either result may be NULL. The order of the sums does not depend on the thread count. */
void tp_column_sums_f32(const float *dy, const float *x, const float *mean, const float *inv_std,
                        int64_t rows, int64_t n, float *sum_dy_xhat, float *sum_dy);

/* Of tp_layernorm_f32, with its saved statistics:
 *   dy, x, dx (rows, n); scale (n); mean, inv_std (rows)
 *   dx = inv_std * (g - mean(g) - xhat * mean(g * xhat)), g = dy * scale,
 *        xhat = (x - mean) * inv_std
 *   dscale (n) = sum over rows of dy * xhat; dbias (n) = sum over rows of dy */
TpKernelStatus tp_layernorm_backward_f32(const float *dy, const float *x, const float *scale,
                               const float *mean, const float *inv_std, int64_t rows, int64_t n,
                               float *dx, float *dscale, float *dbias);

/* Of Gelu (x * Phi(x), or its tanh approximation): dx = dy * gelu'(x). dy, x, dx (n);
 * dx may alias dy. */
TpKernelStatus tp_gelu_backward_f32(const float *dy, const float *x, int64_t n, bool tanh_approx, float *dx);

/* Of tp_softmax_f32 along the middle axis of (outer, n, inner), from the forward RESULT y:
 *   softmax:     dx = y * (dy - sum_j dy * y)
 *   log-softmax: dx = dy - exp(y) * sum_j dy
 * dy, y, dx (outer, n, inner); dx may alias dy. */
TpKernelStatus tp_softmax_backward_f32(const float *dy, const float *y, int64_t outer, int64_t n,
                             int64_t inner, bool log, float *dx);

/* Of tp_attention_f32 without past (p->past_len 0): the probabilities are recomputed from
 * q, k and the mask (nothing is saved by the forward); the mask is a constant and gets no
 * gradient.
 *   q, dq (B, q_heads, q_len, D)     or packed (B, q_len, q_heads * D)
 *   k, dk (B, kv_heads, kv_len, D)   or packed; k with kv_rows rows (TpAttention.kv_rows)
 *   v, dv (B, kv_heads, kv_len, Dv)  or packed; v likewise, dk and dv dense
 *   dy    (B, q_heads, q_len, Dv)    or packed
 * Grouped-query heads sum into their shared kv head. Causal (with causal_offset and
 * window), mask, scale and softcap as in the forward. Like the forward, each block of
 * query rows computes only the keys its rows see (keys no query sees get zero dk, dv).
 * Work is spread over (batch, kv head). */
TpKernelStatus tp_attention_backward_f32(const TpAttention *p, const float *dy, const float *q,
                               const float *k, const float *v, float *dq, float *dk, float *dv);

/* Of tp_cross_entropy_f32:
 *   logits, dlogits (R, V); targets (R)
 *   dlogits[r, :] = (softmax(logits[r, :]) - onehot(targets[r])) * dloss / denominator
 * A target outside [0, V) gives TP_KERNEL_BAD_INDEX with its row in *bad. */
TpKernelStatus tp_cross_entropy_backward_f32(float dloss, const float *logits,
                                             const int64_t *targets, int64_t R, int64_t V,
                                             float denominator, float *dlogits, int64_t *bad);

#endif
