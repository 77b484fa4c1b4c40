#include "slicing.h"

#include <stdlib.h>
#include <string.h>

#include "cost.h"
#include "json.h"

void tp_slice_cost_init(TpSliceCost *t, TpSliceCostKind kind, int batch, int units, int granularity) {
  memset(t, 0, sizeof *t);
  t->kind = kind;
  t->batch = batch;
  t->units = units;
  t->granularity = granularity;
  size_t n1 = (size_t)units + 1, rows = ((size_t)batch + 1) * n1;
  if (kind == TP_COST_DENSE) {
    t->dense = malloc(rows * n1 * sizeof(double));
    for (size_t i = 0; i < rows * n1; i++) t->dense[i] = INFINITY;
  } else {
    t->t0 = malloc(rows * sizeof(double));
    for (size_t i = 0; i < rows; i++) t->t0[i] = INFINITY;
    t->ctx = calloc(((size_t)batch + 1) * 4, sizeof(double));
  }
}

void tp_slice_cost_free(TpSliceCost *t) {
  free(t->dense);
  free(t->t0);
  free(t->ctx);
  memset(t, 0, sizeof *t);
}

int tp_slice_cost_finish(TpSliceCost *t, TpDiag *d) {
  int n = t->units;
  bool mono = true;
  /* A separable table is linear in c for c >= 1, so contexts 0, 1 and the last decide
   * monotonicity; a dense one is checked entry by entry. */
  bool dense = t->kind == TP_COST_DENSE;
  for (int b = 1; b <= t->batch; b++)
    for (int s = 1; s <= n; s++)
      for (int c = 0, prev = -1; c <= n - s; prev = c, c = dense || c + 1 >= n - s ? c + 1 : n - s) {
        double v = tp_slice_cost(t, b, s, c);
        if (isnan(v) || v < 0) return tp_error(d, "cost t[%d][%d][%d] = %g is not a time", b, s, c, v);
        if (prev >= 0 && v < tp_slice_cost(t, b, s, prev)) mono = false;
        if (s > 1 && v < tp_slice_cost(t, b, s - 1, c)) mono = false;
      }
  t->monotone = mono;
  return TP_OK;
}

int tp_slice_cost_load(const char *path, TpSliceCost *t, int *stages, TpDiag *d) {
  char err[256];
  memset(t, 0, sizeof *t);
  TpJson *j = tp_json_parse_file(path, err, sizeof err);
  if (!j) return tp_error(d, "cost table %s: %s", path, err);
  int rc = tp_slice_cost_from_json(j, path, t, stages, d);
  tp_json_free(j);
  return rc;
}

int tp_slice_cost_from_json(const TpJson *j, const char *path, TpSliceCost *t, int *stages, TpDiag *d) {
  int rc = TP_OK;
  bool ok = true;
  double g = tp_json_number(j, "granularity", -1, &ok), k = tp_json_number(j, "stages", -1, &ok);
  const TpJson *T = tp_json_get(j, "t");
  memset(t, 0, sizeof *t);
  if (!ok || g < 1 || g != floor(g) || g > TP_MAX_SEQ || k < 1 || k != floor(k) || k > TP_MAX_STAGES) {
    rc = tp_error(d, "cost table %s: needs integers \"granularity\" in [1, %d] and \"stages\" in [1, %d]", path,
                  TP_MAX_SEQ, TP_MAX_STAGES);
    goto done;
  }
  if (!T || T->kind != TP_JSON_ARRAY || T->count < 2 || T->items[1].kind != TP_JSON_ARRAY || T->items[1].count < 2) {
    rc = tp_error(d, "cost table %s: \"t\" must be T[b][s][c] with b and s from 1", path);
    goto done;
  }
  int batch = T->count - 1, n = T->items[1].count - 1;
  if ((double)batch * (n + 1) * (n + 1) > 1 << 24) {
    rc = tp_error(d, "cost table %s: %d x %d x %d entries, more than %d", path, batch, n + 1, n + 1, 1 << 24);
    goto done;
  }
  if ((double)n * g > TP_MAX_SEQ) {
    rc = tp_error(d, "cost table %s: %d units of granularity %d make a sequence longer than %d tokens", path, n,
                  (int)g, TP_MAX_SEQ);
    goto done;
  }
  tp_slice_cost_init(t, TP_COST_DENSE, batch, n, (int)g);
  *stages = (int)k;
  for (int b = 1; b <= batch && !rc; b++) {
    const TpJson *Tb = &T->items[b];
    if (Tb->kind != TP_JSON_ARRAY || Tb->count != n + 1) {
      rc = tp_error(d, "cost table %s: t[%d] must have %d entries like t[1]", path, b, n + 1);
      break;
    }
    for (int s = 1; s <= n && !rc; s++) {
      const TpJson *Ts = &Tb->items[s];
      if (Ts->kind != TP_JSON_ARRAY || Ts->count < n - s + 1) {
        rc = tp_error(d, "cost table %s: t[%d][%d] needs contexts 0..%d", path, b, s, n - s);
        break;
      }
      for (int c = 0; c <= n - s; c++) {
        const TpJson *v = &Ts->items[c];
        if (v->kind == TP_JSON_NULL) continue;
        if (v->kind != TP_JSON_NUMBER || !(v->number >= 0 && v->number <= TP_MAX_SECONDS)) {
          rc = tp_error(d, "cost table %s: t[%d][%d][%d] is not null or seconds in [0, %g]", path, b, s, c,
                        TP_MAX_SECONDS);
          break;
        }
        t->dense[((long)b * (n + 1) + s) * (n + 1) + c] = v->number;
      }
    }
  }
  if (!rc) rc = tp_slice_cost_finish(t, d);
  if (rc) tp_slice_cost_free(t);
done:
  return rc;
}

