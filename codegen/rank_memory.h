/* The memory one rank holds during a training step: one model for the compiler
 * (codegen/pipeline.c counts it from a module's parameters and memory plan) and the
 * planner (passes/planner counts it from a model description), so that a plan the
 * planner fits is a plan tokpipec accepts.
 *
 * Per parameter element a rank holds:
 *   fp32:        the value 4, its gradient 4 (a microbatch's 4 more when M > 1),
 *                AdamW's two moments 8 / Z
 *   bf16, fp16:  the 16-bit value 2, its 16-bit gradient 2, the step's fp32 gradient
 *                sum 4, the fp32 master 4 / Z, AdamW's two moments 8 / Z
 * where Z is the replicas sharing the optimizer state and the masters (--zero 1: D, else
 * 1); a frozen parameter is its value (and under bf16, fp16 its whole fp32 master) only. Activations: the microbatches in flight keep what their
 * units pass each other (kept), and one unit at a time its working set (transient). */
#ifndef TOKPIPE_CODEGEN_RANK_MEMORY_H
#define TOKPIPE_CODEGEN_RANK_MEMORY_H

#include <stdbool.h>
#include <stdint.h>

typedef enum {
  TP_PRECISION_FP32, /* everything stored and computed in fp32 */
  TP_PRECISION_BF16, /* parameters, activations and gradients stored in bf16; fp32 masters */
  TP_PRECISION_FP16, /* as bf16 in fp16, with dynamic loss scaling */
} TpPrecision;

/* "fp32", "bf16", "fp16"; and back (false for another name). */
const char *tp_precision_name(TpPrecision p);
bool tp_precision_parse(const char *name, TpPrecision *p);
/* Bytes of one stored activation, parameter or gradient element: 4 or 2. */
int tp_precision_bytes(TpPrecision p);

typedef struct {
  int64_t trained, frozen; /* parameter elements the rank holds */
  TpPrecision precision;
  int microbatches;  /* M >= 1 */
  int zero_shards;   /* Z >= 1: the ranks that share one copy of the optimizer state */
  int64_t kept;      /* bytes one microbatch keeps from unit to unit */
  int64_t transient; /* bytes of the largest unit's own working set, one at a time */
  int arenas;        /* microbatches in flight at once */
  /* interleaved: the bytes the arenas of the rank's other virtual stages hold (their
   * arenas x kept, summed); `kept` and `arenas` are its first virtual stage's, `transient`
   * the largest of its virtual stages' (one region, which their units share) */
  int64_t chunks_kept;
} TpRankMemoryInput;

typedef struct {
  int64_t params;      /* the stored values (16-bit under bf16/fp16) */
  int64_t grads;       /* the gradients: a microbatch's and the step's sum */
  int64_t masters;     /* fp32 master weights (0 under fp32: the values are the masters) */
  int64_t state;       /* AdamW's moments */
  int64_t activations; /* arenas x kept + transient */
  int64_t peak;        /* the sum */
} TpRankMemory;

/* The model above. Every input is below 2^53; false when a sum would pass 2^63. */
bool tp_rank_memory(const TpRankMemoryInput *in, TpRankMemory *out);

#endif
