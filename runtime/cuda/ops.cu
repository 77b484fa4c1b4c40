/* The plan's kernel calls (ops.h) of cpu/nn.h, loss.h, transformer.h, nn_backward.h and
 * matmul.h, the bf16 products and the loss's copy to the host: adaptors over the launchers
 * of kernels.h and blas.h, with the scratch they need from the stream. (Elementwise,
 * layout and reduction calls: anydtype.cu; attention: attention.cu.) */
#include "../kernels/check.h"
#include "dtype.cuh"
#include "ops.h"

TpKernelStatus tp_cuda_copy_to_host(void *host, const void *device, size_t bytes, TpStream *stream) {
  if (bytes) TP_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream->cuda));
  return TP_KERNEL_OK;
}

/* One thread: the value travels in the launch, so the host's copy may change at once. */
__global__ void fill_i64_kernel(int64_t *dst, int64_t value) { *dst = value; }

TpKernelStatus tp_cuda_fill_i64(int64_t *dst, int64_t value, TpStream *stream) {
  TP_LAUNCH(fill_i64_kernel, dim3(1), dim3(1), stream->cuda, dst, value);
  return TP_KERNEL_OK;
}

/* ---- Softmax: rows of n in place for inner 1; else [outer, n, inner] is transposed to
 * rows in scratch and back ---- */

/* dst [outer, inner, n] = src [outer, n, inner], or back when `back` */
static void swap_last(const float *src, float *dst, int64_t outer, int64_t n, int64_t inner, bool back,
                      TpStream *stream) {
  TpTensor x = {TP_F32, 3, {outer, back ? inner : n, back ? n : inner}, const_cast<float *>(src)};
  TpTensor y = {TP_F32, 3, {outer, back ? n : inner, back ? inner : n}, dst};
  const int64_t perm[3] = {0, 2, 1};
  tp_cuda_launch_transpose_f32(&x, perm, &y, stream->cuda);
}

