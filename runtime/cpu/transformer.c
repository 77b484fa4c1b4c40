#include "transformer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../base/tensor.h" /* TP_MAX_RANK */
#include "elementwise.h"       /* tp_unary */
#include "matmul.h"
#include "nn_backward.h" /* tp_column_sums_f32, tp_gelu_backward_f32 */
#include "../kernels/element.h"
#include "vecmath.h"

/* Loops shorter than this stay on one thread: the fork costs more than it saves. */
#define PARALLEL_MIN_ELEMS 32768
/* Reductions are cut into this many fixed pieces, summed in order: the same bits on any
 * thread count. */
#define SUM_PIECES 64

TpKernelStatus tp_linear_f32(const float *x, const float *w, const float *bias, int64_t M, int64_t K, int64_t N,
                             bool transpose_w, float *y) {
  if (M == 0 || N == 0) return TP_KERNEL_OK;
  if (bias) {
#pragma omp parallel for if (M * N >= PARALLEL_MIN_ELEMS)
    for (int64_t i = 0; i < M; i++) memcpy(y + i * N, bias, (size_t)N * sizeof *y);
  }
  if (K == 0) { /* empty product */
    if (!bias) memset(y, 0, (size_t)(M * N) * sizeof *y);
    return TP_KERNEL_OK;
  }
  tp_sgemm(false, transpose_w, M, N, K, 1, x, K, w, transpose_w ? K : N, bias ? 1 : 0, y, N);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_linear_gelu_f32(const float *x, const float *w, const float *bias, int64_t M, int64_t K, int64_t N,
                                  bool transpose_w, float *pre, float *y) {
  TpKernelStatus s = tp_linear_f32(x, w, bias, M, K, N, transpose_w, pre);
  if (s != TP_KERNEL_OK) return s;
  const TpTensor from = {TP_F32, 1, {M * N}, pre};
  TpTensor to = {TP_F32, 1, {M * N}, y};
  return tp_unary(TP_UNARY_GELU_TANH, &from, &to); /* the unfused Gelu's loop, its bits */
}

TpKernelStatus tp_embedding_f32(const float *table, const int64_t *ids, int64_t n, int64_t V, int64_t C, float *out,
                                int64_t *bad) {
  static const int64_t whole = 0; /* the one range of one */
  return tp_embedding_part_f32(table, ids, &whole, n, V, 1, C, out, bad);
}

/* Are ids (n) all in [-V * parts, V * parts) (without negatives: [0, ...))? Else the
 * position of the first that is not goes to *bad. */
static bool ids_in_range(const int64_t *ids, int64_t n, int64_t V, int64_t parts, bool negatives, int64_t *bad) {
  for (int64_t i = 0; i < n; i++)
    if (ids[i] < (negatives ? -V * parts : 0) || ids[i] >= V * parts) {
      *bad = i;
      return false;
    }
  return true;
}

/* The row of the range's V that id (checked) falls on, or -1. */
static inline int64_t range_row(int64_t id, int64_t V, int64_t parts, int64_t part) {
  int64_t row = (id < 0 ? id + V * parts : id) - part * V;
  return row >= 0 && row < V ? row : -1;
}

TpKernelStatus tp_embedding_part_f32(const float *table, const int64_t *ids, const int64_t *part, int64_t n,
                                     int64_t V, int64_t parts, int64_t C, float *out, int64_t *bad) {
  if (!ids_in_range(ids, n, V, parts, true, bad)) return TP_KERNEL_BAD_INDEX; /* first: the copy cannot fail */
#pragma omp parallel for if (n * C >= PARALLEL_MIN_ELEMS)
  for (int64_t i = 0; i < n; i++) {
    int64_t row = range_row(ids[i], V, parts, *part);
    if (row >= 0) memcpy(out + i * C, table + row * C, (size_t)C * sizeof *out);
    else memset(out + i * C, 0, (size_t)C * sizeof *out);
  }
  return TP_KERNEL_OK;
}

TpKernelStatus tp_embedding_part_backward_f32(const float *dy, const int64_t *ids, const int64_t *part, int64_t n,
                                              int64_t V, int64_t parts, int64_t C, float *dtable, int64_t *bad) {
  if (!ids_in_range(ids, n, V, parts, true, bad)) return TP_KERNEL_BAD_INDEX;
  if (V * C != 0) memset(dtable, 0, (size_t)(V * C) * sizeof *dtable);
    /* columns split among the threads: each row's sum keeps the order of i */
#pragma omp parallel for schedule(static) if (n * C >= PARALLEL_MIN_ELEMS)
  for (int64_t c0 = 0; c0 < C; c0 += 64) {
    int64_t w = C - c0 < 64 ? C - c0 : 64;
    for (int64_t i = 0; i < n; i++) {
      int64_t row = range_row(ids[i], V, parts, *part);
      if (row < 0) continue;
      float *d = dtable + row * C + c0;
      const float *s = dy + i * C + c0;
#pragma omp simd
      for (int64_t c = 0; c < w; c++) d[c] += s[c];
    }
  }
  return TP_KERNEL_OK;
}

/* The sum of exp(x[j] - *mx) over a row, *mx its maximum, in double (the sum
 * row_logsumexp takes the log of); 1 when *mx is infinite. */
TP_VECTOR_CLONES static double row_sumexp(const float *x, int64_t n, float *mx) {
  float m = *mx = tp_row_max(x, n, 1);
  if (m == -INFINITY || m == INFINITY) return 1;
  double sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; j++) sum += tp_vexpf(x[j] - m);
  return sum;
}

