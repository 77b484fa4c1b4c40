#include "schedule.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const insn_names[TP_INSN_COUNT] = {"forward",        "backward",       "send-act",
                                                      "recv-act",       "send-grad",      "recv-grad",
                                                      "allreduce-tied", "allreduce",      "optimizer-step",
                                                      "backward-input", "backward-weight"};
static const char *const schedule_names[] = {"gpipe", "1f1b", "zb", "interleaved"};

const char *tp_insn_name(TpInsnKind k) { return k < TP_INSN_COUNT ? insn_names[k] : "?"; }
const char *tp_schedule_name(TpScheduleKind k) { return k <= TP_SCHEDULE_INTERLEAVED ? schedule_names[k] : "?"; }

bool tp_schedule_parse(const char *name, TpScheduleKind *k) {
  for (int i = 0; i <= TP_SCHEDULE_INTERLEAVED; i++)
    if (!strcmp(name, schedule_names[i])) {
      *k = (TpScheduleKind)i;
      return true;
    }
  return false;
}

void tp_schedule_init(TpSchedule *s, TpScheduleKind kind, int stages, int nmb, const int *nslices) {
  memset(s, 0, sizeof *s);
  s->kind = kind;
  s->stages = stages;
  s->chunks = 1;
  s->nmb = nmb;
  s->nslices = malloc(sizeof(int) * (size_t)(nmb ? nmb : 1));
  memcpy(s->nslices, nslices, sizeof(int) * (size_t)nmb);
  s->count = calloc((size_t)stages, sizeof(int));
  s->insn = calloc((size_t)stages, sizeof(TpInsn *));
}

void tp_schedule_push(TpSchedule *s, int rank, TpInsn insn) {
  int n = s->count[rank];
  if ((n & (n - 1)) == 0) /* grow at powers of two */
    s->insn[rank] = realloc(s->insn[rank], sizeof(TpInsn) * (size_t)(n ? 2 * n : 1));
  s->insn[rank][s->count[rank]++] = insn;
}

void tp_schedule_free(TpSchedule *s) {
  for (int k = 0; k < s->stages; k++) free(s->insn[k]);
  free(s->insn);
  free(s->count);
  free(s->nslices);
  memset(s, 0, sizeof *s);
}

static void unit_forward(TpSchedule *s, int k, int mb, int slice) {
  if (k > 0) tp_schedule_push(s, k, (TpInsn){TP_INSN_RECV_ACT, mb, slice, k - 1, 0});
  tp_schedule_push(s, k, (TpInsn){TP_INSN_FORWARD, mb, slice, -1, 0});
  if (k + 1 < s->stages) tp_schedule_push(s, k, (TpInsn){TP_INSN_SEND_ACT, mb, slice, k + 1, 0});
}

static void unit_backward(TpSchedule *s, int k, int mb, int slice) {
  if (k + 1 < s->stages) tp_schedule_push(s, k, (TpInsn){TP_INSN_RECV_GRAD, mb, slice, k + 1, 0});
  tp_schedule_push(s, k, (TpInsn){TP_INSN_BACKWARD, mb, slice, -1, 0});
  if (k > 0) tp_schedule_push(s, k, (TpInsn){TP_INSN_SEND_GRAD, mb, slice, k - 1, 0});
}

/* The step's end on rank k: the tied all-reduce (first and last virtual stage), the
 * data-parallel all-reduce, the optimizer step. */
static void push_step_end(TpSchedule *s, const TpScheduleSpec *spec, int k) {
  int S = spec->stages;
  if (spec->tied_embedding && S > 1 && (k == 0 || k == S - 1))
    tp_schedule_push(s, k, (TpInsn){TP_INSN_ALLREDUCE_TIED, -1, -1, k == 0 ? S - 1 : 0, k == 0 ? 0 : s->chunks - 1});
  if (spec->data_parallel) tp_schedule_push(s, k, (TpInsn){TP_INSN_ALLREDUCE, -1, -1, -1, 0});
  tp_schedule_push(s, k, (TpInsn){TP_INSN_OPTIMIZER_STEP, -1, -1, -1, 0});
}

/* ZB-H1 (Qi et al., zero-bubble pipeline parallelism) over token slices. Each rank runs
 * its forwards and backward-inputs in 1F1B's order (so the lists keep 1F1B's shape, which
 * holds up when real costs differ from the ones assumed here), and its backward-weights in
 * the backward-inputs' order, so a microbatch's W units come in their B order and together
 * among the W's. Where the W's go comes from a timed run with equal F, B and W costs (the
 * paper's setting): a rank whose next F or B can run runs it (B sends its gradient as soon
 * as it can: the previous stage waits for it); else, its oldest deferred W (an idle slot,
 * or a W that frees a microbatch's arena for the next F); else it waits for the next
 * message. The first stage sends no gradient, so its whole backward is its W (the
 * split-backward pass's rule: what only feeds parameter gradients is weight part): there B
 * costs nothing and W twice. An F that begins a microbatch waits for one of 1F1B's arenas on this rank: a
 * microbatch lives from its first forward to its last W, and no more of them are alive at
 * once (in order) than 1F1B keeps, so ZB-H1 keeps 1F1B's memory. With equal costs and
 * unsliced microbatches the bubble shrinks from 1F1B's (S - 1)(F + B + W) to (S - 1)(F + B)
 * (the last rank's one arena keeps it from the paper's (S - 1)(F + B - W), which counts
 * memory more finely). */
