#include "nn.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "matmul.h"

/* Rows shorter than this stay on one thread: the fork costs more than it saves. */
#define PARALLEL_MIN_ELEMS 32768

void tp_softmax_f32(const float *x, float *y, int64_t outer, int64_t n, int64_t inner, bool log) {
  int64_t rows = outer * inner;
#pragma omp parallel for if (rows * n >= PARALLEL_MIN_ELEMS)
  for (int64_t r = 0; r < rows; r++) {
    int64_t base = (r / inner) * n * inner + r % inner;
    const float *xr = x + base;
    float *yr = y + base;
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; j++)
      if (xr[j * inner] > mx) mx = xr[j * inner];
    if (mx == -INFINITY) { /* every element masked out */
      for (int64_t j = 0; j < n; j++) yr[j * inner] = log ? -INFINITY : 0.0f;
      continue;
    }
    double sum = 0;
    if (log) {
      for (int64_t j = 0; j < n; j++) sum += expf(xr[j * inner] - mx);
      float lse = logf((float)sum);
      for (int64_t j = 0; j < n; j++) yr[j * inner] = (xr[j * inner] - mx) - lse;
    } else {
      for (int64_t j = 0; j < n; j++) {
        float e = expf(xr[j * inner] - mx);
        yr[j * inner] = e;
        sum += e;
      }
      float inv = (float)(1.0 / sum);
      for (int64_t j = 0; j < n; j++) yr[j * inner] *= inv;
    }
  }
}

void tp_layernorm_f32(const float *x, const float *scale, const float *bias, int64_t outer,
                      int64_t n, float eps, float *y, float *mean, float *inv_std) {
#pragma omp parallel for if (outer * n >= PARALLEL_MIN_ELEMS)
  for (int64_t r = 0; r < outer; r++) {
    const float *xr = x + r * n;
    float *yr = y + r * n;
    double sum = 0, sq = 0;
    for (int64_t j = 0; j < n; j++) sum += xr[j];
    float mu = (float)(sum / (double)n);
    for (int64_t j = 0; j < n; j++) {
      float dx = xr[j] - mu;
      sq += (double)dx * dx;
    }
    float inv = (float)(1.0 / sqrt(sq / (double)n + eps));
    for (int64_t j = 0; j < n; j++) yr[j] = (xr[j] - mu) * inv * scale[j] + (bias ? bias[j] : 0.0f);
    if (mean) mean[r] = mu;
    if (inv_std) inv_std[r] = inv;
  }
}

/* Writes past ++ new keys (or values) of every kv head into dst [B, kv_heads, total, D]. */
static void concat_kv(const TpAttention *p, const float *past, const float *x, int64_t D, float *dst) {
  int64_t total = p->past_len + p->kv_len;
  for (int64_t b = 0; b < p->batch; b++)
    for (int64_t g = 0; g < p->kv_heads; g++) {
      float *out = dst + (b * p->kv_heads + g) * total * D;
      if (p->past_len)
        memcpy(out, past + (b * p->kv_heads + g) * p->past_len * D, (size_t)(p->past_len * D) * sizeof *out);
      for (int64_t s = 0; s < p->kv_len; s++) {
        const float *row = p->packed ? x + ((b * p->kv_len + s) * p->kv_heads + g) * D
                                     : x + ((b * p->kv_heads + g) * p->kv_len + s) * D;
        memcpy(out + (p->past_len + s) * D, row, (size_t)D * sizeof *out);
      }
    }
}

/* The [S, D] matrix of batch b, head h of a Q/K/V/Y-shaped tensor with `heads` heads, and
 * its leading dimension. */
static int64_t head_offset(const TpAttention *p, int64_t b, int64_t h, int64_t heads, int64_t S,
                           int64_t D, int64_t *ld) {
  *ld = p->packed ? heads * D : D;
  return p->packed ? b * S * heads * D + h * D : (b * heads + h) * S * D;
}

