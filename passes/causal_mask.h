/* The causal-mask prover (passes/causal_mask.c): whether an attention's mask, evaluated from
 * its constant data at every score position, hides exactly the keys after each query (and,
 * for a sliding window, those out of it), so the attention may run as causal and the
 * sequence be sliced. raise-transformer raises what it proves; insert-token-dim names why
 * an attention is not causal (tp_attention_unproven, ir/ir.h). */
#ifndef TOKPIPE_PASSES_CAUSAL_MASK_H
#define TOKPIPE_PASSES_CAUSAL_MASK_H

#include "../ir/ir.h"

enum { TP_SCORE_CHAIN_MAX = 32 };

/* A primitive attention: the score chain from the product Q K^T to its Softmax, and the
 * product P V after it. */
typedef struct {
  int softmax, product, pv;      /* the Softmax, the MatMuls Q K^T and P V */
  int cap;                       /* the soft-cap's last op, Mul(Tanh(..), c), a step; -1: none */
  double softcap;                /* its c */
  int steps[TP_SCORE_CHAIN_MAX]; /* the score chain's ops, from the product to the Softmax */
  int slot[TP_SCORE_CHAIN_MAX];  /* which operand of each carries the scores */
  int nsteps;
  TpDType dt;
  int64_t B, H, T, BH; /* B batch rows, H heads (0 until a form shows them), T tokens */
  bool inner;          /* the heads inside the queries: [B, T, H, T] and [B, T*H, T]
                               (GPT-BigCode's multi-query), not [B, H, T, T], [B*H, T, T] */
} TpScoreChain;

/* What the attention computes, proven from its chain's constants. */
typedef struct {
  double scale;
  double softcap; /* 0: none */
  int64_t window; /* 0: none */
  bool biased;    /* some visible position has an additive bias */
} TpCausalProof;

/* The proofs made so far in one run of raise-transformer: the layers of a model usually
 * share one mask, which is then evaluated once. Zero-initialised; freed by
 * tp_causal_memo_free. */
typedef struct {
  struct TpProven *at;
  int n;
} TpCausalMemo;
void tp_causal_memo_free(TpCausalMemo *memo);

/* Proves the attention at Softmax `softmax` causal: its chain *c and proof *pr; NULL, or
 * why it is not causal attention (a module-owned string naming the op or the mask values
 * that failed). memo (may be NULL) gives and keeps proofs. With `bias` non-NULL and a
 * biased proof, *bias is a new f32 CONST [nb|1, nh|1, T|1, T] of the additive bias (0
 * where masked), named after the P V product's result, at the Softmax's origin; else -1. */
const char *tp_prove_causal_attention(TpModule *m, int softmax, TpCausalMemo *memo, TpScoreChain *c,
                                      TpCausalProof *pr, int *bias);

/* The heads of operand t of a product over the scores of c: [B, h, ..] (4-D) or [B*H, ..]
 * (3-D, H heads); -1 if its batch is not the scores'. */
int64_t tp_score_heads(const TpScoreChain *c, const TpType *t);

/* The mask [.., T, T] of an imported Attention over scores of dtype dt, proven causal from
 * its values (bool: false hides; float: at most a bound so low the softmax gives it weight
 * 0 hides, anything else is an additive bias): whether it hides exactly the keys after each
 * query and, with a sliding window, those out of it (*window keys; 0: none). *bias is the
 * additive bias at the visible positions, malloc'ed f32 of the mask's elements (0 where
 * hidden), or NULL when there is none. A bias must be f32 constant data, no parameter's: a
 * parameter would train, frozen into the attention it would not. */
bool tp_prove_causal_mask(TpModule *m, int mask, TpDType dt, int64_t T, int64_t *window, float **bias);

#endif
