/* What a tensor-split rule (TpOpRules.tensor_split) works with: the shard-tensor pass's
 * state (passes/shard_tensor.c, which splits the Linear products Megatron-style and calls
 * the rule of every other op that reads a split value) and its helpers. A rule splits the
 * op's result along the axis its operands' split continues in (tp_split_mark), re-infers
 * the per-rank types, or refuses naming why (tp_split_refuse). */
#ifndef TOKPIPE_OPS_SPLIT_H
#define TOKPIPE_OPS_SPLIT_H

#include "rules.h"

struct TpSplitCtx {
  TpModule *m;
  TpDiag *d;
  int ranks;
  const char *logits; /* --logits: the graph output add-loss will train (NULL: the one it finds) */
  int *axis;          /* per value: the axis split over the ranks, -1 when replicated */
  int *parts;         /* per value: how many parts that axis is cut into */
  int *copy_of;       /* per value: its TensorCopy result, -1 when none yet */
};

/* "shard-tensor cannot split op X over N tensor ranks: why" at op. */
int tp_split_refuse(TpSplitCtx *s, int op, const char *why);
/* Value v is split along axis into parts. */
void tp_split_mark(TpSplitCtx *s, int v, int axis, int parts);
/* Re-infers op's results from its (now per-rank) operands. */
int tp_split_reinfer(TpSplitCtx *s, int op);
/* Routes replicated operand i of op through a TensorCopy (its gradient summed over the
 * ranks), unless it is a constant or not a float. */
int tp_split_share_operand(TpSplitCtx *s, int op, int i);
/* Splits param w, which op alone reads, along axis into parts (of chunks chunks each). */
int tp_split_param(TpSplitCtx *s, int op, int w, int axis, int parts, int chunks);
/* The chunks of split value v: those of the fused column product it views; else 1. */
int tp_split_chunks_of(const TpSplitCtx *s, int v);
/* The axis of the result dims `out` that continues axis a of the per-rank operand dims
 * `in` (split into p parts) through a Reshape, or -1. */
int tp_split_reshape_axis(const TpType *in, const TpType *out, int a, int p);
/* A new op after `after` (its placement and origin) computing kind(in), not yet inferred;
 * add_after infers it and returns its result (-1 after an error). */
int tp_split_new_op(TpSplitCtx *s, int after, TpOpKind kind, const int *in, int nin, const char *name);
int tp_split_add_after(TpSplitCtx *s, int after, TpOpKind kind, const int *in, int nin, const char *name);

/* A norm op's first normalised axis; whether it is an RMSNorm that can normalise across
 * the ranks (a scale param of its own). */
int tp_split_norm_axis(const TpModule *m, int op);
bool tp_split_norm_splits_across(const TpModule *m, int op);
/* Attention op's bias differs per head; it is a param the op alone reads. */
bool tp_split_per_head_bias(const TpModule *m, int op);
bool tp_split_own_bias(const TpModule *m, int op);

/* Positionwise ops' rule (ops/elementwise.c, for the fused positionwise ops too): the
 * result split as the operands; `last_axis_refusal`, when set, refuses a split last axis.
 * tp_split_elementwise: none. */
int tp_split_positionwise(TpSplitCtx *s, int op, const char *last_axis_refusal);
int tp_split_elementwise(TpSplitCtx *s, int op);

#endif