typedef struct {
  const TpScheduleSpec *spec;
  TpSchedule *s;
  int units, (*fwd)[2], (*bwd)[2], *base;
  int *limit;            /* [rank] 1F1B's arenas: the most microbatches alive at once */
  double *fdone, *bdone; /* [rank * units + u] when the rank's F or B of unit u finished; -1 before */
  double *clock;
  int *fi, *bi, *wi;       /* [rank] the next F, B and W in their orders (W: the B order) */
  int *started, *finished; /* [rank] microbatches begun (first F) and done (last W) */
  bool **backward;         /* [rank][F and B count]: 1F1B's order of F (false) and B (true) */
} ZbRun;

/* When rank k's next B could start (its gradient arrived) and its next F (its activation);
 * -1 while not known. */
static double zb_grad_at(const ZbRun *z, int k) {
  if (z->bi[k] == z->units) return -1;
  int u = z->base[z->bwd[z->bi[k]][0]] + z->bwd[z->bi[k]][1];
  size_t row = (size_t)k * z->units;
  if (z->fdone[row + u] < 0) return -1;
  return k + 1 == z->spec->stages ? z->fdone[row + u] : z->bdone[row + z->units + u];
}
static double zb_act_at(const ZbRun *z, int k) {
  if (z->fi[k] == z->units) return -1;
  int m = z->fwd[z->fi[k]][0], i = z->fwd[z->fi[k]][1];
  if (i == 0 && z->started[k] - z->finished[k] >= z->limit[k]) return -1; /* no arena free */
  return k == 0 ? 0 : z->fdone[(size_t)(k - 1) * z->units + z->base[m] + i];
}

/* Rank k's next instruction at time t, if it has one it can run now. */
static bool zb_step(ZbRun *z, int k, double t) {
  size_t row = (size_t)k * z->units;
  int S = z->spec->stages;
  double grad_at = zb_grad_at(z, k), act_at = zb_act_at(z, k);
  bool b_next = z->bi[k] < z->units && z->backward[k][z->fi[k] + z->bi[k]];
  if (b_next && grad_at >= 0 && grad_at <= t) {
    int m = z->bwd[z->bi[k]][0], i = z->bwd[z->bi[k]][1];
    if (k + 1 < S) tp_schedule_push(z->s, k, (TpInsn){TP_INSN_RECV_GRAD, m, i, k + 1, 0});
    tp_schedule_push(z->s, k, (TpInsn){TP_INSN_BACKWARD_INPUT, m, i, -1, 0});
    if (k > 0) tp_schedule_push(z->s, k, (TpInsn){TP_INSN_SEND_GRAD, m, i, k - 1, 0});
    z->bdone[row + z->base[m] + i] = z->clock[k] = t + (k > 0); /* the first stage's B: nothing (below) */
    z->bi[k]++;
  } else if (!b_next && act_at >= 0 && act_at <= t) {
    int m = z->fwd[z->fi[k]][0], i = z->fwd[z->fi[k]][1];
    unit_forward(z->s, k, m, i);
    z->started[k] += i == 0;
    z->fdone[row + z->base[m] + i] = z->clock[k] = t + 1;
    z->fi[k]++;
  } else if (z->wi[k] < z->bi[k]) {
    int m = z->bwd[z->wi[k]][0], i = z->bwd[z->wi[k]][1];
    tp_schedule_push(z->s, k, (TpInsn){TP_INSN_BACKWARD_WEIGHT, m, i, -1, 0});
    z->finished[k] += i == 0; /* slice 0's W is the microbatch's last */
    z->clock[k] = t + (k > 0 ? 1 : 2);
    z->wi[k]++;
  } else return false;
  return true;
}

