/* The shape and dtype checks the CPU and CUDA kernels share: each returns the status both
 * targets' kernel returns for operands that do not fit (TP_KERNEL_OK when they do), and
 * some derive what the kernel computes over. Where the targets implement different dtypes
 * (the CPU's matrix products take more than f32), each checks its dtypes first and then
 * calls the shape check here. */
#ifndef TOKPIPE_KERNELS_CHECK_H
#define TOKPIPE_KERNELS_CHECK_H

#include <stdbool.h>
#include <stdint.h>

#include "args.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A cross-entropy over V classes whose last `pad` are a padded vocabulary's: 0 <= pad, and
 * a padded row keeps a class (an unpadded one may have none) */
TpKernelStatus tp_check_vocab_pad(int64_t V, int64_t pad);
/* tp_unary: op's dtypes (scalar.h's tp_unary_dtype_ok), y of x's dtype and dims */
TpKernelStatus tp_check_unary(TpUnaryOp op, const TpTensor *x, const TpTensor *y);
/* tp_cast: numeric or bool dtypes, the same dims */
TpKernelStatus tp_check_cast(const TpTensor *x, const TpTensor *y);
/* tp_reshape: one dtype, the same element count */
TpKernelStatus tp_check_reshape(const TpTensor *x, const TpTensor *y);
/* tp_tile: one dtype and rank, each of y's dims a multiple of x's */
TpKernelStatus tp_check_tile(const TpTensor *x, const TpTensor *y);
/* tp_slice (x the whole, y the slice) and tp_slice_backward (dx the whole, dy the slice):
 * one dtype and rank, each dim's slice inside the whole (tp_slice_fits) */
TpKernelStatus tp_check_slice(const TpTensor *whole, const int64_t *starts, const int64_t *steps,
                              const TpTensor *slice);

/* Index j of an i64 or i32 indices tensor (host memory). */
static inline int64_t tp_index_at(const TpTensor *indices, int64_t j) {
  return indices->dtype == TP_I64 ? ((const int64_t *)indices->data)[j] : ((const int32_t *)indices->data)[j];
}

/* tp_gather's checks of indices against data's dims (`data_dims`, rank `rank`) and of y's
 * dims (its backward's too, with dy as y): the status it would return, but for the dtypes
 * of data and y. bad NULL: the shapes only, the indices not read (they may be on a device). */
TpKernelStatus tp_gather_check(int rank, const int64_t *data_dims, const TpTensor *indices, int axis,
                               const TpTensor *y, int64_t *bad);
/* tp_gather_elements' checks of indices against data's dims (`data_dims`, rank `rank`) and
 * of y's dims (its backward's too, with dy as y): the status it would return. bad NULL:
 * the shapes only, as tp_gather_check. */
TpKernelStatus tp_gather_elements_check(int rank, const int64_t *data_dims, const TpTensor *indices, int axis,
                                        const TpTensor *y, int64_t *bad);
/* tp_split's and tp_concat's checks of the pieces against the whole along axis: the status
 * they return. */
TpKernelStatus tp_pieces_check(const TpTensor *whole, const TpTensor *pieces, int n, int axis);
/* tp_topk: x numeric, y i64 of x's dims but k <= x's on axis */
TpKernelStatus tp_topk_check(const TpTensor *x, int axis, const TpTensor *y);

/* ---- matrix products ---- */

/* The layout of numpy's matmul a x b: M x K times K x N matrices over right-aligned,
 * broadcast batch dims (a 1-D a is [1, K], a 1-D b is [K, 1]). Shared by the forward and
 * backward kernels of both targets. */
typedef struct {
  int64_t M, K, N;
  int rank;                                 /* batch dims */
  int64_t dims[TP_MAX_RANK];                /* the broadcast batch dims */
  int64_t sa[TP_MAX_RANK], sb[TP_MAX_RANK]; /* strides in whole matrices, 0 where broadcast */
  int64_t nbatch, na, nb;                   /* matrices in the batch, in a, in b */
} TpMatmulLayout;
/* False if the shapes do not multiply. */
bool tp_matmul_layout(const TpTensor *a, const TpTensor *b, TpMatmulLayout *l);
/* The matrix indices in a and b of batch element n. */
void tp_matmul_operands(const TpMatmulLayout *l, int64_t n, int64_t *ia, int64_t *ib);

/* tp_matmul's shapes (its dtypes are the target's): the layout into *l, y of its size */
TpKernelStatus tp_check_matmul_shape(const TpTensor *a, const TpTensor *b, const TpTensor *y, TpMatmulLayout *l);
/* tp_matmul_backward_f32: f32 operands, da and db (either may be NULL) of a's and b's
 * sizes, dy of the product's; the layout into *l */
TpKernelStatus tp_check_matmul_backward(const TpTensor *dy, const TpTensor *a, const TpTensor *b, const TpTensor *da,
                                        const TpTensor *db, TpMatmulLayout *l);

/* tp_gemm's shapes (its dtypes are the target's): op(a) [M, K], op(b) [K, N], y [M, N],
 * and c (when c and beta != 0) broadcast to [M, N] from [cm, cn] */
typedef struct {
  int64_t M, K, N, cm, cn;
  bool with_c;
} TpGemmShape;
TpKernelStatus tp_check_gemm_shape(const TpTensor *a, const TpTensor *b, const TpTensor *c, bool trans_a,
                                   bool trans_b, double beta, const TpTensor *y, TpGemmShape *g);

#ifdef __cplusplus
}
#endif

#endif
