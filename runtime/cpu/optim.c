#include "optim.h"

#include "../kernels/element.h"

#define PARALLEL_MIN_ELEMS 32768

void tp_adamw_step(float *w, const float *g, float *m, float *v, int64_t n, double lr, double beta1, double beta2,
                   double eps, double weight_decay, int64_t step) {
  const TpAdamWFactors f = tp_adamw_factors(lr, beta1, beta2, eps, weight_decay, step);
#pragma omp parallel for simd schedule(static) if (n >= PARALLEL_MIN_ELEMS)
  for (int64_t i = 0; i < n; i++) tp_adamw_element(w, g, m, v, i, f);
}

void tp_sum_squares_pieces_f32(const float *x, int64_t n, int first, int count, double *out) {
#pragma omp parallel for schedule(static) if (n / TP_SUM_PIECES * count >= PARALLEL_MIN_ELEMS)
  for (int j = 0; j < count; j++) {
    int p = first + j;
    double sum = 0;
    for (int64_t i = n * p / TP_SUM_PIECES; i < n * (p + 1) / TP_SUM_PIECES; i++) sum += (double)x[i] * x[i];
    out[j] = sum;
  }
}

double tp_sum_squares_f32(const float *x, int64_t n) {
  double piece[TP_SUM_PIECES];
  tp_sum_squares_pieces_f32(x, n, 0, TP_SUM_PIECES, piece);
  double total = 0;
  for (int p = 0; p < TP_SUM_PIECES; p++) total += piece[p];
  return total;
}

void tp_scale_f32(float *x, int64_t n, float s) {
#pragma omp parallel for simd schedule(static) if (n >= PARALLEL_MIN_ELEMS)
  for (int64_t i = 0; i < n; i++) x[i] *= s;
}
