/* Forward kernels of the raised transformer ops (ir/ops.def: Linear, Embedding,
 * CrossEntropy, RMSNorm, Rotary, SwiGLU, GeGLU), f32, over flat row-major arrays; the shapes are
 * in the comments. The backward kernels of the first three are in nn_backward.h
 * (Embedding's is tp_gather_backward); those of the fused ops of modern blocks follow
 * their forward ones here, with nn_backward.h's conventions (they write the gradients; a
 * NULL result pointer skips one). Shared by the reference interpreter and the generated
 * trainer. */
#ifndef TOKPIPE_CPU_TRANSFORMER_H
#define TOKPIPE_CPU_TRANSFORMER_H

#include <stdbool.h>
#include <stdint.h>

#include "../kernels/args.h"

/* y = x @ w + bias, one sgemm over all rows.
 *   x (M, K)   M = the product of the leading dims of X[..., K]
 *   w (K, N), or (N, K) when transpose_w
 *   bias (N) or NULL
 *   y (M, N) */
TpKernelStatus tp_linear_f32(const float *x, const float *w, const float *bias, int64_t M, int64_t K,
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

/* ---- Vocabulary-parallel embedding and loss (ir/ops.def; passes/shard_tensor.c) ----
 * The vocabulary of V * parts classes is cut into parts ranges of V; this rank holds
 * range *part, classes [*part * V, (*part + 1) * V) (part points at TensorRank's result:
 * device memory for the CUDA kernels). Summing a forward's results over the ranks (the
 * AllReduce after it) gives the unsplit kernel's; each backward gives this range's part
 * of the unsplit gradient. An id or target outside [0, V * parts) (ids also [-V * parts,
 * 0), counted from the end) gives TP_KERNEL_BAD_INDEX with its position in *bad. */

/* tp_embedding_f32 of the range: out[i, :] = table[ids[i] - *part * V, :] for the ids in
 * it, zeros for the others.
 *   table (V, C), ids (n), out (n, C) */
TpKernelStatus tp_embedding_part_f32(const float *table, const int64_t *ids, const int64_t *part, int64_t n,
                                     int64_t V, int64_t parts, int64_t C, float *out, int64_t *bad);

/* Its backward: dtable = the sum of dy[i, :] into the row of each id in the range, in the
 * order of i (the bits of the unsplit GatherBackward's rows).
 *   dy (n, C), ids (n), dtable (V, C) */
TpKernelStatus tp_embedding_part_backward_f32(const float *dy, const int64_t *ids, const int64_t *part, int64_t n,
                                              int64_t V, int64_t parts, int64_t C, float *dtable, int64_t *bad);

/* CrossEntropyStats: per row r of stats (2 parts + 1 columns), column *part the row's
 * maximum mx, column parts + *part the sum of exp(logits[r, j] - mx) (as
 * tp_cross_entropy_f32's, in double, stored as float; 1 for an infinite mx), column
 * 2 parts the target's logit when it is in the range; every other column 0. Summed over
 * the ranks, a row holds every range's maximum and sum: the whole row's logsumexp without
 * the rounding of a logsumexp stored as float.
 *   logits (R, V), targets (R), stats (R, 2 parts + 1) */
TpKernelStatus tp_cross_entropy_stats_f32(const float *logits, const int64_t *targets, const int64_t *part, int64_t R,
                                          int64_t V, int64_t parts, float *stats, int64_t *bad);

/* CrossEntropy from the statistics summed over the ranks: *loss = the sum over rows of
 * lse_r - stats[r, 2 parts], lse_r = M + log(sum over ranges p of sum_p exp(max_p - M)),
 * M the largest max_p, divided by denominator; in double, in a fixed order, so every
 * rank gets the same bits. */
TpKernelStatus tp_cross_entropy_parts_f32(const float *stats, int64_t R, int64_t parts, float denominator,
                                          float *loss);

/* Its backward, the range's dlogits: (exp(logits[r, j] - lse_r) - onehot(targets[r])) *
 * dloss / denominator, computed as exp(logits - M) / (the forward's sum), as
 * tp_cross_entropy_backward_f32 does with its row's maximum.
 *   logits, dlogits (R, V), targets (R), stats (R, 2 parts + 1) */
TpKernelStatus tp_cross_entropy_parts_backward_f32(float dloss, const float *logits, const int64_t *targets,
                                                   const float *stats, const int64_t *part, int64_t R, int64_t V,
                                                   int64_t parts, float denominator, float *dlogits, int64_t *bad);

/* y = x / sqrt(mean(x^2) + eps) * scale, per row; the mean of squares in double.
 *   x, y (rows, n); scale (n) */
TpKernelStatus tp_rmsnorm_f32(const float *x, const float *scale, int64_t rows, int64_t n, float eps, float *y);

/* Of tp_rmsnorm_f32, with r = 1 / sqrt(mean(x^2) + eps) of each row recomputed:
 *   dy, x, dx (rows, n); scale, dscale (n)
 *   dx = r * (g - x * r^2 * mean(g * x)), g = dy * scale
 *   dscale = the sum over rows of dy * x * r */
TpKernelStatus tp_rmsnorm_backward_f32(const float *dy, const float *x, const float *scale, int64_t rows,
                             int64_t n, float eps, float *dx, float *dscale);

/* Rotary position embedding (ir/ops.def Rotary): over the first rotary_dim features of
 * each row, y = x * cos + rot(x) * sin, with rot(x) = [-x2, x1] of the halves x1, x2, or
 * (interleaved) of each pair (x[2i], x[2i+1]); the other features are copied.
 *   x, y: rank dims, the last D; cos, sin: table_dims (rank of them, the last rotary_dim,
 *   the others 1, broadcast, or dims[k]) */
TpKernelStatus tp_rotary_f32(const float *x, const float *cos, const float *sin, int rank, const int64_t *dims,
                   const int64_t *table_dims, int64_t rotary_dim, bool interleaved, float *y);

/* Of tp_rotary_f32 (a rotation, so the tables suffice): dx = dy * cos - rot(dy * sin) over
 * the first rotary_dim features, dy elsewhere. Shapes as tp_rotary_f32's. */
TpKernelStatus tp_rotary_backward_f32(const float *dy, const float *cos, const float *sin, int rank,
                            const int64_t *dims, const int64_t *table_dims, int64_t rotary_dim,
                            bool interleaved, float *dx);

/* y = silu(gate) * up = gate * sigmoid(gate) * up.  gate, up, y (n) */
TpKernelStatus tp_swiglu_f32(const float *gate, const float *up, int64_t n, float *y);

/* Of tp_swiglu_f32, s = sigmoid(gate):  dy, gate, up, dgate, dup (n)
 *   dgate = dy * up * s * (1 + gate * (1 - s)),  dup = dy * gate * s */
TpKernelStatus tp_swiglu_backward_f32(const float *dy, const float *gate, const float *up, int64_t n,
                            float *dgate, float *dup);

/* y = gelu(gate) * up, gelu the tanh approximation when tanh_approx.  gate, up, y (n; y
 * apart from the operands)
 * Rounded as the Gelu (tp_unary) and Mul it fuses: the same bits. */
TpKernelStatus tp_geglu_f32(const float *gate, const float *up, int64_t n, bool tanh_approx, float *y);

/* Of tp_geglu_f32:  dy, gate, up, dgate, dup (n; the results apart from the operands)
 *   dgate = (dy * up) * gelu'(gate),  dup = dy * gelu(gate)  (the unfused ops' bits) */
TpKernelStatus tp_geglu_backward_f32(const float *dy, const float *gate, const float *up, int64_t n,
                                     bool tanh_approx, float *dgate, float *dup);

#endif
