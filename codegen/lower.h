/* Lowering (codegen/lower.c): a run of one stage's ops, after the memory plan, turned into the
 * statements of a generated function: the views it declares with the memory each one addresses
 * (arena and transient region offsets, parameter indices, constants, the views declared before
 * it), and the kernel calls with their arguments in the target's order. Every decision about
 * what runs is made here: a Reshape that is a view runs nothing, a token slice's Concat appends
 * to its context buffer (TP_K_CONTEXT_APPEND), attention reads that buffer in place
 * (TpAttention.kv_rows), TensorCopy and AllReduce become a copy and a collective, TensorRank a
 * store, the loss a copy to io->loss. The outliner (codegen/outline.c) compares these
 * statements and codegen/emit_c.c prints them. */
#ifndef TOKPIPE_CODEGEN_LOWER_H
#define TOKPIPE_CODEGEN_LOWER_H

#include <stdbool.h>

#include "codegen.h"
#include "target.h"

/* Where the bytes of a declared view are. */
typedef enum {
  TP_ADDR_ARENA,     /* arena + n: the microbatch's arena (io->arena) */
  TP_ADDR_TRANSIENT, /* transient + n: the rank's transient region (io->transient) */
  TP_ADDR_PARAM,     /* io->param[n]: n is the plan's parameter index */
  TP_ADDR_GRAD,      /* io->grad[n] */
  TP_ADDR_CONST,     /* the static array of value n (on a device target, its device copy) */
  TP_ADDR_TOKENS,    /* io->tokens */
  TP_ADDR_TARGETS,   /* io->targets */
  TP_ADDR_VALUE,     /* the data of value n, a view declared before in the function */
  /* &io->loss_scale */
  TP_ADDR_LOSS_SCALE,
} TpAddrKind;

typedef struct {
  TpAddrKind kind;
  int64_t n;
} TpAddr;

/* One argument of a kernel call. The kinds are target.h's; TP_ARG_RANK and TP_ARG_DIMS are
 * lowered to their numbers (TP_ARG_I64, TP_ARG_I64S). */
typedef struct {
  TpArgKind kind;
  int value; /* VIEW, DATA, SCALAR, SCRATCH: the value (-1: NULL; SCRATCH: the op's
                    scratch buffer at offset i of the arena, or of the transient region
                    when `transient`) */
  bool transient;
  int64_t i; /* I64, INT, BOOL, UNARY_OP, BINARY_OP; SCRATCH without a value: offset */
  double f;  /* F32, F64 */
  int n;     /* I64S: ints[n]; VIEWS_IN, VIEWS_OUT: values[n] */
  int64_t *ints;
  int *values;
  TpAttention attention; /* ATTENTION (its pointers unused) */
  TpLossOptions loss;    /* LOSS (its weight pointer unused) */
  int aux;               /* ATTENTION: the mask, LOSS: the weight (-1: none) */
} TpLowArg;

typedef enum {
  TP_LOW_OP,         /* op `op` begins (its comment); view: a Reshape that runs nothing */
  TP_LOW_DECLARE,    /* TpTensor value = {its type, addr}; top: a value computed elsewhere */
  TP_LOW_CALL,       /* CHECK(kernel(args)) */
  TP_LOW_ALLREDUCE,  /* io->tensor_allreduce(io, value's data, count) */
  TP_LOW_RANK_STORE, /* value's i64 = io->tensor_rank, on the host */
  TP_LOW_RANK_FILL,  /* the same queued on the stream (target->fill_i64) */
  TP_LOW_LOSS_STORE, /* io->loss = value's f32, on the host */
  TP_LOW_LOSS_COPY,  /* the same queued on the stream (target->copy_to_host) */
  TP_LOW_OUTLINED,   /* the call of outlined range `call` (an index of the caller's list) */
} TpLowKind;

typedef struct {
  TpLowKind kind;
  int op;            /* OP */
  bool view;         /* OP */
  bool top;          /* DECLARE */
  int value;         /* DECLARE, ALLREDUCE, RANK_*, LOSS_* */
  TpAddr addr;       /* DECLARE */
  int64_t count;     /* ALLREDUCE: elements */
  TpKernelId kernel; /* CALL */
  int nargs;         /* CALL */
  TpLowArg *args;
  int call; /* OUTLINED */
} TpLowStmt;

/* A function body: top declarations first, then each op's, with its calls. */
typedef struct {
  TpLowStmt *stmts;
  int n, cap;
  int nops;            /* the range's ops, boundary copies left out (they run no code) */
  bool uses_arena;     /* an arena address */
  bool uses_transient; /* a transient region address */
  bool uses_bad;       /* a kernel reports ids out of range (TP_ARG_BAD) */
} TpLowFunc;

typedef struct {
  const TpModule *m;
  const TpMemoryPlan *mem;
  const TpTarget *target;
  const int *param_map; /* a probe's: per parameter of mem, the main plan's index (NULL: same) */
  int tensor;           /* the tensor group's ranks (1: none) */
  TpDiag *d;
  bool gelu_epilogues; /* fuse a tanh-approximate Gelu into the product before or after it
                          (the target's TpTarget.gelu_epilogues, unless turned off) */
} TpLowering;

/* A range of positions [begin, end) of a stage's order. */
typedef struct {
  int begin, end;
} TpLowRange;

/* Lowers positions [from, to) of stage s's order into f (which it initialises), the ranges
 * outlined[0, n) (in order, inside it) as TP_LOW_OUTLINED calls. The loss, where the range
 * computes it in a forward, is stored to io->loss at the end. An op or dtype the plan cannot
 * run is an internal error naming the op (or a user error: TensorRank without --tensor);
 * f is then partial, still to be freed. */
int tp_lower_range(const TpLowering *L, int s, bool backward, int from, int to, const TpLowRange *outlined,
                   int noutlined, TpLowFunc *f);
void tp_low_func_free(TpLowFunc *f);

/* A profiling probe's parameters (module pm, plan pp) as the plan's (m, mem): map[i], for
 * each parameter i of pp, the plan's parameter of the same ONNX name, which must be held by
 * the same stages (else an internal error: the stage cuts differ). Lowering a probe's units
 * with this map (TpLowering.param_map) addresses the plan's parameter buffers. */
int tp_lower_param_map(const TpModule *m, const TpMemoryPlan *mem, const TpModule *pm, const TpMemoryPlan *pp,
                       int *map, TpDiag *d);

/* The tokens of token slice `slice` (seq: the whole sequence), and the tokens of the slices
 * before it (its context). */
int64_t tp_slice_length(const TpModule *m, const TpMemoryPlan *mem, int slice, int64_t seq);
int64_t tp_slice_context(const TpModule *m, const TpMemoryPlan *mem, int slice, int64_t seq);

#endif
