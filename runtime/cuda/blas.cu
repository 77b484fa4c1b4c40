/* Matrix products through cuBLASLt (blas.h); the emulated build runs the same column-major
 * products through OpenBLAS. The bias broadcast is a kernel of this file and the bias
 * gradient colsum.cu's column sums, so they run through the emulation for real. */
#include <stdio.h>
#include <stdlib.h>

#include "blas.h"
#include "common.cuh"

#ifdef TOKPIPE_CUDA_EMULATE
#include <cblas.h>
#endif

struct TpCudaBlas {
#ifndef TOKPIPE_CUDA_EMULATE
  cublasLtHandle_t lt;
  void *workspace;
  size_t workspace_size;
#endif
  /* the bias gradient's column runs: scratch of its own, apart from the stream's
   * (tp_cuda_scratch), which the caller's bf16 operands may occupy */
  void *column_runs;
  size_t column_runs_bytes;
};

/* cuBLASLt's recommended workspace for Hopper (Ampere needs less). */
enum { BLAS_WORKSPACE_BYTES = 32 << 20 };

TpCudaBlas *tp_cuda_blas_create(void) {
  TpCudaBlas *blas = static_cast<TpCudaBlas *>(calloc(1, sizeof *blas));
  if (!blas) return NULL;
#ifndef TOKPIPE_CUDA_EMULATE
  TP_CUBLAS_CHECK(cublasLtCreate(&blas->lt));
  blas->workspace_size = BLAS_WORKSPACE_BYTES;
  TP_CUDA_ALLOC(cudaMalloc(&blas->workspace, blas->workspace_size));
#endif
  return blas;
}

void tp_cuda_blas_destroy(TpCudaBlas *blas) {
  if (!blas) return;
  if (blas->column_runs) TP_CUDA_CHECK(cudaFree(blas->column_runs));
#ifndef TOKPIPE_CUDA_EMULATE
  TP_CUDA_CHECK(cudaFree(blas->workspace));
  TP_CUBLAS_CHECK(cublasLtDestroy(blas->lt));
#endif
  free(blas);
}

#ifdef TOKPIPE_CUDA_EMULATE
/* n bf16 values widened to f32 (exact), in a new array. */
static float *widen_bf16(const void *bits, int64_t n) {
  float *wide = static_cast<float *>(malloc((size_t)(n ? n : 1) * sizeof *wide));
  if (!wide) {
    fprintf(stderr, "tokpipe: error: out of memory widening a bf16 operand\n");
    exit(1);
  }
  for (int64_t i = 0; i < n; i++) wide[i] = tp_bf16_to_f32(static_cast<const uint16_t *>(bits)[i]);
  return wide;
}
#endif

#ifndef TOKPIPE_CUDA_EMULATE
/* The largest power of two up to 256 dividing p's address: cuBLASLt's heuristic assumes
 * 256-byte aligned operands unless told less (a batch element of a MatMul starts anywhere). */
static uint32_t alignment_bytes(const void *p) {
  uint32_t bytes = 256;
  while (bytes > 1 && reinterpret_cast<uintptr_t>(p) % bytes) bytes /= 2;
  return bytes;
}

static void set_alignment(cublasLtMatmulPreference_t preference, cublasLtMatmulPreferenceAttributes_t attribute,
                          const void *p) {
  uint32_t bytes = alignment_bytes(p);
  TP_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &bytes, sizeof bytes));
}
#endif

/* Column-major C (m, n) = op(A) (m, k) @ op(B) (k, n) + beta C, with k > 0; A and B f32,
 * or bf16 when `bf16` (C f32 either way). */
