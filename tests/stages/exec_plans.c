/* A reference executor of the plan ABI (runtime/train/plan.h) in one process, to check what
 * the compiler emits without MPI or the trainer runtime. It links two generated plans:
 *   plan_ref   one stage, one microbatch, unsliced (compiled with -Dtp_plan=plan_ref
 *              -Dmain=main_ref)
 *   plan_test  the configuration under test (-Dtp_plan=plan_test -Dmain=main_test)
 * and runs one step of both on the same weights and tokens: the loss and every gradient
 * (what the optimizer step would see) must agree to 1e-5 relative (of the tensor's largest
 * magnitude). Every rank of plan_test (stages x replicas) is simulated: ranks run their
 * instruction lists round robin, a receive waits for its send, allreduce-tied for its peer,
 * allreduce for all replicas of the stage; a round without progress is a deadlock. Arenas
 * start as NaN bytes and are reused as `arenas` says, and each rank's transient region is
 * filled with NaN bytes again before every unit, so a plan that reads a buffer before
 * writing it, arenas that collide, or a unit that reads what another left in the
 * transient region show up as wrong numbers. A send completes as late as
 * the ABI allows: its bytes are read when the receiver receives them, or when the sender
 * gives the arena to another microbatch, so a send buffer the plan overwrites too early
 * shows up too.
 * Split backwards (BACKWARD_INPUT, BACKWARD_WEIGHT) run as the plan says, or with
 * --defer-weights each rank's weight parts as late as they may: queued until another
 * microbatch's weight part, an instruction of a microbatch sharing the arena of a queued
 * one, or a step-level instruction (the most a zero-bubble list could defer them), so a
 * buffer of a weight part that another unit overwrites in between shows up; or with
 * --eager-weights each weight part right after its input part (the list's own weight
 * instruction is then skipped). --exact asks
 * for the same bits (loss and gradients) instead of 1e-5, for plans that should compute
 * alike (the same configuration under another schedule).
 * Usage: exec_plans [--seed N] [--defer-weights | --eager-weights] [--exact]; exit 0 if they
 * agree, 1 if not. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/plan.h"

extern const TpPlan plan_ref, plan_test;

/* The plans' main() call this; the executor has its own main. */
int tp_trainer_main(const TpPlan *plan, int argc, char **argv) {
  (void)plan, (void)argc, (void)argv;
  return 3;
}

static uint64_t rng = 1;
static bool defer_weights, eager_weights;
static double uniform(void) { /* splitmix64 -> [0, 1) */
  uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (double)((z ^ (z >> 31)) >> 11) / 9007199254740992.0;
}

static int64_t numel(const TpPlanParam *p) {
  int64_t n = 1;
  for (int k = 0; k < p->rank; k++) n *= p->dims[k];
  return n;
}

static void *garbage(size_t bytes) { /* NaN floats: a read before a write poisons the result */
  void *p = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
  if (!p) abort();
  memset(p, 0xff, (bytes + 63) / 64 * 64 + 64);
  return p;
}

typedef struct {
  int stage, replica, pc;
  float **param, **grad, **sum; /* per parameter; NULL where the stage does not hold it */
  void **arena;
  int *arena_mb;      /* per arena: the microbatch using it, or -1 */
  void *transient;    /* NaN bytes again before each unit */
  int backward_mb;    /* the microbatch whose backward units run now, or -1 */
  TpPlanInsn *queued; /* --defer-weights: weight parts not run yet, in order */
  int nqueued;
  bool finished_grads; /* sum / M moved into grad */
} Rank;

typedef struct {
  bool grad; /* activation or gradient */
  int replica, from, to, mb, slice;
  size_t bytes;
  const TpPlanMessage *msg; /* the sender's buffers, until the bytes are read */
  const char *arena;
  char *data; /* the bytes, once read */
  bool taken;
} Mail;

typedef struct {
  const TpPlan *P;
  int S, D, M, N, nranks;
  Rank *rank;
  const float *init;               /* the initial weights, concatenated */
  const int64_t *tokens, *targets; /* [global_batch, seq] */
  double *loss;                    /* [D * M] */
  Mail *mail;
  int nmail;
} Run;

static int64_t message_bytes(const TpPlanMessage *m) {
  int64_t n = 0;
  for (int j = 0; j < m->nbuffers; j++) n += m->buffers[j].bytes;
  return n;
}

