/* The fused attention of runtime/cuda/attention.cu (ops.h's tp_cuda_attention_f32 and
 * tp_cuda_attention_backward_f32) on the CPU through the emulation of the CUDA execution
 * model, against tp_attention_f32 and tp_attention_backward_f32, one ctest per case and
 * direction (`test_cuda_attention NAME_fwd` / `NAME_bwd`). Each case is one feature of
 * TpAttention at a length that is no multiple of the kernels' tiles (32 rows for head
 * sizes <= 64, 16 for <= 128, 8 for <= 256): grouped and multi-query heads, packed, a
 * token slice (causal_offset) reading its keys from a longer context buffer (kv_rows),
 * window (within one key tile and across several), softcap, bool and f32 masks broadcast
 * over some dims or none, past keys (forward only: the CPU backward takes none), with and
 * without present outputs, rows that see no key, no keys at all, NULL gradients, head
 * sizes 1, 8, 64, 80, 128, 256 and a V head size unlike K's.
 * Outputs start as NaN, so an element the kernel should write but skips fails. Each test
 * prints its worst absolute error.
 *
 * Tolerances, |gpu - cpu| <= atol + rtol * |cpu| per element (ATTENTION = (5e-6, 1e-5)):
 * inputs are in [-1, 1) (q scaled by 2). y is a convex combination of rows of v, summed
 * online (rescaled when a row's maximum grows) against the CPU's softmax then sgemm; the
 * gradients sum <= 2 heads * 41 rows of terms of magnitude <= ~2 in another order than
 * the CPU's (double dot products, sgemm's blocking; delta as dy . y rather than
 * sum P dP) and the softcap's tanhf differs from the CPU's by an ulp or two. Each sum
 * errs by a few ulp of its largest partial sum (<= ~40), so under 5e-6 absolute (the
 * worst measured: 1.2e-6, dv of gqa_causal) and 1e-5 relative. The copies into
 * present_k/present_v are EXACT.
 *
 * The tensor-core kernels (tp_cuda_bf16_attention_f32, tp_cuda_bf16_attention_backward_f32,
 * with and without the forward's saved log-sum-exp; `tc_NAME_fwd` / `tc_NAME_bwd`, the same
 * cases, whose lengths are no multiple
 * of 16 either) run on the emulated WMMA fragments, against the CPU kernels given the same
 * operands rounded to bf16 (q, k, v, past, dy; masks stay f32), so what remains is the
 * kernels' own rounding: the probabilities P and the score gradients dS rounded to bf16
 * for the products they feed (a relative error of at most 2^-9 each, round to nearest
 * even), and f32 sums in another order:
 *   y    a sum of rows of v (|v| < 1) with weights off by <= 2^-9 relative, over the f32
 *        sum of the weights: off by <= 2^-9 = 2.0e-3 (worst measured 1.4e-3):
 *        TC_FORWARD = (2.5e-3, 1e-2);
 *   lse  from the f32 scores of bf16 products (exact) and the f32 weights: as the CPU's
 *        up to f32 rounding (worst measured 4.8e-7): LSE = (5e-6, 1e-5);
 *   dq, dk, dv  each term p dy, ds k or ds q is off by <= 2^-9 of itself, so an element
 *        by <= 2^-9 times the sum of its terms' magnitudes: for dv of an early key of
 *        gqa_causal, the probabilities the 2 heads' 37 rows give it sum to about
 *        2 (H(37) - 1) = 6.3, a bound of 1.2e-2; the roundings' errors are unbiased and
 *        partly cancel (worst measured 5.3e-3, dv of mqa_packed): TC_GRADIENTS = (8e-3, 1e-2).
 * The backward given the forward's y and lse (fp32 and tensor-core kernels alike) gives the
 * bits of the backward that runs its own statistics pass (the forward's lse is that pass's,
 * delta = dy . y is summed in that pass's order), with the forward's flops fewer; the CPU's
 * lse is checked against the reference within LSE, the CUDA one against the CPU's. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "compare.h"
#include "cpu/nn.h"
#include "cpu/nn_backward.h"
#include "cuda/ops.h"
#include "cuda/stats.h"

static const Tolerance ATTENTION = {5e-6, 1e-5}, LSE = {5e-6, 1e-5};
static const Tolerance TC_FORWARD = {2.5e-3, 1e-2}, TC_GRADIENTS = {8e-3, 1e-2};

enum MaskKind { NO_MASK, BOOL_MASK, F32_MASK };

typedef struct {
  int64_t batch, q_heads, kv_heads, q_len, kv_len, kv_rows, past_len, D, Dv;
  bool packed, causal;
  int64_t causal_offset, window;
  float softcap;
  enum MaskKind mask;
  int mask_rank;
  int64_t mask_dims[4]; /* right-aligned over [B, q_heads, q_len, mask_len] */
  bool present;         /* the forward writes present_k and present_v */
} Case;

