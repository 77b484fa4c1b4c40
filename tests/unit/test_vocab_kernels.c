/* The vocabulary-parallel kernels (runtime/cpu/transformer.h) against the unsplit ones: a
 * vocabulary of V classes is cut into 2 and 3 ranges in one process, every range's kernel
 * runs as its rank would, and the results are combined as the ranks' AllReduce would (a
 * sum in rank order) or put side by side (each rank's own columns or rows). The embedding,
 * the loss and every gradient must equal tp_embedding_f32, tp_cross_entropy_f32 and their
 * backwards (GatherBackward on axis 0 for the table) within TOL relative to the largest
 * magnitude; the loss must also be the same bits on every rank. Ids and targets out of
 * range are reported at their position. A padded vocabulary (V - 1 true classes and one of
 * padding at the end of the last range, holding a huge logit the mask must ignore) must
 * equal the unsplit loss over the true classes, with exactly zero dlogits in the padding,
 * and refuse the padded class as a target. */
#include <math.h>
#include <string.h>

#include "runtime/cpu/layout_backward.h"
#include "runtime/cpu/nn_backward.h"
#include "runtime/cpu/transformer.h"

#include "../check.h"

static const double TOL = 1e-6;
enum { V = 12, C = 5, R = 13, N_IDS = 9, MAX_PARTS = 3 };

/* Largest |a - b| over the largest |b| (at least 1e-30), of n floats; where in *at. */
static double rel_err(const float *a, const float *b, int64_t n, int64_t *at) {
  double err = 0, big = 1e-30;
  *at = 0;
  for (int64_t i = 0; i < n; i++) {
    if (fabs((double)a[i] - b[i]) > err) err = fabs((double)a[i] - b[i]), *at = i;
    big = fmax(big, fabs((double)b[i]));
  }
  return err / big;
}

static void expect_close(const char *what, int parts, const float *got, const float *want, int64_t n) {
  int64_t at;
  double err = rel_err(got, want, n, &at);
  printf("test_vocab_kernels: %s over %d ranges: max relative error %.2g\n", what, parts, err);
  if (err > TOL)
    fail("%s over %d ranges: relative error %.2g at [%lld] above %.0e", what, parts, err, (long long)at, TOL);
}

/* Embedding and its backward: ids with repeats and negatives (counted from the end). */
static void check_embedding(int parts) {
  int64_t Vp = V / parts, ids[N_IDS] = {3, 0, 11, -1, 7, 3, -12, 5, 11}, bad = -1;
  float *table = rand_array(V * C, 1), *dy = rand_array(N_IDS * C, 1);
  float want[N_IDS * C], got[N_IDS * C] = {0}, part_out[N_IDS * C];
  float dwant[V * C], dgot[V * C];
  if (tp_embedding_f32(table, ids, N_IDS, V, C, want, &bad)) fail("tp_embedding_f32 refused");
  for (int64_t p = 0; p < parts; p++) { /* rank p's rows of the table, then the AllReduce */
    if (tp_embedding_part_f32(table + p * Vp * C, ids, &p, N_IDS, Vp, parts, C, part_out, &bad))
      fail("tp_embedding_part_f32 refused range %lld", (long long)p);
    for (int i = 0; i < N_IDS * C; i++) got[i] += part_out[i];
  }
  expect_close("embedding", parts, got, want, N_IDS * C);

  TpTensor tdy = {TP_F32, 2, {N_IDS, C}, dy}, tids = {TP_I64, 1, {N_IDS}, ids}, tdt = {TP_F32, 2, {V, C}, dwant};
  if (tp_gather_backward(&tdy, &tids, 0, -1, &tdt, &bad)) fail("tp_gather_backward refused");
  for (int64_t p = 0; p < parts; p++) /* each rank's rows of the table's gradient */
    if (tp_embedding_part_backward_f32(dy, ids, &p, N_IDS, Vp, parts, C, dgot + p * Vp * C, &bad))
      fail("tp_embedding_part_backward_f32 refused range %lld", (long long)p);
  expect_close("embedding backward", parts, dgot, dwant, V * C);

  int64_t p = parts - 1, wrong[2] = {1, V};
  bad = -1;
  if (tp_embedding_part_f32(table, wrong, &p, 2, Vp, parts, C, part_out, &bad) != TP_KERNEL_BAD_INDEX || bad != 1)
    fail("embedding over %d ranges: id %d not refused at position 1 (bad %lld)", parts, V, (long long)bad);
  wrong[1] = -V - 1, bad = -1;
  if (tp_embedding_part_backward_f32(dy, wrong, &p, 2, Vp, parts, C, dgot, &bad) != TP_KERNEL_BAD_INDEX || bad != 1)
    fail("embedding backward over %d ranges: id %d not refused", parts, -V - 1);
  free(table);
  free(dy);
}

