#include "optim.h"

#include <math.h>

#define PARALLEL_MIN_ELEMS 32768
/* Sums are cut into this many fixed pieces, added in order: the same bits on any thread
 * count. */
#define SUM_PIECES 64

void tp_adamw_step(float *w, const float *g, float *m, float *v, int64_t n, double lr, double beta1,
                   double beta2, double eps, double weight_decay, int64_t step) {
  const float decay = (float)(1 - lr * weight_decay);
  const float b1 = (float)beta1, a1 = (float)(1 - beta1), b2 = (float)beta2,
              a2 = (float)(1 - beta2);
  const float neg_step_size = (float)-(lr / (1 - pow(beta1, (double)step)));
  const float bc2_sqrt = (float)sqrt(1 - pow(beta2, (double)step)), e = (float)eps;
#pragma omp parallel for simd schedule(static) if (n >= PARALLEL_MIN_ELEMS)
  for (int64_t i = 0; i < n; i++) {
    float wi = w[i] * decay, gi = g[i];
    float mi = m[i] * b1 + a1 * gi;
    float vi = v[i] * b2 + a2 * gi * gi;
    float denom = sqrtf(vi) / bc2_sqrt + e;
    w[i] = wi + neg_step_size * mi / denom;
    m[i] = mi;
    v[i] = vi;
  }
}

double tp_sum_squares_f32(const float *x, int64_t n) {
  double piece[SUM_PIECES];
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN_ELEMS)
  for (int p = 0; p < SUM_PIECES; p++) {
    double sum = 0;
    for (int64_t i = n * p / SUM_PIECES; i < n * (p + 1) / SUM_PIECES; i++)
      sum += (double)x[i] * x[i];
    piece[p] = sum;
  }
  double total = 0;
  for (int p = 0; p < SUM_PIECES; p++) total += piece[p];
  return total;
}

void tp_scale_f32(float *x, int64_t n, float s) {
#pragma omp parallel for simd schedule(static) if (n >= PARALLEL_MIN_ELEMS)
  for (int64_t i = 0; i < n; i++) x[i] *= s;
}
