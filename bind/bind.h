/* Kernel binders: each op's attributes and operand shapes turned into its kernel's argument
 * struct (runtime/kernels/args.h), once, for both sides that run ops: the interpreter binds and
 * calls the kernel (tp_bound_run), codegen binds and prints the struct as the kernel's call
 * (codegen/target.c). A binder reads attributes, dims and dtypes, never tensor data (codegen
 * has none), and checks that the shapes fit the kernel. Adding an op: a row of
 * runtime/kernels/kernels.def if it needs a new kernel (its argument struct, function and
 * call), and its binder and its row (TpOpRules.bind) in its family's file under ops/. */
#ifndef TOKPIPE_BIND_H
#define TOKPIPE_BIND_H

#include "../ir/ir.h"
#include "../runtime/cpu/elementwise.h"
#include "../runtime/cpu/layout.h"
#include "../runtime/cpu/layout_backward.h"
#include "../runtime/cpu/loss.h"
#include "../runtime/cpu/matmul.h"
#include "../runtime/cpu/nn.h"
#include "../runtime/cpu/nn_backward.h"
#include "../runtime/cpu/reduce.h"
#include "../runtime/cpu/transformer.h"

typedef enum {
#define K(id, name, args, ...) TP_K_##id,
#include "../runtime/kernels/kernels.def"
#undef K
  TP_K_COUNT
} TpKernelId;

/* A bound op: its kernel and the kernel's arguments. The views point into the operand and
 * result arrays given to tp_bind_op, and `bad` fields at b->bad: keep those, do not copy. */
typedef struct {
  TpKernelId kernel;
  union {
#define K(id, name, args, ...) args name;
#include "../runtime/kernels/kernels.def"
#undef K
  } a;
  int64_t bad; /* where a kernel reports an index out of range */
} TpBound;

/* What an op's kernel does with operand and result dtypes. */
typedef enum {
  TP_BIND_ANY,       /* the kernel checks them itself */
  TP_BIND_F32,       /* f32 only (the training kernels) */
  TP_BIND_F32_COPY,  /* f32 kernels: the interpreter computes other floats in f32 copies */
  TP_BIND_HALF_COPY, /* the interpreter computes f16 and bf16 in f32 copies */
} TpBindDtypes;

typedef int (*TpBindFn)(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d);

/* An op kind's row: its binder (NULL: no kernel runs it), dtypes, the operands the dtype
 * rule skips (a bit each: indices, masks), and its ids operand (+1; 0: none), which the
 * flat kernels read as i64. */
typedef struct TpOpBinding {
  TpBindFn bind;
  TpBindDtypes dtypes;
  unsigned not_float;
  int ids;
} TpOpBinding;

/* An op kind's row: its rule set's (ops/, TpOpRules.bind), or one with no binder. */
const TpOpBinding *tp_op_binding(TpOpKind kind);

/* Binds op of m over the views in[] (operand i, data NULL when absent) and out[] (result
 * i). TP_OK, or an error at the op naming what does not fit. */
int tp_bind_op(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpBound *b, TpDiag *d);

/* Runs the bound kernel on the CPU: its row of kernels.def's call. */
TpKernelStatus tp_bound_run(const TpBound *b);

/* The error of a kernel's failure s, at the op. */
int tp_bound_failed(const TpModule *m, int op, const TpBound *b, const TpTensor *in, const TpTensor *out,
                    TpKernelStatus s, TpDiag *d);

#endif