/* Reads the bytes of a pending send from the sender's arena: the send completes. */
static void complete(Mail *mail) {
  if (mail->data) return;
  mail->data = malloc(mail->bytes + 1);
  for (int j = 0, at = 0; j < mail->msg->nbuffers; at += (int)mail->msg->buffers[j].bytes, j++)
    memcpy(mail->data + at, mail->arena + mail->msg->buffers[j].offset, (size_t)mail->msg->buffers[j].bytes);
}

/* Rank k's arena for microbatch mb; the sends of the microbatch that used it before
 * complete first. */
static char *arena_for(Run *r, Rank *k, int mb) {
  int a = mb % r->P->stages[k->stage].arenas;
  if (k->arena_mb[a] != mb) {
    for (int i = 0; i < r->nmail; i++)
      if (r->mail[i].replica == k->replica && r->mail[i].from == k->stage && r->mail[i].mb == k->arena_mb[a])
        complete(&r->mail[i]);
    k->arena_mb[a] = mb;
  }
  return k->arena[a];
}

/* Runs unit (kind, mb, slice) of rank k: FORWARD, BACKWARD, BACKWARD_INPUT or
 * BACKWARD_WEIGHT. The gradients are zeroed before a microbatch's first unit that makes
 * them (a backward, or a split backward's weight part) and summed after its slice 0. */
static void unit(Run *r, Rank *k, int kind, int mb, int slice) {
  const TpPlan *P = r->P;
  const TpPlanStage *st = &P->stages[k->stage];
  int64_t rows = (int64_t)(k->replica * r->M + mb) * P->batch;
  memset(k->transient, 0xff, st->transient_bytes);
  TpStepIO io = {.arena = arena_for(r, k, mb),
                 .transient = k->transient,
                 .param = k->param,
                 .grad = k->grad,
                 .tokens = r->tokens + rows * P->seq,
                 .targets = r->targets + rows * P->seq,
                 .loss = NAN};
  bool grads = kind == TP_PLAN_BACKWARD || kind == TP_PLAN_BACKWARD_WEIGHT;
  if (grads && k->backward_mb != mb) { /* the microbatch's first backward unit */
    k->backward_mb = mb;
    for (int i = 0; i < P->nparams; i++)
      if (k->grad[i]) memset(k->grad[i], 0, (size_t)numel(&P->params[i]) * 4);
  }
  const TpUnitFn *fns = kind == TP_PLAN_FORWARD          ? st->forward
                        : kind == TP_PLAN_BACKWARD       ? st->backward
                        : kind == TP_PLAN_BACKWARD_INPUT ? st->backward_input
                                                         : st->backward_weight;
  fns[slice](&io);
  if (kind == TP_PLAN_FORWARD && !isnan(io.loss)) r->loss[k->replica * r->M + mb] = io.loss;
  if (grads && slice == 0) /* its last: the microbatch's gradient is complete */
    for (int i = 0; i < P->nparams; i++)
      if (k->grad[i])
        for (int64_t j = 0; j < numel(&P->params[i]); j++) k->sum[i][j] += k->grad[i][j];
}

static void finish_grads(Run *r, Rank *k) {
  if (k->finished_grads) return;
  k->finished_grads = true;
  for (int i = 0; i < r->P->nparams; i++)
    if (k->grad[i])
      for (int64_t j = 0; j < numel(&r->P->params[i]); j++) k->grad[i][j] = k->sum[i][j] / (float)r->M;
}

static Rank *rank_of(Run *r, int replica, int stage) { return &r->rank[replica * r->S + stage]; }

/* --defer-weights: runs the queued weight parts of rank k that must run before x (all of
 * them when x is NULL). */
static void run_queued(Run *r, Rank *k, const TpPlanInsn *x) {
  int arenas = r->P->stages[k->stage].arenas;
  bool flush = !x || x->mb < 0;
  for (int i = 0; i < k->nqueued && !flush; i++)
    flush = k->queued[i].mb != x->mb &&
            (x->kind == TP_PLAN_BACKWARD_WEIGHT || k->queued[i].mb % arenas == x->mb % arenas);
  for (int i = 0; flush && i < k->nqueued; i++)
    unit(r, k, TP_PLAN_BACKWARD_WEIGHT, k->queued[i].mb, k->queued[i].slice);
  if (flush) k->nqueued = 0;
}