static void gemm_column_major(TpCudaBlas *blas, bool bf16, bool trans_a, bool trans_b, int64_t m, int64_t n,
                              int64_t k, const void *A, int64_t lda, const void *B, int64_t ldb, float beta,
                              float *C, int64_t ldc, TpCudaStream stream) {
  const float alpha = 1;
  TP_CUDA_COUNT(launches, 1);
  TP_CUDA_COUNT(queries, 1); /* a heuristic query per product */
  TP_CUDA_COUNT(flops[bf16 ? TP_FLOPS_BF16 : TP_FLOPS_F32], 2.0 * (double)m * (double)n * (double)k);
#ifdef TOKPIPE_CUDA_EMULATE
  (void)blas;
  tp_emu_stream_ready(stream); /* after the stream's all-reduces, as on a GPU */
  /* OpenBLAS's sbgemm is missing from some builds: bf16 operands are widened first (the
   * products are then the same as bf16 products accumulated in f32) */
  float *wide_a = bf16 ? widen_bf16(A, lda * (trans_a ? m : k)) : NULL;
  float *wide_b = bf16 ? widen_bf16(B, ldb * (trans_b ? k : n)) : NULL;
  cblas_sgemm(CblasColMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (int)m,
              (int)n, (int)k, alpha, bf16 ? wide_a : static_cast<const float *>(A), (int)lda,
              bf16 ? wide_b : static_cast<const float *>(B), (int)ldb, beta, C, (int)ldc);
  free(wide_a), free(wide_b);
#else
  cudaDataType_t operand_type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  /* CUBLAS_COMPUTE_32F keeps the products in fp32: cuBLASLt uses TF32 only when asked
   * for by a *_FAST_TF32 compute type (it does not read cuBLAS's math mode). bf16
   * operands accumulate in fp32 under it too. */
  cublasLtMatmulDesc_t op;
  TP_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  TP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  TP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  cublasLtMatrixLayout_t layout_a, layout_b, layout_c; /* the stored matrices: rows, columns, leading dim */
  TP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout_a, operand_type, (uint64_t)(trans_a ? k : m),
                                             (uint64_t)(trans_a ? m : k), lda));
  TP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout_b, operand_type, (uint64_t)(trans_b ? n : k),
                                             (uint64_t)(trans_b ? k : n), ldb));
  TP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout_c, CUDA_R_32F, (uint64_t)m, (uint64_t)n, ldc));
  cublasLtMatmulPreference_t preference;
  TP_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  uint64_t workspace_size = blas->workspace_size;
  TP_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                       &workspace_size, sizeof workspace_size));
  set_alignment(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, A);
  set_alignment(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, B);
  set_alignment(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, C);
  set_alignment(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, C);
  cublasLtMatmulHeuristicResult_t heuristic;
  int found = 0;
  TP_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(blas->lt, op, layout_a, layout_b, layout_c, layout_c, preference, 1,
                                                 &heuristic, &found));
  if (found == 0)
    tp_cuda_fail(__FILE__, __LINE__, "cublasLtMatmulAlgoGetHeuristic", "no algorithm for this product");
  TP_CUBLAS_CHECK(cublasLtMatmul(blas->lt, op, &alpha, A, layout_a, B, layout_b, &beta, C, layout_c, C, layout_c,
                                 &heuristic.algo, blas->workspace, blas->workspace_size,
                                 static_cast<cudaStream_t>(stream)));
  TP_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(preference));
  TP_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(layout_c));
  TP_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(layout_b));
  TP_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(layout_a));
  TP_CUBLAS_CHECK(cublasLtMatmulDescDestroy(op));
#endif
}

/* y (rows, n): every row = bias, or zeros when bias is NULL. */
__global__ void fill_rows_kernel(const float *bias, int64_t rows, int64_t n, float *y) {
  TP_GRID_STRIDE_LOOP(i, rows * n) y[i] = bias ? bias[i % n] : 0.0f;
}

static void fill_rows(const float *bias, int64_t rows, int64_t n, float *y, TpCudaStream stream) {
  if (rows * n == 0) return;
  TP_LAUNCH(fill_rows_kernel, tp_elementwise_grid(rows * n), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream, bias, rows,
            n, y);
}

/* Row-major contiguous C (M, N) = op(A) (M, K) @ op(B) (K, N) + beta C (tp_sgemm's
 * convention); A and B f32, or bf16 when `bf16`. Row-major C is column-major C^T =
 * op(B)^T op(A)^T, and a row-major matrix read as column-major is its transpose: so the
 * column-major call takes B first, A second, with the same transposition flags and no copies. */
