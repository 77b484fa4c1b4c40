/* Code generation: the memory plan of a training module and the C program it becomes.
 *
 * codegen/memory.c decides where every value of a (staged) module lives while a step runs:
 * parameters and their gradients in the trainer's buffers (TpStepIO), constants in static
 * arrays, token ids in the trainer's batch, and every activation and activation gradient
 * at an offset of one of its stage's two regions: the microbatch's arena, for what a
 * microbatch keeps from one of its units to a later one, and the transient region, for
 * what lives inside one unit, which the rank's units share whatever their microbatch. Each
 * region is placed by liveness so that buffers whose lifetimes do not overlap share bytes.
 * The plan.c that runs it (see runtime/train/plan.h for the interface it implements) is
 * written in three steps: codegen/lower.c lowers each unit's ops
 * to kernel calls on those memory slots, codegen/outline.c finds the runs units share, and
 * codegen/emit_c.c prints them (codegen/plan_tables.c the TpPlan tables). */
#ifndef TOKPIPE_CODEGEN_H
#define TOKPIPE_CODEGEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "../ir/ir.h"
#include "../passes/planner/schedule.h"
#include "rank_memory.h"

/* Arena offsets and buffer sizes are multiples of this (a cache line, SIMD-friendly). */
#define TP_ARENA_ALIGN 64

typedef enum {
  TP_MEM_NONE,    /* not stored: an absent value, or one no op of the plan touches */
  TP_MEM_ARENA,   /* at `offset` in a region of `stage`: its arena, or its transient region */
  TP_MEM_VIEW,    /* the bytes of value `index` (a Reshape shares its operand's data) */
  TP_MEM_PARAM,   /* io->param[index] */
  TP_MEM_GRAD,    /* io->grad[index]: the gradient of parameter `index` */
  TP_MEM_CONST,   /* a static array of the generated program */
  TP_MEM_TOKENS,  /* io->tokens */
  TP_MEM_TARGETS, /* io->targets */
  /* &io->loss_scale: the backward's seed under fp16 (store-fp16's input) */
  TP_MEM_LOSS_SCALE,
} TpMemKind;

typedef struct {
  TpMemKind kind;
  int stage;       /* TP_MEM_ARENA */
  bool transient;  /* TP_MEM_ARENA: in the transient region, else in the arena */
  int64_t offset;  /* TP_MEM_ARENA: bytes from its region's start */
  int64_t bytes;   /* TP_MEM_ARENA: the buffer's size, rounded up to TP_ARENA_ALIGN */
  int index;       /* TP_MEM_VIEW: the value; TP_MEM_PARAM, TP_MEM_GRAD: the parameter */
  int first, last; /* TP_MEM_ARENA: the live range, positions in the stage's op order */
  /* TP_MEM_ARENA in a split plan: the latest position of a reader in an input part (-1:
   * none), which a run may put after a weight part that the op order puts later */
  int last_input;
  bool bf16; /* TP_MEM_ARENA: an f32 result its kernel writes in bf16 (TpMemoryOptions) */
} TpMemSlot;

/* The boundary messages of a stage, per slice (see runtime/train/plan.h). */
typedef enum { TP_MSG_RECV_ACT, TP_MSG_SEND_ACT, TP_MSG_RECV_GRAD, TP_MSG_SEND_GRAD, TP_MSG_COUNT } TpMsgKind;

typedef struct {
  int n;
  int *values; /* in message order; a receive lists the boundary copy, a send its operand
                  (both in their stage's arena, alive for the whole microbatch) */
} TpMemMessage;

typedef struct {
  int nstages;
  int nslices;          /* token slices (1: unsliced) */
  TpMemSlot *value;     /* per value */
  TpMemSlot *scratch;   /* per op: a temporary buffer the op's kernel needs (TP_MEM_NONE) */
  int nparams;          /* PARAM values in value order: parameter i of the plan */
  int *params;          /* the value of each parameter */
  int64_t *arena_bytes; /* per stage: one microbatch's arena (what it keeps between units) */
  /* per stage: the transient region (one per rank), and the arena if it held every buffer
   * (no transient region: tp_memory_one_region) */
  int64_t *transient_bytes, *one_region_bytes;
  int64_t *live_peak;   /* per stage: the most bytes live at once (the regions' lower bound) */
  int64_t *total_bytes; /* per stage: the sum of its buffers (what no reuse would cost) */
  int *nbuffers;        /* per stage */
  int **order;          /* per stage: its ops in run order, forward then backward */
  int *norder;          /* per stage: how many */
  int *nforward;        /* per stage: how many of them are forward ops */
  /* per stage, [2 * nslices] ([3 * nslices] when split): the unit (phase, slice) runs
   * order[begin, end) at index tp_unit_index(); a stage runs forward slices 0..N-1, then
   * backward N-1..0 (split: their input parts N-1..0, then their weight parts N-1..0) */
  int **unit_begin, **unit_end;
  /* The backward units run as backward-input and backward-weight parts (the module's
   * split-backward marked ops @weight). A weight part may run any time after its input
   * part (the weight parts of one microbatch in their order): two buffers of a microbatch
   * share bytes only where one's last use precedes the other's first use in every such run
   * (first and last stay positions in the plan's order), and one inside a weight part goes
   * to the transient region. */
  bool split;
  TpMemMessage **messages; /* per stage, [TP_MSG_COUNT * nslices]: kind k of slice i at k * nslices + i */
  int *param_stage;        /* per parameter: the stage holding it (the first that reads it) */
  int *param_tied_stage;   /* per parameter: 0, or the last stage, which reads a tied copy */
} TpMemoryPlan;

