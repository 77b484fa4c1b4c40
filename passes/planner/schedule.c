#include "schedule.h"

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

/* Interleaved lists until the planner builds Megatron's order: each rank runs its virtual
 * stages one after the other, every unit's forward through chunk 0, then chunk 1, ..., then
 * the backwards in reverse (GPipe over the S * V virtual stages, rank k's chunk c being
 * virtual stage c * S + k). */
static void build_interleaved_in_order(const TpScheduleSpec *spec, TpSchedule *s) {
  int S = spec->stages, V = spec->chunks, last = S * V - 1;
  s->chunks = V;
  for (int k = 0; k < S; k++) {
    for (int c = 0; c < V; c++) {
      int j = c * S + k;
      for (int m = 0; m < spec->nmb; m++)
        for (int i = 0; i < spec->nslices[m]; i++) {
          if (j > 0) tp_schedule_push(s, k, (TpInsn){TP_INSN_RECV_ACT, m, i, (j - 1) % S, c});
          tp_schedule_push(s, k, (TpInsn){TP_INSN_FORWARD, m, i, -1, c});
          if (j < last) tp_schedule_push(s, k, (TpInsn){TP_INSN_SEND_ACT, m, i, (j + 1) % S, c});
        }
    }
    for (int c = V - 1; c >= 0; c--) {
      int j = c * S + k;
      for (int m = spec->nmb - 1; m >= 0; m--)
        for (int i = 0; i < spec->nslices[m]; i++) {
          int slice = spec->nslices[m] - 1 - i;
          if (j < last) tp_schedule_push(s, k, (TpInsn){TP_INSN_RECV_GRAD, m, slice, (j + 1) % S, c});
          tp_schedule_push(s, k, (TpInsn){TP_INSN_BACKWARD, m, slice, -1, c});
          if (j > 0) tp_schedule_push(s, k, (TpInsn){TP_INSN_SEND_GRAD, m, slice, (j - 1) % S, c});
        }
    }
    if (spec->tied_embedding && (k == 0 || k == S - 1))
      tp_schedule_push(s, k, (TpInsn){TP_INSN_ALLREDUCE_TIED, -1, -1, k == 0 ? S - 1 : 0, 0});
    if (spec->data_parallel) tp_schedule_push(s, k, (TpInsn){TP_INSN_ALLREDUCE, -1, -1, -1, 0});
    tp_schedule_push(s, k, (TpInsn){TP_INSN_OPTIMIZER_STEP, -1, -1, -1, 0});
  }
}

void tp_schedule_build(const TpScheduleSpec *spec, TpSchedule *s) {
  tp_schedule_init(s, spec->kind, spec->stages, spec->nmb, spec->nslices);
  if (spec->kind == TP_SCHEDULE_INTERLEAVED) {
    build_interleaved_in_order(spec, s);
    return;
  }
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
  for (int k = 0; k < spec->stages; k++) {
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
    bool edge = k == 0 || k == spec->stages - 1;
    if (spec->tied_embedding && spec->stages > 1 && edge)
      tp_schedule_push(s, k, (TpInsn){TP_INSN_ALLREDUCE_TIED, -1, -1, k == 0 ? spec->stages - 1 : 0, 0});
    if (spec->data_parallel) tp_schedule_push(s, k, (TpInsn){TP_INSN_ALLREDUCE, -1, -1, -1, 0});
    tp_schedule_push(s, k, (TpInsn){TP_INSN_OPTIMIZER_STEP, -1, -1, -1, 0});
  }
  free(fwd);
  free(bwd);
}

/* ---- verification ---- */

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

/* Position of the instruction on rank r matching insn x of rank `from` (-1 if none);
 * *dups counts further matches. */
static int find_match(const TpSchedule *s, int from, const TpInsn *x, int *dups) {
  int r = x->peer, at = -1;
  *dups = 0;
  for (int i = 0; i < s->count[r]; i++) {
    const TpInsn *y = &s->insn[r][i];
    if (y->kind == matching(x->kind) && y->peer == from && y->mb == x->mb && y->slice == x->slice) {
      if (at < 0) at = i;
      else (*dups)++;
    }
  }
  return at;
}