/* logsumexp of a row, the maximum subtracted first; the exponentials summed in double. */
static double row_logsumexp(const float *x, int64_t n) {
  float mx;
  double sum = row_sumexp(x, n, &mx);
  return mx == -INFINITY || mx == INFINITY ? mx : mx + log(sum);
}

TpKernelStatus tp_cross_entropy_f32(const float *logits, const int64_t *targets, int64_t R, int64_t V,
                                    float denominator, float *loss, int64_t *bad) {
  return tp_cross_entropy_pad_f32(logits, targets, R, V, 0, denominator, loss, bad);
}

TpKernelStatus tp_cross_entropy_pad_f32(const float *logits, const int64_t *targets, int64_t R, int64_t V,
                                        int64_t pad, float denominator, float *loss, int64_t *bad) {
  TpKernelStatus status = tp_check_vocab_pad(V, pad);
  if (status != TP_KERNEL_OK) return status;
  for (int64_t r = 0; r < R; r++)
    if (targets[r] < 0 || targets[r] >= V - pad) {
      *bad = r;
      return TP_KERNEL_BAD_INDEX;
    }
  double piece[SUM_PIECES];
#pragma omp parallel for schedule(static) if (R * V >= PARALLEL_MIN_ELEMS)
  for (int p = 0; p < SUM_PIECES; p++) {
    double sum = 0;
    for (int64_t r = R * p / SUM_PIECES; r < R * (p + 1) / SUM_PIECES; r++) {
      const float *row = logits + r * V;
      sum += row_logsumexp(row, V - pad) - row[targets[r]];
    }
    piece[p] = sum;
  }
  double total = 0;
  for (int p = 0; p < SUM_PIECES; p++) total += piece[p];
  *loss = (float)(total / denominator);
  return TP_KERNEL_OK;
}

/* From a row of summed statistics (maxima, sums, target logit: tp_cross_entropy_stats_f32),
 * the whole row's maximum in *mx and the sum of exp(x - *mx) over every range, in double. */
static double stats_sumexp(const float *s, int64_t parts, float *mx) {
  *mx = tp_row_max(s, parts, 1);
  if (*mx == -INFINITY || *mx == INFINITY) return 1;
  double sum = 0;
  for (int64_t p = 0; p < parts; p++)
    if (s[p] != -INFINITY) sum += s[parts + p] * exp((double)s[p] - *mx);
  return sum;
}