/* The cross-entropy: logits spread wide (and one row far from 0, for the stable
 * logsumexp), every class a target somewhere. */
static void check_cross_entropy(int parts) {
  int64_t Vp = V / parts, targets[R], bad = -1;
  float *logits = rand_array(R * V, 4), dloss = 0.75f;
  for (int j = 0; j < V; j++) logits[2 * V + j] += 80;
  for (int r = 0; r < R; r++) targets[r] = (r * 5 + 2) % V;
  float want, dwant[R * V], dgot[R * V], stats[R * (2 * MAX_PARTS + 1)] = {0}, part_stats[R * (2 * MAX_PARTS + 1)];
  float *cut = malloc((size_t)(R * Vp) * sizeof *cut), *dcut = malloc((size_t)(R * Vp) * sizeof *dcut);
  if (tp_cross_entropy_f32(logits, targets, R, V, R, &want, &bad) ||
      tp_cross_entropy_backward_f32(dloss, logits, targets, R, V, R, dwant, &bad))
    fail("tp_cross_entropy_f32 refused");
  for (int64_t p = 0; p < parts; p++) { /* rank p's logits: its columns; its statistics summed */
    for (int r = 0; r < R; r++) memcpy(cut + r * Vp, logits + r * V + p * Vp, (size_t)Vp * sizeof *cut);
    if (tp_cross_entropy_stats_f32(cut, targets, &p, R, Vp, parts, part_stats, &bad))
      fail("tp_cross_entropy_stats_f32 refused range %lld", (long long)p);
    for (int i = 0; i < R * (2 * parts + 1); i++) stats[i] += part_stats[i];
  }
  float loss[MAX_PARTS];
  for (int64_t p = 0; p < parts; p++) { /* every rank: the loss from the summed statistics, and its dlogits */
    for (int r = 0; r < R; r++) memcpy(cut + r * Vp, logits + r * V + p * Vp, (size_t)Vp * sizeof *cut);
    tp_cross_entropy_parts_f32(stats, R, parts, R, &loss[p]);
    if (tp_cross_entropy_parts_backward_f32(dloss, cut, targets, stats, &p, R, Vp, parts, R, dcut, &bad))
      fail("tp_cross_entropy_parts_backward_f32 refused range %lld", (long long)p);
    for (int r = 0; r < R; r++) memcpy(dgot + r * V + p * Vp, dcut + r * Vp, (size_t)Vp * sizeof *dgot);
    if (memcmp(&loss[p], &loss[0], sizeof loss[0]) != 0)
      fail("cross-entropy over %d ranges: rank %lld's loss %.9g is not rank 0's %.9g", parts, (long long)p, loss[p],
           loss[0]);
  }
  expect_close("cross-entropy loss", parts, &loss[0], &want, 1);
  expect_close("cross-entropy backward", parts, dgot, dwant, R * V);

  int64_t p = 0;
  targets[4] = V, bad = -1;
  if (tp_cross_entropy_stats_f32(cut, targets, &p, R, Vp, parts, part_stats, &bad) != TP_KERNEL_BAD_INDEX ||
      bad != 4)
    fail("cross-entropy stats over %d ranges: target %d not refused at row 4 (bad %lld)", parts, V, (long long)bad);
  targets[4] = -1, bad = -1;
  if (tp_cross_entropy_parts_backward_f32(dloss, cut, targets, stats, &p, R, Vp, parts, R, dcut, &bad) !=
          TP_KERNEL_BAD_INDEX ||
      bad != 4)
    fail("cross-entropy backward over %d ranges: target -1 not refused at row 4", parts);
  free(logits);
  free(cut);
  free(dcut);
}

