/* The optimal token slicing of TeraPipe (the paper's Eqs. 5-8), exact, with
 * the joint batch x token knapsack over microbatch sizes.
 *
 * Minimises  T = sum of the cost of every slice of every microbatch
 *              + (stages - 1) * the largest single slice cost                    (Eq. 5)
 * over multisets of microbatch sizes summing to the batch and, per microbatch, slice
 * lengths (in units of `granularity` tokens) summing to the sequence.
 *
 * Search: T*(t_max) = S*(t_max) + (K-1) * t_max where S* (the knapsack of per-size
 * Eq. 8 DPs with every slice <= t_max) is a non-increasing step function. A DP run at cap
 * p returns a plan whose actual max m <= p, and S* is constant on [m, p], so one run
 * settles the whole interval. The rest is branch and bound over intervals [a, b) of
 * candidate caps (values of t), pruned by the lower bound max(S*(b), a) + (K-1)*a >=
 * best, probing midpoints. Exact: every candidate is probed, covered or pruned. */
#ifndef TOKPIPE_PLANNER_SLICING_H
#define TOKPIPE_PLANNER_SLICING_H

#include <math.h>
#include <stdbool.h>

#include "ir/ir.h"
#include "json.h"

typedef enum { TP_COST_DENSE, TP_COST_SEPARABLE } TpSliceCostKind;

/* t(b, s, c): seconds one stage needs for forward + backward of b sequences, a slice of s
 * units with a context of c units (s >= 1, s + c <= units). INFINITY = not allowed. */
typedef struct {
  TpSliceCostKind kind;
  int batch;       /* largest microbatch size; tables are indexed b = 1..batch */
  int units;       /* n = sequence length / granularity */
  int granularity; /* tokens per unit */
  double *dense;   /* DENSE: [(b * (n+1) + s) * (n+1) + c] */
  double *t0;      /* SEPARABLE: [b * (n+1) + s] = t(b, s, 0) */
  double *ctx;     /* SEPARABLE: [b * 4 + i]: + a0 + a1*s + a2*c + a3*s*c where c > 0 */
  bool monotone;   /* t nondecreasing in s and in c: allows the fast search; set by
                      tp_slice_cost_finish */
} TpSliceCost;

static inline double tp_slice_cost(const TpSliceCost *t, int b, int s, int c) {
  int n1 = t->units + 1;
  if (t->kind == TP_COST_DENSE) return t->dense[((long)b * n1 + s) * n1 + c];
  double v = t->t0[(long)b * n1 + s];
  if (c > 0) {
    const double *a = &t->ctx[b * 4];
    v += a[0] + a[1] * s + a[2] * c + a[3] * (double)s * c;
  }
  return v;
}

/* Allocates the tables for (batch, units) (filled with INFINITY / zero). */
void tp_slice_cost_init(TpSliceCost *t, TpSliceCostKind kind, int batch, int units, int granularity);
/* Checks the table and sets `monotone`. NaN or negative entries are an input error. */
int tp_slice_cost_finish(TpSliceCost *t, TpDiag *d);
void tp_slice_cost_free(TpSliceCost *t);
/* Reads {"granularity": g, "stages": K, "t": T} (T[b][s][c], index 0 of b and s unused,
 * null where not measurable). */
int tp_slice_cost_load(const char *path, TpSliceCost *t, int *stages, TpDiag *d);
/* The same from a parsed document; errors name `path`. */
int tp_slice_cost_from_json(const TpJson *j, const char *path, TpSliceCost *t, int *stages, TpDiag *d);

typedef struct {
  int size; /* sequences */
  int nslices;
  int *len; /* slice lengths in tokens, first to last */
} TpMicrobatch;

typedef struct {
  int n;
  TpMicrobatch *mb;
  double time, sum, max; /* Eq. 5 and its parts */
  int evaluations;       /* DP runs (probed caps) */
} TpSlicing;

/* The search's work: a knapsack over microbatch sizes (batch^2) and per size a DP over
 * units (batch x units^2) per probed cap. Larger problems are refused, naming the bound (at
 * the bounds, about a minute on one core). */
#define TP_SLICING_MAX_BATCH 1024
#define TP_SLICING_MAX_WORK 4294967296.0 /* batch x units^2 */
int tp_slicing_check_size(int batch, int units, TpDiag *d);
/* The exact optimum of Eq. 5 for `batch` sequences on `stages` stages. No plan with a
 * finite cost is an input error. */
int tp_solve_slicing(const TpSliceCost *t, int batch, int stages, TpSlicing *out, TpDiag *d);
/* Plan with `batch / mb_size` equal microbatches, each sequence in `slices` near-equal
 * slices (unit counts differ by at most one, longer first); Eq. 5 filled in. */
void tp_uniform_slicing(const TpSliceCost *t, int batch, int mb_size, int slices, int stages, TpSlicing *out);
/* Fills sum, max and time of `p` from t (INFINITY if a slice is not allowed). */
void tp_slicing_eval(const TpSliceCost *t, int stages, TpSlicing *p);
void tp_slicing_copy(TpSlicing *dst, const TpSlicing *src);
void tp_slicing_free(TpSlicing *p);

#endif
