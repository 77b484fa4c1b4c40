#include "transformer.h"

#include <math.h>
#include <string.h>

#include "matmul.h"
#include "vecmath.h"

/* Loops shorter than this stay on one thread: the fork costs more than it saves. */
#define PARALLEL_MIN_ELEMS 32768
/* Reductions are cut into this many fixed pieces, summed in order: the same bits on any
 * thread count. */
#define SUM_PIECES 64

void tp_linear_f32(const float *x, const float *w, const float *bias, int64_t M, int64_t K,
                   int64_t N, bool transpose_w, float *y) {
  if (M == 0 || N == 0) return;
  if (bias) {
#pragma omp parallel for if (M * N >= PARALLEL_MIN_ELEMS)
    for (int64_t i = 0; i < M; i++) memcpy(y + i * N, bias, (size_t)N * sizeof *y);
  }
  if (K == 0) { /* empty product */
    if (!bias) memset(y, 0, (size_t)(M * N) * sizeof *y);
    return;
  }
  tp_sgemm(false, transpose_w, M, N, K, 1, x, K, w, transpose_w ? K : N, bias ? 1 : 0, y, N);
}

TpKernelStatus tp_embedding_f32(const float *table, const int64_t *ids, int64_t n, int64_t V,
                                int64_t C, float *out, int64_t *bad) {
  for (int64_t i = 0; i < n; i++) /* checked first, so the copy below cannot fail */
    if (ids[i] < -V || ids[i] >= V) {
      *bad = i;
      return TP_KERNEL_BAD_INDEX;
    }
#pragma omp parallel for if (n * C >= PARALLEL_MIN_ELEMS)
  for (int64_t i = 0; i < n; i++) {
    int64_t id = ids[i] < 0 ? ids[i] + V : ids[i];
    memcpy(out + i * C, table + id * C, (size_t)C * sizeof *out);
  }
  return TP_KERNEL_OK;
}

/* logsumexp of a row, the maximum subtracted first; the exponentials summed in double. */
TP_VECTOR_CLONES static double row_logsumexp(const float *x, int64_t n) {
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j < n; j++) mx = x[j] > mx ? x[j] : mx;
  if (mx == -INFINITY || mx == INFINITY) return mx;
  double sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; j++) sum += tp_vexpf(x[j] - mx);
  return mx + log(sum);
}

TpKernelStatus tp_cross_entropy_f32(const float *logits, const int64_t *targets, int64_t R,
                                    int64_t V, float denominator, float *loss, int64_t *bad) {
  for (int64_t r = 0; r < R; r++)
    if (targets[r] < 0 || targets[r] >= V) {
      *bad = r;
      return TP_KERNEL_BAD_INDEX;
    }
  double piece[SUM_PIECES];
#pragma omp parallel for schedule(static) if (R * V >= PARALLEL_MIN_ELEMS)
  for (int p = 0; p < SUM_PIECES; p++) {
    double sum = 0;
    for (int64_t r = R * p / SUM_PIECES; r < R * (p + 1) / SUM_PIECES; r++) {
      const float *row = logits + r * V;
      sum += row_logsumexp(row, V) - row[targets[r]];
    }
    piece[p] = sum;
  }
  double total = 0;
  for (int p = 0; p < SUM_PIECES; p++) total += piece[p];
  *loss = (float)(total / denominator);
  return TP_KERNEL_OK;
}