/* The cases (see the header comment): one feature each. */
static const Case ONE = {1, 1, 1, 1, 1, 0, 0, 1, 1, .causal = false};
static const Case GQA_CAUSAL = {2, 4, 2, 37, 37, 0, 0, 64, 64, .causal = true};
static const Case MQA_PACKED = {1, 3, 1, 19, 19, 0, 0, 80, 80, .packed = true, .causal = true};
static const Case SLICE = {2, 4, 2, 5, 13, 16, 0, 40, 24, .causal = true, .causal_offset = 8};
static const Case SLICE_PACKED =
    {1, 2, 1, 11, 35, 40, 0, 64, 64, .packed = true, .causal = true, .causal_offset = 24};
static const Case WINDOW = {1, 2, 2, 41, 41, 0, 0, 32, 32, .causal = true, .window = 5};
static const Case SOFTCAP = {1, 2, 1, 17, 17, 0, 0, 16, 16, .causal = true, .softcap = 1.5f};
/* a bool mask [B, 1, q_len, 18] over 20 keys: keys 18, 19 masked out by its length; row 3
 * of batch 1 all false (sees no key) */
static const Case BOOL_MASKED =
    {2, 2, 1, 9, 20, 0, 0, 24, 24, .mask = BOOL_MASK, .mask_rank = 4, .mask_dims = {2, 1, 9, 18}};
/* an f32 mask [B, 1, 1, kv_len] (padding: -inf on some keys, values elsewhere), causal */
static const Case F32_MASKED =
    {2, 2, 2, 13, 13, 0, 0, 8, 8, .causal = true, .mask = F32_MASK, .mask_rank = 4, .mask_dims = {2, 1, 1, 13}};
/* window 3 with an f32 mask [4] (broadcast over everything) of 4 keys: rows i >= 6 see
 * keys [i - 2, 4), none */
static const Case NO_KEY =
    {1, 2, 1, 12, 12, 0, 0, 16, 16, .causal = true, .window = 3, .mask = F32_MASK, .mask_rank = 1, .mask_dims = {4}};
static const Case PAST = {2, 4, 2, 3, 3, 0, 6, 32, 24, .packed = true, .causal = true, .present = true};
static const Case PAST_SCRATCH = {1, 2, 1, 4, 4, 0, 5, 16, 16, .causal = true};
static const Case D128 = {1, 2, 1, 21, 21, 0, 0, 128, 128, .causal = true};
static const Case D256 = {1, 2, 2, 11, 11, 0, 0, 256, 256, .causal = true};
static const Case DV_DIFFERS = {1, 2, 1, 9, 9, 0, 0, 72, 33, .causal = false};
/* a full f32 mask [B, q_heads, q_len, 9] (no broadcast) and a bool one [q_len, 10] over
 * batch and heads of grouped heads, causal */
static const Case F32_MASK_FULL =
    {1, 2, 1, 7, 9, 0, 0, 8, 8, .mask = F32_MASK, .mask_rank = 4, .mask_dims = {1, 2, 7, 9}};
static const Case BOOL_MASK_ROWS =
    {2, 4, 2, 10, 10, 0, 0, 8, 8, .causal = true, .mask = BOOL_MASK, .mask_rank = 2, .mask_dims = {10, 10}};
/* a window of 40 over 100 rows: tiles of 32 skip the key tiles before the window too */
static const Case LONG_WINDOW = {1, 1, 1, 100, 100, 0, 0, 8, 8, .causal = true, .window = 40};
static const Case NO_KEYS_AT_ALL = {1, 2, 1, 3, 0, 0, 0, 8, 8, .causal = false};

/* n floats set to NaN: an output before the kernel must overwrite it. */
static float *nans(int64_t n) {
  float *a = test_alloc((size_t)n * sizeof *a);
  for (int64_t i = 0; i < n; i++) a[i] = NAN;
  return a;
}
static float *random_floats(int64_t n, float scale) {
  float *a = test_alloc((size_t)n * sizeof *a);
  for (int64_t i = 0; i < n; i++) a[i] = frand() * scale;
  return a;
}

/* The case's description, inputs and mask. */
typedef struct {
  TpAttention p;
  int64_t nq, nk, nkr, npast; /* rows of q, of dense k, of k as read (kv_rows), of past */
  float *q, *k, *v, *past_k, *past_v, *dy;
  void *mask;
} Inputs;

