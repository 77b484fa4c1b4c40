#include "nn.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "matmul.h"
#include "vecmath.h"

/* Rows shorter than this stay on one thread: the fork costs more than it saves. */
#define PARALLEL_MIN_ELEMS 32768

/* Softmax (or log-softmax) of the n elements x[j * stride] into y (may alias x), and the
 * row's log-sum-exp into *row_lse when not NULL (+inf when every element is masked out).
 * Inlined, so that the stride-1 calls vectorise with unit steps, and into both copies of
 * its TP_VECTOR_CLONES callers. */
TP_VECTOR_INLINE void softmax_row(const float *x, float *y, int64_t n, int64_t stride, bool log, float *row_lse) {
  float mx = tp_row_max(x, n, stride);
  if (mx == -INFINITY) { /* every element masked out */
    for (int64_t j = 0; j < n; j++) y[j * stride] = log ? -INFINITY : 0.0f;
    if (row_lse) *row_lse = INFINITY;
    return;
  }
  double sum = 0;
  if (log) {
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; j++) sum += tp_vexpf(x[j * stride] - mx);
    float lse = logf((float)sum);
#pragma omp simd
    for (int64_t j = 0; j < n; j++) y[j * stride] = (x[j * stride] - mx) - lse;
  } else {
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; j++) {
      float e = tp_vexpf(x[j * stride] - mx);
      y[j * stride] = e;
      sum += e;
    }
    float inv = (float)(1.0 / sum);
#pragma omp simd
    for (int64_t j = 0; j < n; j++) y[j * stride] *= inv;
  }
  if (row_lse) *row_lse = mx + logf((float)sum);
}

/* Rows [r0, r1) of tp_softmax_f32's [outer, n, inner] view. */
TP_VECTOR_CLONES static void softmax_rows(const float *x, float *y, int64_t r0, int64_t r1, int64_t n, int64_t inner,
                                          bool log) {
  for (int64_t r = r0; r < r1; r++) {
    int64_t base = (r / inner) * n * inner + r % inner;
    if (inner == 1) softmax_row(x + base, y + base, n, 1, log, NULL);
    else softmax_row(x + base, y + base, n, inner, log, NULL);
  }
}

TpKernelStatus tp_softmax_f32(const float *x, float *y, int64_t outer, int64_t n, int64_t inner, bool log) {
  int64_t rows = outer * inner;
  if (rows * n < PARALLEL_MIN_ELEMS) {
    softmax_rows(x, y, 0, rows, n, inner, log);
    return TP_KERNEL_OK;
  }
#pragma omp parallel
  {
    int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    softmax_rows(x, y, rows * t / nt, rows * (t + 1) / nt, n, inner, log);
  }
  return TP_KERNEL_OK;
}

/* Rows [r0, r1) of tp_layernorm_f32. */
TP_VECTOR_CLONES static void layernorm_rows(const float *x, const float *scale, const float *bias, int64_t r0,
                                            int64_t r1, int64_t n, float eps, float *y, float *mean,
                                            float *inv_std) {
  for (int64_t r = r0; r < r1; r++) {
    const float *xr = x + r * n;
    float *yr = y + r * n;
    double sum = 0, sq = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; j++) sum += xr[j];
    float mu = (float)(sum / (double)n);
#pragma omp simd reduction(+ : sq)
    for (int64_t j = 0; j < n; j++) {
      float dx = xr[j] - mu;
      sq += (double)dx * dx;
    }
    float inv = (float)(1.0 / sqrt(sq / (double)n + eps));
    if (bias) {
#pragma omp simd
      for (int64_t j = 0; j < n; j++) yr[j] = (xr[j] - mu) * inv * scale[j] + bias[j];
    } else {
#pragma omp simd
      for (int64_t j = 0; j < n; j++) yr[j] = (xr[j] - mu) * inv * scale[j];
    }
    if (mean) mean[r] = mu;
    if (inv_std) inv_std[r] = inv;
  }
}

TpKernelStatus tp_layernorm_f32(const float *x, const float *scale, const float *bias, int64_t outer, int64_t n,
                                float eps, float *y, float *mean, float *inv_std) {
  if (outer * n < PARALLEL_MIN_ELEMS) {
    layernorm_rows(x, scale, bias, 0, outer, n, eps, y, mean, inv_std);
    return TP_KERNEL_OK;
  }
#pragma omp parallel
  {
    int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    layernorm_rows(x, scale, bias, outer * t / nt, outer * (t + 1) / nt, n, eps, y, mean, inv_std);
  }
  return TP_KERNEL_OK;
}