/* The padded kernels: classes V - 1 true ones, the last range's last column padding. */
static void check_padded_cross_entropy(int parts) {
  enum { PAD = 1, VT = V - PAD };
  int64_t Vp = V / parts, targets[R], bad = -1;
  float *logits = rand_array(R * V, 4), dloss = 0.75f, truth[R * VT];
  for (int r = 0; r < R; r++) {
    logits[r * V + VT] = 1000; /* the padding: a logit that would take all the probability */
    memcpy(truth + r * VT, logits + r * V, sizeof(float) * VT);
    targets[r] = (r * 5 + 2) % VT;
  }
  float want, dwant[R * VT], dgot[R * VT], stats[R * (2 * MAX_PARTS + 1)] = {0}, part_stats[R * (2 * MAX_PARTS + 1)];
  float *cut = malloc((size_t)(R * Vp) * sizeof *cut), *dcut = malloc((size_t)(R * Vp) * sizeof *dcut);
  if (tp_cross_entropy_f32(truth, targets, R, VT, R, &want, &bad) ||
      tp_cross_entropy_backward_f32(dloss, truth, targets, R, VT, R, dwant, &bad))
    fail("tp_cross_entropy_f32 refused");
  for (int64_t p = 0; p < parts; p++) {
    for (int r = 0; r < R; r++) memcpy(cut + r * Vp, logits + r * V + p * Vp, (size_t)Vp * sizeof *cut);
    if (tp_cross_entropy_stats_pad_f32(cut, targets, &p, R, Vp, parts, PAD, part_stats, &bad))
      fail("tp_cross_entropy_stats_pad_f32 refused range %lld", (long long)p);
    for (int i = 0; i < R * (2 * parts + 1); i++) stats[i] += part_stats[i];
  }
  float loss;
  tp_cross_entropy_parts_f32(stats, R, parts, R, &loss);
  for (int64_t p = 0; p < parts; p++) {
    for (int r = 0; r < R; r++) memcpy(cut + r * Vp, logits + r * V + p * Vp, (size_t)Vp * sizeof *cut);
    if (tp_cross_entropy_parts_backward_pad_f32(dloss, cut, targets, stats, &p, R, Vp, parts, PAD, R, dcut, &bad))
      fail("tp_cross_entropy_parts_backward_pad_f32 refused range %lld", (long long)p);
    for (int r = 0; r < R; r++)
      for (int64_t j = 0; j < Vp; j++) {
        int64_t c = p * Vp + j;
        if (c < VT) dgot[r * VT + c] = dcut[r * Vp + j];
        else if (dcut[r * Vp + j] != 0)
          fail("padded cross-entropy over %d ranges: padded class %lld has dlogit %g, want 0", parts, (long long)c,
               (double)dcut[r * Vp + j]);
      }
  }
  expect_close("padded cross-entropy loss", parts, &loss, &want, 1);
  expect_close("padded cross-entropy backward", parts, dgot, dwant, R * VT);
  int64_t p = parts - 1;
  targets[4] = VT, bad = -1; /* the padded class is no target */
  if (tp_cross_entropy_stats_pad_f32(cut, targets, &p, R, Vp, parts, PAD, part_stats, &bad) != TP_KERNEL_BAD_INDEX ||
      bad != 4)
    fail("padded cross-entropy stats over %d ranges: target %d not refused at row 4", parts, VT);
  bad = -1;
  if (tp_cross_entropy_parts_backward_pad_f32(dloss, cut, targets, stats, &p, R, Vp, parts, PAD, R, dcut, &bad) !=
          TP_KERNEL_BAD_INDEX ||
      bad != 4)
    fail("padded cross-entropy backward over %d ranges: target %d not refused at row 4", parts, VT);
  free(logits);
  free(cut);
  free(dcut);
}

int main(void) {
  for (int parts = 2; parts <= MAX_PARTS; parts++) {
    check_embedding(parts);
    check_cross_entropy(parts);
    check_padded_cross_entropy(parts);
  }
  if (failures) fprintf(stderr, "test_vocab_kernels: %d failures\n", failures);
  return failures ? 1 : 0;
}