static void gemm_row_major(TpCudaBlas *blas, bool bf16, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                           const void *A, const void *B, float beta, float *C, TpCudaStream stream) {
  if (M == 0 || N == 0) return;
  if (K == 0) { /* an empty sum; cuBLASLt takes no k of 0 */
    if (beta == 0) fill_rows(NULL, M, N, C, stream);
    return;
  }
  gemm_column_major(blas, bf16, trans_b, trans_a, N, M, K, B, trans_b ? K : N, A, trans_a ? M : K, beta, C, N,
                    stream);
}

/* the element `index` of an operand array of f32, or of bf16 when `bf16` */
static const void *element(const void *p, bool bf16, int64_t index) {
  return static_cast<const char *>(p) + index * (bf16 ? 2 : 4);
}

/* y = x @ w (+ bias) on f32 or bf16 operands. */
static void linear(TpCudaBlas *blas, bool bf16, const void *x, const void *w, const float *bias, int64_t M,
                   int64_t K, int64_t N, bool transpose_w, float *y, TpCudaStream stream) {
  if (bias) fill_rows(bias, M, N, y, stream); /* then accumulated onto, as the CPU kernel does */
  gemm_row_major(blas, bf16, false, transpose_w, M, N, K, x, w, bias ? 1.0f : 0.0f, y, stream);
}

void tp_cuda_launch_linear_f32(TpCudaBlas *blas, const float *x, const float *w, const float *bias, int64_t M,
                               int64_t K, int64_t N, bool transpose_w, float *y, TpCudaStream stream) {
  linear(blas, false, x, w, bias, M, K, N, transpose_w, y, stream);
}

void tp_cuda_launch_linear_bf16(TpCudaBlas *blas, const uint16_t *x, const uint16_t *w, const float *bias, int64_t M,
                                int64_t K, int64_t N, bool transpose_w, float *y, TpCudaStream stream) {
  linear(blas, true, x, w, bias, M, K, N, transpose_w, y, stream);
}

/* The bias gradient: dy's column sums (the CPU's bits). The runs' scratch grows in the
 * stream's order, as tp_cuda_scratch does: after the kernels queued before, no device-wide wait. */
static void column_sums(TpCudaBlas *blas, const float *dy, int64_t M, int64_t N, float *dbias, TpCudaStream stream) {
  size_t bytes = tp_cuda_column_sums_scratch(M, N, 1);
  if (bytes > blas->column_runs_bytes) {
    size_t grown = blas->column_runs_bytes * 2 > bytes ? blas->column_runs_bytes * 2 : bytes;
    if (blas->column_runs) TP_CUDA_CHECK(cudaFreeAsync(blas->column_runs, static_cast<cudaStream_t>(stream)));
    blas->column_runs = NULL;
    TP_CUDA_ALLOC(cudaMallocAsync(&blas->column_runs, grown, static_cast<cudaStream_t>(stream)));
    blas->column_runs_bytes = grown;
  }
  tp_cuda_launch_column_sums_f32(dy, NULL, NULL, NULL, M, N, NULL, dbias, blas->column_runs, stream);
}

/* The two products of tp_linear_backward_f32 on f32 or bf16 operands. */
static void linear_backward(TpCudaBlas *blas, bool bf16, const void *dy, const void *x, const void *w, int64_t M,
                            int64_t K, int64_t N, bool transpose_w, float *dx, float *dw, TpCudaStream stream) {
  if (dx) gemm_row_major(blas, bf16, false, !transpose_w, M, K, N, dy, w, 0, dx, stream); /* dy (M, N) @ w^T */
  if (dw) {
    if (transpose_w) gemm_row_major(blas, bf16, true, false, N, K, M, dy, x, 0, dw, stream); /* dy^T @ x */
    else gemm_row_major(blas, bf16, true, false, K, N, M, x, dy, 0, dw, stream);             /* x^T @ dy */
  }
}

void tp_cuda_launch_linear_backward_f32(TpCudaBlas *blas, const float *dy, const float *x, const float *w, int64_t M,
                                        int64_t K, int64_t N, bool transpose_w, float *dx, float *dw, float *dbias,
                                        TpCudaStream stream) {
  linear_backward(blas, false, dy, x, w, M, K, N, transpose_w, dx, dw, stream);
  if (dbias) column_sums(blas, dy, M, N, dbias, stream);
}

