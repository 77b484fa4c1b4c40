/* Internal to runtime/train/: the trainer's state, shared by trainer.c (command line, the
 * step loop, logs), weights.c (initial weights, checkpoints, dumps, ONNX export),
 * profile.c (--profile), the step's files (the buffers and the steps of every plan:
 * schedule.c, plan_check.c, buffers.c, messages.c, collectives.c, params.c; step.h is
 * private to them) and trace.c (--trace). Calls go one way, each using only those after it:
 *   trainer.c -> profile.c -> weights.c -> the step's files -> trace.c
 * (trainer.c also calls weights.c, the step's files and trace.c; profile.c the step's), and
 * the step's files alone reach the compute backend for the others. */
#ifndef TOKPIPE_TRAIN_TRAIN_H
#define TOKPIPE_TRAIN_TRAIN_H

#include <stdbool.h>
#include <stdio.h>

#include "../../base/diag.h"
#include "../../base/file.h"
#include "../comm/comm.h"
#include "../compute.h"
#include "../../base/atomic.h"
#include "plan.h"
#include "safetensors.h"
#include "tokens.h"

/* The most steps a run may have: steps and the step count take part in double arithmetic
 * (the learning rate schedule, AdamW's bias correction), exact up to 2^53, and a loop to
 * the limit never overflows. */
#define TRAIN_MAX_STEPS ((int64_t)1 << 53)

typedef struct {
  const char *init, *data, *val_data, *log, *dump_grads, *dump_weights, *save, *resume, *export_onnx, *trace,
      *profile;
  const char *no_decay; /* POSIX ERE: the parameters AdamW does not decay */
  int64_t steps;        /* the total; -1: one pass over the training data */
  uint64_t seed;
  int64_t val_every;   /* 0: only after the last step */
  int64_t val_batches; /* 0: every whole batch of the file, at most 20 */
  int64_t save_every;  /* 0: only after the last step */
  int64_t warmup;
  double lr, beta1, beta2, eps, weight_decay, grad_clip; /* grad_clip 0: off */
  bool cosine;
} TrainOptions;

/* A checkpoint's metadata, every field checked (no unknown key, no missing one, plain
 * decimal numbers in range, the version this runtime writes). */
typedef struct {
  int64_t step, data_position, data_tokens, batch, seq, vocab;
  uint32_t data_crc32c;
  uint64_t rng, seed;
  bool scaled; /* an fp16 plan's: its loss scaling state */
  float loss_scale;
  int64_t good_steps, skipped_steps;
} TrainCheckpointMeta;

typedef struct PipeRank PipeRank; /* step.h */
typedef struct TraceLog TraceLog; /* trace.c */

/* Host copies of parameter values, gradients and AdamW moments (per parameter; NULL
 * where absent): the values weights.c reads and writes. */
typedef struct {
  float **param, **grad, **m, **v;
} TrainHost;

/* The parameters: in an ABI 1 plan all of them, in one process. In an ABI 2 plan each
 * process holds the parameters of the stages of the ranks it hosts (held[i]): values and
 * AdamW state once per process, gradients per hosted rank (grad[i] is the step gradient
 * of the first hosted rank holding i; after the all-reduces they are all equal).
 * param, grad, m, v, arena, transient, dev_tokens and dev_targets are device memory of
 * `compute`, which the runtime reaches only through its entries (../compute.h); `host` holds host
 * copies while weights.c works on them: what every process holds while the weights load
 * (pipe_host_alloc, pipe_upload), and on process 0 every parameter's for the writers
 * (pipe_download). */
