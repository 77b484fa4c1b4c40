/* Matrix products on the CPU: numpy MatMul and ONNX Gemm over TpTensor views, and a
 * row-major sgemm wrapper for the other kernels. f32 and f64 go to OpenBLAS; integer
 * types use a plain loop. */
#ifndef TOKPIPE_CPU_MATMUL_H
#define TOKPIPE_CPU_MATMUL_H

#include <stdbool.h>
#include <stdint.h>

#include "../../base/tensor.h"
#include "../kernels/args.h"
#include "../kernels/check.h" /* TpMatmulLayout */

/* y = a @ b with numpy semantics: a 1-D a is [1,K] and a 1-D b is [K,1] (the added dim is
 * not in y), the batch dims (all but the last two) broadcast. y's data is allocated with
 * the result shape. TP_KERNEL_BAD_DTYPE for mixed or unsupported dtypes, TP_KERNEL_BAD_SHAPE for
 * shapes that do not fit (tp_gemm likewise). */
TpKernelStatus tp_matmul(const TpTensor *a, const TpTensor *b, TpTensor *y);

/* y[M,N] = alpha * op(a) @ op(b) + beta * c, where op() transposes a 2-D operand when its
 * trans flag is set and c (NULL when absent) broadcasts to [M,N]. */
TpKernelStatus tp_gemm(const TpTensor *a, const TpTensor *b, const TpTensor *c, bool trans_a, bool trans_b,
             double alpha, double beta, TpTensor *y);

/* Row-major C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C with leading dimensions.
 * Splits a large product over OpenMP's threads; inside a parallel region it runs on the
 * calling thread alone. OpenBLAS itself is kept single-threaded. */
void tp_sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
              const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
              int64_t ldc);

#endif
