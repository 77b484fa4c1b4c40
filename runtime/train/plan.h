/* The interface between a generated training program (codegen/ writes plan.c) and the
 * trainer runtime (runtime/train/) it links against. The generated file defines one
 * `const TpPlan tp_plan` and a main() that calls tp_trainer_main(&tp_plan, argc, argv);
 * everything else (command line, data, optimizer, checkpoints, logs) is the runtime's.
 * Depends only on runtime/tensor.h, so plan.c needs no compiler headers. */
#ifndef TOKPIPE_PLAN_H
#define TOKPIPE_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "../tensor.h"

#define TP_PLAN_ABI 1

/* A trainable or frozen parameter: one ONNX initializer (or the name an exporter's
 * Identity gave a de-duplicated one). Values and gradients are f32, row-major. */
typedef struct {
  const char *name;    /* the ONNX name: what --init reads and the dumps are keyed by */
  const char *source;  /* the ONNX initializer holding its initial value (== name unless it
                          was an Identity alias of a shared initializer) */
  int rank;
  int64_t dims[TP_MAX_RANK];
  int trainable;       /* 0 if frozen (--freeze): no gradient, no update */
} TpPlanParam;

/* An ONNX initializer that the compiler replaced by a function of a parameter (weight
 * re-tying): its value is param (transposed when `transpose`, a 2-D swap). Written by
 * --export-onnx and --dump-weights/--dump-grads under its own name. */
typedef struct {
  const char *name;
  int param;
  int transpose;
} TpPlanDerived;

/* What one training step's stage functions read and write. The trainer owns all buffers. */
typedef struct {
  void *arena;            /* plan->arena_bytes[stage], 64-byte aligned, per stage */
  float *const *param;    /* param[i]: values of plan->params[i] */
  float *const *grad;     /* grad[i]: gradients, zeroed by the trainer before forward;
                             the backward functions accumulate (+=) into them */
  const int64_t *tokens;  /* [batch, seq] model input ids */
  const int64_t *targets; /* [batch, seq] the next token of each position */
  float loss;             /* set by the last stage's forward: the mean cross-entropy */
} TpStepIO;

typedef void (*TpStageFn)(TpStepIO *io);

typedef struct {
  int abi;                 /* TP_PLAN_ABI */
  const char *model;       /* the ONNX file it was compiled from (--export-onnx rewrites it
                              unless --init names another) */
  const char *tokpipec_version;
  int64_t batch, seq, vocab;
  int nparams;
  const TpPlanParam *params;
  int nderived;
  const TpPlanDerived *derived;
  int nstages;
  const size_t *arena_bytes;     /* per stage: activations and activation gradients */
  const TpStageFn *forward;      /* per stage */
  const TpStageFn *backward;     /* per stage, run in reverse stage order */
} TpPlan;

/* The trainer: parses the command line, runs training, returns the process exit code
 * (0 ok, 1 bad input, 2 bad usage). */
int tp_trainer_main(const TpPlan *plan, int argc, char **argv);

#endif
