/* The vectorised and threaded forward kernels against plain double-precision references:
 * attention (row blocks, causal prefixes, masks, past, GQA, qk_out), softmax, layer
 * normalisation, f32 Gelu, the threaded sgemm, and vecmath.h's exp and erfc. Sizes are
 * chosen to cross the kernels' block and threading thresholds, and every threaded result
 * must be the same bits on 1 and on 3 threads. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cpu/elementwise.h"
#include "runtime/cpu/matmul.h"
#include "runtime/cpu/nn.h"
#include "runtime/cpu/vecmath.h"
#include "../check.h"

/* got within atol + rtol |want| of want (inf matches inf of the same sign, NaN NaN). */
static bool check(const char *what, const float *got, const double *want, int64_t n, double atol, double rtol) {
  for (int64_t i = 0; i < n; i++) {
    double g = got[i], w = want[i];
    bool ok = (isnan(g) && isnan(w)) || g == w || fabs(g - w) <= atol + rtol * fabs(w);
    if (!ok) {
      fail("%s: [%lld] got %.9g want %.9g", what, (long long)i, g, w);
      return false;
    }
  }
  return true;
}

static void check_same_bits(const char *what, const float *a, const float *b, int64_t n) {
  if (memcmp(a, b, (size_t)n * sizeof *a) != 0) fail("%s: 1 and 3 threads differ", what);
}

/* ---- attention ---- */

/* Element (b, h, s, d) of a Q/K/V/Y tensor in p's layout with `heads` heads and S rows. */
static int64_t at(const TpAttention *p, int64_t b, int64_t h, int64_t s, int64_t d, int64_t heads, int64_t S,
                  int64_t D) {
  return p->packed ? ((b * S + s) * heads + h) * D + d : ((b * heads + h) * S + s) * D + d;
}

/* ONNX Attention in double, straight from its definition; K/V rows [0, past) from past. */
static void attention_ref(const TpAttention *p, const float *q, const float *k, const float *v, const float *pk,
                          const float *pv, double *y, double *qk) {
  int64_t T = p->past_len + p->kv_len, D = p->head_size, Dv = p->v_head_size;
  double *s = malloc((size_t)T * sizeof *s);
  for (int64_t b = 0; b < p->batch; b++)
    for (int64_t h = 0; h < p->q_heads; h++)
      for (int64_t i = 0; i < p->q_len; i++) {
        int64_t g = h / (p->q_heads / p->kv_heads);
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < T; j++) {
          double dotp = 0;
          for (int64_t d = 0; d < D; d++) {
            double kj = j < p->past_len ? pk[((b * p->kv_heads + g) * p->past_len + j) * D + d]
                                        : k[at(p, b, g, j - p->past_len, d, p->kv_heads, p->kv_len, D)];
            dotp += q[at(p, b, h, i, d, p->q_heads, p->q_len, D)] * kj;
          }
          s[j] = p->scale * dotp;
          if (p->softcap > 0) s[j] = p->softcap * tanh(s[j] / p->softcap);
          int64_t last = i + p->past_len + p->causal_offset; /* the latest key a causal row sees */
          bool keep = !p->is_causal || (j <= last && (!p->window || j > last - p->window));
          if (p->mask) {
            const int64_t *ms = p->mask_strides;
            int64_t mi = b * ms[0] + h * ms[1] + i * ms[2] + j * ms[3];
            if (j >= p->mask_len) keep = false;
            else if (p->mask_is_bool) keep = keep && ((const unsigned char *)p->mask)[mi];
            else s[j] += ((const float *)p->mask)[mi];
          }
          if (!keep) s[j] = -INFINITY;
          if (s[j] > mx) mx = s[j];
        }
        for (int64_t j = 0; j < T; j++) sum += mx == -INFINITY ? 0 : exp(s[j] - mx);
        for (int64_t j = 0; j < T; j++) {
          double pj = sum == 0 ? 0 : exp(s[j] - mx) / sum;
          if (qk) qk[((b * p->q_heads + h) * p->q_len + i) * T + j] = pj;
          s[j] = pj;
        }
        for (int64_t d = 0; d < Dv; d++) {
          double acc = 0;
          for (int64_t j = 0; j < T; j++) {
            double vj = j < p->past_len ? pv[((b * p->kv_heads + g) * p->past_len + j) * Dv + d]
                                        : v[at(p, b, g, j - p->past_len, d, p->kv_heads, p->kv_len, Dv)];
            acc += s[j] * vj;
          }
          y[at(p, b, h, i, d, p->q_heads, p->q_len, Dv)] = acc;
        }
      }
  free(s);
}