static void build_zb(const TpScheduleSpec *spec, TpSchedule *s, int units, int (*fwd)[2], int (*bwd)[2]) {
  int S = spec->stages, M = spec->nmb;
  ZbRun z = {.spec = spec, .s = s, .units = units, .fwd = fwd, .bwd = bwd};
  z.limit = malloc(sizeof(int) * (size_t)S);
  TpScheduleSpec one = *spec;
  one.kind = TP_SCHEDULE_1F1B;
  TpSchedule ref;
  tp_schedule_build(&one, &ref);
  z.backward = malloc(sizeof(bool *) * (size_t)S);
  for (int k = 0; k < S; k++) {
    z.limit[k] = tp_schedule_arenas(&ref, k);
    z.backward[k] = malloc(sizeof(bool) * (size_t)(2 * units));
    for (int i = 0, n = 0; i < ref.count[k]; i++)
      if (ref.insn[k][i].kind == TP_INSN_FORWARD || ref.insn[k][i].kind == TP_INSN_BACKWARD)
        z.backward[k][n++] = ref.insn[k][i].kind == TP_INSN_BACKWARD;
  }
  tp_schedule_free(&ref);
  z.base = malloc(sizeof(int) * (size_t)(M + 1));
  for (int m = 0, u = 0; m <= M; u += m < M ? spec->nslices[m] : 0, m++) z.base[m] = u;
  size_t su = (size_t)S * (size_t)units;
  z.fdone = malloc(sizeof(double) * su), z.bdone = malloc(sizeof(double) * su);
  for (size_t i = 0; i < su; i++) z.fdone[i] = z.bdone[i] = -1;
  z.clock = calloc((size_t)S, sizeof(double));
  z.fi = calloc((size_t)S, sizeof(int)), z.bi = calloc((size_t)S, sizeof(int)),
  z.wi = calloc((size_t)S, sizeof(int));
  z.started = calloc((size_t)S, sizeof(int)), z.finished = calloc((size_t)S, sizeof(int));
  for (;;) {
    /* the ranks at the earliest clock run what they can; a step ends later than it starts,
     * so none of them can wait for another's step at this time */
    double t = -1;
    for (int k = 0; k < S; k++)
      if (z.wi[k] < units && (t < 0 || z.clock[k] < t)) t = z.clock[k];
    if (t < 0) break;
    bool moved = false;
    for (int k = 0; k < S; k++)
      if (z.wi[k] < units && z.clock[k] == t) moved |= zb_step(&z, k, t);
    if (moved) continue;
    /* all wait: until the next message arrives or another rank's step ends */
    double next = -1;
    for (int k = 0; k < S; k++) {
      if (z.wi[k] == units) continue;
      double at[3] = {z.clock[k], zb_grad_at(&z, k), zb_act_at(&z, k)};
      for (int j = 0; j < 3; j++)
        if (at[j] > t && (next < 0 || at[j] < next)) next = at[j];
    }
    TP_ASSERT(next > t); /* nothing left to wait for: a builder bug */
    for (int k = 0; k < S; k++)
      if (z.wi[k] < units && z.clock[k] == t) z.clock[k] = next;
  }
  for (int k = 0; k < S; k++) push_step_end(s, spec, k);
  for (int k = 0; k < S; k++) free(z.backward[k]);
  free(z.backward);
  free(z.limit);
  free(z.base);
  free(z.fdone);
  free(z.bdone);
  free(z.clock);
  free(z.fi);
  free(z.bi);
  free(z.wi);
  free(z.started);
  free(z.finished);
}

int tp_schedule_check_spec(const TpScheduleSpec *spec, TpDiag *d) {
  if (spec->kind != TP_SCHEDULE_INTERLEAVED) {
    if (spec->chunks > 1)
      return tp_error(d, "%d chunks per rank need the interleaved schedule (not %s)", spec->chunks,
                      tp_schedule_name(spec->kind));
    return TP_OK;
  }
  if (spec->chunks < 2 || spec->chunks > TP_SCHEDULE_MAX_CHUNKS)
    return tp_error(d, "the interleaved schedule needs 2 to %d chunks per rank (got %d)", TP_SCHEDULE_MAX_CHUNKS,
                    spec->chunks);
  if (spec->stages < 2)
    return tp_error(d,
                    "the interleaved schedule needs at least 2 pipeline ranks (got %d): one rank's chunks "
                    "would send to itself",
                    spec->stages);
  return TP_OK;
}

/* ---- interleaved: V virtual stages per rank ---- */

/* Virtual stage j's forward of a unit on rank k = j % S, chunk c = j / S. */
static void virtual_forward(TpSchedule *s, int k, int c, int mb, int slice) {
  int S = s->stages, j = c * S + k;
  if (j > 0) tp_schedule_push(s, k, (TpInsn){TP_INSN_RECV_ACT, mb, slice, (k + S - 1) % S, c});
  tp_schedule_push(s, k, (TpInsn){TP_INSN_FORWARD, mb, slice, -1, c});
  if (j + 1 < S * s->chunks) tp_schedule_push(s, k, (TpInsn){TP_INSN_SEND_ACT, mb, slice, (k + 1) % S, c});
}

static void virtual_backward(TpSchedule *s, int k, int c, int mb, int slice) {
  int S = s->stages, j = c * S + k;
  if (j + 1 < S * s->chunks) tp_schedule_push(s, k, (TpInsn){TP_INSN_RECV_GRAD, mb, slice, (k + 1) % S, c});
  tp_schedule_push(s, k, (TpInsn){TP_INSN_BACKWARD, mb, slice, -1, c});
  if (j > 0) tp_schedule_push(s, k, (TpInsn){TP_INSN_SEND_GRAD, mb, slice, (k + S - 1) % S, c});
}

