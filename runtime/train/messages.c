/* Point-to-point messages between a stage and its neighbours (SEND_ACT, RECV_ACT,
 * SEND_GRAD, RECV_GRAD): one process moves them between its hosted ranks through their
 * inboxes, mpirun through the transport.
 *
 * Messages are packed into one device buffer per (kind, microbatch, slice): the sender's
 * arena is free again once the pack ran, and a message of several boundary buffers (or
 * none) is one send. These buffers are allocated with the rank (MessageBuffers), never on
 * the step path: allocating or freeing device memory may synchronize the whole device,
 * which would keep the host from running ahead of the GPU and, between a rank's sends and
 * the receive its peer waits for, deadlock a transport whose sends wait for their receives
 * (NCCL). Each (kind, microbatch, slice) has its own, so a step never reuses one; the step's
 * end (every send complete, every stream synchronized) frees them all for the next. Each
 * hosted rank queues its work on its own stream; events order a message's unpack after its
 * pack, and the host synchronizes before it hands a buffer to the transport (one that reads
 * device memory gets the stream instead, and its own stream waits for the pack; its
 * receives are queued so that the receiver's stream waits for them, recv_on) or reads a
 * result back. */
#include "step.h"

#include <stdio.h>

enum { MESSAGE_ALIGN = 256 };

/* ---- the buffers ---- */

static const TpPlanMessage *stage_messages(const TpPlanStage *st, int kind) {
  switch (kind) {
  case TP_PLAN_SEND_ACT: return st->send_act;
  case TP_PLAN_RECV_ACT: return st->recv_act;
  case TP_PLAN_SEND_GRAD: return st->send_grad;
  default: return st->recv_grad;
  }
}

static int message_kind(int kind) { return kind - TP_PLAN_SEND_ACT; } /* SEND_ACT..RECV_GRAD */

static size_t message_bytes(const TpPlanMessage *msg) {
  size_t n = 0;
  for (int j = 0; j < msg->nbuffers; j++) n += (size_t)msg->buffers[j].bytes;
  return n;
}

static size_t aligned(size_t bytes) { return (bytes + MESSAGE_ALIGN - 1) / MESSAGE_ALIGN * MESSAGE_ALIGN; }

/* The buffers of R's chunk c for the messages of `kind` its schedule has (mpirun: receives
 * too; one process: a receiver unpacks from the sender's buffer). */
int pipe_alloc_messages(Trainer *t, PipeRank *R, int c, int kind) {
  const TpPlan *P = t->plan;
  int M = P->microbatches, N = P->nslices;
  bool send = kind == TP_PLAN_SEND_ACT || kind == TP_PLAN_SEND_GRAD, used = false;
  for (int j = 0; j < R->st->ninsns; j++) used |= R->st->insns[j].kind == kind && R->st->insns[j].chunk == c;
  if (!used || (!send && one_process(t))) return TP_OK;
  const TpPlanStage *st = R->chunk[c].st;
  const TpPlanMessage *msgs = stage_messages(st, kind);
  size_t per_mb = 0;
  for (int i = 0; i < N; i++) per_mb += aligned(message_bytes(&msgs[i]));
  MessageBuffers *B = &R->chunk[c].messages[message_kind(kind)];
  B->data = xcalloc((size_t)M * N, sizeof *B->data);
  if (send) B->ready = xcalloc((size_t)M * N, sizeof *B->ready);
  if (!(B->block = pipe_alloc(t, per_mb * (size_t)M, "rank %d's message buffers", R->rank))) return TP_ERR_INPUT;
  for (int mb = 0, at = 0; mb < M; mb++) {
    char *next = (char *)B->block + per_mb * (size_t)mb;
    for (int i = 0; i < N; i++, at++) {
      B->data[at] = next;
      next += aligned(message_bytes(&msgs[i]));
      if (send) B->ready[at] = be(t)->event_new(t->compute);
    }
  }
  return TP_OK;
}

void pipe_free_messages(Trainer *t, PipeRank *R) {
  int n = t->plan->microbatches * t->plan->nslices;
  for (int j = 0; j < R->nsends; j++)
    if (R->sends[j].view != R->sends[j].data) free(R->sends[j].view);
  for (int c = 0; R->chunk && c < R->nchunks; c++)
    for (int k = 0; k < MESSAGE_KINDS; k++) {
      MessageBuffers *B = &R->chunk[c].messages[k];
      for (int i = 0; B->ready && i < n; i++) be(t)->event_free(t->compute, B->ready[i]);
      pipe_dev_free(t, B->block);
      free(B->data), free(B->ready);
    }
  free(R->inbox), free(R->sends);
}

/* ---- sending and receiving ---- */

/* (kind, mb, slice) and, in an interleaved plan, which boundary between virtual stages (the
 * chunk of the earlier one): unique per step, sender and receiver (plan.h). */
static int message_tag(const Trainer *t, const PipeRank *R, const TpPlanInsn *x) {
  int here = R->chunk[x->chunk].stage, boundary = here < x->peer ? here : x->peer;
  return tp_plan_message_tag(t->plan, boundary / train_pipeline(t->plan), x->mb, x->slice,
                             x->kind == TP_PLAN_SEND_GRAD || x->kind == TP_PLAN_RECV_GRAD);
}

