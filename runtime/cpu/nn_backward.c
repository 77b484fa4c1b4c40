#include "nn_backward.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "matmul.h"
#include "../kernels/check.h"
#include "../kernels/element.h"
#include "vecmath.h"

/* Loops shorter than this stay on one thread: the fork costs more than it saves. */
#define PARALLEL_MIN_ELEMS 32768
/* Columns per task of a column-sum: one task owns its columns, so no two threads add into
 * the same sum and the order of the additions is fixed. */
#define COLUMN_BLOCK 32

/* tp_sgemm that allows an empty inner dimension (C = beta * C, beta 0 or 1). */
static void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                 const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    if (beta == 0)
      for (int64_t i = 0; i < M; i++) memset(C + i * ldc, 0, (size_t)N * sizeof *C);
    return;
  }
  tp_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* Runs of ROW_RUN rows are summed in float (vectorised), the runs in double. */
#define ROW_RUN 64
void tp_column_sums_f32(const float *dy, const float *x, const float *mean, const float *inv_std, int64_t rows,
                        int64_t n, float *sum_dy_xhat, float *sum_dy) {
  int64_t nblocks = (n + COLUMN_BLOCK - 1) / COLUMN_BLOCK;
#pragma omp parallel for schedule(static) if (rows * n >= PARALLEL_MIN_ELEMS)
  for (int64_t blk = 0; blk < nblocks; blk++) {
    int64_t j0 = blk * COLUMN_BLOCK, w = n - j0 < COLUMN_BLOCK ? n - j0 : COLUMN_BLOCK;
    double s[COLUMN_BLOCK] = {0}, sx[COLUMN_BLOCK] = {0};
    for (int64_t r0 = 0; r0 < rows; r0 += ROW_RUN) {
      float fs[COLUMN_BLOCK] = {0}, fsx[COLUMN_BLOCK] = {0};
      for (int64_t r = r0; r < rows && r < r0 + ROW_RUN; r++) {
        const float *d = dy + r * n + j0;
#pragma omp simd
        for (int64_t j = 0; j < w; j++) fs[j] += d[j];
        if (x) {
          const float *xr = x + r * n + j0;
          float mu = mean ? mean[r] : 0, rs = inv_std[r];
#pragma omp simd
          for (int64_t j = 0; j < w; j++) fsx[j] += d[j] * ((xr[j] - mu) * rs);
        }
      }
      for (int64_t j = 0; j < w; j++) s[j] += fs[j], sx[j] += fsx[j];
    }
    for (int64_t j = 0; j < w; j++) {
      if (sum_dy) sum_dy[j0 + j] = (float)s[j];
      if (sum_dy_xhat) sum_dy_xhat[j0 + j] = (float)sx[j];
    }
  }
}

/* ---- Linear, MatMul ---- */

