/* Attention with a causal offset (TpAttention.causal_offset, the IR's causal_offset), a
 * window and a position bias: the kernels a token slice runs. Two checks:
 *   1. the backward against central finite differences of the forward, with offsets,
 *      windows (a band of keys per query) and float or bool masks (ALiBi-like [1, H, 1, T],
 *      relative [1, H, S, T]), grouped-query heads; keys no query sees get no gradient;
 *   2. slicing: a sequence of T tokens cut into slices; slice i's queries (rows
 *      [c_i, c_i + l_i)) attend over keys and values [0, c_i + l_i) with causal_offset c_i,
 *      the same window, and the mask's query rows [c_i, c_i + l_i) and key columns
 *      [0, c_i + l_i) (as split-sequence cuts it). Its output equals the full causal
 *      attention's rows, and the sum of the slices' dK and dV (each over its context rows)
 *      and their dQ rows equal the full backward's. The same with K and V read in place
 *      from a T-row context buffer (kv_rows = T, as the compiled slices do), its rows past
 *      the slice's context, and the rows before its first query's window, set to NaN.
 * T = 70 crosses the forward's block of 64 query rows. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cpu/nn.h"
#include "runtime/cpu/nn_backward.h"
#include "../check.h"

static float *zeros(int64_t n) { return calloc((size_t)(n ? n : 1), sizeof(float)); }

/* Elements of a Q/K/V/Y-shaped tensor of `len` rows. */
static int64_t numel(const TpAttention *p, int64_t heads, int64_t len, int64_t D) {
  return p->batch * heads * len * D;
}

/* ---- 1. finite differences ---- */

typedef struct {
  TpAttention p;
  float *q, *k, *v, *y, *dy;
  int64_t nq, nk, nv, ny;
} Case;

static double loss(Case *c) { /* sum(dy * y) */
  tp_attention_f32(&c->p, c->q, c->k, c->v, NULL, NULL, c->y, NULL, NULL, NULL, NULL);
  double s = 0;
  for (int64_t i = 0; i < c->ny; i++) s += (double)c->dy[i] * c->y[i];
  return s;
}

static void check_grad(const char *what, Case *c, float *x, int64_t n, const float *grad) {
  const float eps = 1e-2f;
  double worst = 0, scale = 1e-6;
  for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(grad[i]));
  for (int64_t i = 0; i < n; i++) {
    float orig = x[i];
    x[i] = orig + eps;
    double hi = loss(c);
    x[i] = orig - eps;
    double lo = loss(c);
    x[i] = orig;
    worst = fmax(worst, fabs((hi - lo) / (2 * eps) - grad[i]) / scale);
  }
  if (worst > 5e-4) fail("%s: finite differences differ by %.3g of the largest gradient", what, worst);
}

static void finite_differences(const char *name, TpAttention p) {
  Case c = {.p = p};
  c.nq = numel(&p, p.q_heads, p.q_len, p.head_size), c.nk = numel(&p, p.kv_heads, p.kv_len, p.head_size);
  c.nv = numel(&p, p.kv_heads, p.kv_len, p.v_head_size), c.ny = numel(&p, p.q_heads, p.q_len, p.v_head_size);
  c.q = rand_array(c.nq, 2), c.k = rand_array(c.nk, 1), c.v = rand_array(c.nv, 1);
  c.y = zeros(c.ny), c.dy = rand_array(c.ny, 1);
  float *dq = zeros(c.nq), *dk = zeros(c.nk), *dv = zeros(c.nv);
  tp_attention_backward_f32(&p, c.dy, c.q, c.k, c.v, NULL, NULL, dq, dk, dv);
  char what[128];
  snprintf(what, sizeof what, "%s dQ", name), check_grad(what, &c, c.q, c.nq, dq);
  snprintf(what, sizeof what, "%s dK", name), check_grad(what, &c, c.k, c.nk, dk);
  snprintf(what, sizeof what, "%s dV", name), check_grad(what, &c, c.v, c.nv, dv);
  /* keys after the last query's or before the first query's window get no gradient */
  int64_t seen = p.q_len + p.causal_offset,
          first = p.window && p.causal_offset + 1 > p.window ? p.causal_offset + 1 - p.window : 0;
  if (!p.packed)
    for (int64_t b = 0; b < p.batch * p.kv_heads; b++)
      for (int64_t j = 0; j < p.kv_len; j++)
        for (int64_t x = 0; x < p.head_size && (j < first || j >= seen); x++)
          if (dk[(b * p.kv_len + j) * p.head_size + x] != 0 || dv[(b * p.kv_len + j) * p.v_head_size] != 0) {
            fail("%s: key %lld is outside every query's window yet has a gradient", name, (long long)j);
            j = p.kv_len, b = p.batch * p.kv_heads;
            break;
          }
  free(c.q), free(c.k), free(c.v), free(c.y), free(c.dy), free(dq), free(dk), free(dv);
}