typedef struct {
  const TpPlan *plan;
  TrainOptions o;
  TpDiag *d;
  TpComm *comm;
  TpCompute *compute;
  TpStream *stream; /* transfers, the norm's read-back, ABI 1's units */
  /* per parameter; m and v are NULL for frozen ones (whose grad stays unused, zero); param
   * is NULL for trained ones under train_sharded_masters (the shards hold the masters) */
  float **param, **grad, **m, **v;
  /* TpPlan.precision bf16 or fp16: per parameter, the 16-bit working copy the units read
   * (io->param), rounded from param, which is then the f32 master; NULL under fp32 */
  void **work;
  /* TpPlan.precision fp16: dynamic loss scaling, as torch.cuda.amp.GradScaler does. The
   * backward starts from loss_scale (TpStepIO.loss_scale; 1 under other precisions); a step
   * whose gradients are not finite is skipped and halves it; LOSS_SCALE_GROWTH good steps in
   * a row double it. Checkpoints keep the three. */
  float loss_scale;
  int64_t scale_growth;  /* LOSS_SCALE_GROWTH (a test hook sets another) */
  int64_t good_steps;    /* updates since the scale last changed */
  int64_t skipped_steps; /* steps skipped so far (AdamW counts only the updates) */
  TrainHost host;
  bool *held;
  int64_t *numel;                    /* elements of what a rank holds (its piece of a split parameter) */
  int64_t *whole_numel;              /* of the whole tensor: what host copies and files hold */
  double *decay;                     /* per parameter: its AdamW weight decay (0 where --no-decay matches) */
  void **arena, **transient;         /* per stage (ABI 1) */
  int64_t *tokens, *targets;         /* [global batch, seq], host (staging memory, step.h): what
                                      * the token reader fills */
  int64_t *dev_tokens, *dev_targets; /* their device copies, which the units read */
  float *dev_loss_scale;             /* loss_scale's device copy (TpStepIO.loss_scale_device) */
  double *norm_pieces;               /* device: the gradient norm's pieces (TP_NORM_PIECES per
                                      * parameter) of each hosted rank (ABI 1: one) */
  double *norm_host;                 /* their host copy (staging memory) */
  float *loss_scale_host;            /* loss_scale as copied to dev_loss_scale (staging memory) */
  TpEvent *tokens_ready;             /* on stream after the copies of the step's tokens: the
                                      * hosted ranks' streams wait for it */
  float *param_block;                /* --zero 1 under mpirun: the held values, contiguous in the
                                      * order of the rank's gradient block (all-gathered in place);
                                      * else NULL and each value allocated alone */
  void *work_block;                  /* the same for the 16-bit working copies under
                                      * train_sharded_masters (which gathers those) */
  TpTokenFile train, val;
  int64_t step;     /* steps done */
  int64_t data_pos; /* token position of the next training batch */
  uint64_t rng;     /* splitmix64 state (random init) */
  /* process 0's outputs while training */
  FILE *log;            /* --log, opened when its first line is written */
  TpPathLock save_lock; /* --save's checkpoint, locked from before the first step */
  bool made_save_dir;   /* --save's folder was created by this run */
  /* ABI 2 */
  int nranks;  /* stages * tensor * dp */
  int nhosted; /* ranks this process runs: all of them (one process) or one */
  PipeRank **hosted;
  TraceLog *trace; /* NULL without --trace */
  /* --resume: the checkpoint as read at start-up (train_open_checkpoint), until the
   * weights are loaded from it; process 0 holds the folder's lock for reading meanwhile,
   * so that no trainer replaces it while the ranks read it */
  TpSafetensors resume_st;
  bool resume_open;
  TrainCheckpointMeta resume_meta;
  uint32_t resume_crc; /* CRC-32C of its checksums: the whole file's identity */
  TpPathLock resume_lock;
} Trainer;

enum { LOSS_SCALE_GROWTH = 2000 };
#define LOSS_SCALE_INITIAL 65536.0f

/* Bytes of a stored parameter or gradient element: 2 under TpPlan.precision bf16 and fp16. */
static inline size_t train_elem_bytes(const TpPlan *P) { return P->precision != TP_PLAN_FP32 ? 2 : 4; }

/* Rows of one step: global_batch in ABI 2, batch in ABI 1. */
static inline int64_t train_rows(const TpPlan *P) { return P->stages ? P->global_batch : P->batch; }
/* Token ids must be below this (TpPlan.token_limit, else the vocabulary). */
static inline int64_t train_token_limit(const TpPlan *P) { return P->token_limit ? P->token_limit : P->vocab; }
/* V: the virtual stages each pipeline rank runs (TpPlan.chunks; 1 unless interleaved). */
static inline int train_chunks(const TpPlan *P) { return P->chunks > 1 ? P->chunks : 1; }
/* S: the pipeline ranks of a replica (of one tensor rank): the plan's stages, or under an
 * interleaved plan its nstages / V virtual stages' ranks. A plan's "stage" names a virtual
 * stage, run by rank stage % S as its chunk stage / S (plan.h). */