TpKernelStatus tp_cross_entropy_stats_f32(const float *logits, const int64_t *targets, const int64_t *part,
                                          int64_t R, int64_t V, int64_t parts, float *stats, int64_t *bad) {
  return tp_cross_entropy_stats_pad_f32(logits, targets, part, R, V, parts, 0, stats, bad);
}

/* The columns of range `part`'s V that are true classes: all but the last range's last pad. */
static int64_t range_classes(int64_t V, int64_t parts, int64_t part, int64_t pad) {
  return part == parts - 1 ? V - pad : V;
}

TpKernelStatus tp_cross_entropy_stats_pad_f32(const float *logits, const int64_t *targets, const int64_t *part,
                                              int64_t R, int64_t V, int64_t parts, int64_t pad, float *stats,
                                              int64_t *bad) {
  if (!ids_in_range(targets, R, V * parts - pad, 1, false, bad)) return TP_KERNEL_BAD_INDEX; /* no padded class */
  if (*part < 0 || *part >= parts || pad < 0 || pad >= V)
    return TP_KERNEL_BAD_SHAPE; /* a range past the row's columns */
  int64_t classes = range_classes(V, parts, *part, pad);
#pragma omp parallel for schedule(static) if (R * V >= PARALLEL_MIN_ELEMS)
  for (int64_t r = 0; r < R; r++) {
    const float *row = logits + r * V;
    float *s = stats + r * (2 * parts + 1);
    memset(s, 0, (size_t)(2 * parts + 1) * sizeof *s);
    s[parts + *part] = (float)row_sumexp(row, classes, &s[*part]);
    int64_t t = range_row(targets[r], V, parts, *part);
    if (t >= 0) s[2 * parts] = row[t];
  }
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cross_entropy_parts_f32(const float *stats, int64_t R, int64_t parts, float denominator,
                                          float *loss) {
  double piece[SUM_PIECES];
#pragma omp parallel for schedule(static) if (R * parts >= PARALLEL_MIN_ELEMS)
  for (int p = 0; p < SUM_PIECES; p++) {
    double sum = 0;
    for (int64_t r = R * p / SUM_PIECES; r < R * (p + 1) / SUM_PIECES; r++) {
      const float *s = stats + r * (2 * parts + 1);
      float mx;
      double total = stats_sumexp(s, parts, &mx);
      sum += (mx == -INFINITY || mx == INFINITY ? mx : mx + log(total)) - s[2 * parts];
    }
    piece[p] = sum;
  }
  double total = 0;
  for (int p = 0; p < SUM_PIECES; p++) total += piece[p];
  *loss = (float)(total / denominator);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_cross_entropy_parts_backward_f32(float dloss, const float *logits, const int64_t *targets,
                                                   const float *stats, const int64_t *part, int64_t R, int64_t V,
                                                   int64_t parts, float denominator, float *dlogits, int64_t *bad) {
  return tp_cross_entropy_parts_backward_pad_f32(dloss, logits, targets, stats, part, R, V, parts, 0, denominator,
                                                 dlogits, bad);
}

TpKernelStatus tp_cross_entropy_parts_backward_pad_f32(float dloss, const float *logits, const int64_t *targets,
                                                       const float *stats, const int64_t *part, int64_t R, int64_t V,
                                                       int64_t parts, int64_t pad, float denominator, float *dlogits,
                                                       int64_t *bad) {
  if (!ids_in_range(targets, R, V * parts - pad, 1, false, bad)) return TP_KERNEL_BAD_INDEX;
  if (pad < 0 || pad >= V) return TP_KERNEL_BAD_SHAPE;
  float scale = dloss / denominator;
  int64_t classes = range_classes(V, parts, *part, pad);
#pragma omp parallel for schedule(static) if (R * V >= PARALLEL_MIN_ELEMS)
  for (int64_t r = 0; r < R; r++) {
    const float *x = logits + r * V;
    float *o = dlogits + r * V, mx;
    float inv = (float)(1.0 / stats_sumexp(stats + r * (2 * parts + 1), parts, &mx)) * scale;
#pragma omp simd
    for (int64_t j = 0; j < classes; j++) o[j] = tp_vexpf(x[j] - mx) * inv;
    for (int64_t j = classes; j < V; j++) o[j] = 0; /* the padding: no probability, no gradient */
    int64_t t = range_row(targets[r], V, parts, *part);
    if (t >= 0) o[t] -= scale;
  }
  return TP_KERNEL_OK;
}

/* ---- RMSNorm ---- */

/* 1 / sqrt(mean(x^2) + eps) of a row of n. */
TP_VECTOR_CLONES static float inv_rms(const float *x, int64_t n, float eps) {
  double sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; j++) sum += (double)x[j] * x[j];
  return (float)(1 / sqrt(sum / (double)n + eps));
}

TpKernelStatus tp_rmsnorm_f32(const float *x, const float *scale, int64_t rows, int64_t n, float eps, float *y) {
#pragma omp parallel for schedule(static) if (rows * n >= PARALLEL_MIN_ELEMS)
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * n;
    float *yr = y + r * n, inv = inv_rms(xr, n, eps);
#pragma omp simd
    for (int64_t j = 0; j < n; j++) yr[j] = xr[j] * inv * scale[j];
  }
  return TP_KERNEL_OK;
}