TpKernelStatus tp_linear_backward_f32(const float *dy, const float *x, const float *w, int64_t M, int64_t K,
                                      int64_t N, bool transpose_w, float *dx, float *dw, float *dbias) {
  if (dx) {
    if (transpose_w) gemm(false, false, M, K, N, 1, dy, N, w, K, 0, dx, K);
    else gemm(false, true, M, K, N, 1, dy, N, w, N, 0, dx, K);
  }
  if (dw) {
    if (transpose_w) gemm(true, false, N, K, M, 1, dy, N, x, K, 0, dw, K);
    else gemm(true, false, K, N, M, 1, x, K, dy, N, 0, dw, N);
  }
  if (dbias) tp_column_sums_f32(dy, NULL, NULL, NULL, M, N, NULL, dbias);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_linear_backward_dgelu_f32(const float *dy, const float *x, const float *w, const float *pre,
                                            int64_t M, int64_t K, int64_t N, bool transpose_w, float *dx, float *dw,
                                            float *dbias) {
  /* dw and dbias first: dx may take x's bytes (x is read by dw's product alone) */
  TpKernelStatus s = tp_linear_backward_f32(dy, x, w, M, K, N, transpose_w, NULL, dw, dbias);
  if (s == TP_KERNEL_OK && dx) s = tp_linear_backward_f32(dy, x, w, M, K, N, transpose_w, dx, NULL, NULL);
  if (s == TP_KERNEL_OK && dx) s = tp_gelu_backward_f32(dx, pre, M * K, true, dx);
  return s;
}

TpKernelStatus tp_matmul_backward_f32(const TpTensor *dy, const TpTensor *a, const TpTensor *b, TpTensor *da,
                                      TpTensor *db) {
  TpMatmulLayout l;
  TpKernelStatus s = tp_check_matmul_backward(dy, a, b, da, db, &l);
  if (s != TP_KERNEL_OK) return s;
  int64_t M = l.M, K = l.K, N = l.N, nbatch = l.nbatch;
  const float *g = dy->data, *A = a->data, *B = b->data;
  float *dA = da ? da->data : NULL, *dB = db ? db->data : NULL;

  /* One shared b: the batch folds into the rows of one product each way. */
  if (l.nb == 1 && l.na == nbatch) {
    if (dA) gemm(false, true, nbatch * M, K, N, 1, g, N, B, N, 0, dA, K);
    if (dB) gemm(true, false, K, N, nbatch * M, 1, A, K, g, N, 0, dB, N);
    return TP_KERNEL_OK;
  }
  /* An operand broadcast along a batch dim collects the sum of its products. */
  bool sum_a = l.na != nbatch, sum_b = l.nb != nbatch;
  if (dA && sum_a) memset(dA, 0, tp_tensor_bytes(da));
  if (dB && sum_b) memset(dB, 0, tp_tensor_bytes(db));
  for (int64_t n = 0; n < nbatch; n++) {
    int64_t oa, ob;
    tp_matmul_operands(&l, n, &oa, &ob);
    const float *gn = g + n * M * N;
    if (dA) gemm(false, true, M, K, N, 1, gn, N, B + ob * K * N, N, sum_a, dA + oa * M * K, K);
    if (dB) gemm(true, false, K, N, M, 1, A + oa * M * K, K, gn, N, sum_b, dB + ob * K * N, N);
  }
  return TP_KERNEL_OK;
}

/* ---- LayerNorm, Gelu, Softmax ---- */

TpKernelStatus tp_layernorm_backward_f32(const float *dy, const float *x, const float *scale, const float *mean,
                                         const float *inv_std, int64_t rows, int64_t n, float *dx, float *dscale,
                                         float *dbias) {
  if (dx) {
#pragma omp parallel for schedule(static) if (rows * n >= PARALLEL_MIN_ELEMS)
    for (int64_t r = 0; r < rows; r++) {
      const float *d = dy + r * n, *xr = x + r * n;
      float *o = dx + r * n, mu = mean[r], rs = inv_std[r];
      double sum_g = 0, sum_gx = 0;
#pragma omp simd reduction(+ : sum_g, sum_gx)
      for (int64_t j = 0; j < n; j++) {
        float gj = d[j] * scale[j];
        sum_g += gj;
        sum_gx += (double)gj * ((xr[j] - mu) * rs);
      }
      float mean_g = (float)(sum_g / (double)n), mean_gx = (float)(sum_gx / (double)n);
#pragma omp simd
      for (int64_t j = 0; j < n; j++) o[j] = rs * (d[j] * scale[j] - mean_g - (xr[j] - mu) * rs * mean_gx);
    }
  }
  if (dscale || dbias) tp_column_sums_f32(dy, x, mean, inv_std, rows, n, dscale, dbias);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_gelu_backward_f32(const float *dy, const float *x, int64_t n, bool tanh_approx, float *dx) {
  if (tanh_approx) {
#pragma omp parallel for simd schedule(static) if (n >= PARALLEL_MIN_ELEMS)
    for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * tp_gelu_tanh_grad_f32(x[i]);
  } else {
#pragma omp parallel for simd schedule(static) if (n >= PARALLEL_MIN_ELEMS)
    for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * tp_gelu_grad_f32(x[i]);
  }
  return TP_KERNEL_OK;
}

TpKernelStatus tp_softmax_backward_f32(const float *dy, const float *y, int64_t outer, int64_t n, int64_t inner,
                                       bool log, float *dx) {
  int64_t rows = outer * inner;
#pragma omp parallel for schedule(static) if (rows * n >= PARALLEL_MIN_ELEMS)
  for (int64_t r = 0; r < rows; r++) {
    int64_t base = (r / inner) * n * inner + r % inner, s = inner;
    const float *d = dy + base, *yr = y + base;
    float *o = dx + base;
    double dot = 0;
    if (log) {
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < n; j++) dot += d[j * s];
      float sum = (float)dot;
#pragma omp simd
      for (int64_t j = 0; j < n; j++) o[j * s] = d[j * s] - tp_vexpf(yr[j * s]) * sum;
    } else {
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < n; j++) dot += (double)d[j * s] * yr[j * s];
      float sum = (float)dot;
#pragma omp simd
      for (int64_t j = 0; j < n; j++) o[j * s] = yr[j * s] * (d[j * s] - sum);
    }
  }
  return TP_KERNEL_OK;
}

/* ---- Attention ---- */

/* Per-thread scratch of the attention backward: (TP_ATTENTION_QUERY_BLOCK, T) matrices. */
typedef struct {
  float *prob;   /* the recomputed probabilities */
  float *grad;   /* d probabilities, then d scores */
  float *capped; /* tanh(s / softcap) when softcap > 0 */
} AttnScratch;