/* The index of stage unit (backward, weight part, slice) in unit_begin/unit_end. */
static inline int tp_unit_index(const TpMemoryPlan *p, bool backward, bool weight, int slice) {
  return (backward ? (weight ? 2 : 1) * p->nslices : 0) + slice;
}

/* What the target's kernels read and write besides the module's values. products_read_bf16:
 * a matrix product (Linear, MatMul, Gemm and their backwards) reads the bf16 value that its
 * operand's read-back Cast widens (codegen/lower.c folds the Cast: codegen/target.h's
 * tp_target_reads_bf16), so that value lives until the product. bf16_results (NULL: none):
 * per value, an f32 result that its kernel writes in bf16 for the products reading it
 * (codegen/lower.h's tp_lower_memory_options), so its buffer holds 2 bytes an element. */
typedef struct {
  bool products_read_bf16;
  const bool *bf16_results;
} TpMemoryOptions;

/* Plans the module's memory for a target reading as o says (NULL: the module's values only).
 * Reports what the plan cannot hold (a value crossing stages, a parameter that is not f32,
 * ...) as internal errors, since the passes should not produce it. On success *plan owns
 * arrays freed by tp_memory_plan_free. */
int tp_plan_memory(const TpModule *m, const TpMemoryOptions *o, TpMemoryPlan *plan, TpDiag *d);
void tp_memory_plan_free(TpMemoryPlan *plan);
/* Places stage s's buffers all in its arena (transient_bytes[s] 0, arena_bytes[s]
 * one_region_bytes[s]): for a rank keeping one microbatch at a time, whose arena may reuse
 * the bytes a transient region would add. tp_pipeline_build decides. */
void tp_memory_one_region(const TpModule *m, TpMemoryPlan *plan, int s);

/* The bound on token ids (runtime/train/plan.h's token_limit): the fewest rows of every
 * table that the token ids or the targets index (Embedding and Gather tables, the classes
 * of a loss), following them through ops that move ids unchanged (Slice, Reshape, Concat,
 * ...); a vocabulary-parallel table or loss counts the whole vocabulary's, not one tensor
 * rank's range. `what` gets the phrase naming it ("the 100 rows of table 'wte'"). 0: none
 * found. */
int64_t tp_token_limit(const TpModule *m, const TpMemoryPlan *plan, char *what, size_t what_size);
/* The classes of loss op `op` (CrossEntropy, SoftmaxCrossEntropyLoss or
 * NegativeLogLikelihoodLoss): a vocabulary-parallel CrossEntropy's logits hold one tensor
 * rank's range of them, its statistics operand (2 P + 1 columns) says how many ranges. */
int64_t tp_loss_classes(const TpModule *m, int op);

/* The rows of the buffer a token slice's K/V context v lives in (Concat {context_rows}):
 * attention reads it in place with TpAttention.kv_rows; 0 for any other value. */
int64_t tp_context_rows(const TpModule *m, int v);

/* Scratch bytes op `op` needs besides its operands and results (0 for most ops). */
int64_t tp_op_scratch_bytes(const TpModule *m, int op);

/* ---- the pipeline (codegen/pipeline.c) ----
 * How a staged, sliced plan runs a step: M microbatches per replica, D replicas, and the
 * schedule (passes/planner/schedule.h) of every stage's rank over the (microbatch, slice)
 * units, verified when built; from it the arenas each rank keeps alive and its memory. */