static void attention_case(const char *name, TpAttention p, bool with_qk) {
  int64_t T = p.past_len + p.kv_len;
  int64_t nq = p.batch * p.q_heads * p.q_len * p.head_size;
  int64_t nk = p.batch * p.kv_heads * p.kv_len * p.head_size;
  int64_t nv = p.batch * p.kv_heads * p.kv_len * p.v_head_size;
  int64_t ny = p.batch * p.q_heads * p.q_len * p.v_head_size, nqk = p.batch * p.q_heads * p.q_len * T;
  float *q = rand_array(nq, 1), *k = rand_array(nk, 1), *v = rand_array(nv, 1);
  float *pk = rand_array(p.batch * p.kv_heads * p.past_len * p.head_size, 1);
  float *pv = rand_array(p.batch * p.kv_heads * p.past_len * p.v_head_size, 1);
  float *y1 = malloc((size_t)ny * sizeof(float)), *y3 = malloc((size_t)ny * sizeof(float));
  float *qk1 = malloc((size_t)nqk * sizeof(float)), *qk3 = malloc((size_t)nqk * sizeof(float));
  double *want = malloc((size_t)ny * sizeof(double)), *want_qk = malloc((size_t)nqk * sizeof(double));
  if (with_qk) p.qk_mode = 3;
  attention_ref(&p, q, k, v, pk, pv, want, want_qk);
  omp_set_num_threads(1);
  tp_attention_f32(&p, q, k, v, pk, pv, y1, NULL, NULL, with_qk ? qk1 : NULL, NULL);
  omp_set_num_threads(3);
  tp_attention_f32(&p, q, k, v, pk, pv, y3, NULL, NULL, with_qk ? qk3 : NULL, NULL);
  char what[160];
  snprintf(what, sizeof what, "attention %s", name);
  check(what, y1, want, ny, 1e-5, 1e-4);
  check_same_bits(what, y1, y3, ny);
  if (with_qk) {
    snprintf(what, sizeof what, "attention %s probabilities", name);
    check(what, qk1, want_qk, nqk, 1e-6, 1e-4);
    check_same_bits(what, qk1, qk3, nqk);
  }
  free(q), free(k), free(v), free(pk), free(pv), free(y1), free(y3), free(qk1), free(qk3);
  free(want), free(want_qk);
}

static void test_attention(void) {
  /* 150 query rows: two full blocks of 64 and a short one. */
  TpAttention base = {.batch = 2,
                      .q_heads = 4,
                      .kv_heads = 4,
                      .q_len = 150,
                      .kv_len = 150,
                      .head_size = 8,
                      .v_head_size = 8,
                      .scale = 0.35f};
  attention_case("full", base, false);
  TpAttention c = base;
  c.is_causal = true;
  attention_case("causal", c, false);
  attention_case("causal probabilities", c, true);
  c.packed = true, c.kv_heads = 2, c.v_head_size = 12;
  attention_case("causal packed gqa", c, false);
  TpAttention o = base;
  o.is_causal = true, o.q_len = 70, o.kv_len = 150, o.causal_offset = 80;
  attention_case("causal offset", o, false);
  TpAttention past = base;
  past.is_causal = true, past.q_len = 3, past.kv_len = 3, past.past_len = 130;
  attention_case("causal past", past, false);

  /* bool mask [q_len, T] broadcast over batch and heads, with one query seeing nothing */
  TpAttention m = base;
  m.q_len = 100, m.kv_len = 90, m.is_causal = true;
  unsigned char *bm = malloc(100 * 90);
  for (int i = 0; i < 100 * 90; i++) bm[i] = frand() > -0.6f && i / 90 != 7;
  m.mask = bm, m.mask_is_bool = true, m.mask_len = 90;
  m.mask_strides[2] = 90, m.mask_strides[3] = 1;
  attention_case("bool mask", m, true);
  /* float mask [B, 1, 1, mask_len] shorter than the keys */
  float *fm = rand_array(2 * 80, 2);
  TpAttention f = base;
  f.q_len = 70, f.kv_len = 90, f.softcap = 2;
  f.mask = fm, f.mask_is_bool = false, f.mask_len = 80;
  f.mask_strides[0] = 80, f.mask_strides[3] = 1;
  attention_case("float mask softcap", f, false);

  /* windows: a band of keys per query, with the block of 64 rows skipping keys before it */
  TpAttention w = base;
  w.is_causal = true, w.window = 7;
  attention_case("window 7", w, false);
  attention_case("window 7 probabilities", w, true);
  w.window = 100, w.packed = true, w.kv_heads = 2;
  attention_case("window 100 packed gqa", w, false);
  w.window = 1;
  attention_case("window 1 packed gqa", w, false);
  TpAttention wo = o;
  wo.window = 30, wo.kv_heads = 2; /* a token slice: offset 80 */
  attention_case("window 30 offset 80 gqa", wo, false);
  TpAttention wp = past;
  wp.window = 50;
  attention_case("window 50 past", wp, false);
  /* ALiBi-like bias [1, H, 1, T] and a relative bias [1, H, S, T], with a window */
  float *alibi = malloc(4 * 150 * sizeof *alibi), *rel = rand_array(4 * 150 * 150, 3);
  for (int h = 0; h < 4; h++)
    for (int j = 0; j < 150; j++) alibi[h * 150 + j] = -powf(2.0f, -(float)(h + 1)) * (float)j;
  TpAttention wa = base;
  wa.is_causal = true, wa.window = 20, wa.kv_heads = 2;
  tp_attention_set_mask(&wa, alibi, false, (const int64_t[]){1, 4, 1, 150}, 4);
  attention_case("window 20 alibi gqa", wa, false);
  attention_case("window 20 alibi gqa probabilities", wa, true);
  TpAttention wr = o;
  wr.window = 90, wr.softcap = 3;
  tp_attention_set_mask(&wr, rel, false, (const int64_t[]){1, 4, 70, 150}, 4);
  attention_case("window 90 offset 80 relative bias softcap", wr, false);
  free(bm), free(fm), free(alibi), free(rel);
}