/* ---- 2. slices against the full sequence ---- */

/* Copies rows [r0, r0 + n) of every (batch, head) of src (len rows) into dst (n rows), or
 * adds dst into src's rows when `back`. */
static void rows(const TpAttention *p, int64_t heads, int64_t D, float *full, int64_t len, float *part, int64_t r0,
                 int64_t n, bool back) {
  for (int64_t b = 0; b < p->batch; b++)
    for (int64_t h = 0; h < heads; h++)
      for (int64_t r = 0; r < n; r++) {
        float *f, *s;
        if (p->packed) f = full + ((b * len + r0 + r) * heads + h) * D, s = part + ((b * n + r) * heads + h) * D;
        else f = full + ((b * heads + h) * len + r0 + r) * D, s = part + ((b * heads + h) * n + r) * D;
        for (int64_t x = 0; x < D; x++) {
          if (back) f[x] += s[x];
          else s[x] = f[x];
        }
      }
}

static double max_rel(const float *a, const float *b, int64_t n) {
  double scale = 1e-30, worst = 0;
  for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(b[i]));
  for (int64_t i = 0; i < n; i++) {
    double e = fabs((double)a[i] - b[i]);
    if (isnan(e)) return NAN; /* fmax would drop it */
    worst = fmax(worst, e);
  }
  return worst / scale;
}

/* Rows [r0, r1) of every (batch, head) of x (len rows) set to NaN. */
static void poison_rows(const TpAttention *p, int64_t heads, int64_t D, float *x, int64_t len, int64_t r0,
                        int64_t r1) {
  for (int64_t b = 0; b < p->batch; b++)
    for (int64_t h = 0; h < heads; h++)
      for (int64_t r = r0; r < r1; r++)
        for (int64_t i = 0; i < D; i++)
          x[p->packed ? ((b * len + r) * heads + h) * D + i : ((b * heads + h) * len + r) * D + i] = NAN;
}

/* A float mask of `rank` dims (<= 4), row-major. */
typedef struct {
  const float *data;
  int64_t dims[4];
  int rank;
} Bias;

/* Slice i's part of the mask (query rows [c, c + l), key columns [0, c + l); dims of 1
 * stay), as split-sequence cuts it: a dense copy, its dims in *part. */
static float *cut_bias(const Bias *full, int64_t c, int64_t l, Bias *part) {
  *part = *full;
  int64_t d[4] = {1, 1, 1, 1}, off[4] = {0, 0, 0, 0}, n[4];
  for (int k = 0; k < full->rank; k++) d[4 - full->rank + k] = full->dims[k];
  for (int k = 0; k < 4; k++) n[k] = d[k];
  if (d[2] != 1) off[2] = c, n[2] = l;
  if (d[3] != 1) n[3] = c + l;
  float *out = malloc((size_t)(n[0] * n[1] * n[2] * n[3]) * sizeof *out), *o = out;
  for (int64_t a = 0; a < n[0]; a++)
    for (int64_t b = 0; b < n[1]; b++)
      for (int64_t i = 0; i < n[2]; i++)
        for (int64_t j = 0; j < n[3]; j++) *o++ = full->data[((a * d[1] + b) * d[2] + off[2] + i) * d[3] + j];
  for (int k = 0; k < full->rank; k++) part->dims[k] = n[4 - full->rank + k];
  part->data = out;
  return out;
}