static Inputs make_inputs(const Case *c) {
  Inputs in = {.p = {.batch = c->batch,
                     .q_heads = c->q_heads,
                     .kv_heads = c->kv_heads,
                     .q_len = c->q_len,
                     .kv_len = c->kv_len,
                     .past_len = c->past_len,
                     .head_size = c->D,
                     .v_head_size = c->Dv,
                     .packed = c->packed,
                     .is_causal = c->causal,
                     .causal_offset = c->causal_offset,
                     .window = c->window,
                     .kv_rows = c->kv_rows,
                     .scale = 1 / sqrtf((float)c->D),
                     .softcap = c->softcap}};
  int64_t rows = c->kv_rows ? c->kv_rows : c->kv_len;
  in.nq = c->batch * c->q_heads * c->q_len;
  in.nk = c->batch * c->kv_heads * c->kv_len;
  in.nkr = c->batch * c->kv_heads * rows;
  in.npast = c->batch * c->kv_heads * c->past_len;
  in.q = random_floats(in.nq * c->D, 2);
  in.k = random_floats(in.nkr * c->D, 1);
  in.v = random_floats(in.nkr * c->Dv, 1);
  in.past_k = c->past_len ? random_floats(in.npast * c->D, 1) : NULL;
  in.past_v = c->past_len ? random_floats(in.npast * c->Dv, 1) : NULL;
  in.dy = random_floats(in.nq * c->Dv, 1);
  if (c->mask != NO_MASK) {
    int64_t n = 1;
    for (int d = 0; d < c->mask_rank; d++) n *= c->mask_dims[d];
    if (c->mask == BOOL_MASK) {
      unsigned char *m = test_alloc((size_t)n);
      for (int64_t e = 0; e < n; e++) m[e] = frand() > -0.6f; /* 80% attend */
      if (c->mask_rank == 4 && c->mask_dims[0] > 1)           /* row 3 of batch 1 sees nothing */
        memset(m + (c->mask_dims[2] + 3) * c->mask_dims[3], 0, (size_t)c->mask_dims[3]);
      in.mask = m;
    } else {
      float *m = test_alloc((size_t)n * sizeof *m);
      for (int64_t e = 0; e < n; e++) m[e] = frand() < -0.7f ? -INFINITY : frand();
      in.mask = m;
    }
    tp_attention_set_mask(&in.p, in.mask, c->mask == BOOL_MASK, c->mask_dims, c->mask_rank);
  }
  return in;
}

/* Frees what test_alloc gave, skipping NULL (on a GPU, compare.h's free asks CUDA about
 * the pointer first). */
static void release(void *p) {
  if (p) free(p);
}

static void free_inputs(Inputs *in) {
  free(in->q), free(in->k), free(in->v), free(in->dy);
  release(in->past_k), release(in->past_v), release(in->mask);
}

/* Compares n results and prints the worst absolute error. */
static void compare_within(const char *what, const float *got, const float *want, int64_t n, Tolerance tol) {
  double worst = 0;
  for (int64_t e = 0; e < n; e++) {
    if (got[e] == want[e]) continue; /* equal infinities too */
    double err = fabs((double)got[e] - want[e]);
    if (!(err <= worst)) worst = err;
  }
  printf("%s: worst abs error %.3g over %lld values\n", what, worst, (long long)n);
  check_close(what, got, want, n, tol);
}
static void compare(const char *what, const float *got, const float *want, int64_t n) {
  compare_within(what, got, want, n, ATTENTION);
}

typedef TpKernelStatus (*ForwardEntry)(const TpAttention *p, const float *q, const float *k, const float *v,
                                       const float *past_k, const float *past_v, float *y, float *present_k,
                                       float *present_v, float *qk_out, float *lse, TpStream *stream);
typedef TpKernelStatus (*BackwardEntry)(const TpAttention *p, const float *dy, const float *q, const float *k,
                                        const float *v, const float *y, const float *lse, float *dq, float *dk,
                                        float *dv, TpStream *stream);

/* The entry points (fp32 or bf16) refuse what they do not implement: qk_out (it would
 * need the scores the fused kernels never store), head sizes over 256, a backward with
 * past keys, and a saved y without its lse. */
static void refusals_of(ForwardEntry forward_entry, BackwardEntry backward_entry) {
  Inputs in = make_inputs(&ONE);
  TpStream *s = tp_cuda_stream_new();
  float *y = nans(in.nq), *qk = nans(in.nq), *big = nans(257);
  if (forward_entry(&in.p, in.q, in.k, in.v, NULL, NULL, y, NULL, NULL, qk, NULL, s) != TP_KERNEL_BAD_DTYPE)
    fail("qk_out accepted");
  TpAttention wide = in.p;
  wide.head_size = wide.v_head_size = 257;
  if (forward_entry(&wide, big, big, big, NULL, NULL, big, NULL, NULL, NULL, NULL, s) != TP_KERNEL_BAD_DTYPE)
    fail("head size 257 accepted");
  TpAttention past = in.p;
  past.past_len = 1;
  if (backward_entry(&past, y, in.q, in.k, in.v, NULL, NULL, y, y, y, s) != TP_KERNEL_BAD_DTYPE)
    fail("a backward with past keys accepted");
  if (backward_entry(&in.p, y, in.q, in.k, in.v, y, NULL, y, y, y, s) != TP_KERNEL_BAD_DTYPE)
    fail("a saved y without its lse accepted");
  tp_cuda_stream_free(s);
  free(y), free(qk), free(big);
  free_inputs(&in);
}
/* The backward given the forward's y and lse (forward_entry writes them) must give the
 * bits of the backward that runs its own statistics pass (dq, dk, dv, from `recompute`),
 * counting the forward's products fewer (flops of `precision`). */