void tp_attention_f32(const TpAttention *p, const float *q, const float *k, const float *v,
                      const float *past_k, const float *past_v, float *y, float *present_k,
                      float *present_v, float *qk_out) {
  int64_t total = p->past_len + p->kv_len, D = p->head_size, Dv = p->v_head_size;
  int64_t group = p->q_heads / p->kv_heads, Sq = p->q_len;

  /* With a past, K and V are read from the contiguous [B, kv_heads, total, D] present
   * buffers (the caller's, or scratch); without one, straight from the inputs. */
  float *kbuf = present_k, *vbuf = present_v, *scratch_k = NULL, *scratch_v = NULL;
  if (p->past_len && !kbuf) kbuf = scratch_k = malloc((size_t)(p->batch * p->kv_heads * total * D) * sizeof(float));
  if (p->past_len && !vbuf) vbuf = scratch_v = malloc((size_t)(p->batch * p->kv_heads * total * Dv) * sizeof(float));
  if (kbuf) concat_kv(p, past_k, k, D, kbuf);
  if (vbuf) concat_kv(p, past_v, v, Dv, vbuf);

  float *s = malloc((size_t)(Sq * total > 0 ? Sq * total : 1) * sizeof *s);
  const unsigned char *mb = p->mask_is_bool ? p->mask : NULL;
  const float *mf = p->mask_is_bool ? NULL : p->mask;
  const int64_t *ms = p->mask_strides;
  for (int64_t b = 0; b < p->batch; b++)
    for (int64_t h = 0; h < p->q_heads; h++) {
      int64_t g = h / group, ldq, ldk, ldv, ldy;
      const float *qh = q + head_offset(p, b, h, p->q_heads, Sq, D, &ldq);
      const float *kh, *vh;
      if (kbuf) kh = kbuf + (b * p->kv_heads + g) * total * D, ldk = D;
      else kh = k + head_offset(p, b, g, p->kv_heads, p->kv_len, D, &ldk);
      if (vbuf) vh = vbuf + (b * p->kv_heads + g) * total * Dv, ldv = Dv;
      else vh = v + head_offset(p, b, g, p->kv_heads, p->kv_len, Dv, &ldv);
      float *yh = y + head_offset(p, b, h, p->q_heads, Sq, Dv, &ldy);
      float *qk = qk_out ? qk_out + (b * p->q_heads + h) * Sq * total : NULL;
      size_t sbytes = (size_t)(Sq * total) * sizeof *s;

      if (Sq * total == 0) continue;
      tp_sgemm(false, true, Sq, total, D, p->scale, qh, ldq, kh, ldk, 0, s, total);
      if (qk && p->qk_mode == 0) memcpy(qk, s, sbytes);
      if (p->softcap > 0)
        for (int64_t i = 0; i < Sq * total; i++) s[i] = p->softcap * tanhf(s[i] / p->softcap);
      if (qk && p->qk_mode == 1) memcpy(qk, s, sbytes);
      if (p->mask || p->is_causal)
        for (int64_t i = 0; i < Sq; i++)
          for (int64_t j = 0; j < total; j++) {
            bool keep = !p->is_causal || j <= i + p->past_len;
            float add = 0;
            if (p->mask) {
              int64_t mi = b * ms[0] + h * ms[1] + i * ms[2] + j * ms[3];
              if (j >= p->mask_len) keep = false;
              else if (mb) keep = keep && mb[mi];
              else add = mf[mi];
            }
            s[i * total + j] = keep ? s[i * total + j] + add : -INFINITY;
          }
      if (qk && p->qk_mode == 2) memcpy(qk, s, sbytes);
      tp_softmax_f32(s, s, Sq, total, 1, false);
      if (qk && p->qk_mode == 3) memcpy(qk, s, sbytes);
      tp_sgemm(false, false, Sq, Dv, total, 1, s, total, vh, ldv, 0, yh, ldy);
    }
  if (Sq * total == 0 && Sq * Dv > 0) /* no keys: nothing to attend to */
    for (int64_t b = 0; b < p->batch; b++)
      for (int64_t h = 0; h < p->q_heads; h++) {
        int64_t ldy;
        float *yh = y + head_offset(p, b, h, p->q_heads, Sq, Dv, &ldy);
        for (int64_t i = 0; i < Sq; i++) memset(yh + i * ldy, 0, (size_t)Dv * sizeof *yh);
      }
  free(s);
  free(scratch_k);
  free(scratch_v);
}
