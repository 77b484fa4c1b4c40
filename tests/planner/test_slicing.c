/* The slicing DP equals brute-force enumeration of Eq. 5 over every multiset of
 * microbatch sizes and every slicing of every microbatch, on random cost tables
 * (monotone ones, which take the fast path, and arbitrary ones with missing entries);
 * plus the separable form, granularity and the uniform slicing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes/planner/slicing.h"

static unsigned rng = 12345;
static double uniform01(void) {
  rng = rng * 1103515245u + 12345u;
  return ((rng >> 8) & 0xffff) / 65536.0;
}

/* Brute force: microbatches chosen in nonincreasing size order, each slicing given as a
 * bit mask of cut points; tracks sum and max. */
typedef struct {
  const TpSliceCost *t;
  int n, stages;
  double best;
} Brute;

static void slicings(Brute *br, int remaining, int maxsize, double sum, double max);

static void one_mb(Brute *br, int b, int remaining, double sum, double max) {
  int n = br->n;
  for (unsigned mask = 0; mask < 1u << (n - 1); mask++) {
    double s = sum, m = max;
    int start = 0;
    for (int i = 1; i <= n; i++) {
      if (i < n && !(mask >> (i - 1) & 1)) continue;
      double v = tp_slice_cost(br->t, b, i - start, start);
      s += v;
      if (v > m) m = v;
      start = i;
    }
    slicings(br, remaining - b, b, s, m);
  }
}

static void slicings(Brute *br, int remaining, int maxsize, double sum, double max) {
  if (remaining == 0) {
    double T = sum + (br->stages - 1) * max;
    if (T < br->best) br->best = T;
    return;
  }
  for (int b = remaining < maxsize ? remaining : maxsize; b >= 1; b--) one_mb(br, b, remaining, sum, max);
}

static int check(const TpSliceCost *t, int batch, int stages, const char *what, int trial) {
  Brute br = {t, t->units, stages, INFINITY};
  slicings(&br, batch, batch, 0, 0);
  TpSlicing plan;
  TpDiag d;
  tp_diag_init(&d, "test_slicing", NULL, stderr);
  int rc = tp_solve_slicing(t, batch, stages, &plan, &d);
  if (br.best == INFINITY) {
    if (rc == TP_OK) {
      printf("FAIL %s trial %d: found a plan where none exists\n", what, trial);
      return 1;
    }
    return 0;
  }
  if (rc != TP_OK) {
    printf("FAIL %s trial %d: no plan, brute force %g\n", what, trial, br.best);
    return 1;
  }
  /* the plan is consistent: sizes sum to the batch, lengths to the sequence */
  int seqs = 0;
  for (int m = 0; m < plan.n; m++) {
    int tokens = 0;
    for (int i = 0; i < plan.mb[m].nslices; i++) tokens += plan.mb[m].len[i];
    if (tokens != t->units * t->granularity) {
      printf("FAIL %s: slices sum to %d\n", what, tokens);
      return 1;
    }
    seqs += plan.mb[m].size;
  }
  double eq5 = plan.time;
  tp_slicing_eval(t, stages, &plan);
  int bad = seqs != batch || fabs(eq5 - plan.time) > 1e-12 * br.best || fabs(plan.time - br.best) > 1e-12 * br.best;
  if (bad)
    printf("FAIL %s trial %d (batch %d, n %d, K %d): dp %.12g brute %.12g (diff %.3g)\n", what, trial, batch,
           t->units, stages, plan.time, br.best, plan.time - br.best);
  tp_slicing_free(&plan);
  return bad;
}

int main(void) {
  int failures = 0, trials = 0;
  for (int trial = 0; trial < 600; trial++) {
    int batch = 1 + trial % 3, n = 1 + (trial / 3) % 8, stages = 1 + trial % 7;
    bool monotone = trial % 2 == 0;
    TpSliceCost t;
    tp_slice_cost_init(&t, TP_COST_DENSE, batch, n, 1 + trial % 4);
    for (int b = 1; b <= batch; b++)
      for (int s = 1; s <= n; s++)
        for (int c = 0; c <= n - s; c++) {
          double v;
          if (monotone) { /* overhead + linear in s + context, on a coarse grid for ties */
            double prev_s = s > 1 ? t.dense[((long)b * (n + 1) + s - 1) * (n + 1) + c] : 0;
            double prev_c = c > 0 ? t.dense[((long)b * (n + 1) + s) * (n + 1) + c - 1] : 0;
            v = (prev_s > prev_c ? prev_s : prev_c) + floor(uniform01() * 4) * 0.25;
            if (s == 1 && c == 0) v = 1 + b * uniform01();
          } else {
            v = uniform01() < 0.1 ? INFINITY : floor(uniform01() * 8);
          }
          t.dense[((long)b * (n + 1) + s) * (n + 1) + c] = v;
        }
    TpDiag d;
    tp_diag_init(&d, "test_slicing", NULL, stderr);
    if (tp_slice_cost_finish(&t, &d)) return 1;
    if (monotone && !t.monotone) {
      printf("FAIL: monotone table %d not recognised\n", trial);
      failures++;
    }
    failures += check(&t, batch, stages, monotone ? "monotone" : "arbitrary", trial);
    trials++;
    tp_slice_cost_free(&t);
  }
  /* separable tables (the planner's own form) */
  for (int trial = 0; trial < 200; trial++) {
    int batch = 1 + trial % 3, n = 2 + trial % 7, stages = 2 + trial % 5;
    TpSliceCost t;
    tp_slice_cost_init(&t, TP_COST_SEPARABLE, batch, n, 8);
    for (int b = 1; b <= batch; b++) {
      double over = 1 + uniform01(), rate = 0.1 + uniform01();
      for (int s = 1; s <= n; s++) t.t0[b * (n + 1) + s] = b * (over + rate * s);
      double *a = &t.ctx[b * 4];
      a[0] = 0.01 * uniform01();
      a[1] = 0.01 * uniform01();
      a[2] = 0.05 * uniform01();
      a[3] = 0.02 * uniform01();
    }
    TpDiag d;
    tp_diag_init(&d, "test_slicing", NULL, stderr);
    if (tp_slice_cost_finish(&t, &d)) return 1;
    if (!t.monotone) {
      printf("FAIL: separable table %d not monotone\n", trial);
      failures++;
    }
    failures += check(&t, batch, stages, "separable", trial);
    trials++;
    tp_slice_cost_free(&t);
  }
  /* uniform slicing: 2 microbatches of 1, 3 slices of 7 units: lengths 3,2,2 units */
  TpSliceCost t;
  tp_slice_cost_init(&t, TP_COST_SEPARABLE, 2, 7, 4);
  for (int b = 1; b <= 2; b++)
    for (int s = 1; s <= 7; s++) t.t0[b * 8 + s] = s;
  TpSlicing u;
  tp_uniform_slicing(&t, 2, 1, 3, 4, &u);
  if (u.n != 2 || u.mb[1].nslices != 3 || u.mb[1].len[0] != 12 || u.mb[1].len[2] != 8 || u.time != 14 + 3 * 3) {
    printf("FAIL uniform: n %d, len %d..%d, time %g (want 2 mbs, 12..8, 23)\n", u.n, u.mb[1].len[0], u.mb[1].len[2],
           u.time);
    failures++;
  }
  tp_slicing_free(&u);
  tp_slice_cost_free(&t);
  printf("%d of %d random cost tables: DP == brute force\n", trials - failures, trials);
  return failures != 0;
}