/* ---- softmax, layernorm ---- */

static void test_softmax(bool take_log, int64_t inner) {
  int64_t outer = 37, n = 300, total = outer * n * inner;
  float *x = rand_array(total, 20), *y = malloc((size_t)total * sizeof(float));
  double *want = malloc((size_t)total * sizeof(double));
  for (int64_t j = 0; j < n * inner; j++) x[5 * n * inner + j] = -INFINITY; /* a masked-out row */
  for (int64_t o = 0; o < outer; o++)
    for (int64_t r = 0; r < inner; r++) {
      const float *xr = x + o * n * inner + r;
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j < n; j++) mx = xr[j * inner] > mx ? xr[j * inner] : mx;
      for (int64_t j = 0; j < n; j++) sum += mx == -INFINITY ? 0 : exp(xr[j * inner] - mx);
      for (int64_t j = 0; j < n; j++) {
        double *w = want + o * n * inner + r + j * inner;
        if (mx == -INFINITY) *w = take_log ? -INFINITY : 0;
        else *w = take_log ? xr[j * inner] - mx - log(sum) : exp(xr[j * inner] - mx) / sum;
      }
    }
  tp_softmax_f32(x, y, outer, n, inner, take_log);
  char what[64];
  snprintf(what, sizeof what, "%s inner %lld", take_log ? "log-softmax" : "softmax", (long long)inner);
  check(what, y, want, total, 1e-6, 1e-5);
  free(x), free(y), free(want);
}

static void test_layernorm(void) {
  int64_t rows = 300, n = 257;
  float *x = rand_array(rows * n, 3), *scale = rand_array(n, 1), *bias = rand_array(n, 1);
  for (int64_t i = 0; i < rows * n; i++) x[i] += 100; /* a large mean: the variance must not cancel */
  float *y = malloc((size_t)(rows * n) * sizeof(float)), *mean = malloc((size_t)rows * sizeof(float));
  float *inv = malloc((size_t)rows * sizeof(float));
  double *want = malloc((size_t)(rows * n) * sizeof(double)), *want_mean = malloc((size_t)rows * sizeof(double));
  for (int64_t r = 0; r < rows; r++) {
    double mu = 0, var = 0;
    for (int64_t j = 0; j < n; j++) mu += x[r * n + j];
    mu /= (double)n;
    for (int64_t j = 0; j < n; j++) var += (x[r * n + j] - mu) * (x[r * n + j] - mu);
    double rs = 1 / sqrt(var / (double)n + 1e-5);
    for (int64_t j = 0; j < n; j++) want[r * n + j] = (x[r * n + j] - mu) * rs * scale[j] + bias[j];
    want_mean[r] = mu;
  }
  tp_layernorm_f32(x, scale, bias, rows, n, 1e-5f, y, mean, inv);
  check("layernorm", y, want, rows * n, 1e-4, 1e-4);
  check("layernorm mean", mean, want_mean, rows, 0, 1e-6);
  free(x), free(scale), free(bias), free(y), free(mean), free(inv), free(want), free(want_mean);
}

/* ---- Gelu, vecmath ---- */