/* Megatron's order of (unit, chunk) pairs over the units in forward or backward order (both
 * list a microbatch's slices together): groups of whole microbatches of at least S units
 * each (the last may be smaller), each group through chunks 0..V-1 (forward) or V-1..0
 * (`down`). With one slice per microbatch: Megatron's groups of S microbatches. Whole
 * microbatches, since a microbatch's backward waits for all its slices' forwards. out[i] =
 * {unit index into the order, chunk}. */
static void virtual_order(const TpScheduleSpec *spec, bool down, int (*out)[2]) {
  int S = spec->stages, V = spec->chunks, i = 0;
  for (int m = 0, g = 0; m < spec->nmb;) {
    int size = 0;
    while (m < spec->nmb && size < S) size += spec->nslices[m++];
    for (int step = 0; step < V; step++)
      for (int u = g; u < g + size; u++) out[i][0] = u, out[i][1] = down ? V - 1 - step : step, i++;
    g += size;
  }
}

/* The lists are the order in which the ranks run their forwards and backwards when all
 * units cost alike (forward 1, backward 2, free transfers), each rank taking, when idle:
 * its next forward while it has run fewer than its target (Megatron's warm-up count plus
 * one per backward run; and before a backward of microbatch mb, mb's last slice on the last
 * chunk plus 2 (S - k - 1)), else its next backward once its gradient is there. Running
 * both orders as they come, never out of order, keeps the lists free of deadlock by
 * construction; when no rank can run anything a rank with a forward ready goes past its
 * target (short last groups and slices can need it), so the build always ends. */
static void interleaved_build(const TpScheduleSpec *spec, TpSchedule *s, int units, int (*fwd)[2], int (*bwd)[2]) {
  int S = spec->stages, V = spec->chunks, T = units * V, J = S * V;
  s->chunks = V;
  int(*fseq)[2] = malloc(sizeof *fseq * (size_t)(T ? T : 1)),
  (*bseq)[2] = malloc(sizeof *bseq * (size_t)(T ? T : 1));
  virtual_order(spec, false, fseq);
  virtual_order(spec, true, bseq);
  /* last[mb]: 1 + where the forward order runs mb's last slice on the last chunk; a
   * backward of mb needs it (the gradient comes back through every later virtual stage) */
  int *last = calloc((size_t)(spec->nmb ? spec->nmb : 1), sizeof(int));
  for (int i = 0; i < T; i++)
    if (fseq[i][1] == V - 1) last[fwd[fseq[i][0]][0]] = i + 1;
  /* unit index in the forward order of each entry of the backward order */
  int *unit_of = malloc(sizeof(int) * (size_t)(units ? units : 1)),
      *base = calloc((size_t)spec->nmb + 1, sizeof(int));
  for (int m = 0; m < spec->nmb; m++) base[m + 1] = base[m] + spec->nslices[m];
  for (int u = 0; u < units; u++) unit_of[u] = base[bwd[u][0]] + bwd[u][1];
  /* when virtual stage j finished unit u's forward / backward (-1: not yet) */
  double *fdone = malloc(sizeof(double) * (size_t)(J * units + 1)),
         *bdone = malloc(sizeof(double) * (size_t)(J * units + 1));
  for (int i = 0; i < J * units; i++) fdone[i] = bdone[i] = -1;
  int *f = calloc((size_t)S, sizeof(int)), *b = calloc((size_t)S, sizeof(int));
  double *free_at = calloc((size_t)S, sizeof(double)), now = 0;
  bool stalled = false;
  for (;;) {
    bool ran = false, busy = false;
    for (int k = 0; k < S; k++) {
      if (free_at[k] > now) {
        busy = true;
        continue;
      }
      if (f[k] == T && b[k] == T) continue;
      int slack = 2 * (S - k - 1), target = T;
      if (b[k] < T) {
        int mb = bwd[bseq[b[k]][0]][0];
        target = slack + (V - 1) * S + b[k] + 1;
        if (last[mb] + slack > target) target = last[mb] + slack;
        if (target > T) target = T;
      }
      bool fready = false, bready = false;
      int fu = 0, fj = 0, bu = 0, bj = 0;
      if (f[k] < T) {
        fu = fseq[f[k]][0], fj = fseq[f[k]][1] * S + k;
        double in = fj == 0 ? 0 : fdone[(size_t)(fj - 1) * units + fu];
        fready = in >= 0 && in <= now;
      }
      if (b[k] < T) {
        bu = unit_of[bseq[b[k]][0]], bj = bseq[b[k]][1] * S + k;
        double in = bj == J - 1 ? fdone[(size_t)bj * units + bu] : bdone[(size_t)(bj + 1) * units + bu];
        bready = in >= 0 && in <= now;
      }
      if (fready && (f[k] < target || (stalled && !bready))) {
        fdone[(size_t)fj * units + fu] = free_at[k] = now + 1;
        virtual_forward(s, k, fseq[f[k]][1], fwd[fu][0], fwd[fu][1]);
        f[k]++;
      } else if (bready) {
        bdone[(size_t)bj * units + bu] = free_at[k] = now + 2;
        virtual_backward(s, k, bseq[b[k]][1], bwd[bseq[b[k]][0]][0], bwd[bseq[b[k]][0]][1]);
        b[k]++;
      } else continue;
      ran = busy = true;
      stalled = false;
    }
    if (ran) continue; /* others may start at the same time */
    if (!busy) {
      bool all = true;
      for (int k = 0; k < S; k++) all = all && f[k] == T && b[k] == T;
      if (all) break;
      TP_ASSERT(!stalled); /* a forward is always ready somewhere when nothing runs */
      stalled = true;
      continue;
    }
    double next = INFINITY;
    for (int k = 0; k < S; k++)
      if (free_at[k] > now && free_at[k] < next) next = free_at[k];
    now = next;
  }
  for (int k = 0; k < S; k++) push_step_end(s, spec, k);
  free(f), free(b), free(free_at), free(fdone), free(bdone), free(unit_of), free(base);
  free(last);
  free(fseq);
  free(bseq);
}