static void check_saved_statistics(const Case *c, const Inputs *in, ForwardEntry forward_entry,
                                   BackwardEntry backward_entry, TpFlopsKind precision, const float *dq,
                                   const float *dk, const float *dv, double recomputing, TpStream *s) {
  float *y = nans(in->nq * c->Dv), *lse = nans(in->nq);
  float *dq2 = nans(in->nq * c->D), *dk2 = nans(in->nk * c->D), *dv2 = nans(in->nk * c->Dv);
  char counts[256];
  tp_cuda_stats_take(counts, sizeof counts);
  if (forward_entry(&in->p, in->q, in->k, in->v, NULL, NULL, y, NULL, NULL, NULL, lse, s) != TP_KERNEL_OK)
    fail("the forward refused the case");
  double forward_flops = tp_cuda_stats.flops[precision];
  tp_cuda_stats_take(counts, sizeof counts);
  if (backward_entry(&in->p, in->dy, in->q, in->k, in->v, y, lse, dq2, dk2, dv2, s) != TP_KERNEL_OK)
    fail("the backward given y and lse refused the case");
  double saved = tp_cuda_stats.flops[precision];
  if (precision == TP_FLOPS_F32 && c->kv_len) /* the delta pass (f32 either way), unless nothing is attended */
    saved -= 2.0 * (double)in->nq * (double)c->Dv;
  if (tp_cuda_stats_on && fabs(saved - (recomputing - forward_flops)) > 1e-9 * recomputing)
    fail("the backward given lse counts %g flops, %g without it, the forward %g", saved, recomputing, forward_flops);
  test_sync();
  tp_cuda_stream_sync(s);
  check_close("dq (saved lse, bits)", dq2, dq, in->nq * c->D, (Tolerance){0, 0});
  check_close("dk (saved lse, bits)", dk2, dk, in->nk * c->D, (Tolerance){0, 0});
  check_close("dv (saved lse, bits)", dv2, dv, in->nk * c->Dv, (Tolerance){0, 0});
  free(y), free(lse), free(dq2), free(dk2), free(dv2);
}

/* ---- the tensor-core kernels ---- */

/* x (n floats, or NULL) rounded to bf16 in place: the operands as the kernels see them. */
static void round_to_bf16(float *x, int64_t n) {
  for (int64_t e = 0; x && e < n; e++) x[e] = tp_bf16_to_f32(tp_f32_to_bf16(x[e]));
}

/* The case's inputs with q, k, v, past and dy rounded to bf16. */
static Inputs make_bf16_inputs(const Case *c) {
  Inputs in = make_inputs(c);
  round_to_bf16(in.q, in.nq * c->D);
  round_to_bf16(in.k, in.nkr * c->D);
  round_to_bf16(in.v, in.nkr * c->Dv);
  round_to_bf16(in.past_k, in.npast * c->D);
  round_to_bf16(in.past_v, in.npast * c->Dv);
  round_to_bf16(in.dy, in.nq * c->Dv);
  return in;
}

/* Each query row's log-sum-exp of its masked scores, from the CPU's qk_out (+inf for a row
 * that sees no key, as the kernel writes it). */
static float *reference_lse(const Inputs *in, int64_t total) {
  TpAttention p = in->p;
  p.qk_mode = 2;
  float *y = nans(in->nq * p.v_head_size), *scores = nans(in->nq * total), *lse = nans(in->nq);
  float *present_k = nans(in->p.batch * in->p.kv_heads * total * p.head_size);
  float *present_v = nans(in->p.batch * in->p.kv_heads * total * p.v_head_size);
  tp_attention_f32(&p, in->q, in->k, in->v, in->past_k, in->past_v, y, present_k, present_v, scores, NULL);
  for (int64_t row = 0; row < in->nq; row++) {
    const float *s = scores + row * total;
    double m = -INFINITY, sum = 0;
    for (int64_t j = 0; j < total; j++) m = s[j] > m ? s[j] : m;
    for (int64_t j = 0; j < total && m > -INFINITY; j++) sum += exp(s[j] - m);
    lse[row] = sum > 0 ? (float)(m + log(sum)) : INFINITY;
  }
  free(y), free(scores), free(present_k), free(present_v);
  return lse;
}