static inline int train_pipeline(const TpPlan *P) { return P->nstages / train_chunks(P); }
/* N: the tensor-parallel ranks of a stage (plans before ABI 5 have 0: 1). */
static inline int train_tensor(const TpPlan *P) { return P->tensor > 1 ? P->tensor : 1; }
/* Whether parameter p is split over its stage's tensor group (TpPlanShard): a rank holds a
 * piece (p->dims), host copies and files the whole (dims[axis] * parts, less a padded
 * vocabulary's padding). A padded vocabulary of one tensor rank (--target cuda, --tensor
 * 1: one part) is held so too: its one piece is the whole with the padding. */
static inline bool train_split(const TpPlan *P, const TpPlanParam *p) {
  return p->shard.parts > 0 && (train_tensor(P) > 1 || (P->param_pad && P->param_pad[p - P->params] > 0));
}
/* The padding of split parameter p's padded vocabulary (TpPlan.param_pad; 0: none). */
static inline int train_pad(const TpPlan *P, const TpPlanParam *p) {
  return P->param_pad && train_split(P, p) ? P->param_pad[p - P->params] : 0;
}
/* Whether the replicas shard the optimizer state (TpPlan.zero; ABI 2, D > 1). */
static inline bool train_zero(const TpPlan *P) { return P->stages && P->zero && P->dp > 1; }
/* Whether, under --zero 1 with 16-bit storage, each replica keeps the fp32 masters of its
 * shard only (PipeRank.master_block) and the replicas gather the 16-bit working copies. */
static inline bool train_sharded_masters(const TpPlan *P) { return train_zero(P) && P->precision != TP_PLAN_FP32; }
/* Whether this process writes the outputs (rank 0). */
static inline bool train_is_root(const Trainer *t) { return t->comm->rank == 0; }

/* weights.c */
/* Fills the parameters: from --resume (also optimizer state, step, data position and RNG
 * state), --init (.onnx or .safetensors) or randomly from --seed. */
int train_load_weights(Trainer *t);
/* Before training: --export-onnx's source model holds every name the trainer will write. */
int train_check_export(Trainer *t);
/* The checkpoint of the current step into --save's folder, unless a value (or with
 * moments, an AdamW moment) is not finite. */
int train_save_checkpoint(Trainer *t);
/* Every parameter value (and with moments, AdamW's moments) is finite; else one error
 * naming the parameter and the step. */
int train_check_finite(Trainer *t, bool moments);
int train_checkpoint_meta(const TpSafetensors *st, TrainCheckpointMeta *m, TpDiag *d);
/* --resume's checkpoint read and its metadata checked (t->resume_st, resume_meta,
 * resume_crc); train_load_weights takes the weights from it and closes it. */
int train_open_checkpoint(Trainer *t);
void train_close_checkpoint(Trainer *t);
/* --dump-grads (grads) and --dump-weights: every (trainable, for grads) parameter and
 * derived initializer by ONNX name. */
int train_dump(Trainer *t, const char *path, bool grads);
int train_export_onnx(Trainer *t);
/* The folder of a checkpoint file; the checkpoint inside it. */
char *train_checkpoint_path(const char *dir);

/* The step's files: the buffers and the steps of every plan (ABI 2: the ranks of a
 * pipeline). */
/* plan_check.c: checks the pipeline part of the plan (TP_ERR_INTERNAL if malformed). */
int pipe_check_plan(const TpPlan *P, TpDiag *d);
/* buffers.c */
/* Device memory: zeroed, 64-byte aligned; NULL after an error naming the bytes and what
 * they are for (fmt, printf-style). */
void *pipe_alloc(Trainer *t, size_t bytes, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Every buffer: the step's tokens; for ABI 2 which ranks this process hosts (one
 * process: all; mpirun with stages * dp: one) and which parameters it holds.
 * TP_ERR_USAGE on a wrong process count. */