static int check_units(const TpSchedule *s, int k, TpDiag *d) {
  int units = 0;
  for (int m = 0; m < s->nmb; m++) units += s->nslices[m];
  int *fpos = malloc(sizeof(int) * (size_t)(units + 1)), *bpos = malloc(sizeof(int) * (size_t)(units + 1));
  int *base = malloc(sizeof(int) * (size_t)(s->nmb + 1));
  for (int m = 0, u = 0; m <= s->nmb; u += m < s->nmb ? s->nslices[m] : 0, m++) base[m] = u;
  for (int u = 0; u < units; u++) fpos[u] = bpos[u] = -1;
  int rc = TP_OK;
  for (int i = 0; i < s->count[k] && !rc; i++) {
    const TpInsn *x = &s->insn[k][i];
    if (x->kind >= TP_INSN_COUNT) {
      rc = tp_error(d, "rank %d instruction %d: bad kind", k, i);
      break;
    }
    if (x->kind <= TP_INSN_RECV_GRAD &&
        (x->mb < 0 || x->mb >= s->nmb || x->slice < 0 || x->slice >= s->nslices[x->mb])) {
      rc = tp_error(d, "rank %d instruction %d (%s): no unit mb %d slice %d", k, i, tp_insn_name(x->kind), x->mb,
                    x->slice);
      break;
    }
    if (is_send(x->kind) || is_recv(x->kind) || x->kind == TP_INSN_ALLREDUCE_TIED) {
      bool down = x->kind == TP_INSN_SEND_ACT || x->kind == TP_INSN_RECV_GRAD;
      int want = x->kind == TP_INSN_ALLREDUCE_TIED ? x->peer : down ? k + 1 : k - 1;
      if (x->peer != want || x->peer < 0 || x->peer >= s->stages || x->peer == k)
        rc = tp_error(d, "rank %d instruction %d (%s mb %d slice %d): peer %d is not rank %d", k, i,
                      tp_insn_name(x->kind), x->mb, x->slice, x->peer, want);
      continue;
    }
    if (x->kind != TP_INSN_FORWARD && x->kind != TP_INSN_BACKWARD) continue;
    int u = base[x->mb] + x->slice;
    int *pos = x->kind == TP_INSN_FORWARD ? fpos : bpos;
    if (pos[u] >= 0) {
      rc = tp_error(d, "rank %d: %s of mb %d slice %d twice", k, tp_insn_name(x->kind), x->mb, x->slice);
      break;
    }
    pos[u] = i;
    if (x->kind == TP_INSN_FORWARD && x->slice > 0 && fpos[u - 1] < 0)
      rc = tp_error(d, "rank %d: forward of mb %d slice %d before slice %d", k, x->mb, x->slice, x->slice - 1);
    if (x->kind == TP_INSN_BACKWARD && fpos[u] < 0)
      rc = tp_error(d, "rank %d: backward of mb %d slice %d before its forward", k, x->mb, x->slice);
    if (x->kind == TP_INSN_BACKWARD && x->slice + 1 < s->nslices[x->mb] && bpos[u + 1] < 0)
      rc = tp_error(d, "rank %d: backward of mb %d slice %d before slice %d (later slices go first)", k, x->mb,
                    x->slice, x->slice + 1);
  }
  for (int u = 0; u < units && !rc; u++)
    if (fpos[u] < 0 || bpos[u] < 0) {
      int m = 0;
      while (base[m + 1] <= u) m++;
      rc = tp_error(d, "rank %d: mb %d slice %d has no %s", k, m, u - base[m], fpos[u] < 0 ? "forward" : "backward");
    }
  free(fpos);
  free(bpos);
  free(base);
  return rc;
}

int tp_schedule_verify(const TpSchedule *s, bool rendezvous, TpDiag *d) {
  for (int k = 0; k < s->stages; k++) {
    int rc = check_units(s, k, d);
    if (rc) return rc;
    for (int i = 0; i < s->count[k]; i++) {
      const TpInsn *x = &s->insn[k][i];
      if (!is_send(x->kind) && !is_recv(x->kind)) continue;
      int dups, at = find_match(s, k, x, &dups);
      if (at < 0 || dups)
        return tp_error(d, "rank %d: %s mb %d slice %d %s rank %d has %s", k, tp_insn_name(x->kind), x->mb, x->slice,
                        is_send(x->kind) ? "to" : "from", x->peer,
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
      rc = tp_error(d, "schedule %s deadlocks%s: rank %d waits at instruction %d (%s mb %d slice %d, peer %d)",
                    tp_schedule_name(s->kind), rendezvous ? " with blocking sends" : "", r, pc[r],
                    tp_insn_name(x->kind), x->mb, x->slice, x->peer);
    }
  for (int r = 0; r < n; r++) free(done[r]);
  free(done);
  free(pc);
  return rc;
}

void tp_schedule_print(const TpSchedule *s, FILE *out) {
  fprintf(out, "schedule %s: %d stages, %d microbatches, slices [", tp_schedule_name(s->kind), s->stages, s->nmb);
  for (int m = 0; m < s->nmb; m++) fprintf(out, "%s%d", m ? ", " : "", s->nslices[m]);
  fprintf(out, "]\n");
  for (int k = 0; k < s->stages; k++) {
    fprintf(out, "rank %d:\n", k);
    for (int i = 0; i < s->count[k]; i++) {
      const TpInsn *x = &s->insn[k][i];
      fprintf(out, "  %-15s", tp_insn_name(x->kind));
      if (x->mb >= 0) fprintf(out, " mb %d slice %d", x->mb, x->slice);
      if (is_send(x->kind)) fprintf(out, " -> %d", x->peer);
      if (is_recv(x->kind)) fprintf(out, " <- %d", x->peer);
      if (x->kind == TP_INSN_ALLREDUCE_TIED) fprintf(out, " with %d", x->peer);
      fprintf(out, "\n");
    }
  }
}

int tp_schedule_arenas(const TpSchedule *s, int k) { return tp_schedule_chunk_arenas(s, k, -1); }

int tp_schedule_chunk_arenas(const TpSchedule *s, int k, int chunk) {
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