/* The forward on the tensor cores, with and without the log-sum-exp, against the CPU; its
 * products counted as bf16 flops, none as f32. */
static void tc_forward(const Case *c) {
  Inputs in = make_bf16_inputs(c);
  TpStream *s = tp_cuda_stream_new();
  int64_t total = c->past_len + c->kv_len, nt = c->batch * c->kv_heads * total;
  float *y = nans(in.nq * c->Dv), *y2 = nans(in.nq * c->Dv), *want = nans(in.nq * c->Dv), *lse = nans(in.nq);
  float *pk = c->present ? nans(nt * c->D) : NULL, *pv = c->present ? nans(nt * c->Dv) : NULL;
  float *want_pk = c->present ? nans(nt * c->D) : NULL, *want_pv = c->present ? nans(nt * c->Dv) : NULL;
  tp_attention_f32(&in.p, in.q, in.k, in.v, in.past_k, in.past_v, want, want_pk, want_pv, NULL, NULL);
  char counts[256];
  tp_cuda_stats_take(counts, sizeof counts);
  TpKernelStatus st = tp_cuda_bf16_attention_f32(&in.p, in.q, in.k, in.v, in.past_k, in.past_v, y, pk, pv, NULL,
                                                 NULL, s);
  if (st != TP_KERNEL_OK) fail("tp_cuda_bf16_attention_f32 returned %d", (int)st);
  if (tp_cuda_stats_on && in.nq && total &&
      (tp_cuda_stats.flops[TP_FLOPS_F32] != 0 || !(tp_cuda_stats.flops[TP_FLOPS_BF16] > 0)))
    fail("forward flops: f32 %g, bf16 %g (want 0 and > 0)", tp_cuda_stats.flops[TP_FLOPS_F32],
         tp_cuda_stats.flops[TP_FLOPS_BF16]);
  st = tp_cuda_bf16_attention_f32(&in.p, in.q, in.k, in.v, in.past_k, in.past_v, y2, NULL, NULL, NULL, lse, s);
  if (st != TP_KERNEL_OK) fail("tp_cuda_bf16_attention_f32 (with lse) returned %d", (int)st);
  test_sync();
  tp_cuda_stream_sync(s);
  compare_within("y", y, want, in.nq * c->Dv, TC_FORWARD);
  check_close("y (with lse)", y2, y, in.nq * c->Dv, (Tolerance){0, 0});
  float *want_lse = reference_lse(&in, total);
  compare_within("lse", lse, want_lse, in.nq, LSE);
  if (c->present) {
    check_close("present_k", pk, want_pk, nt * c->D, (Tolerance){0, 0});
    check_close("present_v", pv, want_pv, nt * c->Dv, (Tolerance){0, 0});
  }
  tp_cuda_stream_free(s);
  free(y), free(y2), free(want), free(lse), free(want_lse);
  release(pk), release(pv), release(want_pk), release(want_pv);
  free_inputs(&in);
}

/* The backward on the tensor cores against the CPU's: as it runs without the forward's
 * statistics (its own statistics pass), then given the forward's y and log-sum-exp. */
static void tc_backward(const Case *c) {
  Inputs in = make_bf16_inputs(c);
  TpStream *s = tp_cuda_stream_new();
  float *dq = nans(in.nq * c->D), *dk = nans(in.nk * c->D), *dv = nans(in.nk * c->Dv);
  float *want_dq = nans(in.nq * c->D), *want_dk = nans(in.nk * c->D), *want_dv = nans(in.nk * c->Dv);
  tp_attention_backward_f32(&in.p, in.dy, in.q, in.k, in.v, NULL, NULL, want_dq, want_dk, want_dv);
  char counts[256];
  tp_cuda_stats_take(counts, sizeof counts);
  TpKernelStatus st = tp_cuda_bf16_attention_backward_f32(&in.p, in.dy, in.q, in.k, in.v, NULL, NULL, dq, dk, dv, s);
  if (st != TP_KERNEL_OK) fail("tp_cuda_bf16_attention_backward_f32 returned %d", (int)st);
  double recomputing = tp_cuda_stats.flops[TP_FLOPS_BF16];
  test_sync();
  tp_cuda_stream_sync(s);
  compare_within("dq", dq, want_dq, in.nq * c->D, TC_GRADIENTS);
  compare_within("dk", dk, want_dk, in.nk * c->D, TC_GRADIENTS);
  compare_within("dv", dv, want_dv, in.nk * c->Dv, TC_GRADIENTS);
  check_saved_statistics(c, &in, tp_cuda_bf16_attention_f32, tp_cuda_bf16_attention_backward_f32, TP_FLOPS_BF16, dq,
                         dk, dv, recomputing, s);
  tp_cuda_stream_free(s);
  free(dq), free(dk), free(dv), free(want_dq), free(want_dk), free(want_dv);
  free_inputs(&in);
}

