/* The matrix products' entry points (ops.h): Linear, MatMul and Gemm and their backwards,
 * fp32 and (--precision bf16) on operands rounded to bf16 in scratch, over the cuBLASLt
 * products of blas.h; the shape checks are runtime/kernels/check.h's. */
#include "../kernels/check.h"
#include "blas.h"
#include "dtype.cuh"
#include "ops.h"

TpKernelStatus tp_cuda_linear_f32(const float *x, const float *w, const float *bias, int64_t M, int64_t K, int64_t N,
                                  bool transpose_w, float *y, TpStream *stream) {
  tp_cuda_launch_linear_f32(stream->blas, x, w, bias, M, K, N, transpose_w, y, stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_linear_backward_f32(const float *dy, const float *x, const float *w, int64_t M, int64_t K,
                                           int64_t N, bool transpose_w, float *dx, float *dw, float *dbias,
                                           TpStream *stream) {
  tp_cuda_launch_linear_backward_f32(stream->blas, dy, x, w, M, K, N, transpose_w, dx, dw, dbias, stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_matmul_backward_f32(const TpTensor *dy, const TpTensor *a, const TpTensor *b, TpTensor *da,
                                           TpTensor *db, TpStream *stream) {
  TpMatmulLayout l;
  TpKernelStatus s = tp_check_matmul_backward(dy, a, b, da, db, &l);
  if (s != TP_KERNEL_OK) return s;
  tp_cuda_launch_matmul_backward_f32(stream->blas, &l, static_cast<const float *>(dy->data),
                                     static_cast<const float *>(a->data), static_cast<const float *>(b->data),
                                     da ? static_cast<float *>(da->data) : NULL,
                                     db ? static_cast<float *>(db->data) : NULL, stream->cuda);
  return TP_KERNEL_OK;
}

/* tp_matmul's checks, f32 only (the CPU's other dtypes: TP_KERNEL_BAD_DTYPE) */
static TpKernelStatus matmul_check(const TpTensor *a, const TpTensor *b, const TpTensor *y, TpMatmulLayout *l) {
  if (a->dtype != TP_F32 || b->dtype != TP_F32 || y->dtype != TP_F32) return TP_KERNEL_BAD_DTYPE;
  return tp_check_matmul_shape(a, b, y, l);
}

TpKernelStatus tp_cuda_matmul(const TpTensor *a, const TpTensor *b, TpTensor *y, TpStream *stream) {
  TpMatmulLayout l;
  TpKernelStatus s = matmul_check(a, b, y, &l);
  if (s == TP_KERNEL_OK)
    tp_cuda_launch_matmul_f32(stream->blas, &l, static_cast<const float *>(a->data),
                              static_cast<const float *>(b->data), static_cast<float *>(y->data), stream->cuda);
  return s;
}

/* ---- --precision bf16: operands rounded to bf16 in scratch, products on bf16 ---- */

/* round to nearest even, as base/half.h */
__global__ void to_bf16_kernel(const float *x, int64_t n, uint16_t *y) {
  TP_GRID_STRIDE_LOOP(i, n) y[i] = tp_half_f32_to_bf16(x[i]);
}

/* x's bf16 rounding into y, when y is wanted (NULL: not converted) */
static void to_bf16(const float *x, int64_t n, uint16_t *y, TpStream *stream) {
  if (y && n) TP_CUDA_COUNT(convert_bytes, 2 * (uint64_t)n);
  if (y && n)
    TP_LAUNCH(to_bf16_kernel, tp_elementwise_grid(n), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream->cuda, x, n, y);
}

/* Carves scratch into pieces of the given byte sizes (256-byte aligned), taken in one call. */
static void carve(TpStream *stream, int n, const size_t *bytes, void **out) {
  size_t total = 0, at[4];
  for (int k = 0; k < n; k++) at[k] = total, total += (bytes[k] + 255) / 256 * 256;
  char *base = static_cast<char *>(tp_cuda_scratch(stream, total + 1));
  for (int k = 0; k < n; k++) out[k] = base + at[k];
}

/* bf16 copies in scratch of the f32 arrays from[k] of n[k] elements; out[k] NULL where
 * wanted[k] is false (an operand no requested output reads) */
static void bf16_operands(TpStream *stream, int count, const float *const *from, const int64_t *n,
                          const bool *wanted, uint16_t **out) {
  void *p[4];
  size_t bytes[4];
  for (int k = 0; k < count; k++) bytes[k] = wanted[k] ? (size_t)n[k] * sizeof(uint16_t) : 0;
  carve(stream, count, bytes, p);
  for (int k = 0; k < count; k++) {
    out[k] = wanted[k] ? static_cast<uint16_t *>(p[k]) : NULL;
    to_bf16(from[k], n[k], out[k], stream);
  }
}

TpKernelStatus tp_cuda_bf16_linear_f32(const float *x, const float *w, const float *bias, int64_t M, int64_t K,
                                       int64_t N, bool transpose_w, float *y, TpStream *stream) {
  const float *from[2] = {x, w};
  const int64_t n[2] = {M * K, K * N};
  const bool wanted[2] = {true, true};
  uint16_t *h[2];
  bf16_operands(stream, 2, from, n, wanted, h);
  tp_cuda_launch_linear_bf16(stream->blas, h[0], h[1], bias, M, K, N, transpose_w, y, stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_bf16_linear_backward_f32(const float *dy, const float *x, const float *w, int64_t M,
                                                int64_t K, int64_t N, bool transpose_w, float *dx, float *dw,
                                                float *dbias, TpStream *stream) {
  const float *from[3] = {dy, x, w};
  const int64_t n[3] = {M * N, M * K, K * N};
  const bool wanted[3] = {dx || dw, dw != NULL, dx != NULL}; /* dx = dy w^T, dw = x^T dy */
  uint16_t *h[3];
  bf16_operands(stream, 3, from, n, wanted, h);
  tp_cuda_launch_linear_backward_bf16(stream->blas, h[0], h[1], h[2], dy, M, K, N, transpose_w, dx, dw, dbias,
                                      stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_bf16_matmul(const TpTensor *a, const TpTensor *b, TpTensor *y, TpStream *stream) {
  TpMatmulLayout l;
  TpKernelStatus s = matmul_check(a, b, y, &l);
  if (s != TP_KERNEL_OK) return s;
  const float *from[2] = {static_cast<const float *>(a->data), static_cast<const float *>(b->data)};
  const int64_t n[2] = {tp_tensor_numel(a), tp_tensor_numel(b)};
  const bool wanted[2] = {true, true};
  uint16_t *h[2];
  bf16_operands(stream, 2, from, n, wanted, h);
  tp_cuda_launch_matmul_bf16(stream->blas, &l, h[0], h[1], static_cast<float *>(y->data), stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_bf16_matmul_backward_f32(const TpTensor *dy, const TpTensor *a, const TpTensor *b,
                                                TpTensor *da, TpTensor *db, TpStream *stream) {
  TpMatmulLayout l;
  TpKernelStatus s = tp_check_matmul_backward(dy, a, b, da, db, &l);
  if (s != TP_KERNEL_OK) return s;
  const float *from[3] = {static_cast<const float *>(dy->data), static_cast<const float *>(a->data),
                          static_cast<const float *>(b->data)};
  const int64_t n[3] = {tp_tensor_numel(dy), tp_tensor_numel(a), tp_tensor_numel(b)};
  const bool wanted[3] = {da || db, db != NULL, da != NULL}; /* da = dy b^T, db = a^T dy */
  uint16_t *h[3];
  bf16_operands(stream, 3, from, n, wanted, h);
  tp_cuda_launch_matmul_backward_bf16(stream->blas, &l, h[0], h[1], h[2], da ? static_cast<float *>(da->data) : NULL,
                                      db ? static_cast<float *>(db->data) : NULL, stream->cuda);
  return TP_KERNEL_OK;
}

/* y = alpha * y + beta * c[i or 0, j or 0] (c's broadcast dims cm, cn; c NULL: no term) */
__global__ void gemm_epilogue_kernel(float *y, int64_t M, int64_t N, float alpha, float beta, const float *c,
                                     int64_t cm, int64_t cn) {
  TP_GRID_STRIDE_LOOP(e, M * N) {
    int64_t i = e / N, j = e % N;
    float v = alpha * y[e];
    if (c) v += beta * c[(cm == 1 ? 0 : i) * cn + (cn == 1 ? 0 : j)];
    y[e] = v;
  }
}

/* tp_gemm on f32 (its other dtypes: TP_KERNEL_BAD_DTYPE), on the operands rounded to bf16
 * when bf16. op(a) is made row-major in scratch when trans_a (before the rounding), then the
 * product is Linear's (op(b) as its w), then alpha and beta * c applied. */
static TpKernelStatus gemm(const TpTensor *a, const TpTensor *b, const TpTensor *c, bool trans_a, bool trans_b,
                           double alpha, double beta, TpTensor *y, bool bf16, TpStream *stream) {
  if (a->dtype != TP_F32 || b->dtype != TP_F32 || y->dtype != TP_F32 || (c && c->dtype != TP_F32))
    return TP_KERNEL_BAD_DTYPE;
  TpGemmShape g;
  TpKernelStatus s = tp_check_gemm_shape(a, b, c, trans_a, trans_b, beta, y, &g);
  if (s != TP_KERNEL_OK) return s;
  int64_t M = g.M, K = g.K, N = g.N, cm = g.cm, cn = g.cn;
  bool with_c = g.with_c;
  void *p[3]; /* op(a) row-major, then a and b rounded to bf16 */
  const size_t bytes[3] = {(size_t)(M * K) * 4, bf16 ? (size_t)(M * K) * 2 : 0, bf16 ? (size_t)(K * N) * 2 : 0};
  carve(stream, 3, bytes, p);
  const float *A = static_cast<const float *>(a->data), *B = static_cast<const float *>(b->data);
  if (trans_a && M * K != 0) {
    TpTensor from = {TP_F32, 2, {K, M}, const_cast<float *>(A)}, to = {TP_F32, 2, {M, K}, p[0]};
    const int64_t perm[2] = {1, 0};
    tp_cuda_launch_transpose_f32(&from, perm, &to, stream->cuda);
    A = static_cast<const float *>(p[0]);
  }
  float *Y = static_cast<float *>(y->data);
  if (bf16) {
    uint16_t *a16 = static_cast<uint16_t *>(p[1]), *b16 = static_cast<uint16_t *>(p[2]);
    to_bf16(A, M * K, a16, stream);
    to_bf16(B, K * N, b16, stream);
    tp_cuda_launch_linear_bf16(stream->blas, a16, b16, NULL, M, K, N, trans_b, Y, stream->cuda);
  } else {
    tp_cuda_launch_linear_f32(stream->blas, A, B, NULL, M, K, N, trans_b, Y, stream->cuda);
  }
  if (M * N != 0)
    TP_LAUNCH(gemm_epilogue_kernel, tp_elementwise_grid(M * N), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream->cuda, Y,
              M, N, (float)alpha, (float)beta, with_c ? static_cast<const float *>(c->data) : NULL, cm, cn);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_gemm(const TpTensor *a, const TpTensor *b, const TpTensor *c, bool trans_a, bool trans_b,
                            double alpha, double beta, TpTensor *y, TpStream *stream) {
  return gemm(a, b, c, trans_a, trans_b, alpha, beta, y, false, stream);
}

TpKernelStatus tp_cuda_bf16_gemm(const TpTensor *a, const TpTensor *b, const TpTensor *c, bool trans_a, bool trans_b,
                                 double alpha, double beta, TpTensor *y, TpStream *stream) {
  return gemm(a, b, c, trans_a, trans_b, alpha, beta, y, true, stream);
}