void tp_cuda_launch_linear_backward_bf16(TpCudaBlas *blas, const uint16_t *dy, const uint16_t *x, const uint16_t *w,
                                         const float *dy_f32, int64_t M, int64_t K, int64_t N, bool transpose_w,
                                         float *dx, float *dw, float *dbias, TpCudaStream stream) {
  linear_backward(blas, true, dy, x, w, M, K, N, transpose_w, dx, dw, stream);
  if (dbias) column_sums(blas, dy_f32, M, N, dbias, stream);
}

/* tp_matmul's product on f32 or bf16 operands */
static void matmul(TpCudaBlas *blas, bool bf16, const TpMatmulLayout *l, const void *a, const void *b, float *y,
                   TpCudaStream stream) {
  int64_t M = l->M, K = l->K, N = l->N;
  if (l->nb == 1 && l->na == l->nbatch) { /* one shared right operand: fold the batch into M */
    gemm_row_major(blas, bf16, false, false, l->nbatch * M, N, K, a, b, 0, y, stream);
    return;
  }
  for (int64_t n = 0; n < l->nbatch; n++) {
    int64_t oa, ob;
    tp_matmul_operands(l, n, &oa, &ob);
    gemm_row_major(blas, bf16, false, false, M, N, K, element(a, bf16, oa * M * K), element(b, bf16, ob * K * N), 0,
                   y + n * M * N, stream);
  }
}

/* tp_matmul_backward_f32's products on f32 or bf16 operands */
static void matmul_backward(TpCudaBlas *blas, bool bf16, const TpMatmulLayout *l, const void *dy, const void *a,
                            const void *b, float *da, float *db, TpCudaStream stream) {
  int64_t M = l->M, K = l->K, N = l->N, nbatch = l->nbatch;
  if (l->nb == 1 && l->na == nbatch) { /* one shared b: the batch folds into the rows */
    if (da) gemm_row_major(blas, bf16, false, true, nbatch * M, K, N, dy, b, 0, da, stream);
    if (db) gemm_row_major(blas, bf16, true, false, K, N, nbatch * M, a, dy, 0, db, stream);
    return;
  }
  /* An operand broadcast along a batch dim collects the sum of its products. */
  bool sum_a = l->na != nbatch, sum_b = l->nb != nbatch;
  if (da && sum_a) fill_rows(NULL, l->na * M, K, da, stream);
  if (db && sum_b) fill_rows(NULL, l->nb * K, N, db, stream);
  float beta_a = sum_a ? 1.0f : 0.0f, beta_b = sum_b ? 1.0f : 0.0f;
  for (int64_t n = 0; n < nbatch; n++) {
    int64_t oa, ob;
    tp_matmul_operands(l, n, &oa, &ob);
    const void *dy_n = element(dy, bf16, n * M * N), *a_n = element(a, bf16, oa * M * K);
    const void *b_n = element(b, bf16, ob * K * N);
    if (da) gemm_row_major(blas, bf16, false, true, M, K, N, dy_n, b_n, beta_a, da + oa * M * K, stream);
    if (db) gemm_row_major(blas, bf16, true, false, K, N, M, a_n, dy_n, beta_b, db + ob * K * N, stream);
  }
}

void tp_cuda_launch_matmul_f32(TpCudaBlas *blas, const TpMatmulLayout *l, const float *a, const float *b, float *y,
                               TpCudaStream stream) {
  matmul(blas, false, l, a, b, y, stream);
}

void tp_cuda_launch_matmul_bf16(TpCudaBlas *blas, const TpMatmulLayout *l, const uint16_t *a, const uint16_t *b,
                                float *y, TpCudaStream stream) {
  matmul(blas, true, l, a, b, y, stream);
}

void tp_cuda_launch_matmul_backward_f32(TpCudaBlas *blas, const TpMatmulLayout *l, const float *dy, const float *a,
                                        const float *b, float *da, float *db, TpCudaStream stream) {
  matmul_backward(blas, false, l, dy, a, b, da, db, stream);
}

void tp_cuda_launch_matmul_backward_bf16(TpCudaBlas *blas, const TpMatmulLayout *l, const uint16_t *dy,
                                         const uint16_t *a, const uint16_t *b, float *da, float *db,
                                         TpCudaStream stream) {
  matmul_backward(blas, true, l, dy, a, b, da, db, stream);
}
