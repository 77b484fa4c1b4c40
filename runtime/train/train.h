/* Internal to runtime/train/: the trainer's state, shared by trainer.c (command line, the
 * step loop, logs) and weights.c (initial weights, checkpoints, dumps, ONNX export). */
#ifndef TOKPIPE_TRAIN_TRAIN_H
#define TOKPIPE_TRAIN_TRAIN_H

#include <stdbool.h>
#include <stdio.h>

#include "../../ir/ir.h"
#include "plan.h"
#include "tokens.h"

typedef struct {
  const char *init, *data, *val_data, *log, *dump_grads, *dump_weights, *save, *resume,
      *export_onnx;
  int64_t steps;       /* the total; -1: one pass over the training data */
  uint64_t seed;
  int64_t val_every;   /* 0: only after the last step */
  int64_t val_batches; /* 0: every whole batch of the file, at most 20 */
  int64_t save_every;  /* 0: only after the last step */
  int64_t warmup;
  double lr, beta1, beta2, eps, weight_decay, grad_clip; /* grad_clip 0: off */
  bool cosine;
} TrainOptions;

typedef struct {
  const TpPlan *plan;
  TrainOptions o;
  TpDiag *d;
  /* per parameter; m and v are NULL for frozen ones (whose grad stays unused, zero) */
  float **param, **grad, **m, **v;
  int64_t *numel;
  void **arena; /* per stage */
  int64_t *tokens, *targets; /* [batch, seq] */
  TpTokenFile train, val;
  int64_t step;     /* steps done */
  int64_t data_pos; /* token position of the next training batch */
  uint64_t rng;     /* splitmix64 state (random init) */
} Trainer;

/* weights.c */
/* Fills the parameters: from --resume (also optimizer state, step, data position and RNG
 * state), --init (.onnx or .safetensors) or randomly from --seed. */
int train_load_weights(Trainer *t);
/* Before training: --export-onnx's source model holds every name the trainer will write. */
int train_check_export(Trainer *t);
int train_save_checkpoint(Trainer *t);
/* --dump-grads (grads) and --dump-weights: every (trainable, for grads) parameter and
 * derived initializer by ONNX name. */
int train_dump(Trainer *t, const char *path, bool grads);
int train_export_onnx(Trainer *t);
/* The folder of a checkpoint file; the checkpoint inside it. */
char *train_checkpoint_path(const char *dir);

#endif