/* ---- the DP ---- */

typedef struct {
  const TpSliceCost *t;
  int batch, stages, n;
  double *S, *mx;  /* [b][i]: best sum of a prefix of i units, the largest slice in it */
  int *choice;     /* [b][i]: last slice length of that prefix */
  int *cmax;       /* [k]: largest context allowed for a slice of k units at the cap */
  double *K, *kmx; /* knapsack over sequences: sum and max */
  int *pick;
  int evaluations;
} Solver;

/* Eq. 8 for microbatch size b at cap: fills S, mx, choice of row b. */
static void dp_row(Solver *sv, int b, double cap) {
  const TpSliceCost *t = sv->t;
  int n = sv->n;
  double *S = sv->S + (long)b * (n + 1), *mx = sv->mx + (long)b * (n + 1);
  int *choice = sv->choice + (long)b * (n + 1);
  int kcap = n;
  if (t->monotone) { /* slices allowed at the cap: k <= kcap and context <= cmax[k] */
    kcap = 0;
    while (kcap < n && tp_slice_cost(t, b, kcap + 1, 0) <= cap) kcap++;
    for (int k = 1; k <= kcap; k++) {
      int lo = 0, hi = n - k; /* largest c with t(k, c) <= cap; t(k, 0) <= cap holds */
      while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (tp_slice_cost(t, b, k, mid) <= cap) lo = mid;
        else hi = mid - 1;
      }
      sv->cmax[k] = lo;
    }
  }
  S[0] = 0;
  mx[0] = 0;
  for (int i = 1; i <= n; i++) {
    double best = INFINITY, bestmx = INFINITY;
    int bestk = 0;
    int kmax = i < kcap ? i : kcap;
    for (int k = 1; k <= kmax; k++) {
      if (S[i - k] == INFINITY) continue;
      if (t->monotone && i - k > sv->cmax[k]) continue;
      double c = tp_slice_cost(t, b, k, i - k);
      if (!(c <= cap)) continue;
      double v = S[i - k] + c, m = c > mx[i - k] ? c : mx[i - k];
      if (v < best || (v == best && m < bestmx)) {
        best = v;
        bestmx = m;
        bestk = k;
      }
    }
    S[i] = best;
    mx[i] = bestmx;
    choice[i] = bestk;
  }
}

/* S*(cap): per-size DPs, then the knapsack over microbatch sizes. Returns false when no
 * plan fits under cap; else *sum and *max (the actual largest slice). */