/* Runs rank k's next instruction if it can; false if it must wait. */
static bool step(Run *r, Rank *k, bool *bad) {
  const TpPlanStage *st = &r->P->stages[k->stage];
  const TpPlanInsn *x = &st->insns[k->pc];
  if (defer_weights) {
    run_queued(r, k, x);
    if (x->kind == TP_PLAN_BACKWARD_WEIGHT) {
      k->queued = realloc(k->queued, sizeof *k->queued * (size_t)(k->nqueued + 1));
      k->queued[k->nqueued++] = *x;
      k->pc++;
      return true;
    }
  }
  switch (x->kind) {
  case TP_PLAN_FORWARD:
  case TP_PLAN_BACKWARD: unit(r, k, x->kind, x->mb, x->slice); break;
  case TP_PLAN_BACKWARD_INPUT:
    unit(r, k, x->kind, x->mb, x->slice);
    if (eager_weights) unit(r, k, TP_PLAN_BACKWARD_WEIGHT, x->mb, x->slice);
    break;
  case TP_PLAN_BACKWARD_WEIGHT:
    if (!eager_weights) unit(r, k, x->kind, x->mb, x->slice);
    break;
  case TP_PLAN_SEND_ACT:
  case TP_PLAN_SEND_GRAD: {
    bool grad = x->kind == TP_PLAN_SEND_GRAD;
    const TpPlanMessage *m = &(grad ? st->send_grad : st->send_act)[x->slice];
    Mail mail =
        {grad, k->replica, k->stage, x->peer, x->mb, x->slice, (size_t)message_bytes(m), m, arena_for(r, k, x->mb),
         NULL, false};
    r->mail = realloc(r->mail, (size_t)(r->nmail + 1) * sizeof *r->mail);
    r->mail[r->nmail++] = mail;
    break;
  }
  case TP_PLAN_RECV_ACT:
  case TP_PLAN_RECV_GRAD: {
    bool grad = x->kind == TP_PLAN_RECV_GRAD;
    const TpPlanMessage *m = &(grad ? st->recv_grad : st->recv_act)[x->slice];
    Mail *mail = NULL;
    for (int i = 0; i < r->nmail && !mail; i++) {
      Mail *y = &r->mail[i];
      if (!y->taken && y->grad == grad && y->replica == k->replica && y->from == x->peer && y->to == k->stage &&
          y->mb == x->mb && y->slice == x->slice)
        mail = y;
    }
    if (!mail) return false;
    if ((int64_t)mail->bytes != message_bytes(m)) {
      fprintf(stderr, "stage %d receives %lld bytes of %s (mb %d slice %d) but stage %d sent %zu\n", k->stage,
              (long long)message_bytes(m), grad ? "gradient" : "activation", x->mb, x->slice, x->peer, mail->bytes);
      *bad = true;
    }
    complete(mail);
    char *arena = arena_for(r, k, x->mb);
    for (int j = 0, at = 0; j < m->nbuffers && !*bad; at += (int)m->buffers[j].bytes, j++)
      memcpy(arena + m->buffers[j].offset, mail->data + at, (size_t)m->buffers[j].bytes);
    mail->taken = true;
    break;
  }
  case TP_PLAN_ALLREDUCE_TIED: {
    Rank *peer = rank_of(r, k->replica, x->peer);
    const TpPlanInsn *y = peer->pc < r->P->stages[peer->stage].ninsns ? &r->P->stages[peer->stage].insns[peer->pc]
                                                                      : NULL;
    if (!y || y->kind != TP_PLAN_ALLREDUCE_TIED || y->peer != k->stage) return false;
    finish_grads(r, k), finish_grads(r, peer);
    for (int i = 0; i < r->P->nparams; i++) {
      if (!r->P->params[i].tied_stage) continue;
      if (!k->grad[i] || !peer->grad[i]) {
        fprintf(stderr, "tied parameter %s is not held by stages %d and %d\n", r->P->params[i].name, k->stage,
                peer->stage);
        *bad = true;
        continue;
      }
      for (int64_t j = 0; j < numel(&r->P->params[i]); j++)
        k->grad[i][j] = peer->grad[i][j] = k->grad[i][j] + peer->grad[i][j];
    }
    peer->pc++;
    break;
  }
  case TP_PLAN_ALLREDUCE: {
    for (int d = 0; d < r->D; d++) {
      Rank *o = rank_of(r, d, k->stage);
      if (o->pc >= st->ninsns || st->insns[o->pc].kind != TP_PLAN_ALLREDUCE) return false;
    }
    for (int i = 0; i < r->P->nparams; i++) {
      if (!k->grad[i]) continue;
      for (int64_t j = 0; j < numel(&r->P->params[i]); j++) {
        double s = 0;
        for (int d = 0; d < r->D; d++)
          finish_grads(r, rank_of(r, d, k->stage)), s += rank_of(r, d, k->stage)->grad[i][j];
        for (int d = 0; d < r->D; d++) rank_of(r, d, k->stage)->grad[i][j] = (float)(s / r->D);
      }
    }
    for (int d = 0; d < r->D; d++)
      if (rank_of(r, d, k->stage) != k) rank_of(r, d, k->stage)->pc++;
    break;
  }
  case TP_PLAN_OPTIMIZER_STEP: finish_grads(r, k); break;
  default: fprintf(stderr, "stage %d: bad instruction kind %d\n", k->stage, x->kind); *bad = true;
  }
  k->pc++;
  return true;
}

