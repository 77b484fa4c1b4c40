/* The CUDA kernels' launchers that several entry points of ops.h, the compute backend
 * (backend.cu) or the tests share, callable from C: each runs one kernel (or a fixed pair) on
 * `stream` over DEVICE pointers and returns without synchronising. Each computes what the
 * CPU kernel it names computes (same formulas, same shapes, same NULL conventions); sums
 * differ from the CPU's only in their order (tests/cuda states the tolerances). In the
 * emulated test build the pointers are host pointers and the kernels run on the CPU. */
#ifndef TOKPIPE_CUDA_KERNELS_H
#define TOKPIPE_CUDA_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st *TpCudaStream; /* cudaStream_t */

/* ---- embedding.cu ----
 * Ids as tp_embedding_f32's (negatives count from the end). An id out of range is not
 * read (its row of out is left as it was) and the smallest such position goes to *bad,
 * which the caller sets to INT64_MAX before (device memory). */
void tp_cuda_launch_embedding_f32(const float *table, const int64_t *ids, int64_t n, int64_t V, int64_t C,
                                  float *out, int64_t *bad, TpCudaStream stream);
/* Embedding's backward, and Gather's on any axis (tp_gather_backward): dy (outer, n, C)
 * added into dtable (outer, V, C) at the rows ids (n of them, int32 if ids_i32, else
 * int64) name, dtable zeroed first. Deterministic, the CPU's bits: the positions are sorted
 * by id (stable, on the device) and each row's are added in the order of i, no float
 * atomics. Out-of-range ids are skipped and reported in *bad as above; those naming row
 * padding_idx (>= 0; -1: none) add nothing. scratch: device memory of
 * tp_cuda_embedding_backward_scratch(n) bytes, 8-byte aligned. */
size_t tp_cuda_embedding_backward_scratch(int64_t n);
void tp_cuda_launch_embedding_backward_f32(const float *dy, const void *ids, bool ids_i32, int64_t padding_idx,
                                           int64_t n, int64_t outer, int64_t V, int64_t C, float *dtable,
                                           int64_t *bad, void *scratch, TpCudaStream stream);

/* ---- colsum.cu ----
 * tp_column_sums_f32 over dy (rows, n): sum_dy[j] = sum_r dy[r, j] and, when sum_dy_xhat
 * is wanted, sum_dy_xhat[j] = sum_r dy[r, j] (x[r, j] - mean[r]) inv_std[r] (mean NULL:
 * 0); either may be NULL. The CPU's bits (the same sums in the same order), deterministic.
 * scratch: device memory of tp_cuda_column_sums_scratch(rows, n, sums) bytes, sums the
 * number of results wanted (1 or 2), 4-byte aligned; 0 bytes (NULL will do) for 64 rows or
 * fewer. Two launches, one for 64 rows or fewer. */
size_t tp_cuda_column_sums_scratch(int64_t rows, int64_t n, int sums);
void tp_cuda_launch_column_sums_f32(const float *dy, const float *x, const float *mean, const float *inv_std,
                                    int64_t rows, int64_t n, float *sum_dy_xhat, float *sum_dy, void *scratch,
                                    TpCudaStream stream);

/* ---- loss.cu ----
 * tp_cross_entropy_pad_f32: *loss (device) = the sum over rows of logsumexp - the target's
 * logit, / denominator, each row's last pad columns padding (0: none); row_loss (R
 * doubles) is scratch. A target outside [0, V - pad) adds 0 and its smallest row goes to
 * *bad (set to INT64_MAX before). */
void tp_cuda_launch_cross_entropy_f32(const float *logits, const int64_t *targets, int64_t R, int64_t V, int64_t pad,
                                      float denominator, float *loss, double *row_loss, int64_t *bad,
                                      TpCudaStream stream);
/* tp_cross_entropy_backward_pad_f32 with dloss on the device (the backward of a loss that
 * stays there); rows with a bad target are left as they were and reported in *bad. */
void tp_cuda_launch_cross_entropy_backward_f32(const float *dloss, const float *logits, const int64_t *targets,
                                               int64_t R, int64_t V, int64_t pad, float denominator, float *dlogits,
                                               int64_t *bad, TpCudaStream stream);

/* The vocabulary-parallel kernels of runtime/cpu/transformer.h, part a device pointer
 * (TensorRank's result), pad the padded classes of the last range (none: 0), bad as above
 * (for the stats and the backward a bad target is
 * reported and its row left as it was). The embedding's forward and backward are the
 * whole table's with a range; the backward's scratch as tp_cuda_embedding_backward_scratch(n).
 * tp_cuda_launch_cross_entropy_parts_f32's row_loss (R doubles) is scratch. */
void tp_cuda_launch_embedding_part_f32(const float *table, const int64_t *ids, const int64_t *part, int64_t n,
                                       int64_t V, int64_t parts, int64_t C, float *out, int64_t *bad,
                                       TpCudaStream stream);
void tp_cuda_launch_embedding_part_backward_f32(const float *dy, const int64_t *ids, const int64_t *part, int64_t n,
                                                int64_t V, int64_t parts, int64_t C, float *dtable, int64_t *bad,
                                                void *scratch, TpCudaStream stream);
void tp_cuda_launch_cross_entropy_stats_f32(const float *logits, const int64_t *targets, const int64_t *part,
                                            int64_t R, int64_t V, int64_t parts, int64_t pad, float *stats,
                                            int64_t *bad, TpCudaStream stream);
void tp_cuda_launch_cross_entropy_parts_f32(const float *stats, int64_t R, int64_t parts, float denominator,
                                            float *loss, double *row_loss, TpCudaStream stream);