typedef struct {
  int microbatches; /* M (>= 1) */
  int dp;           /* D (>= 1) */
  TpScheduleKind kind;
  TpPrecision precision; /* how parameters, gradients and activations are stored */
  int zero;              /* 1: the D replicas each keep 1/D of the optimizer state (ZeRO-1) */
  int chunks;            /* interleaved: virtual stages per rank (V >= 2; the memory plan's
                            stages are S * V); 0 or 1 otherwise */
} TpPipelineOptions;

typedef struct {
  TpPipelineOptions o;
  TpSchedule schedule;
  bool tied;            /* a parameter is held by the first and the last stage */
  int tensor;           /* N: the tensor ranks of each stage (1: none); the figures below
                           are one tensor rank's (its parts of the split parameters) */
  int64_t *whole;       /* per stage: parameters, gradients and AdamW state as --tensor 1
                           would hold them (the split parameters whole) */
  int chunks;           /* V: virtual stages per rank (1 unless interleaved) */
  int *arenas;          /* per (virtual) stage: microbatch arenas alive at once (mb uses
                           mb % arenas) */
  TpRankMemory *memory; /* per rank (stage k < S, running virtual stages k, k + S, ...):
                           codegen/rank_memory.h */
  /* per rank: what `memory` was counted from (kept: the arena, transient: the region) */
  TpRankMemoryInput *input;
} TpPipeline;

/* The rank that runs (virtual) stage s, and s's chunk on it. */
static inline int tp_pipeline_rank(const TpPipeline *pl, int s) { return s % pl->schedule.stages; }
static inline int tp_pipeline_chunk(const TpPipeline *pl, int s) { return s / pl->schedule.stages; }

/* Builds and verifies the schedule (a schedule that fails verification is a compiler bug:
 * TP_ERR_INTERNAL) and the per-rank memory, settling each stage's layout in mem: arenas x
 * kept + transient region, or arenas x one region (tp_memory_one_region) where that is no
 * more bytes. o NULL: one microbatch, one replica, gpipe. */
int tp_pipeline_build(const TpModule *m, TpMemoryPlan *mem, const TpPipelineOptions *o, TpPipeline *pl, TpDiag *d);
void tp_pipeline_free(TpPipeline *pl);
/* The module's tensor group size: --tensor (m->tensor), or for a module read back from
 * text, the ranks its split parameters were split over; 1 without. */
int tp_tensor_ranks(const TpModule *m);
/* An input error for every rank whose peak exceeds max_bytes, naming the rank, by how much,
 * the limit (`limit` names it: "--max-memory") and what takes the bytes; hint (or NULL)
 * ends the line. */
int tp_pipeline_check_memory(const TpPipeline *pl, int64_t max_bytes, const char *limit, const char *hint,
                             TpDiag *d);

/* `tokpipec --emit=memory`: per stage its arena (kept), transient region, live peak and
 * buffers, then the totals of parameters, gradients, optimizer state (AdamW: two moments
 * per parameter) and activations; with a pipeline (may be NULL), each rank's peak too. */
void tp_print_memory(const TpModule *m, const TpMemoryPlan *plan, const TpPipeline *pl, FILE *out);

/* A profiling probe (tokpipec --profile-grid, runtime/train/plan.h "Profiling probes"):
 * the model compiled again, after the same passes and with the same stage cuts, for one
 * microbatch sliced as [c, l, rest] (empty slices dropped). tp_emit_c writes, per stage,
 * the forwards of its context slices and the forward and backward of the probed slice, as
 * probeP_* functions whose parameter indices are the main module's (matched by name). */
typedef struct {
  const TpModule *m;
  int64_t l, c;
} TpEmitProbe;

typedef struct {
  const char *model;                 /* the ONNX file compiled: the trainer's default --init */
  const char *version;               /* tokpipec's version, recorded in the plan */
  const TpPipelineOptions *pipeline; /* NULL: one microbatch, one replica, gpipe */
  const char *slicing;               /* how the token slicing was chosen, for the header (or NULL) */
  int nprobes;                       /* profiling probes (0: none, and the plan has no probe tables) */
  const TpEmitProbe *probes;
  const int *stage_cuts; /* with probes: [nstages], the first layer of each stage */
  const char *target;    /* the kernel table (codegen/target.h): NULL (cpu), "cpu", "cuda" */
  const char *precision; /* the target's precision (NULL: its first; cuda: "fp32", "bf16") */
  bool no_epilogues;     /* tokpipec --no-fuse: the products run no Gelu epilogue (lower.h) */
} TpEmitOptions;

/* Writes the C training program of module m (after the training pipeline: loss, gradients,
 * op placement) to out. An op the code generator cannot emit is an internal error naming
 * it; nothing is written to out then. */
int tp_emit_c(const TpModule *m, const TpEmitOptions *o, FILE *out, TpDiag *d);

#endif
