/* The trainer's scatter and gather of split parameters (runtime/train/params.c,
 * pipe_shard_copy) against TpPlanShard's definition (plan.h), element by element: the whole
 * tensor is `chunks` chunks along `axis`, each cut into `parts` pieces, and tensor rank t of
 * N holds piece t * parts / N of every chunk, in chunk order. Cases: a fused Q|K|V weight
 * (chunks 3) split by columns and by rows, pieces shared by several ranks (parts < N: one
 * K/V head on two ranks, two pieces on four), a rank-3 tensor split inside, and padded
 * vocabularies (TpPlan.param_pad: a table's rows, a head's columns, whose last rank holds
 * padding). Each rank's piece is checked against the index the definition gives (zeros in
 * the padding); gathering one holder of every piece rebuilds the whole tensor, exactly its
 * elements and not one more, and reports a padding element that is not 0. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/train/train.h"
#include "../check.h"

/* The whole tensor's flat index of element k of tensor rank t's piece of p, after `pad`
 * slices of padding along the axis; -1 in the padding. */
static int64_t whole_index(const TpPlanParam *p, int N, int t, int64_t k, int pad) {
  const TpPlanShard *sh = &p->shard;
  int chunks = sh->chunks > 1 ? sh->chunks : 1;
  int64_t idx[TP_MAX_RANK], whole[TP_MAX_RANK];
  for (int a = p->rank - 1; a >= 0; a--) idx[a] = k % p->dims[a], k /= p->dims[a], whole[a] = p->dims[a];
  whole[sh->axis] = p->dims[sh->axis] * sh->parts - pad;
  int64_t piece_len = p->dims[sh->axis] / chunks, c = idx[sh->axis] / piece_len, x = idx[sh->axis] % piece_len;
  idx[sh->axis] = c * piece_len * sh->parts + (int64_t)(t * sh->parts / N) * piece_len + x;
  if (idx[sh->axis] >= whole[sh->axis]) return -1;
  int64_t flat = 0;
  for (int a = 0; a < p->rank; a++) flat = flat * whole[a] + idx[a];
  return flat;
}

static void check_pad(const char *what, TpPlanParam p, int N, int pad) {
  TpPlan plan = {.tensor = N, .nparams = 1, .params = &p, .param_pad = &pad};
  int64_t n = tp_numel(p.rank, p.dims), wn = n / p.dims[p.shard.axis] * (p.dims[p.shard.axis] * p.shard.parts - pad);
  /* one element more, which the gather must leave alone */
  float *whole = malloc((size_t)(wn + 1) * 4), *piece = malloc((size_t)n * 4), *back = calloc((size_t)wn + 1, 4);
  for (int64_t i = 0; i <= wn; i++) whole[i] = (float)i;
  back[wn] = -1;
  for (int t = 0; t < N; t++) {
    memset(piece, 0xff, (size_t)n * 4);
    pipe_shard_copy(&plan, &p, t, piece, whole, false);
    for (int64_t k = 0; k < n; k++) {
      int64_t at = whole_index(&p, N, t, k, pad);
      if (piece[k] != (at < 0 ? 0.0f : (float)at)) { /* the padding: zeros */
        fail("%s: rank %d of %d, piece element %lld is %g, want %s %lld", what, t, N, (long long)k, (double)piece[k],
             at < 0 ? "padding" : "whole element", (long long)at);
        break;
      }
    }
    if (t % (N / p.shard.parts) == 0 && pipe_shard_copy(&plan, &p, t, piece, back, true) >= 0) /* one holder each */
      fail("%s: rank %d's piece, as scattered, has padding that is not 0", what, t);
  }
  if (pad) { /* a padding element the last rank's piece should not have: the gather says where */
    int64_t at = -1;
    for (int64_t k = n - 1; k >= 0 && at < 0; k--)
      if (whole_index(&p, N, N - 1, k, pad) < 0) at = k;
    pipe_shard_copy(&plan, &p, N - 1, piece, whole, false);
    piece[at] = 5;
    float *scratch = malloc((size_t)(wn + 1) * 4);
    int64_t got = pipe_shard_copy(&plan, &p, N - 1, piece, scratch, true);
    if (got != at)
      fail("%s: a nonzero padding element at %lld of the last piece, reported at %lld", what, (long long)at,
           (long long)got);
    free(scratch);
  }
  if (back[wn] != -1) fail("%s: the gather wrote past the whole tensor's %lld elements", what, (long long)wn);
  for (int64_t i = 0; i < wn; i++)
    if (back[i] != whole[i]) {
      fail("%s: gathered element %lld is %g, want %g", what, (long long)i, (double)back[i], (double)whole[i]);
      break;
    }
  free(whole), free(piece), free(back);
}

static void check_case(const char *what, TpPlanParam p, int N) { check_pad(what, p, N, 0); }

int main(void) {
  /* {name, source, rank, dims (a rank's piece), trainable, stage, tied_stage, {axis, parts, chunks}} */
  check_case("fused Q|K|V by columns", (TpPlanParam){"w", "w", 2, {4, 6}, 1, 0, 0, {1, 2, 3}}, 2);
  check_case("fused Q|K|V bias", (TpPlanParam){"b", "b", 1, {6}, 1, 0, 0, {0, 2, 3}}, 2);
  check_case("rows", (TpPlanParam){"w", "w", 2, {3, 5}, 1, 0, 0, {0, 2, 0}}, 2);
  check_case("one K/V head on 2 ranks", (TpPlanParam){"k", "k", 2, {8, 4}, 1, 0, 0, {1, 1, 1}}, 2);
  check_case("2 pieces on 4 ranks", (TpPlanParam){"k", "k", 2, {3, 4}, 1, 0, 0, {0, 2, 1}}, 4);
  check_case("rank 3, inner axis, 2 chunks", (TpPlanParam){"x", "x", 3, {2, 6, 3}, 1, 0, 0, {1, 4, 2}}, 4);
  check_case("2 chunks, shared pieces", (TpPlanParam){"x", "x", 2, {4, 2}, 1, 0, 0, {0, 2, 2}}, 4);
  /* a vocabulary of 125 over 2 ranks (63 rows each, 1 padding) and 4 (32 each, 3 padding) */
  check_pad("padded table rows, 2 ranks", (TpPlanParam){"e", "e", 2, {63, 3}, 1, 0, 0, {0, 2, 0}}, 2, 1);
  check_pad("padded table rows, 4 ranks", (TpPlanParam){"e", "e", 2, {32, 3}, 1, 0, 0, {0, 4, 0}}, 4, 3);
  check_pad("padded head columns", (TpPlanParam){"h", "h", 2, {3, 32}, 1, 0, 0, {1, 4, 0}}, 4, 3);
  check_pad("padded head bias", (TpPlanParam){"b", "b", 1, {63}, 1, 0, 0, {0, 2, 0}}, 2, 1);
  if (failures) return fprintf(stderr, "%d failure(s)\n", failures), 1;
  printf("ok\n");
  return 0;
}