void tp_cuda_launch_cross_entropy_parts_backward_f32(const float *dloss, const float *logits, const int64_t *targets,
                                                     const float *stats, const int64_t *part, int64_t R, int64_t V,
                                                     int64_t parts, int64_t pad, float denominator, float *dlogits,
                                                     int64_t *bad, TpCudaStream stream);

/* ---- optim.cu ---- */
/* tp_adamw_step over n parameters (the scalar factors computed on the host in double) */
void tp_cuda_launch_adamw_step(float *w, const float *g, float *m, float *v, int64_t n, double lr, double beta1,
                               double beta2, double eps, double weight_decay, int64_t step, TpCudaStream stream);
/* Pieces of the sum of squares (tp_sum_squares_f32's). */
enum { TP_CUDA_SUM_PIECES = 64 };
/* out[j] (device) = the sum of squares of piece first + j of x, j < count: tp_sum_squares_pieces_f32's
 * pieces, each in a fixed order of its own (deterministic); the host adds them. */
void tp_cuda_launch_sum_squares_pieces_f32(const float *x, int64_t n, int first, int count, double *out,
                                           TpCudaStream stream);
/* tp_scale_f32 with the factor on the device (the clipping factor computed there). */
void tp_cuda_launch_scale_f32(float *x, int64_t n, const float *s, TpCudaStream stream);

/* ---- elementwise.cu, reduce.cu (layout.cu below): the ops plans keep around the kernels above ---- */
#include "../kernels/args.h" /* TpTensor, TpUnaryOp, TpBinaryOp */
#include "../kernels/iter.h" /* TpIter */

/* tp_unary over n f32 elements (x and y may alias): every op but Not (bool only), which
 * returns false and launches nothing. */
bool tp_cuda_launch_unary_f32(TpUnaryOp op, const float *x, int64_t n, float *y, TpCudaStream stream);
/* tp_binary's f32 arithmetic (Add, Sub, Mul, Div, Pow, Max, Min) with numpy broadcasting:
 * `it` is the host's iterator over (y, a, b) from tp_iter_broadcast (then coalesced or not),
 * byte strides of f32 elements. False (nothing launched) for a comparison or And, whose
 * result is bool. */
bool tp_cuda_launch_binary_f32(TpBinaryOp op, const TpIter *it, const float *a, const float *b, float *y,
                               TpCudaStream stream);
/* tp_where on f32: `it` over (y, cond, a, b), cond bool (1 byte). */
void tp_cuda_launch_where_f32(const TpIter *it, const bool *cond, const float *a, const float *b, float *y,
                              TpCudaStream stream);
/* tp_reduce_sum on f32: x's dims (host) and data (device), axes sorted and distinct; y holds
 * the kept dims' elements. The CPU's sums in its order, runs of 64 elements in double (the
 * same bits; deterministic). scratch: device memory of tp_cuda_reduce_sum_scratch bytes,
 * 8-byte aligned (0 bytes, NULL will do, where no output adds more than 64 elements). Two
 * launches, one where no output adds more than 64. False for bad axes. */
size_t tp_cuda_reduce_sum_scratch(const TpTensor *x, const int64_t *axes, int naxes);
bool tp_cuda_launch_reduce_sum_f32(const TpTensor *x, const int64_t *axes, int naxes, bool mean, float *y,
                                   void *scratch, TpCudaStream stream);
/* The same on x's dtype (any but bool; y of that dtype): integers wrap and their mean
 * truncates, as the CPU's. */
bool tp_cuda_launch_reduce_sum(const TpTensor *x, const int64_t *axes, int naxes, bool mean, void *y, void *scratch,
                               TpCudaStream stream);

/* ---- layout.cu: layout ops as strided copies (data on the device, dims on the host;
 * shapes as the CPU kernel named accepts them, which the caller has checked). The ones
 * taking TpTensor views move elements of any dtype (their dtype's size), despite the
 * _f32 of their names. ---- */
/* y = x through an iterator over (y, x) in byte strides, elements of es bytes: Expand with
 * tp_iter_broadcast's. */
void tp_cuda_launch_strided_copy(const TpIter *it, size_t es, const void *x, void *y, TpCudaStream stream);
void tp_cuda_launch_strided_copy_f32(const TpIter *it, const float *x, float *y, TpCudaStream stream);
/* Reshape (tp_reshape): n contiguous elements; nothing when x == y. */
void tp_cuda_launch_copy_f32(const float *x, int64_t n, float *y, TpCudaStream stream);
/* tp_transpose; false (nothing launched) for a perm that is no permutation fitting y. */
bool tp_cuda_launch_transpose_f32(const TpTensor *x, const int64_t *perm, TpTensor *y, TpCudaStream stream);
/* tp_slice (steps may be negative; tp_slice_fits holds for every dim) */
void tp_cuda_launch_slice_f32(const TpTensor *x, const int64_t *starts, const int64_t *steps, TpTensor *y,
                              TpCudaStream stream);
/* tp_slice_backward: dx = 0, then dy written where the slice read */
void tp_cuda_launch_slice_backward_f32(const TpTensor *dy, const int64_t *starts, const int64_t *steps, TpTensor *dx,
                                       TpCudaStream stream);
/* tp_split (a piece whose data is NULL is skipped) and tp_concat */
void tp_cuda_launch_split_f32(const TpTensor *x, int axis, TpTensor *ys, int n, TpCudaStream stream);
void tp_cuda_launch_concat_f32(const TpTensor *xs, int n, int axis, TpTensor *y, TpCudaStream stream);
/* tp_context_append: x as rows [at, at + x->dims[axis]) of buffer's `rows` along axis */
void tp_cuda_launch_context_append_f32(const TpTensor *x, int axis, int64_t at, int64_t rows, float *buffer,
                                       TpCudaStream stream);

#ifdef __cplusplus
}
#endif

#endif