static void slices(const char *name, TpAttention full, const Bias *bias, const int64_t *len, int nslices,
                   bool context_buffer) {
  int64_t T = full.q_len, D = full.head_size, Dv = full.v_head_size, Hq = full.q_heads, Hk = full.kv_heads;
  int64_t nq = numel(&full, Hq, T, D), nk = numel(&full, Hk, T, D), nv = numel(&full, Hk, T, Dv),
          ny = numel(&full, Hq, T, Dv);
  float *q = rand_array(nq, 2), *k = rand_array(nk, 1), *v = rand_array(nv, 1), *dy = rand_array(ny, 1);
  float *y = zeros(ny), *dq = zeros(nq), *dk = zeros(nk), *dv = zeros(nv);
  if (bias) tp_attention_set_mask(&full, bias->data, false, bias->dims, bias->rank);
  tp_attention_f32(&full, q, k, v, NULL, NULL, y, NULL, NULL, NULL, NULL);
  tp_attention_backward_f32(&full, dy, q, k, v, NULL, NULL, dq, dk, dv);

  float *ys = zeros(ny), *dqs = zeros(nq), *dks = zeros(nk), *dvs = zeros(nv);
  int64_t c = 0;
  for (int i = 0; i < nslices; c += len[i], i++) {
    TpAttention p = full;
    p.q_len = len[i], p.kv_len = c + len[i], p.causal_offset = c;
    Bias part;
    float *mask = bias ? cut_bias(bias, c, len[i], &part) : NULL;
    if (bias) tp_attention_set_mask(&p, part.data, false, part.dims, part.rank);
    int64_t lq = numel(&p, Hq, len[i], D), ly = numel(&p, Hq, len[i], Dv);
    int64_t lk = numel(&p, Hk, p.kv_len, D), lv = numel(&p, Hk, p.kv_len, Dv);
    float *qi = zeros(lq), *dyi = zeros(ly), *ki = zeros(lk), *vi = zeros(lv), *yi = zeros(ly);
    float *dqi = zeros(lq), *dki = zeros(lk), *dvi = zeros(lv);
    rows(&p, Hq, D, q, T, qi, c, len[i], false);
    rows(&p, Hq, Dv, dy, T, dyi, c, len[i], false);
    if (context_buffer) { /* K and V of rows [0, c + l) in place, in buffers of T rows */
      free(ki), free(vi);
      ki = malloc((size_t)nk * sizeof *ki), vi = malloc((size_t)nv * sizeof *vi);
      memcpy(ki, k, (size_t)nk * sizeof *ki), memcpy(vi, v, (size_t)nv * sizeof *vi);
      poison_rows(&p, Hk, D, ki, T, p.kv_len, T), poison_rows(&p, Hk, Dv, vi, T, p.kv_len, T);
      int64_t unseen = p.window && c + 1 > p.window ? c + 1 - p.window : 0; /* before the first query's window */
      poison_rows(&p, Hk, D, ki, T, 0, unseen), poison_rows(&p, Hk, Dv, vi, T, 0, unseen);
      p.kv_rows = T;
    } else {
      rows(&p, Hk, D, k, T, ki, 0, p.kv_len, false);
      rows(&p, Hk, Dv, v, T, vi, 0, p.kv_len, false);
    }
    tp_attention_f32(&p, qi, ki, vi, NULL, NULL, yi, NULL, NULL, NULL, NULL);
    tp_attention_backward_f32(&p, dyi, qi, ki, vi, NULL, NULL, dqi, dki, dvi);
    rows(&p, Hq, Dv, ys, T, yi, c, len[i], true);
    rows(&p, Hq, D, dqs, T, dqi, c, len[i], true);
    rows(&p, Hk, D, dks, T, dki, 0, p.kv_len, true); /* context rows accumulate */
    rows(&p, Hk, Dv, dvs, T, dvi, 0, p.kv_len, true);
    free(qi), free(dyi), free(ki), free(vi), free(yi), free(dqi), free(dki), free(dvi), free(mask);
  }
  struct {
    const char *what;
    const float *got, *want;
    int64_t n;
    double tol;
  } checks[] = {{"Y", ys, y, ny, 1e-6},
                {"dQ", dqs, dq, nq, 1e-5},
                {"dK", dks, dk, nk, 1e-5},
                {"dV", dvs, dv, nv, 1e-5}};
  for (int i = 0; i < 4; i++) {
    double e = max_rel(checks[i].got, checks[i].want, checks[i].n);
    if (!(e <= checks[i].tol))
      fail("%s: the slices' %s differs from the full sequence's by %.3g relative", name, checks[i].what, e);
  }
  free(q), free(k), free(v), free(dy), free(y), free(dq), free(dk), free(dv);
  free(ys), free(dqs), free(dks), free(dvs);
}

