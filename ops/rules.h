/* An op's meaning, in one place: the hooks each pass calls for an op, gathered per op in
 * one TpOpRules defined in the op's family file (ops/<family>.c), e.g. tp_rules_Softmax in
 * ops/activation.c. The passes are drivers: they walk the module and call
 * tp_op_rules[kind]'s hooks. A hook left NULL takes the driver's generic case (named at
 * each field).
 *
 * ops/README.md lists the families and which file holds which op. */
#ifndef TOKPIPE_OPS_RULES_H
#define TOKPIPE_OPS_RULES_H

#include "../ir/ir.h"

typedef struct TpInferCtx TpInferCtx; /* ops/infer.h */
typedef struct TpGradCtx TpGradCtx;   /* ops/grad.h */
typedef struct TpGradOp TpGradOp;
typedef struct TpSplitCtx TpSplitCtx;   /* ops/split.h */
typedef struct TpOpBinding TpOpBinding; /* bind/bind.h */

typedef struct TpOpRules {
  /* Result types from the operands and attributes, or a check of the recorded ones
   * (ir/infer.c runs it after the arity checks). Required. */
  int (*infer)(const TpInferCtx *c);
  /* Forward FLOPs, a simple count (multiply-adds as 2) that ranks layers for
   * assign-stages; NULL: one per element of the first result. */
  double (*flops)(const TpModule *m, int op);
  /* Emits the backward ops of a forward op (passes/autodiff.c calls it when a result
   * carries a gradient and an operand needs one); NULL: "cannot differentiate". */
  void (*gradient)(TpGradCtx *a, const TpGradOp *fwd);
  /* The gradient rule takes a gradient for every result; otherwise a gradient of a result
   * after the first is an error (Split's results are its pieces). */
  bool grads_every_result;
  /* The relations between the token (and batch) axes of the op's values, and the axes it
   * combines elements along (ops/axes.h), for insert-token-dim and rebatch; NULL: unknown,
   * which stops slicing at the op. Backward ops have none: slicing runs before autodiff. */
  void (*token_axes)(const TpModule *m, int op, TpOpAxes *x);
  /* Splits the op over the tensor-parallel ranks when it reads a split value (ops/split.h;
   * passes/shard_tensor.c, for every op but the Linear products it splits itself); NULL:
   * the op cannot take a split operand, which shard-tensor refuses. */
  int (*tensor_split)(TpSplitCtx *s, int op);
  /* The op's kernel binder and how its kernel takes dtypes (ops/bind.h; bind/bind.c's
   * tp_bind_op, for the interpreter and codegen); NULL: no kernel runs the op. */
  const TpOpBinding *bind;
} TpOpRules;

/* One rule set per op of ir/ops.def, named tp_rules_<Op>. */
#define TP_OP(name, min_in, max_in, min_out, max_out, traits) extern const TpOpRules tp_rules_##name;
#include "../ir/ops.def"

/* The elementwise trait: the shape rule, token axes and tensor split every elementwise op
 * shares (ops/infer.h, ops/axes.h, ops/split.h), for a rule set's initializer. */
#define TP_ELEMENTWISE_RULES                                                                                        \
  .infer = tp_infer_elementwise, .token_axes = tp_axes_elementwise, .tensor_split = tp_split_elementwise

/* tp_op_rules[kind]: the rule set of every op (ops/rules.c). */
extern const TpOpRules *const tp_op_rules[TP_OP_COUNT];

/* Elements of op's first result (0 when it has none): the FLOPs of a pointwise op. */
double tp_flops_per_result(const TpModule *m, int op);

#endif