/* Writes past ++ new keys (or values) of every kv head into dst [B, kv_heads, total, D]. */
static void concat_kv(const TpAttention *p, const float *past, const float *x, int64_t D, float *dst) {
  int64_t total = p->past_len + p->kv_len, rows = tp_attention_kv_rows(p);
  for (int64_t b = 0; b < p->batch; b++)
    for (int64_t g = 0; g < p->kv_heads; g++) {
      float *out = dst + (b * p->kv_heads + g) * total * D;
      if (p->past_len)
        memcpy(out, past + (b * p->kv_heads + g) * p->past_len * D, (size_t)(p->past_len * D) * sizeof *out);
      for (int64_t s = 0; s < p->kv_len; s++) {
        const float *row = p->packed ? x + ((b * rows + s) * p->kv_heads + g) * D
                                     : x + ((b * p->kv_heads + g) * rows + s) * D;
        memcpy(out + (p->past_len + s) * D, row, (size_t)D * sizeof *out);
      }
    }
}

/* Where the keys and values of kv head g of batch b are, and their leading dimensions. */
typedef struct {
  const float *k, *v;
  int64_t ldk, ldv;
} KeysValues;

/* Query rows [i0, i1) of batch b, head h; s is (i1 - i0) * total scratch. */
TP_VECTOR_CLONES static void attention_rows(const TpAttention *p, int64_t b, int64_t h, int64_t i0, int64_t i1,
                                            const float *q, KeysValues kv, float *y, float *qk_out, float *lse,
                                            float *s) {
  int64_t total = p->past_len + p->kv_len, D = p->head_size, Dv = p->v_head_size, Sq = p->q_len;
  int64_t ldq, ldy, rows = i1 - i0;
  const float *qh = q + tp_attention_head_offset(p, b, h, p->q_heads, Sq, D, &ldq) + i0 * ldq;
  float *yh = y + tp_attention_head_offset(p, b, h, p->q_heads, Sq, Dv, &ldy) + i0 * ldy;
  /* the keys a row of the block may see; all of them when qk_out wants the full rows */
  int64_t lo = 0, hi = total;
  if (!qk_out) tp_attention_block_keys(p, i0, i1, total, &lo, &hi);
  int64_t w = hi - lo;
  float *lse_rows = lse ? lse + (b * p->q_heads + h) * Sq : NULL;
  if (w <= 0) { /* no row sees a key */
    for (int64_t i = 0; i < rows; i++) memset(yh + i * ldy, 0, (size_t)Dv * sizeof *yh);
    for (int64_t i = i0; lse_rows && i < i1; i++) lse_rows[i] = INFINITY;
    return;
  }
  float *qk = qk_out ? qk_out + ((b * p->q_heads + h) * Sq + i0) * total : NULL;
  size_t sbytes = (size_t)(rows * w) * sizeof *s;

  tp_sgemm(false, true, rows, w, D, p->scale, qh, ldq, kv.k + lo * kv.ldk, kv.ldk, 0, s, w);
  if (qk && p->qk_mode == 0) memcpy(qk, s, sbytes);
  if (p->softcap > 0)
    for (int64_t i = 0; i < rows * w; i++) s[i] = p->softcap * tanhf(s[i] / p->softcap);
  if (qk && p->qk_mode == 1) memcpy(qk, s, sbytes);
  for (int64_t i = i0; i < i1; i++) {
    float *row = s + (i - i0) * w;
    int64_t first, end; /* keys [first, end) of this row, within [lo, hi) */
    tp_attention_key_range(p, i, total, &first, &end);
    if (p->mask) tp_attention_mask_row(p, b, h, i, first, end, row + (first - lo));
    for (int64_t j = lo; j < first; j++) row[j - lo] = -INFINITY;
    for (int64_t j = end; j < hi; j++) row[j - lo] = -INFINITY;
    if (qk && p->qk_mode == 2) memcpy(qk + (i - i0) * total, row, (size_t)w * sizeof *row);
    softmax_row(row + (first - lo), row + (first - lo), end - first, 1, false, lse_rows ? lse_rows + i : NULL);
    for (int64_t j = lo; j < first; j++) row[j - lo] = 0;
    for (int64_t j = end; j < hi; j++) row[j - lo] = 0;
    if (qk && p->qk_mode == 3) memcpy(qk + (i - i0) * total, row, (size_t)w * sizeof *row);
  }
  tp_sgemm(false, false, rows, Dv, w, 1, s, w, kv.v + lo * kv.ldv, kv.ldv, 0, yh, ldy);
}