void tp_schedule_build(const TpScheduleSpec *spec, TpSchedule *s) {
  TpDiag quiet;
  tp_diag_init(&quiet, "tp_schedule_build", NULL, NULL);
  TP_ASSERT(tp_schedule_check_spec(spec, &quiet) == TP_OK); /* callers check first */
  tp_schedule_init(s, spec->kind, spec->stages, spec->nmb, spec->nslices);
  int units = 0;
  for (int m = 0; m < spec->nmb; m++) units += spec->nslices[m];
  /* forward order: microbatches in order, slices in order; backward order per
   * microbatch: later slices first */
  int(*fwd)[2] = malloc(sizeof *fwd * (size_t)units), (*bwd)[2] = malloc(sizeof *bwd * (size_t)units);
  for (int m = 0, u = 0; m < spec->nmb; m++)
    for (int i = 0; i < spec->nslices[m]; i++, u++) {
      fwd[u][0] = m, fwd[u][1] = i;
      bwd[u][0] = m, bwd[u][1] = spec->nslices[m] - 1 - i;
    }
  if (spec->kind == TP_SCHEDULE_ZB) build_zb(spec, s, units, fwd, bwd);
  if (spec->kind == TP_SCHEDULE_INTERLEAVED) interleaved_build(spec, s, units, fwd, bwd);
  for (int k = 0; k < spec->stages && spec->kind <= TP_SCHEDULE_1F1B; k++) {
    if (spec->kind == TP_SCHEDULE_GPIPE) {
      /* all forwards, then all backwards in reverse order */
      for (int u = 0; u < units; u++) unit_forward(s, k, fwd[u][0], fwd[u][1]);
      for (int u = units - 1; u >= 0; u--) unit_backward(s, k, fwd[u][0], fwd[u][1]);
    } else {
      /* 1F1B: enough forwards that a microbatch's last slice can come back (the longest
       * microbatch's slices plus one per later stage), then alternate backward and
       * forward */
      int longest = 0;
      for (int m = 0; m < spec->nmb; m++)
        if (spec->nslices[m] > longest) longest = spec->nslices[m];
      int warm = longest + spec->stages - k - 1;
      if (warm > units) warm = units;
      int f = 0, b = 0;
      for (; f < warm; f++) unit_forward(s, k, fwd[f][0], fwd[f][1]);
      while (b < units) {
        /* a microbatch with more slices than the first needs its forwards done first */
        while (f < units && (fwd[f][0] < bwd[b][0] || (fwd[f][0] == bwd[b][0] && fwd[f][1] <= bwd[b][1]))) {
          unit_forward(s, k, fwd[f][0], fwd[f][1]);
          f++;
        }
        unit_backward(s, k, bwd[b][0], bwd[b][1]);
        b++;
        if (f < units) {
          unit_forward(s, k, fwd[f][0], fwd[f][1]);
          f++;
        }
      }
    }
    push_step_end(s, spec, k);
  }
  free(fwd);
  free(bwd);
}

/* ---- verification ---- */

/* " chunk C" in buf where the schedule has several chunks, else "". */
static const char *chunk_label(const TpSchedule *s, int chunk, char buf[24]) {
  buf[0] = 0;
  if (s->chunks > 1) snprintf(buf, 24, " chunk %d", chunk);
  return buf;
}