/* Rows [r0, r1) of a head's (rows, D) matrix x with leading dimension ld set to zero. */
static void zero_rows(float *x, int64_t ld, int64_t r0, int64_t r1, int64_t D) {
  for (int64_t r = r0; r < r1; r++) memset(x + r * ld, 0, (size_t)D * sizeof *x);
}

/* The probabilities of query rows [i0, i1) of batch b, head h from their scores s
 * (i1 - i0, hi - lo) over keys [lo, hi), in place, as tp_attention_f32 computes them:
 * masked, softmax over each row's keys, 0 for the keys a row does not see. */
static void attention_probabilities(const TpAttention *p, int64_t b, int64_t h, int64_t i0, int64_t i1, float *s,
                                    int64_t lo, int64_t hi) {
  int64_t w = hi - lo;
  for (int64_t i = i0; i < i1; i++) {
    float *row = s + (i - i0) * w;
    int64_t first, end;
    tp_attention_key_range(p, i, p->kv_len, &first, &end);
    if (p->mask) tp_attention_mask_row(p, b, h, i, first, end, row + (first - lo));
    tp_softmax_f32(row + (first - lo), row + (first - lo), 1, end - first, 1, false);
    for (int64_t j = lo; j < first; j++) row[j - lo] = 0;
    for (int64_t j = end; j < hi; j++) row[j - lo] = 0;
  }
}

/* Gradients of kv head g of batch b and of the q heads that share it. */
static void attention_backward_group(const TpAttention *p, int64_t b, int64_t g, const float *dy, const float *q,
                                     const float *k, const float *v, float *dq, float *dk, float *dv,
                                     const AttnScratch *w) {
  int64_t Sq = p->q_len, T = p->kv_len, D = p->head_size, Dv = p->v_head_size;
  int64_t group = p->q_heads / p->kv_heads, ldk, ldv, ldq, ldy;
  /* k and v may lie in a longer context buffer (kv_rows); dk and dv are dense */
  int64_t rows = tp_attention_kv_rows(p);
  int64_t ok = tp_attention_head_offset(p, b, g, p->kv_heads, T, D, &ldk);
  int64_t ov = tp_attention_head_offset(p, b, g, p->kv_heads, T, Dv, &ldv);
  const float *kh = k + tp_attention_head_offset(p, b, g, p->kv_heads, rows, D, &ldk);
  const float *vh = v + tp_attention_head_offset(p, b, g, p->kv_heads, rows, Dv, &ldv);
  /* every block adds its share; keys no query sees keep 0 */
  if (dk) zero_rows(dk + ok, ldk, 0, T, D);
  if (dv) zero_rows(dv + ov, ldv, 0, T, Dv);
  float *P = w->prob, *G = w->grad, c = p->softcap;
  for (int64_t hh = 0; hh < group; hh++) {
    int64_t h = g * group + hh;
    int64_t oq = tp_attention_head_offset(p, b, h, p->q_heads, Sq, D, &ldq);
    int64_t oy = tp_attention_head_offset(p, b, h, p->q_heads, Sq, Dv, &ldy);
    for (int64_t i0 = 0; i0 < Sq; i0 += TP_ATTENTION_QUERY_BLOCK) {
      int64_t i1 = i0 + TP_ATTENTION_QUERY_BLOCK < Sq ? i0 + TP_ATTENTION_QUERY_BLOCK : Sq, n = i1 - i0, lo, hi;
      tp_attention_block_keys(p, i0, i1, T, &lo, &hi);
      int64_t W = hi - lo; /* keys [lo, hi): the ones a row of the block sees */
      const float *qb = q + oq + i0 * ldq, *dyb = dy + oy + i0 * ldy, *kb = kh + lo * ldk, *vb = vh + lo * ldv;

      /* P = softmax(mask(softcap(scale * Q K^T))), as the forward computes it */
      gemm(false, true, n, W, D, p->scale, qb, ldq, kb, ldk, 0, P, W);
      if (c > 0)
        for (int64_t i = 0; i < n * W; i++) {
          w->capped[i] = tanhf(P[i] / c);
          P[i] = c * w->capped[i];
        }
      attention_probabilities(p, b, h, i0, i1, P, lo, hi);

      if (dv) gemm(true, false, W, Dv, n, 1, P, W, dyb, ldy, 1, dv + ov + lo * ldv, ldv);
      if (!dq && !dk) continue;
      /* dP = dY V^T; dS = P * (dP - rowsum(P * dP)); through the softcap: * (1 - tanh^2).
       * The mask is added to the scores, so dS would be its gradient (not needed: constant). */
      gemm(false, true, n, W, Dv, 1, dyb, ldy, vb, ldv, 0, G, W);
      for (int64_t i = 0; i < n; i++) {
        float *Pi = P + i * W, *Gi = G + i * W;
        double dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int64_t j = 0; j < W; j++) dot += (double)Pi[j] * Gi[j];
        float sum = (float)dot;
#pragma omp simd
        for (int64_t j = 0; j < W; j++) Gi[j] = Pi[j] * (Gi[j] - sum);
      }
      if (c > 0)
        for (int64_t i = 0; i < n * W; i++) G[i] *= 1 - w->capped[i] * w->capped[i];
      if (dq) gemm(false, false, n, D, W, p->scale, G, W, kb, ldk, 0, dq + oq + i0 * ldq, ldq);
      if (dk) gemm(true, false, W, D, n, p->scale, G, W, qb, ldq, 1, dk + ok + lo * ldk, ldk);
    }
  }
}

