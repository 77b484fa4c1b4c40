/* What a token-axes rule (TpOpRules.token_axes) works with: the relations it records
 * between its values' axes (TpOpAxes, ir/ir.h). An op relates axis a1 of value v1 to axis
 * a2 of value v2 (a link) when index t along both is the same token, whatever the data, and
 * marks the axes it combines elements along (a mix, with the verb the error prints:
 * "normalises over"). passes/insert_token_dim.c follows the token axis through the links
 * and refuses an op that mixes it; passes/rebatch.c follows the batch axis. */
#ifndef TOKPIPE_OPS_AXES_H
#define TOKPIPE_OPS_AXES_H

#include "rules.h"

static inline const TpType *value_type(const TpModule *m, int v) { return &m->values[v].type; }

static inline void axes_link(TpOpAxes *x, int v1, int a1, int v2, int a2) {
  if (v1 < 0 || v2 < 0) return;
  TP_ASSERT(x->nlinks < TP_MAX_AXIS_LINKS);
  x->link[x->nlinks][0] = (TpAxis){v1, a1};
  x->link[x->nlinks++][1] = (TpAxis){v2, a2};
}

static inline void axes_mix(TpOpAxes *x, int v, int a, const char *why) {
  if (v < 0) return;
  TP_ASSERT(x->nmixes < TP_MAX_AXIS_MIXES);
  x->mix_why[x->nmixes] = why;
  x->mix[x->nmixes++] = (TpAxis){v, a};
}

/* Operand v broadcast (numpy, right-aligned) to result r: the axes it does not stretch. */
static inline void axes_broadcast(const TpModule *m, TpOpAxes *x, int r, int v) {
  if (v < 0 || r < 0) return;
  const TpType *tr = value_type(m, r), *tv = value_type(m, v);
  for (int k = 0; k < tv->rank; k++) {
    int b = k + tr->rank - tv->rank;
    if (b >= 0 && tv->dims[k] == tr->dims[b]) axes_link(x, v, k, r, b);
  }
}

/* Axis k of v1 is axis k of v2, for every axis both have. */
static inline void axes_all(const TpModule *m, TpOpAxes *x, int v1, int v2) {
  if (v1 < 0 || v2 < 0) return;
  for (int k = 0; k < value_type(m, v1)->rank && k < value_type(m, v2)->rank; k++) axes_link(x, v1, k, v2, k);
}

/* Elementwise ops' rule (ops/elementwise.c): every operand broadcast to the result. */
void tp_axes_elementwise(const TpModule *m, int op, TpOpAxes *x);

#endif
