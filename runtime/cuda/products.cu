/* The matrix products' entry points (ops.h): Linear, MatMul and Gemm and their backwards,
 * fp32 and (--precision bf16) on bf16 operands, read as they are or rounded from f32 in
 * scratch, over the cuBLASLt products of blas.h; the shape checks are
 * runtime/kernels/check.h's. */
#include "../kernels/check.h"
#include "blas.h"
#include "dtype.cuh"
#include "ops.h"

TpKernelStatus tp_cuda_linear_f32(const float *x, const float *w, const float *bias, int64_t M, int64_t K, int64_t N,
                                  bool transpose_w, float *y, TpStream *stream) {
  tp_cuda_launch_linear_f32(stream->blas, x, w, bias, M, K, N, transpose_w, y, stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_linear_gelu_f32(const float *x, const float *w, const float *bias, int64_t M, int64_t K,
                                       int64_t N, bool transpose_w, float *pre, float *y, TpStream *stream) {
  tp_cuda_launch_linear_gelu(stream->blas, false, x, w, bias, M, K, N, transpose_w, pre, y, stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_linear_backward_dgelu_f32(const float *dy, const float *x, const float *w, const float *pre,
                                                 int64_t M, int64_t K, int64_t N, bool transpose_w, float *dx,
                                                 float *dw, float *dbias, TpStream *stream) {
  tp_cuda_launch_linear_backward_dgelu(stream->blas, false, dy, x, w, dy, pre, M, K, N, transpose_w, dx, dw, dbias,
                                       stream->cuda);
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

/* ---- --precision bf16: products on bf16 operands ----
 * Each multiplied operand is a view: a bf16 one (a weight's 16-bit working copy, a stored
 * activation or gradient) is read as it is; an f32 one is rounded to bf16 in scratch,
 * counted in convert_bytes. */

/* round to nearest even, as base/half.h */
__global__ void to_bf16_kernel(const float *x, int64_t n, uint16_t *y) {
  TP_GRID_STRIDE_LOOP(i, n) y[i] = tp_half_f32_to_bf16(x[i]);
}

__global__ void widen_bf16_kernel(const uint16_t *x, int64_t n, float *y) {
  TP_GRID_STRIDE_LOOP(i, n) y[i] = tp_half_bf16_to_f32(x[i]);
}

/* Carves scratch into pieces of the given byte sizes (256-byte aligned), taken in one call. */
static void carve(TpStream *stream, int n, const size_t *bytes, void **out) {
  size_t total = 0, at[4];
  for (int k = 0; k < n; k++) at[k] = total, total += (bytes[k] + 255) / 256 * 256;
  char *base = static_cast<char *>(tp_cuda_scratch(stream, total + 1));
  for (int k = 0; k < n; k++) out[k] = base + at[k];
}

/* Are the operands f32 or bf16, each of n[k] elements (n NULL: any)? */
static TpKernelStatus check_operands(int count, const TpTensor *const *from, const int64_t *n) {
  for (int k = 0; k < count; k++)
    if (from[k]->dtype != TP_F32 && from[k]->dtype != TP_BF16) return TP_KERNEL_BAD_DTYPE;
  for (int k = 0; n && k < count; k++)
    if (tp_tensor_numel(from[k]) != n[k]) return TP_KERNEL_BAD_SHAPE;
  return TP_KERNEL_OK;
}

enum { MAX_OPERANDS = 3 };

/* The bf16 bits of operands from[k] (checked by check_operands), out[k] NULL where wanted[k]
 * is false (no requested output reads it): a bf16 operand's data, an f32 one rounded into
 * scratch; then `extra` bytes of that scratch for the caller at *more (when more is not NULL). */
static void bf16_operands(TpStream *stream, int count, const TpTensor *const *from, const bool *wanted,
                          const uint16_t **out, size_t extra, void **more) {
  void *p[MAX_OPERANDS + 1];
  size_t bytes[MAX_OPERANDS + 1];
  for (int k = 0; k < count; k++)
    bytes[k] = wanted[k] && from[k]->dtype == TP_F32 ? (size_t)tp_tensor_numel(from[k]) * sizeof(uint16_t) : 0;
  bytes[count] = extra;
  carve(stream, count + 1, bytes, p);
  if (more) *more = p[count];
  for (int k = 0; k < count; k++) {
    int64_t n = tp_tensor_numel(from[k]);
    out[k] = NULL;
    if (!wanted[k]) continue;
    if (from[k]->dtype == TP_BF16) {
      out[k] = static_cast<const uint16_t *>(from[k]->data);
      continue;
    }
    out[k] = static_cast<const uint16_t *>(p[k]);
    if (n == 0) continue;
    TP_CUDA_COUNT(convert_bytes, 2 * (uint64_t)n);
    TP_LAUNCH(to_bf16_kernel, tp_elementwise_grid(n), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream->cuda,
              static_cast<const float *>(from[k]->data), n, static_cast<uint16_t *>(p[k]));
  }
}

/* Linear on bf16 operands, then the tanh-approximate Gelu in its epilogue when pre is not
 * NULL (pre: the Gelu's operand, y its result). */
static TpKernelStatus bf16_linear(const TpTensor *x, const TpTensor *w, const float *bias, int64_t M, int64_t K,
                                  int64_t N, bool transpose_w, float *pre, float *y, TpStream *stream) {
  const TpTensor *from[2] = {x, w};
  const int64_t n[2] = {M * K, K * N};
  const bool wanted[2] = {true, true};
  TpKernelStatus s = check_operands(2, from, n);
  if (s != TP_KERNEL_OK) return s;
  const uint16_t *h[2];
  bf16_operands(stream, 2, from, wanted, h, 0, NULL);
  if (pre)
    tp_cuda_launch_linear_gelu(stream->blas, true, h[0], h[1], bias, M, K, N, transpose_w, pre, y, stream->cuda);
  else tp_cuda_launch_linear_bf16(stream->blas, h[0], h[1], bias, M, K, N, transpose_w, y, stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_bf16_linear_f32(const TpTensor *x, const TpTensor *w, const float *bias, int64_t M, int64_t K,
                                       int64_t N, bool transpose_w, float *y, TpStream *stream) {
  return bf16_linear(x, w, bias, M, K, N, transpose_w, NULL, y, stream);
}

TpKernelStatus tp_cuda_bf16_linear_gelu_f32(const TpTensor *x, const TpTensor *w, const float *bias, int64_t M,
                                            int64_t K, int64_t N, bool transpose_w, float *pre, float *y,
                                            TpStream *stream) {
  return bf16_linear(x, w, bias, M, K, N, transpose_w, pre, y, stream);
}

/* LinearBackward on bf16 operands; with pre (an f32 or bf16 view of the Gelu's operand,
 * M x K), dx is the Gelu's operand gradient (the DGELU epilogue, on pre in f32: a bf16 pre
 * widened first). */
static TpKernelStatus bf16_linear_backward(const TpTensor *dy, const TpTensor *x, const TpTensor *w,
                                           const TpTensor *pre, int64_t M, int64_t K, int64_t N, bool transpose_w,
                                           float *dx, float *dw, float *dbias, TpStream *stream) {
  const TpTensor *from[4] = {dy, x, w, pre};
  const int64_t n[4] = {M * N, M * K, K * N, M * K};
  const bool wanted[3] = {dx || dw, dw != NULL, dx != NULL}; /* dx = dy w^T, dw = x^T dy */
  TpKernelStatus s = check_operands(pre ? 4 : 3, from, n);
  if (s != TP_KERNEL_OK) return s;
  /* dbias sums dy in f32 (no product: as the f32 plan's), a bf16 dy widened first */
  bool widen = dbias && dy->dtype == TP_BF16 && M * N != 0;
  bool widen_pre = pre && dx && pre->dtype == TP_BF16 && M * K != 0;
  size_t dy_bytes = widen ? ((size_t)(M * N) * sizeof(float) + 255) / 256 * 256 : 0;
  const uint16_t *h[3];
  void *wide = NULL;
  bf16_operands(stream, 3, from, wanted, h, dy_bytes + (widen_pre ? (size_t)(M * K) * sizeof(float) : 0), &wide);
  const float *dy_f32 = dbias ? static_cast<const float *>(dy->data) : NULL;
  if (widen) {
    TP_LAUNCH(widen_bf16_kernel, tp_elementwise_grid(M * N), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream->cuda,
              static_cast<const uint16_t *>(dy->data), M * N, static_cast<float *>(wide));
    dy_f32 = static_cast<const float *>(wide);
  }
  const float *pre_f32 = pre ? static_cast<const float *>(pre->data) : NULL;
  if (widen_pre) {
    float *to = reinterpret_cast<float *>(static_cast<char *>(wide) + dy_bytes);
    TP_LAUNCH(widen_bf16_kernel, tp_elementwise_grid(M * K), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream->cuda,
              static_cast<const uint16_t *>(pre->data), M * K, to);
    pre_f32 = to;
  }
  if (pre)
    tp_cuda_launch_linear_backward_dgelu(stream->blas, true, h[0], h[1], h[2], dy_f32, pre_f32, M, K, N, transpose_w,
                                         dx, dw, dbias, stream->cuda);
  else
    tp_cuda_launch_linear_backward_bf16(stream->blas, h[0], h[1], h[2], dy_f32, M, K, N, transpose_w, dx, dw, dbias,
                                        stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_bf16_linear_backward_f32(const TpTensor *dy, const TpTensor *x, const TpTensor *w, int64_t M,
                                                int64_t K, int64_t N, bool transpose_w, float *dx, float *dw,
                                                float *dbias, TpStream *stream) {
  return bf16_linear_backward(dy, x, w, NULL, M, K, N, transpose_w, dx, dw, dbias, stream);
}

TpKernelStatus tp_cuda_bf16_linear_backward_dgelu_f32(const TpTensor *dy, const TpTensor *x, const TpTensor *w,
                                                      const TpTensor *pre, int64_t M, int64_t K, int64_t N,
                                                      bool transpose_w, float *dx, float *dw, float *dbias,
                                                      TpStream *stream) {
  return bf16_linear_backward(dy, x, w, pre, M, K, N, transpose_w, dx, dw, dbias, stream);
}

TpKernelStatus tp_cuda_bf16_matmul(const TpTensor *a, const TpTensor *b, TpTensor *y, TpStream *stream) {
  const TpTensor *from[2] = {a, b};
  TpMatmulLayout l;
  TpKernelStatus s = check_operands(2, from, NULL);
  if (s == TP_KERNEL_OK && y->dtype != TP_F32) s = TP_KERNEL_BAD_DTYPE;
  if (s == TP_KERNEL_OK) s = tp_check_matmul_shape(a, b, y, &l);
  if (s != TP_KERNEL_OK) return s;
  const bool wanted[2] = {true, true};
  const uint16_t *h[2];
  bf16_operands(stream, 2, from, wanted, h, 0, NULL);
  tp_cuda_launch_matmul_bf16(stream->blas, &l, h[0], h[1], static_cast<float *>(y->data), stream->cuda);
  return TP_KERNEL_OK;
}

/* t's shape as an f32 view (the dtype checks done): for the shape checks of check.h,
 * which take f32 operands */
static TpTensor shape_f32(const TpTensor *t) {
  TpTensor f = *t;
  f.dtype = TP_F32;
  return f;
}

TpKernelStatus tp_cuda_bf16_matmul_backward_f32(const TpTensor *dy, const TpTensor *a, const TpTensor *b,
                                                TpTensor *da, TpTensor *db, TpStream *stream) {
  const TpTensor *from[3] = {dy, a, b};
  TpMatmulLayout l;
  TpKernelStatus s = check_operands(3, from, NULL);
  if (s != TP_KERNEL_OK) return s;
  const TpTensor dy_shape = shape_f32(dy), a_shape = shape_f32(a), b_shape = shape_f32(b);
  s = tp_check_matmul_backward(&dy_shape, &a_shape, &b_shape, da, db, &l);
  if (s != TP_KERNEL_OK) return s;
  const bool wanted[3] = {da || db, db != NULL, da != NULL}; /* da = dy b^T, db = a^T dy */
  const uint16_t *h[3];
  bf16_operands(stream, 3, from, wanted, h, 0, NULL);
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

/* tp_gemm on f32 (its other dtypes: TP_KERNEL_BAD_DTYPE), or when bf16 on bf16 operands (a
 * and b f32 or bf16 views, as the products above take them). op(a) is made row-major in
 * scratch when trans_a, then the product is Linear's (op(b) as its w), then alpha and
 * beta * c applied. */
static TpKernelStatus gemm(const TpTensor *a, const TpTensor *b, const TpTensor *c, bool trans_a, bool trans_b,
                           double alpha, double beta, TpTensor *y, bool bf16, TpStream *stream) {
  const TpTensor *from[2] = {a, b};
  TpKernelStatus s = bf16 ? check_operands(2, from, NULL) : TP_KERNEL_OK;
  if ((!bf16 && (a->dtype != TP_F32 || b->dtype != TP_F32)) || y->dtype != TP_F32 || (c && c->dtype != TP_F32))
    s = TP_KERNEL_BAD_DTYPE;
  TpGemmShape g;
  if (s == TP_KERNEL_OK) s = tp_check_gemm_shape(a, b, c, trans_a, trans_b, beta, y, &g);
  if (s != TP_KERNEL_OK) return s;
  int64_t M = g.M, K = g.K, N = g.N;
  float *Y = static_cast<float *>(y->data);
  const int64_t perm[2] = {1, 0};
  if (bf16) {
    const bool wanted[2] = {true, true};
    const uint16_t *h[2];
    void *row_major = NULL; /* op(a) */
    bf16_operands(stream, 2, from, wanted, h, trans_a ? (size_t)(M * K) * sizeof(uint16_t) : 0, &row_major);
    if (trans_a && M * K != 0) {
      TpTensor at = {TP_BF16, 2, {K, M}, const_cast<uint16_t *>(h[0])}, to = {TP_BF16, 2, {M, K}, row_major};
      tp_cuda_launch_transpose_f32(&at, perm, &to, stream->cuda);
      h[0] = static_cast<const uint16_t *>(row_major);
    }
    tp_cuda_launch_linear_bf16(stream->blas, h[0], h[1], NULL, M, K, N, trans_b, Y, stream->cuda);
  } else {
    const float *A = static_cast<const float *>(a->data);
    if (trans_a && M * K != 0) {
      float *row_major = static_cast<float *>(tp_cuda_scratch(stream, (size_t)(M * K) * sizeof(float)));
      TpTensor at = {TP_F32, 2, {K, M}, const_cast<float *>(A)}, to = {TP_F32, 2, {M, K}, row_major};
      tp_cuda_launch_transpose_f32(&at, perm, &to, stream->cuda);
      A = row_major;
    }
    tp_cuda_launch_linear_f32(stream->blas, A, static_cast<const float *>(b->data), NULL, M, K, N, trans_b, Y,
                              stream->cuda);
  }
  if (M * N != 0)
    TP_LAUNCH(gemm_epilogue_kernel, tp_elementwise_grid(M * N), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream->cuda, Y,
              M, N, (float)alpha, (float)beta, g.with_c ? static_cast<const float *>(c->data) : NULL, g.cm, g.cn);
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