TpKernelStatus tp_attention_backward_f32(const TpAttention *p, const float *dy, const float *q, const float *k,
                                         const float *v, const float *y, const float *lse, float *dq, float *dk,
                                         float *dv) {
  /* y and lse are not needed: a row's statistics come with its probabilities (kernels.def) */
  (void)y, (void)lse;
  int64_t Sq = p->q_len, T = p->kv_len, B = p->batch;
  if (Sq == 0 || T == 0) { /* nothing attended: every gradient is zero */
    if (dq) memset(dq, 0, (size_t)(B * p->q_heads * Sq * p->head_size) * sizeof *dq);
    if (dk) memset(dk, 0, (size_t)(B * p->kv_heads * T * p->head_size) * sizeof *dk);
    if (dv) memset(dv, 0, (size_t)(B * p->kv_heads * T * p->v_head_size) * sizeof *dv);
    return TP_KERNEL_OK;
  }
  /* One task per (batch, kv head); each writes only its own heads' gradients. With enough
   * tasks for every thread, the tasks run in parallel, each product on its thread alone
   * (tp_sgemm inside a parallel region); otherwise one after the other, each product
   * split over the threads. */
  int64_t tasks = B * p->kv_heads;
  int nthreads = omp_get_max_threads();
  bool parallel = nthreads > 1 && tasks >= nthreads;
  size_t bytes = (size_t)((Sq < TP_ATTENTION_QUERY_BLOCK ? Sq : TP_ATTENTION_QUERY_BLOCK) * T) * sizeof(float);
#pragma omp parallel if (parallel)
  {
    AttnScratch w = {malloc(bytes), malloc(bytes), p->softcap > 0 ? malloc(bytes) : NULL};
    if (!w.prob || !w.grad || (p->softcap > 0 && !w.capped)) abort(); /* out of memory */
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tasks; t++)
      attention_backward_group(p, t / p->kv_heads, t % p->kv_heads, dy, q, k, v, dq, dk, dv, &w);
    free(w.prob);
    free(w.grad);
    free(w.capped);
  }
  return TP_KERNEL_OK;
}

/* ---- CrossEntropy ---- */

TpKernelStatus tp_cross_entropy_backward_f32(float dloss, const float *logits, const int64_t *targets, int64_t R,
                                             int64_t V, float denominator, float *dlogits, int64_t *bad) {
  return tp_cross_entropy_backward_pad_f32(dloss, logits, targets, R, V, 0, denominator, dlogits, bad);
}

TpKernelStatus tp_cross_entropy_backward_pad_f32(float dloss, const float *logits, const int64_t *targets, int64_t R,
                                                 int64_t V, int64_t pad, float denominator, float *dlogits,
                                                 int64_t *bad) {
  TpKernelStatus status = tp_check_vocab_pad(V, pad);
  if (status != TP_KERNEL_OK) return status;
  int64_t classes = V - pad;
  for (int64_t r = 0; r < R; r++)
    if (targets[r] < 0 || targets[r] >= classes) {
      *bad = r;
      return TP_KERNEL_BAD_INDEX;
    }
  float scale = dloss / denominator;
#pragma omp parallel for schedule(static) if (R * V >= PARALLEL_MIN_ELEMS)
  for (int64_t r = 0; r < R; r++) {
    const float *x = logits + r * V;
    float *o = dlogits + r * V, mx = tp_row_max(x, classes, 1);
    double sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < classes; j++) {
      o[j] = tp_vexpf(x[j] - mx);
      sum += o[j];
    }
    float inv = (float)(1.0 / sum) * scale;
#pragma omp simd
    for (int64_t j = 0; j < classes; j++) o[j] *= inv;
    for (int64_t j = classes; j < V; j++) o[j] = 0; /* the padding: no probability, no gradient */
    o[targets[r]] -= scale;
  }
  return TP_KERNEL_OK;
}