void pipe_send(Trainer *t, PipeRank *R, const TpPlanInsn *x) {
  const RankChunk *C = &R->chunk[x->chunk];
  const TpPlanStage *st = C->st;
  const TpPlanMessage *msg = &stage_messages(st, x->kind)[x->slice];
  size_t bytes = message_bytes(msg);
  const MessageBuffers *B = &C->messages[message_kind(x->kind)];
  int at = x->mb * t->plan->nslices + x->slice;
  void *data = B->data[at];
  be(t)->pack(t->compute, R->stream, data, C->arena[x->mb % st->arenas], msg->buffers, msg->nbuffers);
  int dst = rank_of(t->plan, R->replica, x->peer % train_pipeline(t->plan), R->tensor), tag = message_tag(t, R, x);
  if (one_process(t)) { /* the receiver's stream waits for the pack */
    TpEvent *ready = B->ready[at];
    be(t)->event_record(t->compute, ready, R->stream);
    PipeRank *to = pipe_hosted_rank(t, dst);
    if (to->ninbox == to->inbox_cap) {
      to->inbox_cap = to->inbox_cap ? 2 * to->inbox_cap : 8;
      to->inbox = realloc(to->inbox, (size_t)to->inbox_cap * sizeof *to->inbox);
      TP_ASSERT(to->inbox);
    }
    to->inbox[to->ninbox++] = (Message){R->rank, tag, bytes, data, ready};
    return;
  }
  if (R->nsends == R->sends_cap) {
    R->sends_cap = R->sends_cap ? 2 * R->sends_cap : 8;
    R->sends = realloc(R->sends, (size_t)R->sends_cap * sizeof *R->sends);
    TP_ASSERT(R->sends);
  }
  if (!t->comm->be->device_memory) { /* the transport reads it from the host's side; else its stream waits */
    be(t)->event_record(t->compute, R->event, R->stream);
    be(t)->event_sync(t->compute, R->event);
  }
  PendingSend *s = &R->sends[R->nsends++];
  *s = (PendingSend){.r = {.what = x->kind == TP_PLAN_SEND_ACT ? "an activation to be received"
                                                               : "a gradient to be received",
                           .stream = R->stream},
                     .data = data,
                     .view = pipe_host_view(t, R->stream, data, bytes, true, true),
                     .bytes = bytes};
  t->comm->be->isend(t->comm, s->view, bytes, dst, tag, &s->r);
}

/* Frees the sends that completed; all of them when `all` (waiting). */
void pipe_complete_sends(Trainer *t, PipeRank *R, bool all) {
  int kept = 0;
  for (int j = 0; j < R->nsends; j++) {
    PendingSend *s = &R->sends[j];
    if (all) tp_comm_wait(t->comm, &s->r);
    if (s->r.impl && !t->comm->be->test(t->comm, &s->r)) {
      R->sends[kept++] = *s;
      continue;
    }
    pipe_end_host_view(t, R->stream, s->data, s->view, s->bytes, false);
  }
  R->nsends = kept;
}

/* False while the message has not arrived (one process: its sender has yet to run). */
bool pipe_receive(Trainer *t, PipeRank *R, const TpPlanInsn *x) {
  RankChunk *C = &R->chunk[x->chunk];
  const TpPlanStage *st = C->st;
  const TpPlanMessage *msg = &stage_messages(st, x->kind)[x->slice];
  int src = rank_of(t->plan, R->replica, x->peer % train_pipeline(t->plan), R->tensor), tag = message_tag(t, R, x);
  size_t bytes = message_bytes(msg);
  void *data;
  if (one_process(t)) {
    int j = 0;
    while (j < R->ninbox && !(R->inbox[j].src == src && R->inbox[j].tag == tag)) j++;
    if (j == R->ninbox) return false;
    TP_ASSERT(R->inbox[j].bytes == bytes);
    data = R->inbox[j].data;
    be(t)->stream_wait(t->compute, R->stream, R->inbox[j].ready);
    R->inbox[j] = R->inbox[--R->ninbox];
  } else if (t->comm->be->recv_on) { /* a transport of device buffers (NCCL) */
    data = C->messages[message_kind(x->kind)].data[x->mb * t->plan->nslices + x->slice];
    t->comm->be->recv_on(t->comm, data, bytes, src, tag, R->stream);
  } else {
    data = C->messages[message_kind(x->kind)].data[x->mb * t->plan->nslices + x->slice];
    char what[96];
    snprintf(what, sizeof what, "the %s of microbatch %d, slice %d",
             x->kind == TP_PLAN_RECV_ACT ? "activation" : "gradient", x->mb, x->slice);
    void *view = pipe_host_view(t, R->stream, data, bytes, false, true);
    tp_comm_recv(t->comm, view, bytes, src, tag, what); /* complete: the unpack below finds it */
    pipe_end_host_view(t, R->stream, data, view, bytes, true);
  }
  /* queued after the message on R's stream: nothing waits for it here (data is not reused
   * before the step's end) */
  be(t)->unpack(t->compute, R->stream, C->arena[x->mb % st->arenas], data, msg->buffers, msg->nbuffers);
  return true;
}