static bool is_send(TpInsnKind k) { return k == TP_INSN_SEND_ACT || k == TP_INSN_SEND_GRAD; }
static bool is_recv(TpInsnKind k) { return k == TP_INSN_RECV_ACT || k == TP_INSN_RECV_GRAD; }
static TpInsnKind matching(TpInsnKind k) {
  switch (k) {
  case TP_INSN_SEND_ACT: return TP_INSN_RECV_ACT;
  case TP_INSN_RECV_ACT: return TP_INSN_SEND_ACT;
  case TP_INSN_SEND_GRAD: return TP_INSN_RECV_GRAD;
  case TP_INSN_RECV_GRAD: return TP_INSN_SEND_GRAD;
  default: return k;
  }
}

int tp_schedule_peer_stage(const TpSchedule *s, int k, const TpInsn *x) {
  int S = s->stages, last = S * s->chunks - 1, j = x->chunk * S + k, p;
  switch (x->kind) {
  case TP_INSN_SEND_ACT:
  case TP_INSN_RECV_GRAD: p = j + 1; break;
  case TP_INSN_RECV_ACT:
  case TP_INSN_SEND_GRAD: p = j - 1; break;
  case TP_INSN_ALLREDUCE_TIED: p = j == 0 ? last : j == last ? 0 : -1; break;
  default: return -1;
  }
  return p >= 0 && p <= last && p != j ? p : -1;
}

/* Position of the instruction on rank r matching insn x of rank `from` (-1 if none);
 * *dups counts further matches. */
static int find_match(const TpSchedule *s, int from, const TpInsn *x, int *dups) {
  int r = x->peer, at = -1, chunk = tp_schedule_peer_stage(s, from, x) / s->stages;
  *dups = 0;
  for (int i = 0; i < s->count[r]; i++) {
    const TpInsn *y = &s->insn[r][i];
    if (y->kind == matching(x->kind) && y->peer == from && y->mb == x->mb && y->slice == x->slice &&
        y->chunk == chunk) {
      if (at < 0) at = i;
      else (*dups)++;
    }
  }
  return at;
}

static bool has_unit(TpInsnKind k) {
  return k <= TP_INSN_RECV_GRAD || k == TP_INSN_BACKWARD_INPUT || k == TP_INSN_BACKWARD_WEIGHT;
}

/* The units of rank k's chunk `chunk` (and all its instructions' kinds, chunks and peers):
 * each forward once, slices in order; each backward once (whole, or its input part then its
 * weight part), after its forward, later slices first; the weight parts of a microbatch in
 * its backward-inputs' order, not interleaved with another microbatch's weight parts (the
 * runtime sums a microbatch's parameter gradients at once). */