TpKernelStatus tp_attention_f32(const TpAttention *p, const float *q, const float *k, const float *v,
                                const float *past_k, const float *past_v, float *y, float *present_k,
                                float *present_v, float *qk_out, float *lse) {
  int64_t total = p->past_len + p->kv_len, D = p->head_size, Dv = p->v_head_size;
  int64_t group = p->q_heads / p->kv_heads, Sq = p->q_len;

  /* With a past, K and V are read from the contiguous [B, kv_heads, total, D] present
   * buffers (the caller's, or scratch); without one, straight from the inputs. */
  float *kbuf = present_k, *vbuf = present_v, *scratch_k = NULL, *scratch_v = NULL;
  if (p->past_len && !kbuf) kbuf = scratch_k = malloc((size_t)(p->batch * p->kv_heads * total * D) * sizeof(float));
  if (p->past_len && !vbuf) vbuf = scratch_v = malloc((size_t)(p->batch * p->kv_heads * total * Dv) * sizeof(float));
  if ((p->past_len && !kbuf) || (p->past_len && !vbuf)) abort(); /* out of memory */
  if (kbuf) concat_kv(p, past_k, k, D, kbuf);
  if (vbuf) concat_kv(p, past_v, v, Dv, vbuf);

  if (Sq * total == 0) { /* no keys: nothing to attend to */
    for (int64_t b = 0; b < p->batch; b++)
      for (int64_t h = 0; h < p->q_heads; h++) {
        int64_t ldy;
        float *yh = y + tp_attention_head_offset(p, b, h, p->q_heads, Sq, Dv, &ldy);
        for (int64_t i = 0; i < Sq; i++) memset(yh + i * ldy, 0, (size_t)Dv * sizeof *yh);
        for (int64_t i = 0; lse && i < Sq; i++) lse[(b * p->q_heads + h) * Sq + i] = INFINITY;
      }
    free(scratch_k);
    free(scratch_v);
    return TP_KERNEL_OK;
  }
  /* One task per (batch, head, block of query rows); each writes only its own rows of y
   * and qk_out, and computes them the same way on any thread, so the result does not
   * depend on the thread count. With a task for every thread they run in parallel, each
   * product on its thread alone (tp_sgemm inside a parallel region); otherwise one after
   * the other, each product split over the threads. */
  int64_t blocks = (Sq + TP_ATTENTION_QUERY_BLOCK - 1) / TP_ATTENTION_QUERY_BLOCK,
          tasks = p->batch * p->q_heads * blocks;
  int nthreads = omp_get_max_threads();
  bool parallel = nthreads > 1 && tasks >= nthreads;
  int64_t rows_max = Sq < TP_ATTENTION_QUERY_BLOCK ? Sq : TP_ATTENTION_QUERY_BLOCK;
#pragma omp parallel if (parallel)
  {
    float *s = malloc((size_t)(rows_max * total) * sizeof *s);
    if (!s) abort(); /* out of memory */
                     /* dynamic: causal blocks further down cost more */
#pragma omp for schedule(dynamic)
    for (int64_t t = 0; t < tasks; t++) {
      int64_t b = t / (p->q_heads * blocks), h = t / blocks % p->q_heads, blk = t % blocks;
      int64_t g = h / group, i0 = blk * TP_ATTENTION_QUERY_BLOCK,
              i1 = i0 + TP_ATTENTION_QUERY_BLOCK < Sq ? i0 + TP_ATTENTION_QUERY_BLOCK : Sq;
      KeysValues kv;
      if (kbuf) kv.k = kbuf + (b * p->kv_heads + g) * total * D, kv.ldk = D;
      else kv.k = k + tp_attention_head_offset(p, b, g, p->kv_heads, tp_attention_kv_rows(p), D, &kv.ldk);
      if (vbuf) kv.v = vbuf + (b * p->kv_heads + g) * total * Dv, kv.ldv = Dv;
      else kv.v = v + tp_attention_head_offset(p, b, g, p->kv_heads, tp_attention_kv_rows(p), Dv, &kv.ldv);
      attention_rows(p, b, h, i0, i1, q, kv, y, qk_out, lse, s);
    }
    free(s);
  }
  free(scratch_k);
  free(scratch_v);
  return TP_KERNEL_OK;
}