int pipe_setup(Trainer *t);
void pipe_free(Trainer *t);
/* schedule.c */
/* One training step's forward and backward of the step's tokens over every hosted rank's
 * schedule, the all-reduces included; returns the step's loss (the same on every
 * process). */
double pipe_train_step(Trainer *t);
/* Forward only over the current tokens: the loss. */
double pipe_eval(Trainer *t);
/* The step's tokens and targets to the device (pipe_train_step and pipe_eval do it). */
void pipe_tokens_to_device(Trainer *t);
/* AdamW on every parameter this process holds, gradients scaled by `clip` first unless it
 * is 1 (each parameter updated once per process; a tied one on both of its ranks). */
void pipe_update(Trainer *t, int64_t step, double lr, float clip);
/* The global gradient norm over every trainable parameter once (the same on every process). */
double pipe_grad_norm(Trainer *t);
/* Hosted rank h's stage and replica, and the io of its units: its parameters, its
 * (scratch) gradients, microbatch 0's arena and rows, its transient region, its stream. */
TpStepIO pipe_rank_io(Trainer *t, int h, int *stage, int *replica);
/* Hosted rank h's step gradients (f32, what AdamW reads; io->grad is a microbatch's). */
float *const *pipe_rank_grads(Trainer *t, int h);
/* AdamW, gradients scaled by `clip` first unless it is 1, on stream s over the parameters
 * hosted rank h (ABI 1: h 0, the process) updates in the optimizer step, with grad its
 * gradients (each parameter updated once per process; a tied one on both of its ranks). */
void pipe_adamw(Trainer *t, int h, TpStream *s, float *const *grad, int64_t step, double lr, float clip);
/* params.c: the parameter store */
/* Host copies (t->host, whole tensors) of the parameters this process holds (values; with moments, AdamW's
 * m and v of trainable ones), for weights.c to fill; pipe_upload sends them to the device. */
int pipe_host_alloc(Trainer *t, bool moments);
void pipe_upload(Trainer *t);
/* After every process has loaded its weights (an agreed success): under
 * train_sharded_masters with one process per rank, each rounded only its shards of the
 * working copies, which the replicas then gather. */
void pipe_gather_loaded(Trainer *t);
/* Parameter p's whole tensor, as host copies and files hold it (p->dims are a rank's piece
 * where it is split), over data. */
TpTensor pipe_whole_tensor(const TpPlan *P, const TpPlanParam *p, void *data);
/* Tensor rank `tensor`'s piece of parameter p (TpPlanShard) from the whole tensor (into
 * piece; a padded vocabulary's padding, TpPlan.param_pad, gets zeros), or into the whole
 * (gather; the padding left out); a parameter not split is copied whole. Returns the
 * piece's first element in the padding that is not 0 when gathering, else -1. */
int64_t pipe_shard_copy(const TpPlan *P, const TpPlanParam *p, int tensor, float *piece, float *whole, bool gather);
/* Brings what the owner of every parameter holds (values, m and v, or gradients) to
 * process 0's host copies (t->host). */
int pipe_download(Trainer *t, bool grads, bool moments);
void pipe_host_free(Trainer *t);
/* collectives.c */
/* buf (count elements of dtype) summed over every process in place: a gather where each
 * process filled its own slots and left the others zero. */
void pipe_sum_processes(Trainer *t, void *buf, size_t count, TpDType dtype);
/* Every process's rc: the worst; the first failing process other than 0 prints its error
 * (process 0 printed its own). */
int pipe_agree(Trainer *t, int rc);

/* profile.c: --profile FILE.json, instead of training */
int train_profile(Trainer *t);

/* trace.c: --trace, a Chrome / Perfetto trace (JSON) of every rank */
enum { TRACE_UPDATE = 100, TRACE_EVAL = 101 }; /* event kinds after the TpPlanInsnKind ones */
TraceLog *trace_new(void);
void trace_free(TraceLog *l);
double trace_now_us(const TraceLog *l);
void trace_add(TraceLog *l, int rank, int kind, int mb, int slice, int peer, int stage, double start_us,
               double end_us);
/* Gathers every process's events to process 0, which writes the file. */
int trace_write(Trainer *t, const char *path);

#endif