static void test_gelu(bool tanh_approx) {
  int64_t n = 4001; /* x from -12 to 12: far into the tails, where 1 + erf cancels */
  float *x = malloc((size_t)n * sizeof(float)), *y = malloc((size_t)n * sizeof(float));
  double *want = malloc((size_t)n * sizeof(double));
  for (int64_t i = 0; i < n; i++) {
    x[i] = -12.0f + 24.0f * (float)i / (float)(n - 1);
    /* x (1 + tanh u) / 2 = x / (1 + e^-2u): the form without cancellation, also here */
    double xi = x[i], u = 0.7978845608028654 * (xi + 0.044715 * xi * xi * xi);
    want[i] = tanh_approx ? xi / (1 + exp(-2 * u)) : 0.5 * xi * erfc(-xi / sqrt(2.0));
  }
  TpTensor X = {TP_F32, 1, {n}, x}, Y = {TP_F32, 1, {n}, y};
  if (tp_unary(tanh_approx ? TP_UNARY_GELU_TANH : TP_UNARY_GELU, &X, &Y) != TP_KERNEL_OK) fail("gelu refused");
  /* relative accuracy everywhere, down to the smallest normal results; in the far tails
   * the float exponent's rounding (|arg| ulp) grows it */
  const char *what = tanh_approx ? "gelu tanh" : "gelu erf";
  int64_t lo = (n - 1) * 7 / 24, hi = n - lo; /* x in [-5, 5] */
  check(what, y + lo, want + lo, hi - lo, 1e-37, 4e-6);
  check(what, y, want, n, 1e-37, 4e-5);
  free(x), free(y), free(want);
}

static void test_vecmath(void) {
  float e[8], w[8] = {-100, -88.5f, -20, 0, 20, 88.3f, 88.5f, 100};
  double want[8];
  for (int i = 0; i < 8; i++) e[i] = tp_vexpf(w[i]), want[i] = exp((double)w[i]);
  want[0] = want[1] = 0, want[6] = want[7] = INFINITY; /* flushed below -88, +inf above 88.37 */
  check("tp_vexpf", e, want, 8, 1e-37, 2e-7);
  float erfc_got[2001];
  double erfc_want[2001];
  for (int i = 0; i <= 2000; i++) {
    float x = -9.0f + 18.0f * (float)i / 2000;
    erfc_got[i] = tp_verfcf(x), erfc_want[i] = erfc(x);
  }
  check("tp_verfcf", erfc_got, erfc_want, 2001, 1e-37, 1e-5);
  check("tp_verfcf", erfc_got, erfc_want, 1501, 1e-37, 2e-6); /* x <= 4.5 */
}

/* ---- threaded sgemm ---- */

static void sgemm_case(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float beta, bool nested) {
  int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;
  float *A = rand_array((ta ? K : M) * lda, 1), *B = rand_array((tb ? N : K) * ldb, 1);
  float *C0 = rand_array(M * ldc, 1), *C1 = malloc((size_t)(M * ldc) * sizeof(float));
  float *C3 = malloc((size_t)(M * ldc) * sizeof(float));
  double *want = malloc((size_t)(M * ldc) * sizeof(double));
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < ldc; j++) {
      double acc = 0;
      for (int64_t l = 0; l < K && j < N; l++)
        acc += (double)(ta ? A[l * lda + i] : A[i * lda + l]) * (tb ? B[j * ldb + l] : B[l * ldb + j]);
      want[i * ldc + j] = j < N ? 0.5 * acc + beta * C0[i * ldc + j] : C0[i * ldc + j];
    }
  memcpy(C1, C0, (size_t)(M * ldc) * sizeof(float));
  memcpy(C3, C0, (size_t)(M * ldc) * sizeof(float));
  omp_set_num_threads(1);
  tp_sgemm(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, beta, C1, ldc);
  omp_set_num_threads(3);
  if (nested) {
#pragma omp parallel num_threads(2)
    if (omp_get_thread_num() == 1) tp_sgemm(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, beta, C3, ldc);
  } else {
    tp_sgemm(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, beta, C3, ldc);
  }
  char what[96];
  snprintf(what, sizeof what, "sgemm %c%c %lldx%lldx%lld beta %g%s", ta ? 'T' : 'N', tb ? 'T' : 'N', (long long)M,
           (long long)N, (long long)K, beta, nested ? " nested" : "");
  check(what, C1, want, M * ldc, 1e-4, 1e-5);
  check_same_bits(what, C1, C3, M * ldc);
  free(A), free(B), free(C0), free(C1), free(C3), free(want);
}

static void test_sgemm(void) {
  sgemm_case(false, false, 1029, 200, 130, 0, false); /* split by rows, a short last piece */
  sgemm_case(true, false, 100, 733, 140, 1, false);   /* split by columns */
  sgemm_case(false, true, 733, 100, 140, 1, false);
  sgemm_case(true, true, 150, 861, 90, 0, false);
  sgemm_case(false, false, 600, 200, 100, 1, true); /* inside a parallel region */
  sgemm_case(false, false, 7, 5, 3, 0, false);      /* below the threading threshold */
}

int main(void) {
  test_attention();
  test_softmax(false, 1);
  test_softmax(true, 1);
  test_softmax(false, 3);
  test_softmax(true, 3);
  test_layernorm();
  test_gelu(false);
  test_gelu(true);
  test_vecmath();
  test_sgemm();
  if (failures) fprintf(stderr, "%d failure(s)\n", failures);
  return failures ? 1 : 0;
}
