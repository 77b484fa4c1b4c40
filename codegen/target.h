/* Code generation targets: how each kernel of bind/kernels.def is spelled in a generated
 * plan for one kind of device (its function's name, the header declaring it, and how each
 * field of the bound argument struct is printed as an argument of its call), built from the
 * kernel's row. codegen/emit_c.c binds every op (bind/bind.h) and prints the call through the
 * chosen target's table; a new target (cuda) is one more table in target.c. */
#ifndef TOKPIPE_CODEGEN_TARGET_H
#define TOKPIPE_CODEGEN_TARGET_H

#include <stddef.h>

#include "../bind/bind.h"

/* How one argument of a call is printed from a field of the bound struct. The kinds up to
 * TP_ARG_DIMS print a view (the field is a TpTensor pointer). */
typedef enum {
  TP_ARG_VIEW,      /* const TpTensor *: &name (NULL when absent) */
  TP_ARG_DATA,      /* const TpTensor *: name.data (NULL when absent) */
  TP_ARG_SCALAR,    /* const TpTensor * of one f32: *(const float *)name.data */
  TP_ARG_SCRATCH,   /* TpTensor *: name.data, or the op's scratch in the arena when absent */
  TP_ARG_RANK,      /* const TpTensor *: its rank */
  TP_ARG_DIMS,      /* const TpTensor *: (const int64_t[]){its dims} */
  TP_ARG_I64,       /* int64_t */
  TP_ARG_INT,       /* int */
  TP_ARG_BOOL,      /* bool */
  TP_ARG_F32,       /* float */
  TP_ARG_F64,       /* double */
  TP_ARG_I64S,      /* const int64_t *, its length the int at `aux` */
  TP_ARG_VIEWS_IN,  /* const TpTensor * of operands: (const TpTensor[]){...}, length at `aux` */
  TP_ARG_VIEWS_OUT, /* TpTensor * of results: (TpTensor[]){...}, length at `aux` */
  TP_ARG_UNARY_OP,  /* TpUnaryOp */
  TP_ARG_BINARY_OP, /* TpBinaryOp */
  TP_ARG_ATTENTION, /* TpAttention: &(TpAttention){...}, its mask the view at `aux` */
  TP_ARG_LOSS,      /* TpLossOptions: &(TpLossOptions){...}, its weight the view at `aux` */
  TP_ARG_BAD,       /* int64_t *: &bad, the unit's */
} TpArgKind;

typedef struct {
  TpArgKind kind;
  size_t offset, aux; /* in TpBound */
} TpArgSpelling;

#define TP_MAX_KERNEL_ARGS 12

typedef struct {
  const char *name; /* the function */
  int header;       /* index into the target's headers */
  int nargs;
  TpArgSpelling args[TP_MAX_KERNEL_ARGS];
} TpKernelSpelling;

typedef struct {
  const char *name;                /* as --target spells it */
  const char *const *headers;      /* included in this order, those a plan uses */
  int nheaders;
  const TpKernelSpelling *kernels; /* [TP_K_COUNT] */
} TpTarget;

/* The target named `name`, or NULL. */
const TpTarget *tp_target_find(const char *name);
/* The known targets' names, ", "-separated, for a usage message. */
const char *tp_target_names(void);

#endif