/* One step of plan P; on success r->rank[*] hold the step's gradients. */
static bool run(Run *r, const TpPlan *P, const float *init, const int64_t *tokens, const int64_t *targets) {
  *r = (Run){.P = P,
             .S = P->nstages,
             .D = P->dp,
             .M = P->microbatches,
             .N = P->nslices,
             .init = init,
             .tokens = tokens,
             .targets = targets};
  if (P->abi != TP_PLAN_ABI || !P->stages) {
    fprintf(stderr, "not an ABI %d plan with stages\n", TP_PLAN_ABI);
    return false;
  }
  r->nranks = r->S * r->D;
  r->rank = calloc((size_t)r->nranks, sizeof *r->rank);
  r->loss = malloc(sizeof(double) * (size_t)(r->D * r->M));
  for (int i = 0; i < r->D * r->M; i++) r->loss[i] = NAN;
  for (int q = 0; q < r->nranks; q++) {
    Rank *k = &r->rank[q];
    k->replica = q / r->S, k->stage = q % r->S, k->backward_mb = -1;
    k->param = calloc((size_t)P->nparams + 1, sizeof(float *));
    k->grad = calloc((size_t)P->nparams + 1, sizeof(float *));
    k->sum = calloc((size_t)P->nparams + 1, sizeof(float *));
    const float *w = init;
    for (int i = 0; i < P->nparams; i++) {
      int64_t n = numel(&P->params[i]);
      if (P->params[i].stage == k->stage || (P->params[i].tied_stage && P->params[i].tied_stage == k->stage)) {
        k->param[i] = malloc((size_t)n * 4 + 4);
        memcpy(k->param[i], w, (size_t)n * 4);
        k->grad[i] = garbage((size_t)n * 4);
        k->sum[i] = calloc((size_t)n + 1, 4);
      }
      w += n;
    }
    const TpPlanStage *st = &P->stages[k->stage];
    k->arena = calloc((size_t)st->arenas, sizeof(void *));
    k->arena_mb = malloc(sizeof(int) * (size_t)st->arenas);
    for (int a = 0; a < st->arenas; a++) k->arena[a] = garbage(st->arena_bytes), k->arena_mb[a] = -1;
    k->transient = garbage(st->transient_bytes);
  }
  bool bad = false;
  for (bool progress = true; progress && !bad;) {
    progress = false;
    for (int q = 0; q < r->nranks && !bad; q++) {
      Rank *k = &r->rank[q];
      while (k->pc < P->stages[k->stage].ninsns && !bad && step(r, k, &bad)) progress = true;
    }
  }
  for (int q = 0; q < r->nranks && !bad; q++) {
    Rank *k = &r->rank[q];
    if (k->pc < P->stages[k->stage].ninsns) {
      const TpPlanInsn *x = &P->stages[k->stage].insns[k->pc];
      fprintf(stderr, "deadlock: replica %d stage %d waits at instruction %d (kind %d, mb %d, slice %d)\n",
              k->replica, k->stage, k->pc, x->kind, x->mb, x->slice);
      bad = true;
    }
  }
  for (int i = 0; i < r->nmail && !bad; i++)
    if (!r->mail[i].taken) fprintf(stderr, "a message nobody received\n"), bad = true;
  return !bad;
}

static void run_free(Run *r) {
  for (int q = 0; q < r->nranks; q++) {
    Rank *k = &r->rank[q];
    for (int i = 0; i < r->P->nparams; i++) free(k->param[i]), free(k->grad[i]), free(k->sum[i]);
    for (int a = 0; a < r->P->stages[k->stage].arenas; a++) free(k->arena[a]);
    free(k->param), free(k->grad), free(k->sum), free(k->arena), free(k->arena_mb), free(k->transient),
        free(k->queued);
  }
  for (int i = 0; i < r->nmail; i++) free(r->mail[i].data);
  free(r->mail), free(r->rank), free(r->loss);
}

