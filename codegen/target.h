/* Code generation targets: how each kernel of runtime/kernels/kernels.def is spelled in a generated
 * plan for one kind of device (its function's name, the header declaring it, and how each
 * field of the bound argument struct is printed as an argument of its call), built from the
 * kernel's row, and how the plan reaches memory that a device target's host cannot read.
 * codegen/lower.c binds every op (bind/bind.h) and lowers the call through the chosen
 * target's table; codegen/emit_c.c prints it. Targets: cpu (runtime/cpu), and cuda
 * (runtime/cuda/ops.h) in the precisions fp32, fp16 and bf16 (bf16 matrix products, whose
 * operands may be bf16 values as they are stored). */
#ifndef TOKPIPE_CODEGEN_TARGET_H
#define TOKPIPE_CODEGEN_TARGET_H

#include <stdbool.h>
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
  TP_ARG_STREAM,    /* no field: the unit's stream, io->stream (device targets) */
} TpArgKind;

typedef struct {
  TpArgKind kind;
  size_t offset, aux; /* in TpBound */
  /* a matrix product's multiplied operand (kernels.def's OPERAND) that the target reads as
   * a view of f32 or bf16 (its products take bf16 operands): codegen/lower.c may pass the
   * stored bf16 value a Cast would widen */
  bool operand;
} TpArgSpelling;

#define TP_MAX_KERNEL_ARGS 13

typedef struct {
  char name[48]; /* the function */
  int header;    /* index into the target's headers */
  int nargs;
  TpArgSpelling args[TP_MAX_KERNEL_ARGS];
} TpKernelSpelling;

typedef struct {
  const char *name;           /* as --target spells it */
  const char *precision;      /* as --precision spells it; NULL: the target has no choice */
  const char *const *headers; /* included in this order, those a plan uses */
  int nheaders;
  const TpKernelSpelling *kernels; /* [TP_K_COUNT] */
  const char *build;               /* the plan's build command, for its header comment */
  /* A device target's plan holds device pointers in its views (TpStepIO: the arena,
   * parameters, gradients, tokens, targets); NULL for the cpu, whose plan reads them: */
  const char *device; /* the TpPlanDevice of TpPlan.device, declared in headers[device_header] */
  int device_header;
  const char *constant;     /* F(io->stream, array, sizeof array): the device copy of a constant */
  const char *copy_to_host; /* F(host, device, bytes, io->stream): queues a copy to the host (the loss) */
  const char *fill_i64;     /* F(dst, value, io->stream): queues storing one int64 (TensorRank) */
  /* Its products run a tanh-approximate Gelu, or its gradient, in their epilogue
   * (cuBLASLt's): codegen/lower.c fuses such a Gelu into the Linear before it. */
  bool gelu_epilogues;
} TpTarget;

/* Do the target's matrix products read bf16 operands as they are stored (an OPERAND
 * argument read as a view: codegen/lower.c folds read-back Casts into them)? */
bool tp_target_reads_bf16(const TpTarget *t);
/* The target named `name` in `precision` (NULL: its first, fp32), or NULL. */
const TpTarget *tp_target_find(const char *name, const char *precision);
/* The known targets' names, ", "-separated, for a usage message. */
const char *tp_target_names(void);
/* The precisions of target `name`, ", "-separated ("" when it has no choice). */
const char *tp_target_precisions(const char *name);

#endif