TpKernelStatus tp_rmsnorm_backward_f32(const float *dy, const float *x, const float *scale, int64_t rows, int64_t n,
                                       float eps, float *dx, float *dscale) {
  float *inv = malloc(((size_t)rows + 1) * sizeof *inv);
  if (!inv) abort(); /* out of memory */
#pragma omp parallel for schedule(static) if (rows * n >= PARALLEL_MIN_ELEMS)
  for (int64_t r = 0; r < rows; r++) {
    const float *d = dy + r * n, *xr = x + r * n;
    float rs = inv[r] = inv_rms(xr, n, eps);
    if (!dx) continue;
    double sum_gx = 0;
#pragma omp simd reduction(+ : sum_gx)
    for (int64_t j = 0; j < n; j++) sum_gx += (double)(d[j] * scale[j]) * xr[j];
    float k = (float)(sum_gx / (double)n) * rs * rs;
    float *o = dx + r * n;
#pragma omp simd
    for (int64_t j = 0; j < n; j++) o[j] = rs * (d[j] * scale[j] - xr[j] * k);
  }
  if (dscale) tp_column_sums_f32(dy, x, NULL, inv, rows, n, dscale, NULL);
  free(inv);
  return TP_KERNEL_OK;
}

/* ---- Rotary ---- */

/* Rows [r0, r1) of X (D features each, the first rd rotated) into y. The pairs (a, b)
 * are (j, j + rd/2) or (2i, 2i + 1). Forward: y_a = x_a c_a - x_b s_a, y_b = x_b c_b +
 * x_a s_b; backward (the transpose): y_a = x_a c_a + x_b s_b, y_b = x_b c_b - x_a s_a. The
 * tables' row of X's row r starts at the sum over dims k of index_k(r) * stride[k]. */
