/* The pipeline part of a compiled plan (ABI 2), checked before anything runs: sizes and
 * slices, parameters and their tensor split, every stage's units, messages and instruction
 * list, the probes. A plan the compiler wrote passes; anything else is a compiler bug. */
#include "step.h"

static bool message_ok(const TpPlanMessage *msgs, int n, size_t arena) {
  if (!msgs) return false;
  for (int i = 0; i < n; i++) {
    if (msgs[i].nbuffers < 0 || (msgs[i].nbuffers && !msgs[i].buffers)) return false;
    for (int j = 0; j < msgs[i].nbuffers; j++) {
      const TpPlanBuffer *b = &msgs[i].buffers[j];
      if (b->offset < 0 || b->bytes < 0 || (uint64_t)(b->offset + b->bytes) > arena) return false;
    }
  }
  return true;
}

int pipe_check_plan(const TpPlan *P, TpDiag *d) {
  /* S (virtual) stages, run by R pipeline ranks, V each (interleaved; else V 1, R S) */
  int S = P->nstages, M = P->microbatches, N = P->nslices, V = train_chunks(P), R = S / V;
  bool ok = P->dp >= 1 && M >= 1 && N >= 1 && P->slice_len && P->global_batch == P->batch * M * P->dp &&
            (int64_t)V * M * N * 2 < GATHER_TAG && P->chunks >= 0 && S % V == 0 && (V == 1 || R >= 2);
  int64_t total = 0;
  for (int i = 0; ok && i < N; i++) ok = P->slice_len[i] >= 1, total += P->slice_len[i];
  ok = ok && total == P->seq;
  int T = train_tensor(P);
  for (int i = 0; ok && i < P->nparams; i++) {
    const TpPlanParam *p = &P->params[i];
    const TpPlanShard *sh = &p->shard;
    ok = p->stage >= 0 && p->stage < S &&
         (p->tied_stage == 0 ||
          (p->tied_stage > p->stage && p->tied_stage < S && p->tied_stage % R != p->stage % R));
    /* a piece is whole chunks' equal parts: its dim is chunks (>= 1) x the piece's length */
    if (ok && train_split(P, p))
      ok = sh->axis >= 0 && sh->axis < p->rank && sh->parts <= T && T % sh->parts == 0 && sh->chunks >= 0 &&
           p->dims[sh->axis] % (sh->chunks > 1 ? sh->chunks : 1) == 0 &&
           (!P->param_pad || P->param_pad[i] == 0 ||
            (P->param_pad[i] > 0 && sh->chunks <= 1 && sh->parts == T && P->param_pad[i] < p->dims[sh->axis]));
  }
  for (int k = 0; ok && k < S; k++) {
    const TpPlanStage *st = &P->stages[k];
    /* the backward units whole, or split into input and weight parts (ABI 8) */
    bool split = st->backward_input && st->backward_weight;
    ok = st->forward && (st->backward || split) && st->arenas >= 1 && st->ninsns >= 0 &&
         (st->insns || !st->ninsns) && (T == 1 || (st->forward_reduces && st->backward_reduces));
    for (int i = 0; ok && i < N; i++)
      ok = st->forward[i] && (!st->backward || st->backward[i]) &&
           (!split || (st->backward_input[i] && st->backward_weight[i])) &&
           (T == 1 || (st->forward_reduces[i] >= 0 && st->backward_reduces[i] >= 0));
    if (ok && k > 0)
      ok = message_ok(st->recv_act, N, st->arena_bytes) && message_ok(st->send_grad, N, st->arena_bytes);
    if (ok && k + 1 < S)
      ok = message_ok(st->send_act, N, st->arena_bytes) && message_ok(st->recv_grad, N, st->arena_bytes);
    ok = ok && (k < R || st->ninsns == 0); /* a rank's list is its first virtual stage's */
    /* per chunk, the microbatch whose backward units run (slice N-1 down to 0, no other
     * microbatch's between): they share one scratch set of gradients (plan.h) */
    int *open = xcalloc((size_t)V, sizeof *open);
    for (int c = 0; c < V; c++) open[c] = -1;
    for (int j = 0; ok && j < st->ninsns; j++) {
      const TpPlanInsn *x = &st->insns[j];
      bool halves = x->kind == TP_PLAN_BACKWARD_INPUT || x->kind == TP_PLAN_BACKWARD_WEIGHT;
      bool unit = x->kind <= TP_PLAN_RECV_GRAD || halves;
      int here = x->chunk * R + k; /* the instruction's virtual stage */
      ok = x->kind >= 0 && x->kind <= TP_PLAN_BACKWARD_WEIGHT && x->chunk >= 0 && x->chunk < V &&
           (!unit || (x->mb >= 0 && x->mb < M && x->slice >= 0 && x->slice < N)) &&
           (x->kind != TP_PLAN_BACKWARD || P->stages[here].backward) && (!halves || split);
      switch (x->kind) {
      case TP_PLAN_SEND_ACT:
      case TP_PLAN_RECV_GRAD: ok = ok && x->peer == here + 1 && here + 1 < S; break;
      case TP_PLAN_RECV_ACT:
      case TP_PLAN_SEND_GRAD: ok = ok && x->peer == here - 1 && here > 0; break;
      case TP_PLAN_ALLREDUCE_TIED:
        ok = ok && S > 1 && (k == 0 || k == R - 1) && x->peer == (k == 0 ? S - 1 : 0);
        break;
      case TP_PLAN_BACKWARD:
        if (ok && x->slice == N - 1) ok = open[x->chunk] == -1, open[x->chunk] = x->mb;
        ok = ok && open[x->chunk] == x->mb;
        if (ok && x->slice == 0) open[x->chunk] = -1;
        break;
      default: break;
      }
    }
    for (int c = 0; ok && c < V; c++) ok = open[c] == -1;
    free(open);
  }
  ok = ok && P->nprobes >= 0 && (P->probes || !P->nprobes);
  for (int p = 0; ok && p < P->nprobes; p++) {
    const TpPlanProbe *pr = &P->probes[p];
    ok = pr->b == P->batch && pr->l >= 1 && pr->c >= 0 && pr->l + pr->c <= P->seq && pr->stages;
    for (int k = 0; ok && k < S; k++) {
      const TpPlanProbeStage *ps = &pr->stages[k];
      ok = ps->forward && ps->backward && ps->nsetup >= 0 && (ps->setup || !ps->nsetup);
      for (int i = 0; ok && i < ps->nsetup; i++) ok = ps->setup[i] != NULL;
    }
  }
  return ok ? TP_OK : tp_internal(d, "the compiled plan's pipeline is malformed");
}
