/* Matrix products on the GPU through cuBLASLt, behind thin entry points that compute what
 * the CPU kernels they name compute (same shapes, same NULL and overwrite conventions),
 * over DEVICE pointers, on `stream`, without synchronising. All products accumulate in
 * fp32 (CUBLAS_COMPUTE_32F, never the TF32 compute types), on f32 operands or, in the *_bf16
 * entries, on bf16 operands (the bits of base/tensor.h's TP_BF16: tensor cores) with f32
 * outputs; results differ from the CPU's product of the same values only in the order of
 * the sums. In the emulated test build
 * (TOKPIPE_CUDA_EMULATE) the same entry points run the products through OpenBLAS
 * (cblas_sgemm, with the same column-major operands as the cuBLASLt call, a batched call
 * one element after another, a bias added as the CPU Linear adds it) and the fill and
 * reduction kernels through the emulation, with the same plan cache; bf16 operands are
 * widened to f32 first, which gives the same products. */
#ifndef TOKPIPE_CUDA_BLAS_H
#define TOKPIPE_CUDA_BLAS_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels.h" /* TpCudaStream */

#ifdef __cplusplus
extern "C" {
#endif
#include "../kernels/check.h" /* TpMatmulLayout, tp_matmul_operands: a C header */

/* A cuBLASLt handle, its workspace and its plan cache: one per stream (calls on two
 * streams at once would share the workspace), created once, destroyed at close. The cache
 * holds up to TP_CUDA_BLAS_PLANS plans (descriptors, layouts and the heuristic's algorithm),
 * one per distinct product (shapes, transposes, dtypes, leading dims, operand alignments,
 * batch count and strides, epilogue), the least recently used replaced when full; a
 * product without a plan queries the heuristic once (stats.h's queries). */
enum { TP_CUDA_BLAS_PLANS = 256 };
typedef struct TpCudaBlas TpCudaBlas;
TpCudaBlas *tp_cuda_blas_create(void);
void tp_cuda_blas_destroy(TpCudaBlas *blas);

/* tp_linear_f32: y (M, N) = x (M, K) @ w (K, N), or w (N, K) transposed when transpose_w,
 * + bias (N) or NULL */
void tp_cuda_launch_linear_f32(TpCudaBlas *blas, const float *x, const float *w, const float *bias, int64_t M,
                               int64_t K, int64_t N, bool transpose_w, float *y, TpCudaStream stream);
/* tp_cuda_launch_linear_f32 on bf16 x and w (the bits of base/tensor.h's TP_BF16): the products
 * accumulate in fp32 (CUBLAS_COMPUTE_32F); bias and y are fp32. */
void tp_cuda_launch_linear_bf16(TpCudaBlas *blas, const uint16_t *x, const uint16_t *w, const float *bias, int64_t M,
                                int64_t K, int64_t N, bool transpose_w, float *y, TpCudaStream stream);
/* tp_linear_backward_f32: dx (M, K) = dy @ w^T, dw like w = x^T @ dy (dy^T @ x when
 * transpose_w), dbias (N) = the sum of dy's rows; each overwritten, each may be NULL. */
void tp_cuda_launch_linear_backward_f32(TpCudaBlas *blas, const float *dy, const float *x, const float *w, int64_t M,
                                        int64_t K, int64_t N, bool transpose_w, float *dx, float *dw, float *dbias,
                                        TpCudaStream stream);
/* tp_cuda_launch_linear_backward_f32's dx and dw from bf16 dy, x and w; dbias from dy_f32, the
 * gradient before its rounding to bf16 (a sum, no product: as the f32 plan's), which may be
 * NULL when dbias is. */
void tp_cuda_launch_linear_backward_bf16(TpCudaBlas *blas, const uint16_t *dy, const uint16_t *x, const uint16_t *w,
                                         const float *dy_f32, int64_t M, int64_t K, int64_t N, bool transpose_w,
                                         float *dx, float *dw, float *dbias, TpCudaStream stream);

/* tp_linear_gelu_f32 on f32 x and w, or bf16 ones when bf16: pre (M, N) = x @ w + bias
 * (or NULL), y (M, N) = gelu_tanh(pre), one product with cuBLASLt's GELU_AUX_BIAS epilogue
 * (GELU_AUX without a bias) where it takes pre (N a multiple of 8, pre 16-byte aligned),
 * else the product and an elementwise kernel. */
void tp_cuda_launch_linear_gelu(TpCudaBlas *blas, bool bf16, const void *x, const void *w, const float *bias,
                                int64_t M, int64_t K, int64_t N, bool transpose_w, float *pre, float *y,
                                TpCudaStream stream);
/* tp_linear_backward_dgelu_f32 on f32 dy, x and w, or bf16 ones when bf16 (then dbias from
 * dy_f32 as in tp_cuda_launch_linear_backward_bf16; else dy_f32 is dy): dx = (dy @ w^T) *
 * gelu_tanh'(pre) as one product with the DGELU epilogue where it takes pre (K a multiple of
 * 8), else the product and an elementwise kernel; dw and dbias as the Linear's. */
void tp_cuda_launch_linear_backward_dgelu(TpCudaBlas *blas, bool bf16, const void *dy, const void *x, const void *w,
                                          const float *dy_f32, const float *pre, int64_t M, int64_t K, int64_t N,
                                          bool transpose_w, float *dx, float *dw, float *dbias, TpCudaStream stream);

/* tp_matmul on f32 (numpy semantics, broadcast batch dims): l is tp_matmul_layout of a's
 * and b's shapes (host memory); y (l->nbatch, M, N) is overwritten. The batch is one
 * strided-batched cuBLASLt call over the trailing batch dims along which each operand steps
 * or is broadcast (stride 0), one call per index of the dims before them. */
void tp_cuda_launch_matmul_f32(TpCudaBlas *blas, const TpMatmulLayout *l, const float *a, const float *b, float *y,
                               TpCudaStream stream);
/* tp_cuda_launch_matmul_f32 on bf16 a and b; y is fp32. */
void tp_cuda_launch_matmul_bf16(TpCudaBlas *blas, const TpMatmulLayout *l, const uint16_t *a, const uint16_t *b,
                                float *y, TpCudaStream stream);
/* tp_matmul_backward_f32: da = dy @ b^T with a's shape, db = a^T @ dy with b's shape, a
 * batch dim an operand was broadcast along summed over; each overwritten, each may be NULL. */
void tp_cuda_launch_matmul_backward_f32(TpCudaBlas *blas, const TpMatmulLayout *l, const float *dy, const float *a,
                                        const float *b, float *da, float *db, TpCudaStream stream);
/* tp_cuda_launch_matmul_backward_f32 on bf16 dy, a and b; da and db are fp32. */
void tp_cuda_launch_matmul_backward_bf16(TpCudaBlas *blas, const TpMatmulLayout *l, const uint16_t *dy,
                                         const uint16_t *a, const uint16_t *b, float *da, float *db,
                                         TpCudaStream stream);

#ifdef __cplusplus
}
#endif

#endif