TpKernelStatus tp_cuda_softmax_f32(const float *x, float *y, int64_t outer, int64_t n, int64_t inner, bool log,
                                   TpStream *stream) {
  if (inner == 1) {
    tp_cuda_launch_softmax_f32(x, y, outer, n, log, stream->cuda);
    return TP_KERNEL_OK;
  }
  int64_t total = outer * n * inner;
  if (total == 0) return TP_KERNEL_OK;
  float *rows = static_cast<float *>(tp_cuda_scratch(stream, (size_t)total * sizeof(float)));
  swap_last(x, rows, outer, n, inner, false, stream);
  tp_cuda_launch_softmax_f32(rows, rows, outer * inner, n, log, stream->cuda);
  swap_last(rows, y, outer, n, inner, true, stream);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_softmax_backward_f32(const float *dy, const float *y, int64_t outer, int64_t n, int64_t inner,
                                            bool log, float *dx, TpStream *stream) {
  if (inner == 1) {
    tp_cuda_launch_softmax_backward_f32(dy, y, outer, n, log, dx, stream->cuda);
    return TP_KERNEL_OK;
  }
  int64_t total = outer * n * inner;
  if (total == 0) return TP_KERNEL_OK;
  float *dy_rows = static_cast<float *>(tp_cuda_scratch(stream, 2 * (size_t)total * sizeof(float)));
  float *y_rows = dy_rows + total;
  swap_last(dy, dy_rows, outer, n, inner, false, stream);
  swap_last(y, y_rows, outer, n, inner, false, stream);
  tp_cuda_launch_softmax_backward_f32(dy_rows, y_rows, outer * inner, n, log, dy_rows, stream->cuda);
  swap_last(dy_rows, dx, outer, n, inner, true, stream);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_layernorm_f32(const float *x, const float *scale, const float *bias, int64_t outer, int64_t n,
                                     float eps, float *y, float *mean, float *inv_std, TpStream *stream) {
  tp_cuda_launch_layernorm_f32(x, scale, bias, outer, n, eps, y, mean, inv_std, stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_layernorm_backward_f32(const float *dy, const float *x, const float *scale, const float *mean,
                                              const float *inv_std, int64_t rows, int64_t n, float *dx, float *dscale,
                                              float *dbias, TpStream *stream) {
  tp_cuda_launch_layernorm_backward_f32(dy, x, scale, mean, inv_std, rows, n, dx, dscale, dbias, stream->cuda);
  return TP_KERNEL_OK;
}

/* ---- NLL loss (loss.h): one thread per element of target; the sum in a fixed order ---- */

/* per element: its loss (into loss for reduction none) and weight, into terms [2][N*D]
 * for the sums; a class out of range (not ignored) reports its flat index */
__global__ void nll_terms_kernel(const float *logp, const int64_t *target, int64_t N, int64_t C, int64_t D,
                                 TpLossOptions o, float *loss, double *terms, int64_t *bad) {
  TP_GRID_STRIDE_LOOP(i, N * D) {
    int64_t n = i / D, d = i % D, t = target[i];
    float l = 0, w = 0;
    if (!(o.has_ignore && t == o.ignore_index)) {
      if (t < 0 || t >= C) {
        tp_report_bad(bad, i);
      } else {
        w = o.weight ? o.weight[t] : 1.0f;
        l = -logp[(n * C + t) * D + d] * w;
      }
    }
    if (o.reduction == TP_REDUCE_NONE) loss[i] = l;
    else terms[i] = l, terms[N * D + i] = w;
  }
}

/* One block: the sums of the terms in double, each thread a strided share, combined in a
 * fixed order (deterministic). */
__global__ void nll_reduce_kernel(const double *terms, int64_t count, TpReduction reduction, float *loss) {
  double sum = 0, wsum = 0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) sum += terms[i], wsum += terms[count + i];
  sum = block_reduce(sum, TpSum(), 0.0);
  wsum = block_reduce(wsum, TpSum(), 0.0);
  if (threadIdx.x == 0) *loss = (float)(reduction == TP_REDUCE_SUM ? sum : sum / wsum);
}

TpKernelStatus tp_cuda_nll_loss_f32(const float *logp, const int64_t *target, int64_t N, int64_t C, int64_t D,
                                    const TpLossOptions *o, float *loss, int64_t *bad, TpStream *stream) {
  (void)bad;
  int64_t count = N * D;
  double *terms = NULL;
  if (o->reduction != TP_REDUCE_NONE) terms = static_cast<double *>(tp_cuda_scratch(stream, 2 * (size_t)count * sizeof(double) + 1));
  if (count)
    TP_LAUNCH(nll_terms_kernel, tp_elementwise_grid(count), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream->cuda, logp,
              target, N, C, D, *o, loss, terms, stream->bad);
  if (o->reduction != TP_REDUCE_NONE)
    TP_LAUNCH(nll_reduce_kernel, dim3(1), dim3(TP_CUDA_ROW_THREADS), stream->cuda, terms, count, o->reduction, loss);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_softmax_cross_entropy_f32(const float *scores, const int64_t *target, int64_t N, int64_t C,
                                                 int64_t D, const TpLossOptions *o, float *log_prob, float *loss,
                                                 int64_t *bad, TpStream *stream) {
  tp_cuda_softmax_f32(scores, log_prob, N, C, D, true, stream);
  return tp_cuda_nll_loss_f32(log_prob, target, N, C, D, o, loss, bad, stream);
}

/* ---- transformer.h ---- */

TpKernelStatus tp_cuda_linear_f32(const float *x, const float *w, const float *bias, int64_t M, int64_t K, int64_t N,
                                  bool transpose_w, float *y, TpStream *stream) {
  tp_cuda_launch_linear_f32(stream->blas, x, w, bias, M, K, N, transpose_w, y, stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_embedding_f32(const float *table, const int64_t *ids, int64_t n, int64_t V, int64_t C,
                                     float *out, int64_t *bad, TpStream *stream) {
  (void)bad;
  tp_cuda_launch_embedding_f32(table, ids, n, V, C, out, stream->bad, stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_cross_entropy_f32(const float *logits, const int64_t *targets, int64_t R, int64_t V,
                                         float denominator, float *loss, int64_t *bad, TpStream *stream) {
  (void)bad;
  double *row_loss = static_cast<double *>(tp_cuda_scratch(stream, (size_t)R * sizeof(double) + 1));
  tp_cuda_launch_cross_entropy_f32(logits, targets, R, V, denominator, loss, row_loss, stream->bad, stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_embedding_part_f32(const float *table, const int64_t *ids, const int64_t *part, int64_t n,
                                          int64_t V, int64_t parts, int64_t C, float *out, int64_t *bad,
                                          TpStream *stream) {
  (void)bad;
  tp_cuda_launch_embedding_part_f32(table, ids, part, n, V, parts, C, out, stream->bad, stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_embedding_part_backward_f32(const float *dy, const int64_t *ids, const int64_t *part, int64_t n,
                                                   int64_t V, int64_t parts, int64_t C, float *dtable, int64_t *bad,
                                                   TpStream *stream) {
  (void)bad;
  void *scratch = tp_cuda_scratch(stream, tp_cuda_embedding_backward_scratch(n) + 1);
  tp_cuda_launch_embedding_part_backward_f32(dy, ids, part, n, V, parts, C, dtable, stream->bad, scratch, stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_cross_entropy_stats_f32(const float *logits, const int64_t *targets, const int64_t *part,
                                               int64_t R, int64_t V, int64_t parts, float *stats, int64_t *bad,
                                               TpStream *stream) {
  (void)bad;
  tp_cuda_launch_cross_entropy_stats_f32(logits, targets, part, R, V, parts, stats, stream->bad, stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_cross_entropy_parts_f32(const float *stats, int64_t R, int64_t parts, float denominator,
                                               float *loss, TpStream *stream) {
  double *row_loss = static_cast<double *>(tp_cuda_scratch(stream, (size_t)R * sizeof(double) + 1));
  tp_cuda_launch_cross_entropy_parts_f32(stats, R, parts, denominator, loss, row_loss, stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_cross_entropy_parts_backward_f32(const float *dloss, const float *logits,
                                                        const int64_t *targets, const float *stats,
                                                        const int64_t *part, int64_t R, int64_t V, int64_t parts,
                                                        float denominator, float *dlogits, int64_t *bad,
                                                        TpStream *stream) {
  (void)bad;
  tp_cuda_launch_cross_entropy_parts_backward_f32(dloss, logits, targets, stats, part, R, V, parts, denominator,
                                                  dlogits, stream->bad, stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_rmsnorm_f32(const float *x, const float *scale, int64_t rows, int64_t n, float eps, float *y,
                                   TpStream *stream) {
  tp_cuda_launch_rmsnorm_f32(x, scale, rows, n, eps, y, stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_rotary_f32(const float *x, const float *cos, const float *sin, int rank, const int64_t *dims,
                                  const int64_t *table_dims, int64_t rotary_dim, bool interleaved, float *y,
                                  TpStream *stream) {
  tp_cuda_launch_rotary_f32(x, cos, sin, rank, dims, table_dims, rotary_dim, interleaved, y, stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_swiglu_f32(const float *gate, const float *up, int64_t n, float *y, TpStream *stream) {
  tp_cuda_launch_swiglu_f32(gate, up, n, y, stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_rmsnorm_backward_f32(const float *dy, const float *x, const float *scale, int64_t rows,
                                            int64_t n, float eps, float *dx, float *dscale, TpStream *stream) {
  float *inv_rms = static_cast<float *>(tp_cuda_scratch(stream, (size_t)rows * sizeof(float) + 1));
  tp_cuda_launch_rmsnorm_backward_f32(dy, x, scale, rows, n, eps, dx, dscale, inv_rms, stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_rotary_backward_f32(const float *dy, const float *cos, const float *sin, int rank,
                                           const int64_t *dims, const int64_t *table_dims, int64_t rotary_dim,
                                           bool interleaved, float *dx, TpStream *stream) {
  tp_cuda_launch_rotary_backward_f32(dy, cos, sin, rank, dims, table_dims, rotary_dim, interleaved, dx, stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_swiglu_backward_f32(const float *dy, const float *gate, const float *up, int64_t n,
                                           float *dgate, float *dup, TpStream *stream) {
  tp_cuda_launch_swiglu_backward_f32(dy, gate, up, n, dgate, dup, stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_gelu_backward_f32(const float *dy, const float *x, int64_t n, bool tanh_approx, float *dx,
                                         TpStream *stream) {
  tp_cuda_launch_gelu_backward_f32(dy, x, n, tanh_approx, dx, stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_cross_entropy_backward_f32(const float *dloss, const float *logits, const int64_t *targets,
                                                  int64_t R, int64_t V, float denominator, float *dlogits,
                                                  int64_t *bad, TpStream *stream) {
  (void)bad;
  tp_cuda_launch_cross_entropy_backward_f32(dloss, logits, targets, R, V, denominator, dlogits, stream->bad,
                                            stream->cuda);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cuda_linear_backward_f32(const float *dy, const float *x, const float *w, int64_t M, int64_t K,
                                           int64_t N, bool transpose_w, float *dx, float *dw, float *dbias,
                                           TpStream *stream) {
  tp_cuda_launch_linear_backward_f32(stream->blas, dy, x, w, M, K, N, transpose_w, dx, dw, dbias, stream->cuda);
  return TP_KERNEL_OK;
}

/* ---- matmul.h: f32 only ---- */

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
  if (y && n) TP_LAUNCH(to_bf16_kernel, tp_elementwise_grid(n), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream->cuda, x, n, y);
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

TpKernelStatus tp_cuda_bf16_linear_backward_f32(const float *dy, const float *x, const float *w, int64_t M, int64_t K,
                                                int64_t N, bool transpose_w, float *dx, float *dw, float *dbias,
                                                TpStream *stream) {
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
    TP_LAUNCH(gemm_epilogue_kernel, tp_elementwise_grid(M * N), dim3(TP_CUDA_ELEMENTWISE_THREADS), stream->cuda,
              Y, M, N, (float)alpha, (float)beta, with_c ? static_cast<const float *>(c->data) : NULL, cm, cn);
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