/* What the tensor-core entry points refuse: as the fp32 ones. */
static void tc_refusals(void) { refusals_of(tp_cuda_bf16_attention_f32, tp_cuda_bf16_attention_backward_f32); }

static void forward(const Case *c) {
  Inputs in = make_inputs(c);
  TpStream *s = tp_cuda_stream_new();
  int64_t total = c->past_len + c->kv_len, nt = c->batch * c->kv_heads * total;
  float *y = nans(in.nq * c->Dv), *want = nans(in.nq * c->Dv);
  float *pk = c->present ? nans(nt * c->D) : NULL, *pv = c->present ? nans(nt * c->Dv) : NULL;
  float *want_pk = c->present ? nans(nt * c->D) : NULL, *want_pv = c->present ? nans(nt * c->Dv) : NULL;
  tp_attention_f32(&in.p, in.q, in.k, in.v, in.past_k, in.past_v, want, want_pk, want_pv, NULL, NULL);
  float *y2 = nans(in.nq * c->Dv), *lse = nans(in.nq), *want_lse = nans(in.nq);
  TpKernelStatus st = tp_cuda_attention_f32(&in.p, in.q, in.k, in.v, in.past_k, in.past_v, y, pk, pv, NULL, NULL, s);
  if (st != TP_KERNEL_OK) fail("tp_cuda_attention_f32 returned %d", (int)st);
  st = tp_cuda_attention_f32(&in.p, in.q, in.k, in.v, in.past_k, in.past_v, y2, NULL, NULL, NULL, lse, s);
  if (st != TP_KERNEL_OK) fail("tp_cuda_attention_f32 (with lse) returned %d", (int)st);
  test_sync();
  tp_cuda_stream_sync(s);
  compare("y", y, want, in.nq * c->Dv);
  check_close("y (with lse)", y2, y, in.nq * c->Dv, (Tolerance){0, 0});
  /* the CPU kernel's lse, and the reference's from its scores */
  float *cpu_y = nans(in.nq * c->Dv), *cpu_lse = nans(in.nq), *ref_lse = reference_lse(&in, total);
  tp_attention_f32(&in.p, in.q, in.k, in.v, in.past_k, in.past_v, cpu_y, want_pk, want_pv, NULL, cpu_lse);
  check_close("cpu y (with lse)", cpu_y, want, in.nq * c->Dv, (Tolerance){0, 0});
  compare_within("cpu lse", cpu_lse, ref_lse, in.nq, LSE);
  compare_within("lse", lse, cpu_lse, in.nq, LSE);
  free(y2), free(lse), free(want_lse), free(cpu_y), free(cpu_lse), free(ref_lse);
  if (c->present) {
    check_close("present_k", pk, want_pk, nt * c->D, (Tolerance){0, 0});
    check_close("present_v", pv, want_pv, nt * c->Dv, (Tolerance){0, 0});
  }
  tp_cuda_stream_free(s);
  free(y), free(want);
  release(pk), release(pv), release(want_pk), release(want_pv);
  free_inputs(&in);
}

static void backward(const Case *c) {
  Inputs in = make_inputs(c);
  TpStream *s = tp_cuda_stream_new();
  float *dq = nans(in.nq * c->D), *dk = nans(in.nk * c->D), *dv = nans(in.nk * c->Dv);
  float *want_dq = nans(in.nq * c->D), *want_dk = nans(in.nk * c->D), *want_dv = nans(in.nk * c->Dv);
  tp_attention_backward_f32(&in.p, in.dy, in.q, in.k, in.v, NULL, NULL, want_dq, want_dk, want_dv);
  char counts[256];
  tp_cuda_stats_take(counts, sizeof counts);
  TpKernelStatus st = tp_cuda_attention_backward_f32(&in.p, in.dy, in.q, in.k, in.v, NULL, NULL, dq, dk, dv, s);
  if (st != TP_KERNEL_OK) fail("tp_cuda_attention_backward_f32 returned %d", (int)st);
  double recomputing = tp_cuda_stats.flops[TP_FLOPS_F32];
  test_sync();
  tp_cuda_stream_sync(s);
  compare("dq", dq, want_dq, in.nq * c->D);
  compare("dk", dk, want_dk, in.nk * c->D);
  compare("dv", dv, want_dv, in.nk * c->Dv);
  check_saved_statistics(c, &in, tp_cuda_attention_f32, tp_cuda_attention_backward_f32, TP_FLOPS_F32, dq, dk, dv,
                         recomputing, s);
  /* the CPU's gradients do not depend on y and lse */
  float *y = nans(in.nq * c->Dv), *lse = nans(in.nq), *cq = nans(in.nq * c->D), *ck = nans(in.nk * c->D),
        *cv = nans(in.nk * c->Dv);
  tp_attention_f32(&in.p, in.q, in.k, in.v, NULL, NULL, y, NULL, NULL, NULL, lse);
  tp_attention_backward_f32(&in.p, in.dy, in.q, in.k, in.v, y, lse, cq, ck, cv);
  check_close("cpu dq (saved lse, bits)", cq, want_dq, in.nq * c->D, (Tolerance){0, 0});
  check_close("cpu dk (saved lse, bits)", ck, want_dk, in.nk * c->D, (Tolerance){0, 0});
  check_close("cpu dv (saved lse, bits)", cv, want_dv, in.nk * c->Dv, (Tolerance){0, 0});
  free(y), free(lse), free(cq), free(ck), free(cv);
  tp_cuda_stream_free(s);
  free(dq), free(dk), free(dv), free(want_dq), free(want_dk), free(want_dv);
  free_inputs(&in);
}