TP_VECTOR_CLONES static void rotary_rows(const float *x, const float *cos, const float *sin, int rank,
                                         const int64_t *dims, const int64_t *stride, int64_t rd, bool interleaved,
                                         bool backward, int64_t r0, int64_t r1, float *y) {
  int64_t D = dims[rank - 1], half = rd / 2, step = interleaved ? 2 : 1, off = interleaved ? 1 : half;
  for (int64_t r = r0; r < r1; r++) {
    int64_t rest = r, at = 0;
    for (int k = rank - 2; k >= 0; k--) {
      at += rest % dims[k] * stride[k];
      rest /= dims[k];
    }
    const float *xr = x + r * D, *c = cos + at, *s = sin + at;
    float *yr = y + r * D;
    float sa = backward ? 1 : -1; /* the sign of x_b's term in y_a; y_b's is its opposite */
#pragma omp simd
    for (int64_t i = 0; i < half; i++) {
      int64_t a = i * step, b = a + off;
      float xa = xr[a], xb = xr[b];
      yr[a] = xa * c[a] + sa * xb * s[backward ? b : a];
      yr[b] = xb * c[b] - sa * xa * s[backward ? a : b];
    }
    if (D > rd) memcpy(yr + rd, xr + rd, (size_t)(D - rd) * sizeof *yr);
  }
}

/* Rows per piece of the parallel loops. */
#define ROWS_PER_PIECE 64

static void rotary(const float *x, const float *cos, const float *sin, int rank, const int64_t *dims,
                   const int64_t *table_dims, int64_t rd, bool interleaved, bool backward, float *y) {
  int64_t rows = 1, stride[TP_MAX_RANK], t = rd;
  for (int k = rank - 2; k >= 0; k--) { /* the tables' element strides, 0 where broadcast */
    stride[k] = table_dims[k] == 1 ? 0 : t;
    t *= table_dims[k];
    rows *= dims[k];
  }
  int64_t pieces = (rows + ROWS_PER_PIECE - 1) / ROWS_PER_PIECE;
#pragma omp parallel for schedule(static) if (rows * dims[rank - 1] >= PARALLEL_MIN_ELEMS)
  for (int64_t p = 0; p < pieces; p++) {
    int64_t r1 = (p + 1) * ROWS_PER_PIECE < rows ? (p + 1) * ROWS_PER_PIECE : rows;
    rotary_rows(x, cos, sin, rank, dims, stride, rd, interleaved, backward, p * ROWS_PER_PIECE, r1, y);
  }
}

TpKernelStatus tp_rotary_f32(const float *x, const float *cos, const float *sin, int rank, const int64_t *dims,
                             const int64_t *table_dims, int64_t rotary_dim, bool interleaved, float *y) {
  rotary(x, cos, sin, rank, dims, table_dims, rotary_dim, interleaved, false, y);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_rotary_backward_f32(const float *dy, const float *cos, const float *sin, int rank,
                                      const int64_t *dims, const int64_t *table_dims, int64_t rotary_dim,
                                      bool interleaved, float *dx) {
  rotary(dy, cos, sin, rank, dims, table_dims, rotary_dim, interleaved, true, dx);
  return TP_KERNEL_OK;
}

/* ---- SwiGLU ---- */

/* The formulas: runtime/kernels/element.h. */

/* Elements per piece of the parallel loops. */
#define ELEMS_PER_PIECE 8192

TP_VECTOR_CLONES static void swiglu_range(const float *gate, const float *up, int64_t i0, int64_t i1, float *y) {
#pragma omp simd
  for (int64_t i = i0; i < i1; i++) y[i] = tp_swiglu_elem_f32(gate[i], up[i]);
}

/* One loop per case, without branches inside, so each vectorises. */
TP_VECTOR_CLONES static void swiglu_backward_range(const float *dy, const float *gate, const float *up, int64_t i0,
                                                   int64_t i1, float *dgate, float *dup) {
  if (dgate && dup) {
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) {
      float g = gate[i], s = tp_logistic_f32(g);
      dgate[i] = tp_swiglu_dgate_f32(dy[i], g, up[i], s);
      dup[i] = tp_swiglu_dup_f32(dy[i], g, s);
    }
  } else if (dgate) {
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) {
      float g = gate[i], s = tp_logistic_f32(g);
      dgate[i] = tp_swiglu_dgate_f32(dy[i], g, up[i], s);
    }
  } else if (dup) {
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) dup[i] = tp_swiglu_dup_f32(dy[i], gate[i], tp_logistic_f32(gate[i]));
  }
}

