/* Matrix products on the CPU: numpy MatMul and ONNX Gemm over TpTensor views, and a
 * row-major sgemm wrapper for the other kernels. f32 and f64 go to OpenBLAS; integer
 * types use a plain loop. */
#ifndef TOKPIPE_CPU_MATMUL_H
#define TOKPIPE_CPU_MATMUL_H

#include <stdbool.h>
#include <stdint.h>

#include "../../base/tensor.h"
#include "kernel.h"

/* y = a @ b with numpy semantics: a 1-D a is [1,K] and a 1-D b is [K,1] (the added dim is
 * not in y), the batch dims (all but the last two) broadcast. y's data is allocated with
 * the result shape. TP_KERNEL_BAD_DTYPE for mixed or unsupported dtypes, TP_KERNEL_BAD_SHAPE for
 * shapes that do not fit (tp_gemm likewise). */
TpKernelStatus tp_matmul(const TpTensor *a, const TpTensor *b, TpTensor *y);

/* The layout of numpy's matmul a x b: M x K times K x N matrices over right-aligned,
 * broadcast batch dims (a 1-D a is [1, K], a 1-D b is [K, 1]). Shared by the forward and
 * backward kernels. */
typedef struct {
  int64_t M, K, N;
  int rank;                  /* batch dims */
  int64_t dims[TP_MAX_RANK]; /* the broadcast batch dims */
  int64_t sa[TP_MAX_RANK], sb[TP_MAX_RANK]; /* strides in whole matrices, 0 where broadcast */
  int64_t nbatch, na, nb;    /* matrices in the batch, in a, in b */
} TpMatmulLayout;
/* False if the shapes do not multiply. */
bool tp_matmul_layout(const TpTensor *a, const TpTensor *b, TpMatmulLayout *l);
/* The matrix indices in a and b of batch element n. */
void tp_matmul_operands(const TpMatmulLayout *l, int64_t n, int64_t *ia, int64_t *ib);

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

/* ---- argument structs ----
 * What the interpreter and the generated plans bind once per op (bind/bind.c) and pass to the
 * kernels above: each struct holds one kernel's parameters, tensors as views; the kernel's
 * row of bind/kernels.def says how each is passed. */
typedef struct {
  const TpTensor *a, *b;
  TpTensor *y;
} TpMatmulArgs;

typedef struct {
  const TpTensor *a, *b, *c;
  bool trans_a, trans_b;
  double alpha, beta;
  TpTensor *y;
} TpGemmArgs;

#endif