/* ALiBi-like: slope_h * key position, [1, H, 1, T]. */
static float *alibi(int64_t H, int64_t T, Bias *b) {
  float *x = malloc((size_t)(H * T) * sizeof *x);
  for (int64_t h = 0; h < H; h++)
    for (int64_t j = 0; j < T; j++) x[h * T + j] = -powf(2.0f, -(float)(h + 1)) * (float)j;
  *b = (Bias){x, {1, H, 1, T}, 4};
  return x;
}

int main(void) {
  TpAttention a = {.batch = 2,
                   .q_heads = 4,
                   .kv_heads = 2,
                   .q_len = 3,
                   .kv_len = 7,
                   .head_size = 3,
                   .v_head_size = 4,
                   .is_causal = true,
                   .causal_offset = 4,
                   .scale = 0.6f};
  finite_differences("4-D GQA offset 4 (q 3, kv 7)", a);
  a.causal_offset = 2;
  finite_differences("4-D GQA offset 2 (keys past the window)", a);
  TpAttention b = {.batch = 2,
                   .q_heads = 2,
                   .kv_heads = 2,
                   .q_len = 2,
                   .kv_len = 5,
                   .head_size = 4,
                   .v_head_size = 2,
                   .packed = true,
                   .is_causal = true,
                   .causal_offset = 3,
                   .scale = 0.5f,
                   .softcap = 1.5f};
  finite_differences("3-D softcap offset 3", b);

  /* windows and biases */
  Bias ab, rb;
  float *al = alibi(4, 7, &ab), *rel = rand_array(2 * 2 * 7, 1.5f);
  rb = (Bias){rel, {3, 7}, 2}; /* [q_len, kv] relative bias, broadcast over batch and heads */
  TpAttention w = a;
  w.causal_offset = 4, w.window = 3;
  finite_differences("4-D GQA offset 4 window 3 (keys before the window)", w);
  tp_attention_set_mask(&w, ab.data, false, ab.dims, ab.rank);
  finite_differences("4-D GQA offset 4 window 3 ALiBi [1, 4, 1, 7]", w);
  w.causal_offset = 2, w.window = 2;
  tp_attention_set_mask(&w, rb.data, false, rb.dims, rb.rank);
  finite_differences("4-D GQA offset 2 window 2 bias [3, 7]", w);
  TpAttention wb = b;
  wb.window = 2, wb.q_len = 2, wb.kv_len = 7, wb.causal_offset = 5;
  tp_attention_set_mask(&wb, rel, false, (const int64_t[]){2, 7}, 2);
  finite_differences("3-D softcap offset 5 window 2 bias [2, 7]", wb);
  unsigned char keep[2 * 7];
  for (int i = 0; i < 2 * 7; i++) keep[i] = i != 5 && i != 12; /* one hidden key per row */
  tp_attention_set_mask(&wb, keep, true, (const int64_t[]){2, 7}, 2);
  wb.window = 3;
  finite_differences("3-D offset 5 window 3 bool mask", wb);

  /* 70 query rows: two blocks of the backward, each with its own keys */
  TpAttention tall = {.batch = 1,
                      .q_heads = 2,
                      .kv_heads = 1,
                      .q_len = 70,
                      .kv_len = 75,
                      .head_size = 2,
                      .v_head_size = 2,
                      .is_causal = true,
                      .causal_offset = 5,
                      .scale = 0.8f};
  finite_differences("4-D GQA 70 rows offset 5", tall);
  Bias tall_bias;
  float *tall_alibi = alibi(2, 75, &tall_bias);
  tall.window = 20;
  tp_attention_set_mask(&tall, tall_bias.data, false, tall_bias.dims, tall_bias.rank);
  finite_differences("4-D GQA 70 rows offset 5 window 20 ALiBi", tall);
  free(tall_alibi);

  TpAttention f = {.batch = 2,
                   .q_heads = 4,
                   .kv_heads = 2,
                   .q_len = 70,
                   .kv_len = 70,
                   .head_size = 8,
                   .v_head_size = 8,
                   .is_causal = true,
                   .scale = 0.35f};
  TpAttention g = f;
  g.packed = true, g.q_heads = 2, g.kv_heads = 2;
  int64_t ones[70];
  for (int i = 0; i < 70; i++) ones[i] = 1;
  Bias alibi70, rel70;
  float *al70 = alibi(4, 70, &alibi70), *r70 = rand_array(2 * 70 * 70, 1);
  rel70 = (Bias){r70, {1, 2, 70, 70}, 4};
  for (int in_place = 0; in_place < 2; in_place++) {
    char what[128];
#define SLICES(label, p, bias, lens, n)                                                                             \
  snprintf(what, sizeof what, "%s%s", label, in_place ? " in a context buffer" : ""),                               \
      slices(what, p, bias, lens, n, in_place)
    SLICES("4-D GQA 37,20,13", f, NULL, ((const int64_t[]){37, 20, 13}), 3);
    SLICES("4-D GQA 1,65,4", f, NULL, ((const int64_t[]){1, 65, 4}), 3);
    SLICES("3-D 35,35", g, NULL, ((const int64_t[]){35, 35}), 2);
    SLICES("3-D 70 slices of 1", g, NULL, ones, 70);
    TpAttention gq = g;
    gq.q_heads = 4; /* packed grouped-query heads: 2 q heads per kv head */
    SLICES("3-D GQA 30,40", gq, NULL, ((const int64_t[]){30, 40}), 2);
    TpAttention fw = f;
    fw.window = 5;
    SLICES("4-D GQA window 5 ALiBi 37,20,13", fw, &alibi70, ((const int64_t[]){37, 20, 13}), 3);
    fw.window = 66; /* wider than a block of query rows */
    SLICES("4-D GQA window 66 ALiBi 1,65,4", fw, &alibi70, ((const int64_t[]){1, 65, 4}), 3);
    TpAttention gw = g;
    gw.window = 9;
    SLICES("3-D window 9 bias [1, 2, 70, 70] 35,35", gw, &rel70, ((const int64_t[]){35, 35}), 2);
    SLICES("3-D window 9 bias [1, 2, 70, 70] 70 slices of 1", gw, &rel70, ones, 70);
    gw.window = 0;
    SLICES("3-D bias [1, 2, 70, 70] 30,40", gw, &rel70, ((const int64_t[]){30, 40}), 2);
#undef SLICES
  }
  free(al), free(rel), free(al70), free(r70);
  if (failures) {
    fprintf(stderr, "%d failure(s)\n", failures);
    return 1;
  }
  printf("causal offset, window and bias: all passed\n");
  return 0;
}