static bool evaluate(Solver *sv, double cap, double *sum, double *max) {
  int n = sv->n;
  sv->evaluations++;
  for (int b = 1; b <= sv->batch; b++) dp_row(sv, b, cap);
  sv->K[0] = 0;
  sv->kmx[0] = 0;
  for (int j = 1; j <= sv->batch; j++) {
    double best = INFINITY, bestmx = INFINITY;
    int pick = 0;
    for (int b = 1; b <= j; b++) {
      double s = sv->S[(long)b * (n + 1) + n], m = sv->mx[(long)b * (n + 1) + n];
      if (s == INFINITY || sv->K[j - b] == INFINITY) continue;
      double v = sv->K[j - b] + s, vm = m > sv->kmx[j - b] ? m : sv->kmx[j - b];
      if (v < best || (v == best && vm < bestmx)) {
        best = v;
        bestmx = vm;
        pick = b;
      }
    }
    sv->K[j] = best;
    sv->kmx[j] = bestmx;
    sv->pick[j] = pick;
  }
  *sum = sv->K[sv->batch];
  *max = sv->kmx[sv->batch];
  return *sum < INFINITY;
}

/* The smallest cost value > x (INFINITY if none). */
static double next_candidate(const Solver *sv, double x) {
  const TpSliceCost *t = sv->t;
  int n = sv->n;
  double best = INFINITY;
  for (int b = 1; b <= sv->batch; b++)
    for (int k = 1; k <= n; k++) {
      if (!t->monotone) {
        for (int c = 0; c <= n - k; c++) {
          double v = tp_slice_cost(t, b, k, c);
          if (v > x && v < best) best = v;
        }
        continue;
      }
      double v0 = tp_slice_cost(t, b, k, 0);
      if (v0 > x) { /* and every longer slice costs at least this */
        if (v0 < best) best = v0;
        break;
      }
      int lo = 1, hi = n - k + 1; /* smallest c with t > x; n - k + 1 = none */
      while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (tp_slice_cost(t, b, k, mid) > x) hi = mid;
        else lo = mid + 1;
      }
      if (lo <= n - k) {
        double v = tp_slice_cost(t, b, k, lo);
        if (v < best) best = v;
      }
    }
  return best;
}

static void extract(const Solver *sv, TpSlicing *out) {
  int n = sv->n, g = sv->t->granularity;
  memset(out, 0, sizeof *out);
  out->mb = calloc((size_t)sv->batch, sizeof *out->mb);
  for (int j = sv->batch; j > 0; j -= sv->pick[j]) {
    int b = sv->pick[j];
    const int *choice = sv->choice + (long)b * (n + 1);
    TpMicrobatch *mb = &out->mb[out->n++];
    mb->size = b;
    for (int i = n; i > 0; i -= choice[i]) mb->nslices++;
    mb->len = malloc(sizeof(int) * (size_t)mb->nslices);
    int at = mb->nslices;
    for (int i = n; i > 0; i -= choice[i]) mb->len[--at] = choice[i] * g;
  }
}

typedef struct {
  double a, b, Sb;
} Interval;

int tp_slicing_check_size(int batch, int units, TpDiag *d) {
  if (batch > TP_SLICING_MAX_BATCH)
    return tp_error(d, "batch %d is more than the slicing search takes (%d sequences per pipeline replica)", batch,
                    TP_SLICING_MAX_BATCH);
  if ((double)batch * units * units > TP_SLICING_MAX_WORK)
    return tp_error(d,
                    "batch %d x (%d slice units)^2 = %.3g, more than the slicing search takes (2^32): a coarser "
                    "granularity or a smaller batch per pipeline replica",
                    batch, units, (double)batch * units * units);
  return TP_OK;
}