static double step_loss(const Run *r) {
  double s = 0;
  for (int i = 0; i < r->D * r->M; i++) s += r->loss[i];
  return s / (r->D * r->M);
}

int main(int argc, char **argv) {
  bool exact = false;
  for (int a = 1; a < argc; a++) {
    if (strcmp(argv[a], "--seed") == 0 && a + 1 < argc) rng = strtoull(argv[++a], NULL, 10);
    else if (strcmp(argv[a], "--defer-weights") == 0) defer_weights = true;
    else if (strcmp(argv[a], "--eager-weights") == 0) eager_weights = true;
    else if (strcmp(argv[a], "--exact") == 0) exact = true;
    else {
      fprintf(stderr, "usage: exec_plans [--seed N] [--defer-weights | --eager-weights] [--exact]\n");
      return 2;
    }
  }
  double tolerance = exact ? 0 : 1e-5;
  const TpPlan *A = &plan_ref, *B = &plan_test;
  int64_t rows = A->batch * A->microbatches * A->dp;
  if (B->batch * B->microbatches * B->dp != rows || A->seq != B->seq || A->nparams != B->nparams ||
      A->vocab != B->vocab) {
    fprintf(stderr, "the plans do not train the same model on the same batch\n");
    return 1;
  }
  int64_t total = 0;
  for (int i = 0; i < A->nparams; i++) {
    if (strcmp(A->params[i].name, B->params[i].name) != 0) {
      fprintf(stderr, "parameter %d: %s vs %s\n", i, A->params[i].name, B->params[i].name);
      return 1;
    }
    total += numel(&A->params[i]);
  }
  float *init = malloc((size_t)total * 4 + 4);
  for (int64_t j = 0; j < total; j++) init[j] = (float)(0.2 * uniform() - 0.1);
  int64_t n = rows * A->seq;
  int64_t *window = malloc(sizeof(int64_t) * (size_t)(n + 1));
  for (int64_t j = 0; j <= n; j++) window[j] = (int64_t)(uniform() * (double)A->vocab) % A->vocab;
  /* row j: tokens [j*T, (j+1)*T) of the window, targets shifted by one */
  int64_t *tokens = malloc(sizeof(int64_t) * (size_t)n), *targets = malloc(sizeof(int64_t) * (size_t)n);
  for (int64_t j = 0; j < n; j++) tokens[j] = window[j], targets[j] = window[j + 1];

  Run ra, rb;
  bool ok = run(&ra, A, init, tokens, targets);
  if (ok) ok = run(&rb, B, init, tokens, targets);
  if (!ok) return 1;
  double la = step_loss(&ra), lb = step_loss(&rb), worst = fabs(la - lb) / fabs(la);
  int fails = 0;
  printf("loss %.9g vs %.9g (relative error %.2g)\n", la, lb, worst);
  if (!(worst <= tolerance)) fails++;
  for (int i = 0; i < A->nparams; i++) {
    if (!A->params[i].trainable) continue;
    const float *ga = ra.rank[A->params[i].stage].grad[i], *gb = rb.rank[B->params[i].stage].grad[i];
    double scale = 0, err = 0;
    for (int64_t j = 0; j < numel(&A->params[i]); j++) {
      if (fabs(ga[j]) > scale) scale = fabs(ga[j]);
      if (!(fabs(ga[j] - gb[j]) <= err)) err = isnan(gb[j]) ? INFINITY : fabs(ga[j] - gb[j]);
    }
    double rel = scale > 0 ? err / scale : err;
    if (rel > worst || isnan(rel)) worst = rel;
    if (!(rel <= tolerance)) {
      fails++;
      printf("gradient of %s (stage %d): relative error %.3g\n", A->params[i].name, B->params[i].stage, rel);
    }
  }
  printf("%d stage%s x %d replica%s x %d microbatch%s x %d slice%s: %d parameters, worst relative error %.3g: %s\n",
         B->nstages, B->nstages == 1 ? "" : "s", B->dp, B->dp == 1 ? "" : "s", B->microbatches,
         B->microbatches == 1 ? "" : "es", B->nslices, B->nslices == 1 ? "" : "s", A->nparams, worst,
         fails ? "FAIL" : "ok");
  run_free(&ra), run_free(&rb);
  free(init), free(window), free(tokens), free(targets);
  return fails ? 1 : 0;
}