static int check_units(const TpSchedule *s, int k, int chunk, TpDiag *d) {
  int units = 0;
  for (int m = 0; m < s->nmb; m++) units += s->nslices[m];
  size_t n = (size_t)(units + 1);
  /* positions of each unit's forward, backward (or backward-input) and backward-weight */
  int *fpos = malloc(sizeof(int) * n), *bpos = malloc(sizeof(int) * n), *wpos = malloc(sizeof(int) * n);
  bool *split = calloc(n, sizeof(bool)), *closed = calloc((size_t)s->nmb + 1, sizeof(bool));
  int *base = malloc(sizeof(int) * (size_t)(s->nmb + 1));
  for (int m = 0, u = 0; m <= s->nmb; u += m < s->nmb ? s->nslices[m] : 0, m++) base[m] = u;
  for (int u = 0; u < units; u++) fpos[u] = bpos[u] = wpos[u] = -1;
  int rc = TP_OK, wmb = -1; /* the microbatch of the last backward-weight */
  char at[24];
  chunk_label(s, chunk, at);
  for (int i = 0; i < s->count[k] && !rc; i++) {
    const TpInsn *x = &s->insn[k][i];
    if (x->kind >= TP_INSN_COUNT) {
      rc = tp_error(d, "rank %d instruction %d: bad kind", k, i);
      break;
    }
    const char *name = tp_insn_name(x->kind);
    if (x->chunk < 0 || x->chunk >= s->chunks) {
      rc = tp_error(d, "rank %d instruction %d (%s): chunk %d, not one of the rank's %d", k, i, name, x->chunk,
                    s->chunks);
      break;
    }
    if (x->chunk != chunk) continue;
    if (has_unit(x->kind) && (x->mb < 0 || x->mb >= s->nmb || x->slice < 0 || x->slice >= s->nslices[x->mb])) {
      rc = tp_error(d, "rank %d instruction %d (%s): no unit mb %d slice %d", k, i, name, x->mb, x->slice);
      break;
    }
    if (is_send(x->kind) || is_recv(x->kind) || x->kind == TP_INSN_ALLREDUCE_TIED) {
      int peer = tp_schedule_peer_stage(s, k, x);
      if (peer < 0)
        rc = tp_error(d, "rank %d%s instruction %d (%s mb %d slice %d): no virtual stage on that side", k, at, i,
                      name, x->mb, x->slice);
      else if (x->peer != peer % s->stages)
        rc = tp_error(d, "rank %d%s instruction %d (%s mb %d slice %d): peer %d is not rank %d", k, at, i, name,
                      x->mb, x->slice, x->peer, peer % s->stages);
      continue;
    }
    if (!has_unit(x->kind)) continue;
    int u = base[x->mb] + x->slice, m = x->mb, sl = x->slice;
    if (x->kind == TP_INSN_BACKWARD_WEIGHT) {
      if (wpos[u] >= 0) rc = tp_error(d, "rank %d: %s of mb %d slice %d twice", k, name, m, sl);
      else if (bpos[u] >= 0 && !split[u])
        rc = tp_error(d, "rank %d instruction %d: mb %d slice %d has both backward and backward-weight", k, i, m,
                      sl);
      else if (bpos[u] < 0)
        rc = tp_error(d, "rank %d instruction %d: backward-weight of mb %d slice %d before its backward-input", k, i,
                      m, sl);
      else if (sl + 1 < s->nslices[m] && wpos[u + 1] < 0)
        rc = tp_error(d,
                      "rank %d instruction %d: backward-weight of mb %d slice %d before slice %d's (a microbatch's "
                      "backward-weights run in its backward-inputs' order)",
                      k, i, m, sl, sl + 1);
      else if (closed[m])
        rc = tp_error(d,
                      "rank %d instruction %d: backward-weight of mb %d slice %d after mb %d's began (a "
                      "microbatch's backward-weights run together, not interleaved with another's)",
                      k, i, m, sl, wmb);
      if (wmb >= 0 && wmb != m) closed[wmb] = true;
      wmb = m;
      wpos[u] = i;
      continue;
    }
    bool backward = x->kind != TP_INSN_FORWARD;
    int *pos = backward ? bpos : fpos;
    if (pos[u] >= 0) {
      if (backward && split[u] != (x->kind == TP_INSN_BACKWARD_INPUT))
        rc = tp_error(d, "rank %d%s instruction %d: mb %d slice %d has both backward and backward-input", k, at, i,
                      m, sl);
      else rc = tp_error(d, "rank %d%s: %s of mb %d slice %d twice", k, at, name, m, sl);
      break;
    }
    pos[u] = i;
    split[u] = x->kind == TP_INSN_BACKWARD_INPUT;
    if (!backward && sl > 0 && fpos[u - 1] < 0)
      rc = tp_error(d, "rank %d%s: forward of mb %d slice %d before slice %d", k, at, m, sl, sl - 1);
    if (backward && fpos[u] < 0)
      rc = tp_error(d, "rank %d%s: %s of mb %d slice %d before its forward", k, at, name, m, sl);
    if (backward && sl + 1 < s->nslices[m] && bpos[u + 1] < 0)
      rc = tp_error(d, "rank %d%s: %s of mb %d slice %d before slice %d (later slices go first)", k, at, name, m, sl,
                    sl + 1);
  }
  for (int u = 0; u < units && !rc; u++)
    if (fpos[u] < 0 || bpos[u] < 0 || (split[u] && wpos[u] < 0)) {
      int m = 0;
      while (base[m + 1] <= u) m++;
      rc = tp_error(d, "rank %d%s: mb %d slice %d has no %s", k, at, m, u - base[m],
                    fpos[u] < 0   ? "forward"
                    : bpos[u] < 0 ? "backward"
                                  : "backward-weight");
    }
  free(fpos);
  free(bpos);
  free(wpos);
  free(split);
  free(closed);
  free(base);
  return rc;
}