/* A NULL gradient is skipped, the others still written: dk alone, then dq alone. */
static void null_gradients(void) {
  Inputs in = make_inputs(&GQA_CAUSAL);
  const Case *c = &GQA_CAUSAL;
  TpStream *s = tp_cuda_stream_new();
  float *dq = nans(in.nq * c->D), *dk = nans(in.nk * c->D);
  float *want_dq = nans(in.nq * c->D), *want_dk = nans(in.nk * c->D);
  tp_attention_backward_f32(&in.p, in.dy, in.q, in.k, in.v, NULL, NULL, want_dq, want_dk, NULL);
  if (tp_cuda_attention_backward_f32(&in.p, in.dy, in.q, in.k, in.v, NULL, NULL, NULL, dk, NULL, s) !=
          TP_KERNEL_OK ||
      tp_cuda_attention_backward_f32(&in.p, in.dy, in.q, in.k, in.v, NULL, NULL, dq, NULL, NULL, s) != TP_KERNEL_OK)
    fail("tp_cuda_attention_backward_f32 refused NULL gradients");
  test_sync();
  tp_cuda_stream_sync(s);
  compare("dk alone", dk, want_dk, in.nk * c->D);
  compare("dq alone", dq, want_dq, in.nq * c->D);
  tp_cuda_stream_free(s);
  free(dq), free(dk), free(want_dq), free(want_dk);
  free_inputs(&in);
}

static void refusals(void) { refusals_of(tp_cuda_attention_f32, tp_cuda_attention_backward_f32); }

#define CASE_TESTS(name, c)                                                                                         \
  static void name##_fwd(void) { forward(&c); }                                                                     \
  static void name##_bwd(void) { backward(&c); }                                                                    \
  static void tc_##name##_fwd(void) { tc_forward(&c); }                                                             \
  static void tc_##name##_bwd(void) { tc_backward(&c); }
CASE_TESTS(one, ONE)
CASE_TESTS(gqa_causal, GQA_CAUSAL)
CASE_TESTS(mqa_packed, MQA_PACKED)
CASE_TESTS(slice, SLICE)
CASE_TESTS(slice_packed, SLICE_PACKED)
CASE_TESTS(window, WINDOW)
CASE_TESTS(softcap, SOFTCAP)
CASE_TESTS(bool_mask, BOOL_MASKED)
CASE_TESTS(f32_mask, F32_MASKED)
CASE_TESTS(no_key, NO_KEY)
CASE_TESTS(d128, D128)
CASE_TESTS(d256, D256)
CASE_TESTS(dv_differs, DV_DIFFERS)
CASE_TESTS(f32_mask_full, F32_MASK_FULL)
CASE_TESTS(bool_mask_rows, BOOL_MASK_ROWS)
CASE_TESTS(long_window, LONG_WINDOW)
CASE_TESTS(no_keys_at_all, NO_KEYS_AT_ALL)
static void past_fwd(void) { forward(&PAST); }
static void past_scratch_fwd(void) { forward(&PAST_SCRATCH); }
static void tc_past_fwd(void) { tc_forward(&PAST); }
static void tc_past_scratch_fwd(void) { tc_forward(&PAST_SCRATCH); }

