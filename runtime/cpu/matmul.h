/* Matrix products on the CPU: numpy MatMul and ONNX Gemm over TpTensor views, and a
 * row-major sgemm wrapper for the other kernels. f32 and f64 go to OpenBLAS; integer
 * types use a plain loop. MatMul and Gemm are declared from their rows of
 * runtime/kernels/kernels.def (kernels.h), their comments there. */
#ifndef TOKPIPE_CPU_MATMUL_H
#define TOKPIPE_CPU_MATMUL_H

#include <stdbool.h>
#include <stdint.h>

#include "../../base/tensor.h"
#include "../kernels/args.h"
#include "../kernels/check.h" /* TpMatmulLayout */
#include "kernels.h"

/* Row-major C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C with leading dimensions.
 * Splits a large product over OpenMP's threads; inside a parallel region it runs on the
 * calling thread alone. OpenBLAS itself is kept single-threaded. */
void tp_sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
              const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

#endif