int tp_schedule_verify(const TpSchedule *s, bool rendezvous, TpDiag *d) {
  for (int k = 0; k < s->stages; k++) {
    for (int c = 0; c < s->chunks; c++) {
      int rc = check_units(s, k, c, d);
      if (rc) return rc;
    }
    for (int i = 0; i < s->count[k]; i++) {
      const TpInsn *x = &s->insn[k][i];
      if (!is_send(x->kind) && !is_recv(x->kind)) continue;
      int dups, at = find_match(s, k, x, &dups);
      char label[24], peer_label[24];
      if (at < 0 || dups)
        return tp_error(d, "rank %d: %s mb %d slice %d%s %s rank %d%s has %s", k, tp_insn_name(x->kind), x->mb,
                        x->slice, chunk_label(s, x->chunk, label), is_send(x->kind) ? "to" : "from", x->peer,
                        chunk_label(s, tp_schedule_peer_stage(s, k, x) / s->stages, peer_label),
                        at < 0 ? "no matching receive or send" : "more than one match");
    }
  }
  /* Run all ranks: a receive waits for its send; with rendezvous a send also waits for its
   * receive; allreduce-tied waits for the peer. Sends are found by scanning (the lists
   * are short enough; this runs once per compile). */
  int n = s->stages, *pc = calloc((size_t)(n > 0 ? n : 1), sizeof(int));
  char **done = malloc(sizeof(char *) * (size_t)n); /* done[r][i]: instruction i executed */
  for (int r = 0; r < n; r++) done[r] = calloc((size_t)s->count[r] + 1, 1);
  bool progress = true;
  int rc = TP_OK;
  while (progress) {
    progress = false;
    for (int r = 0; r < n; r++)
      while (pc[r] < s->count[r]) {
        const TpInsn *x = &s->insn[r][pc[r]];
        int dups, at = is_send(x->kind) || is_recv(x->kind) ? find_match(s, r, x, &dups) : -1;
        if (is_recv(x->kind) && !rendezvous && !done[x->peer][at]) break;
        if ((is_send(x->kind) || is_recv(x->kind)) && rendezvous) {
          if (pc[x->peer] != at) break;
          done[x->peer][at] = 1; /* the pair completes together */
          pc[x->peer]++;
        }
        if (x->kind == TP_INSN_ALLREDUCE_TIED) {
          const TpInsn *y = pc[x->peer] < s->count[x->peer] ? &s->insn[x->peer][pc[x->peer]] : NULL;
          if (!y || y->kind != TP_INSN_ALLREDUCE_TIED || y->peer != r) break;
          done[x->peer][pc[x->peer]++] = 1;
        }
        done[r][pc[r]++] = 1;
        progress = true;
      }
  }
  for (int r = 0; r < n && !rc; r++)
    if (pc[r] < s->count[r]) {
      const TpInsn *x = &s->insn[r][pc[r]];
      char label[24];
      rc = tp_error(d, "schedule %s deadlocks%s: rank %d waits at instruction %d (%s mb %d slice %d%s, peer %d)",
                    tp_schedule_name(s->kind), rendezvous ? " with blocking sends" : "", r, pc[r],
                    tp_insn_name(x->kind), x->mb, x->slice, chunk_label(s, x->chunk, label), x->peer);
    }
  for (int r = 0; r < n; r++) free(done[r]);
  free(done);
  free(pc);
  return rc;
}

void tp_schedule_print(const TpSchedule *s, FILE *out) {
  fprintf(out, "schedule %s: %d stages", tp_schedule_name(s->kind), s->stages);
  if (s->chunks > 1) fprintf(out, " x %d chunks", s->chunks);
  fprintf(out, ", %d microbatches, slices [", s->nmb);
  for (int m = 0; m < s->nmb; m++) fprintf(out, "%s%d", m ? ", " : "", s->nslices[m]);
  fprintf(out, "]\n");
  for (int k = 0; k < s->stages; k++) {
    fprintf(out, "rank %d:\n", k);
    for (int i = 0; i < s->count[k]; i++) {
      const TpInsn *x = &s->insn[k][i];
      fprintf(out, "  %-15s", tp_insn_name(x->kind));
      if (x->mb >= 0) fprintf(out, " mb %d slice %d", x->mb, x->slice);
      if (s->chunks > 1 && (x->mb >= 0 || x->kind == TP_INSN_ALLREDUCE_TIED)) fprintf(out, " chunk %d", x->chunk);
      if (is_send(x->kind)) fprintf(out, " -> %d", x->peer);
      if (is_recv(x->kind)) fprintf(out, " <- %d", x->peer);
      if (x->kind == TP_INSN_ALLREDUCE_TIED) fprintf(out, " with %d", x->peer);
      int peer = tp_schedule_peer_stage(s, k, x);
      if (s->chunks > 1 && peer >= 0) fprintf(out, " chunk %d", peer / s->stages);
      fprintf(out, "\n");
    }
  }
}

/* The arenas of rank k's instructions with that chunk (-1: all of them). */
static int arenas_of(const TpSchedule *s, int k, int chunk) {
  int M = s->nmb, *first = malloc(sizeof(int) * (size_t)M), *last = malloc(sizeof(int) * (size_t)M);
  TP_ASSERT(first && last);
  for (int mb = 0; mb < M; mb++) first[mb] = INT32_MAX, last[mb] = -1;
  for (int i = 0; i < s->count[k]; i++) {
    int mb = s->insn[k][i].mb;
    if (mb < 0 || (chunk >= 0 && s->insn[k][i].chunk != chunk)) continue;
    if (i < first[mb]) first[mb] = i;
    last[mb] = i;
  }
  int arenas = 1;
  for (int a = 0; a < M; a++) { /* the most alive at once */
    int alive = 0;
    for (int b = 0; b < M; b++) alive += first[b] <= first[a] && first[a] <= last[b];
    if (alive > arenas) arenas = alive;
  }
  for (bool clash = true; clash && arenas < M; arenas += clash) {
    clash = false;
    for (int a = 0; a < M && !clash; a++)
      for (int b = a + 1; b < M && !clash; b++)
        clash = a % arenas == b % arenas && first[a] <= last[b] && first[b] <= last[a];
  }
  free(first);
  free(last);
  return arenas;
}

int tp_schedule_arenas(const TpSchedule *s, int k) { return arenas_of(s, k, -1); }

int tp_schedule_chunk_arenas(const TpSchedule *s, int k, int chunk) { return arenas_of(s, k, chunk); }