/* one ctest each (tests/cuda/CMakeLists.txt reads the names from here) */
static const CudaTest TESTS[] = {
    {"attention_one_fwd", one_fwd},
    {"attention_one_bwd", one_bwd},
    {"attention_gqa_causal_fwd", gqa_causal_fwd},
    {"attention_gqa_causal_bwd", gqa_causal_bwd},
    {"attention_mqa_packed_fwd", mqa_packed_fwd},
    {"attention_mqa_packed_bwd", mqa_packed_bwd},
    {"attention_slice_fwd", slice_fwd},
    {"attention_slice_bwd", slice_bwd},
    {"attention_slice_packed_fwd", slice_packed_fwd},
    {"attention_slice_packed_bwd", slice_packed_bwd},
    {"attention_window_fwd", window_fwd},
    {"attention_window_bwd", window_bwd},
    {"attention_softcap_fwd", softcap_fwd},
    {"attention_softcap_bwd", softcap_bwd},
    {"attention_bool_mask_fwd", bool_mask_fwd},
    {"attention_bool_mask_bwd", bool_mask_bwd},
    {"attention_f32_mask_fwd", f32_mask_fwd},
    {"attention_f32_mask_bwd", f32_mask_bwd},
    {"attention_no_key_fwd", no_key_fwd},
    {"attention_no_key_bwd", no_key_bwd},
    {"attention_d128_fwd", d128_fwd},
    {"attention_d128_bwd", d128_bwd},
    {"attention_d256_fwd", d256_fwd},
    {"attention_d256_bwd", d256_bwd},
    {"attention_dv_differs_fwd", dv_differs_fwd},
    {"attention_dv_differs_bwd", dv_differs_bwd},
    {"attention_f32_mask_full_fwd", f32_mask_full_fwd},
    {"attention_f32_mask_full_bwd", f32_mask_full_bwd},
    {"attention_bool_mask_rows_fwd", bool_mask_rows_fwd},
    {"attention_bool_mask_rows_bwd", bool_mask_rows_bwd},
    {"attention_long_window_fwd", long_window_fwd},
    {"attention_long_window_bwd", long_window_bwd},
    {"attention_no_keys_at_all_fwd", no_keys_at_all_fwd},
    {"attention_no_keys_at_all_bwd", no_keys_at_all_bwd},
    {"attention_past_fwd", past_fwd},
    {"attention_past_scratch_fwd", past_scratch_fwd},
    {"attention_null_gradients_bwd", null_gradients},
    {"attention_refusals", refusals},
    {"attention_tc_one_fwd", tc_one_fwd},
    {"attention_tc_one_bwd", tc_one_bwd},
    {"attention_tc_gqa_causal_fwd", tc_gqa_causal_fwd},
    {"attention_tc_gqa_causal_bwd", tc_gqa_causal_bwd},
    {"attention_tc_mqa_packed_fwd", tc_mqa_packed_fwd},
    {"attention_tc_mqa_packed_bwd", tc_mqa_packed_bwd},
    {"attention_tc_slice_fwd", tc_slice_fwd},
    {"attention_tc_slice_bwd", tc_slice_bwd},
    {"attention_tc_slice_packed_fwd", tc_slice_packed_fwd},
    {"attention_tc_slice_packed_bwd", tc_slice_packed_bwd},
    {"attention_tc_window_fwd", tc_window_fwd},
    {"attention_tc_window_bwd", tc_window_bwd},
    {"attention_tc_softcap_fwd", tc_softcap_fwd},
    {"attention_tc_softcap_bwd", tc_softcap_bwd},
    {"attention_tc_bool_mask_fwd", tc_bool_mask_fwd},
    {"attention_tc_bool_mask_bwd", tc_bool_mask_bwd},
    {"attention_tc_f32_mask_fwd", tc_f32_mask_fwd},
    {"attention_tc_f32_mask_bwd", tc_f32_mask_bwd},
    {"attention_tc_no_key_fwd", tc_no_key_fwd},
    {"attention_tc_no_key_bwd", tc_no_key_bwd},
    {"attention_tc_d128_fwd", tc_d128_fwd},
    {"attention_tc_d128_bwd", tc_d128_bwd},
    {"attention_tc_d256_fwd", tc_d256_fwd},
    {"attention_tc_d256_bwd", tc_d256_bwd},
    {"attention_tc_dv_differs_fwd", tc_dv_differs_fwd},
    {"attention_tc_dv_differs_bwd", tc_dv_differs_bwd},
    {"attention_tc_f32_mask_full_fwd", tc_f32_mask_full_fwd},
    {"attention_tc_f32_mask_full_bwd", tc_f32_mask_full_bwd},
    {"attention_tc_bool_mask_rows_fwd", tc_bool_mask_rows_fwd},
    {"attention_tc_bool_mask_rows_bwd", tc_bool_mask_rows_bwd},
    {"attention_tc_long_window_fwd", tc_long_window_fwd},
    {"attention_tc_long_window_bwd", tc_long_window_bwd},
    {"attention_tc_no_keys_at_all_fwd", tc_no_keys_at_all_fwd},
    {"attention_tc_no_keys_at_all_bwd", tc_no_keys_at_all_bwd},
    {"attention_tc_past_fwd", tc_past_fwd},
    {"attention_tc_past_scratch_fwd", tc_past_scratch_fwd},
    {"attention_tc_refusals", tc_refusals},
};

int main(int argc, char **argv) {
  return run_named_test("test_cuda_attention", TESTS, sizeof TESTS / sizeof *TESTS, argc, argv);
}