TpKernelStatus tp_swiglu_f32(const float *gate, const float *up, int64_t n, float *y) {
  int64_t pieces = (n + ELEMS_PER_PIECE - 1) / ELEMS_PER_PIECE;
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN_ELEMS)
  for (int64_t p = 0; p < pieces; p++)
    swiglu_range(gate, up, p * ELEMS_PER_PIECE, (p + 1) * ELEMS_PER_PIECE < n ? (p + 1) * ELEMS_PER_PIECE : n, y);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_swiglu_backward_f32(const float *dy, const float *gate, const float *up, int64_t n, float *dgate,
                                      float *dup) {
  int64_t pieces = (n + ELEMS_PER_PIECE - 1) / ELEMS_PER_PIECE;
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN_ELEMS)
  for (int64_t p = 0; p < pieces; p++)
    swiglu_backward_range(dy, gate, up, p * ELEMS_PER_PIECE,
                          (p + 1) * ELEMS_PER_PIECE < n ? (p + 1) * ELEMS_PER_PIECE : n, dgate, dup);
  return TP_KERNEL_OK;
}

/* ---- GeGLU ----
 * Each result rounded as the Gelu, Mul and GeluBackward it fuses (the same bits): dup =
 * dy * gelu(gate), dgate = GeluBackward(dy * up, gate). */

TP_VECTOR_CLONES static void geglu_range(const float *gate, const float *up, int64_t i0, int64_t i1,
                                         bool tanh_approx, float *y) {
  if (tanh_approx) {
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) y[i] = tp_gelu_tanh_f32(gate[i]) * up[i];
  } else {
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) y[i] = tp_gelu_f32(gate[i]) * up[i];
  }
}

/* dup, and dgate's first factor dy * up (tp_geglu_backward_f32 finishes it). */
TP_VECTOR_CLONES static void geglu_backward_range(const float *dy, const float *gate, const float *up, int64_t i0,
                                                  int64_t i1, bool tanh_approx, float *dgate, float *dup) {
  if (dup && tanh_approx) {
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) dup[i] = dy[i] * tp_gelu_tanh_f32(gate[i]);
  } else if (dup) {
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) dup[i] = dy[i] * tp_gelu_f32(gate[i]);
  }
  if (dgate) {
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) dgate[i] = dy[i] * up[i];
  }
}

TpKernelStatus tp_geglu_f32(const float *gate, const float *up, int64_t n, bool tanh_approx, float *y) {
  int64_t pieces = (n + ELEMS_PER_PIECE - 1) / ELEMS_PER_PIECE;
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN_ELEMS)
  for (int64_t p = 0; p < pieces; p++)
    geglu_range(gate, up, p * ELEMS_PER_PIECE, (p + 1) * ELEMS_PER_PIECE < n ? (p + 1) * ELEMS_PER_PIECE : n,
                tanh_approx, y);
  return TP_KERNEL_OK;
}

TpKernelStatus tp_geglu_backward_f32(const float *dy, const float *gate, const float *up, int64_t n,
                                     bool tanh_approx, float *dgate, float *dup) {
  int64_t pieces = (n + ELEMS_PER_PIECE - 1) / ELEMS_PER_PIECE;
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN_ELEMS)
  for (int64_t p = 0; p < pieces; p++)
    geglu_backward_range(dy, gate, up, p * ELEMS_PER_PIECE,
                         (p + 1) * ELEMS_PER_PIECE < n ? (p + 1) * ELEMS_PER_PIECE : n, tanh_approx, dgate, dup);
  /* in place, once over the whole (its own threads): each dx[i] reads dy[i] alone */
  if (dgate) tp_gelu_backward_f32(dgate, gate, n, tanh_approx, dgate);
  return TP_KERNEL_OK;
}