int tp_solve_slicing(const TpSliceCost *t, int batch, int stages, TpSlicing *out, TpDiag *d) {
  memset(out, 0, sizeof *out);
  if (batch < 1 || batch > t->batch) return tp_error(d, "batch %d outside the cost table's 1..%d", batch, t->batch);
  if (stages < 1) return tp_error(d, "stages must be >= 1");
  int rc = tp_slicing_check_size(batch, t->units, d);
  if (rc) return rc;
  int n = t->units;
  Solver sv = {.t = t, .batch = batch, .stages = stages, .n = n};
  size_t rows = ((size_t)batch + 1) * ((size_t)n + 1);
  sv.S = malloc(rows * sizeof(double));
  sv.mx = malloc(rows * sizeof(double));
  sv.choice = malloc(rows * sizeof(int));
  sv.cmax = malloc(((size_t)n + 1) * sizeof(int));
  sv.K = malloc(((size_t)batch + 1) * sizeof(double));
  sv.kmx = malloc(((size_t)batch + 1) * sizeof(double));
  sv.pick = malloc(((size_t)batch + 1) * sizeof(int));
  double K1 = stages - 1, sum, max;
  if (!evaluate(&sv, INFINITY, &sum, &max)) {
    rc = tp_error(d, "no slicing has a finite cost for batch %d", batch);
    goto done;
  }
  double best = sum + K1 * max, best_cap = INFINITY;
  int cap = 64, top = 0;
  Interval *stack = malloc(sizeof(Interval) * (size_t)cap);
  stack[top++] = (Interval){next_candidate(&sv, -INFINITY), max, sum};
  while (top) {
    Interval iv = stack[--top];
    if (!(iv.a < iv.b)) continue;
    if ((iv.Sb > iv.a ? iv.Sb : iv.a) + K1 * iv.a >= best) continue;
    double p = iv.a + (iv.b - iv.a) / 2;
    if (top + 2 > cap) stack = realloc(stack, sizeof(Interval) * (size_t)(cap *= 2));
    if (!evaluate(&sv, p, &sum, &max)) { /* nothing fits under p */
      stack[top++] = (Interval){next_candidate(&sv, p), iv.b, iv.Sb};
      continue;
    }
    if (sum + K1 * max < best) {
      best = sum + K1 * max;
      best_cap = max;
    }
    stack[top++] = (Interval){next_candidate(&sv, p), iv.b, iv.Sb};
    stack[top++] = (Interval){iv.a, max, sum};
  }
  free(stack);
  int evals = sv.evaluations;
  evaluate(&sv, best_cap, &sum, &max);
  extract(&sv, out);
  out->evaluations = evals;
  tp_slicing_eval(t, stages, out);
  TP_ASSERT(out->time <= best * (1 + 1e-12) + 1e-300);
  TP_ASSERT(isfinite(out->time)); /* bounded costs (TP_MAX_SECONDS) and sizes keep every sum finite */
done:
  free(sv.S);
  free(sv.mx);
  free(sv.choice);
  free(sv.cmax);
  free(sv.K);
  free(sv.kmx);
  free(sv.pick);
  return rc;
}

void tp_slicing_eval(const TpSliceCost *t, int stages, TpSlicing *p) {
  int g = t->granularity;
  p->sum = 0;
  p->max = 0;
  for (int m = 0; m < p->n; m++) {
    int c = 0;
    for (int i = 0; i < p->mb[m].nslices; i++) {
      int s = p->mb[m].len[i] / g;
      double v = p->mb[m].size <= t->batch && s >= 1 && c + s <= t->units ? tp_slice_cost(t, p->mb[m].size, s, c)
                                                                          : INFINITY;
      p->sum += v;
      if (v > p->max) p->max = v;
      c += s;
    }
  }
  p->time = p->sum + (stages - 1) * p->max;
}

void tp_uniform_slicing(const TpSliceCost *t, int batch, int mb_size, int slices, int stages, TpSlicing *out) {
  TP_ASSERT(mb_size >= 1 && batch % mb_size == 0 && slices >= 1 && slices <= t->units);
  memset(out, 0, sizeof *out);
  out->n = batch / mb_size;
  out->mb = calloc((size_t)out->n, sizeof *out->mb);
  for (int m = 0; m < out->n; m++) {
    TpMicrobatch *mb = &out->mb[m];
    mb->size = mb_size;
    mb->nslices = slices;
    mb->len = malloc(sizeof(int) * (size_t)slices);
    for (int i = 0; i < slices; i++) mb->len[i] = (t->units / slices + (i < t->units % slices)) * t->granularity;
  }
  tp_slicing_eval(t, stages, out);
}

void tp_slicing_copy(TpSlicing *dst, const TpSlicing *src) {
  *dst = *src;
  dst->mb = calloc((size_t)src->n, sizeof *dst->mb);
  for (int m = 0; m < src->n; m++) {
    dst->mb[m] = src->mb[m];
    dst->mb[m].len = malloc(sizeof(int) * (size_t)src->mb[m].nslices);
    memcpy(dst->mb[m].len, src->mb[m].len, sizeof(int) * (size_t)src->mb[m].nslices);
  }
}

void tp_slicing_free(TpSlicing *p) {
  for (int m = 0; m < p->n; m++) free(p->mb[m].len);
  free(p->mb);
  memset(p, 0, sizeof *p);
}
