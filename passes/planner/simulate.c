#include "simulate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void *alloc0(size_t n, size_t size) { return calloc(n ? n : 1, size); }

void tp_sim_costs_from_model(const TpCostModel *cm, const TpSlicing *plan, TpSimCosts *c) {
  memset(c, 0, sizeof *c);
  int S = cm->nstages;
  c->stages = S;
  c->nmb = plan->n;
  c->base = alloc0((size_t)plan->n, sizeof(int));
  for (int m = 0; m < plan->n; m++) {
    c->base[m] = c->units;
    c->units += plan->mb[m].nslices;
  }
  size_t su = (size_t)S * c->units;
  c->fwd = alloc0(su, sizeof(double));
  c->bwd = alloc0(su, sizeof(double));
  c->wgt = alloc0(su, sizeof(double));
  c->send = alloc0(su, sizeof(double));
  c->memory = alloc0((size_t)S, sizeof *c->memory);
  double *kept = alloc0((size_t)S, sizeof(double)), *transient = alloc0((size_t)S, sizeof(double));
  c->allreduce = alloc0((size_t)S, sizeof(double));
  c->optimizer = alloc0((size_t)S, sizeof(double));
  /* stages with the same shape cost the same: compute middle stages once per unit */
  for (int m = 0; m < plan->n; m++) {
    const TpMicrobatch *mb = &plan->mb[m];
    for (int i = 0, ctx = 0; i < mb->nslices; ctx += mb->len[i], i++) {
      int u = c->base[m] + i;
      TpTime prev = {0, 0, 0};
      int prev_k = -1;
      for (int k = 0; k < S; k++) {
        const TpStage *st = &cm->stage[k];
        bool same = prev_k >= 0 && !st->embedding && !st->head && !cm->stage[prev_k].embedding &&
                    !cm->stage[prev_k].head && st->layers == cm->stage[prev_k].layers;
        TpTime t = same ? prev : tp_stage_time(cm, k, mb->size, mb->len[i], ctx);
        prev = t;
        prev_k = k;
        c->fwd[(size_t)k * c->units + u] = t.fwd;
        c->bwd[(size_t)k * c->units + u] = t.bwd;
        c->wgt[(size_t)k * c->units + u] = t.wgt;
        double work = tp_unit_transient_bytes(cm, k, mb->size, mb->len[i], ctx);
        if (work > transient[k]) transient[k] = work;
        if (k + 1 < S) c->send[(size_t)k * c->units + u] = tp_send_time(cm, k, mb->size, mb->len[i]);
      }
    }
    for (int k = 0; k < S; k++) {
      double bytes = tp_microbatch_kept_bytes(cm, k, mb->size, mb->nslices);
      if (bytes > kept[k]) kept[k] = bytes;
    }
  }
  for (int k = 0; k < S; k++) {
    c->memory[k] = tp_stage_memory_input(cm, k, plan->n, kept[k], transient[k], 0);
    c->allreduce[k] = tp_grad_allreduce_time(cm, k);
    c->optimizer[k] = tp_optimizer_time(cm, k);
  }
  free(kept);
  free(transient);
  /* tied embedding / head gradient between the first and last rank: each tensor shard
   * with its peer; across nodes the shards share the node's link */
  const TpHardware *hw = &cm->hw;
  double shard = (double)cm->model.vocab * cm->model.hidden / cm->tensor * hw->dtype_bytes;
  int ranks = cm->pipeline; /* the first and last virtual stage are on ranks 0 and ranks - 1 */
  if (ranks > 1 && ranks * cm->tensor > hw->devices_per_node)
    c->tied_allreduce = hw->inter_latency_s + shard * cm->tensor / hw->inter_bandwidth;
  else if (ranks > 1) c->tied_allreduce = hw->intra_latency_s + shard / hw->intra_bandwidth;
}

void tp_sim_costs_free(TpSimCosts *c) {
  free(c->base);
  free(c->fwd);
  free(c->bwd);
  free(c->wgt);
  free(c->send);
  free(c->memory);
  free(c->allreduce);
  free(c->optimizer);
  memset(c, 0, sizeof *c);
}

static void record_event(TpSimResult *r, int *cap, TpEvent e) {
  if (r->nevents == *cap) r->events = realloc(r->events, sizeof(TpEvent) * (size_t)(*cap = *cap ? 2 * *cap : 256));
  r->events[r->nevents++] = e;
}

/* Rank k's memory model input: with several chunks, their parameters summed, their arenas
 * folded into `kept` (one arena), the largest transient region. */
static TpRankMemoryInput rank_memory_input(const TpSchedule *s, const TpSimCosts *c, int k) {
  TpRankMemoryInput in = c->memory[k];
  in.arenas = tp_schedule_arenas(s, k);
  if (s->chunks == 1) return in;
  in.trained = in.frozen = in.kept = in.transient = 0;
  in.arenas = 1;
  for (int chunk = 0; chunk < s->chunks; chunk++) {
    const TpRankMemoryInput *v = &c->memory[chunk * s->stages + k];
    in.trained += v->trained;
    in.frozen += v->frozen;
    in.kept += v->kept * tp_schedule_chunk_arenas(s, k, chunk);
    if (v->transient > in.transient) in.transient = v->transient;
  }
  return in;
}

int tp_simulate(const TpSchedule *s, const TpSimCosts *c, bool record, TpSimResult *r, TpDiag *d) {
  memset(r, 0, sizeof *r);
  /* S ranks; costs and arrivals per virtual stage j = chunk * S + rank (j = rank unless
   * interleaved) */
  int S = s->stages, J = S * s->chunks, U = c->units, cap = 0;
  TP_ASSERT(J == c->stages && s->nmb == c->nmb);
  r->busy_s = alloc0((size_t)S, sizeof(double));
  r->peak_bytes = alloc0((size_t)S, sizeof(double));
  double *clock = alloc0((size_t)S, sizeof(double));
  int *pc = alloc0((size_t)S, sizeof(int));
  /* arrival[k][u]: when unit u's activation reached rank k (act) / its gradient reached
   * rank k (grad); -1 = not sent yet */
  double *act = malloc(sizeof(double) * (size_t)J * (U ? U : 1)),
         *grad = malloc(sizeof(double) * (size_t)J * (U ? U : 1));
  for (long i = 0; i < (long)J * U; i++) act[i] = grad[i] = -1;
  double *link_down = alloc0((size_t)S, sizeof(double)), *link_up = alloc0((size_t)S, sizeof(double));
  r->memory = alloc0((size_t)S, sizeof *r->memory);
  for (int k = 0; k < S; k++) { /* the compiler's count of the arenas this list keeps alive */
    TpRankMemoryInput in = rank_memory_input(s, c, k);
    if (!tp_rank_memory(&in, &r->memory[k])) r->memory[k].peak = INT64_MAX;
    r->peak_bytes[k] = (double)r->memory[k].peak;
  }
  bool progress = true;
  while (progress) {
    progress = false;
    for (int k = 0; k < S; k++) {
      while (pc[k] < s->count[k]) {
        const TpInsn *x = &s->insn[k][pc[k]];
        int u = x->mb >= 0 ? c->base[x->mb] + x->slice : -1, j = x->chunk * S + k;
        double start = clock[k], dur = 0;
        switch (x->kind) {
        case TP_INSN_FORWARD: dur = c->fwd[(size_t)j * U + u]; break;
        case TP_INSN_BACKWARD: dur = c->bwd[(size_t)j * U + u]; break;
        case TP_INSN_BACKWARD_INPUT:
          dur = c->bwd[(size_t)j * U + u] - (c->wgt ? c->wgt[(size_t)j * U + u] : 0);
          break;
        case TP_INSN_BACKWARD_WEIGHT: dur = c->wgt ? c->wgt[(size_t)j * U + u] : 0; break;
        case TP_INSN_RECV_ACT:
        case TP_INSN_RECV_GRAD: {
          double at = (x->kind == TP_INSN_RECV_ACT ? act : grad)[(size_t)j * U + u];
          if (at < 0) goto next_rank;
          if (at > clock[k]) clock[k] = at;
          break;
        }
        case TP_INSN_SEND_ACT:
        case TP_INSN_SEND_GRAD: {
          bool down = x->kind == TP_INSN_SEND_ACT;
          int boundary = down ? j : j - 1; /* between virtual stages boundary and boundary + 1 */
          double *link = down ? &link_down[k] : &link_up[k];
          double t0 = *link > clock[k] ? *link : clock[k];
          *link = t0 + c->send[(size_t)boundary * U + u];
          (down ? act : grad)[(size_t)tp_schedule_peer_stage(s, k, x) * U + u] = *link;
          if (record) record_event(r, &cap, (TpEvent){t0, *link, k, x->kind, x->mb, x->slice, x->chunk});
          break;
        }
        case TP_INSN_ALLREDUCE_TIED: {
          int p = x->peer;
          const TpInsn *y = pc[p] < s->count[p] ? &s->insn[p][pc[p]] : NULL;
          if (!y || y->kind != TP_INSN_ALLREDUCE_TIED || y->peer != k) goto next_rank;
          double t0 = clock[k] > clock[p] ? clock[k] : clock[p];
          clock[k] = clock[p] = t0 + c->tied_allreduce;
          if (record) {
            record_event(r, &cap, (TpEvent){t0, clock[k], k, x->kind, -1, -1, x->chunk});
            record_event(r, &cap, (TpEvent){t0, clock[p], p, x->kind, -1, -1, y->chunk});
          }
          pc[p]++;
          pc[k]++;
          progress = true;
          continue;
        }
        case TP_INSN_ALLREDUCE:
          for (int chunk = 0; chunk < s->chunks; chunk++) dur += c->allreduce[chunk * S + k];
          break;
        case TP_INSN_OPTIMIZER_STEP:
          for (int chunk = 0; chunk < s->chunks; chunk++) dur += c->optimizer[chunk * S + k];
          break;
        default: TP_ASSERT(0);
        }
        if (x->kind == TP_INSN_FORWARD || x->kind == TP_INSN_BACKWARD || x->kind == TP_INSN_BACKWARD_INPUT ||
            x->kind == TP_INSN_BACKWARD_WEIGHT)
          r->busy_s[k] += dur;
        if (dur > 0) {
          start = clock[k];
          clock[k] += dur;
          if (record) record_event(r, &cap, (TpEvent){start, clock[k], k, x->kind, x->mb, x->slice, x->chunk});
        }
        pc[k]++;
        progress = true;
      }
next_rank:;
    }
  }
  int rc = TP_OK;
  for (int k = 0; k < S; k++) {
    if (pc[k] < s->count[k] && !rc) {
      const TpInsn *x = &s->insn[k][pc[k]];
      char chunk[24] = "";
      if (s->chunks > 1) snprintf(chunk, sizeof chunk, " chunk %d", x->chunk);
      rc = tp_error(d, "simulation: schedule %s deadlocks: rank %d waits at %s mb %d slice %d%s",
                    tp_schedule_name(s->kind), k, tp_insn_name(x->kind), x->mb, x->slice, chunk);
    }
    if (clock[k] > r->time_s) r->time_s = clock[k];
  }
  free(clock);
  free(pc);
  free(act);
  free(grad);
  free(link_down);
  free(link_up);
  return rc;
}

void tp_sim_result_free(TpSimResult *r) {
  free(r->busy_s);
  free(r->peak_bytes);
  free(r->memory);
  free(r->events);
  memset(r, 0, sizeof *r);
}

/* Microbatch m -> hue; slice -> lightness; backward (or its input part) darker, its
 * weight part darker still. */
static void unit_colour(const TpSchedule *s, const TpEvent *e, char *out, size_t size) {
  int hue = (e->mb * 137) % 360;
  int n = e->mb >= 0 ? s->nslices[e->mb] : 1;
  double frac = n > 1 ? (double)e->slice / (n - 1) : 0;
  int light = (int)(72 - 30 * frac);
  bool backward = e->kind == TP_INSN_BACKWARD || e->kind == TP_INSN_BACKWARD_INPUT;
  if (backward) light -= 14;
  if (e->kind == TP_INSN_BACKWARD_WEIGHT) light -= 24;
  snprintf(out, size, "hsl(%d,%d%%,%d%%)", hue, backward || e->kind == TP_INSN_BACKWARD_WEIGHT ? 55 : 75, light);
}

void tp_write_svg(const TpSimResult *r, const TpSchedule *s, const char *title, FILE *out) {
  int S = s->stages;
  double width = 1200, left = 70, row = S <= 24 ? 26 : S <= 64 ? 12 : 7, top = 40;
  double height = top + row * S + 50, scale = (width - left - 20) / (r->time_s > 0 ? r->time_s : 1);
  fprintf(out,
          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
          "font-family=\"sans-serif\" font-size=\"11\">\n",
          width, height);
  fprintf(out, "<defs><pattern id=\"bw\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
               "patternTransform=\"rotate(45)\"><line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" "
               "stroke=\"black\" stroke-opacity=\"0.35\" stroke-width=\"2\"/></pattern>");
  /* a split backward's weight part: dots */
  fprintf(out, "<pattern id=\"wg\" width=\"5\" height=\"5\" patternUnits=\"userSpaceOnUse\"><circle cx=\"2.5\" "
               "cy=\"2.5\" r=\"1\" fill=\"white\" fill-opacity=\"0.6\"/></pattern></defs>\n");
  fprintf(out, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
  fprintf(out, "<text x=\"%.0f\" y=\"18\" font-size=\"14\">", left);
  for (const char *p = title; *p; p++) /* escape for XML */
    fputs(*p == '<' ? "&lt;" : *p == '>' ? "&gt;" : *p == '&' ? "&amp;" : (char[2]){*p, 0}, out);
  fprintf(out, "</text>\n");
  for (int k = 0; k < S; k++) { /* idle (bubble) background per rank */
    double y = top + k * row;
    fprintf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#eeeeee\"/>\n", left, y,
            r->time_s * scale, row - 1);
    if (row >= 10 || k % 8 == 0)
      fprintf(out, "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">rank %d</text>\n", left - 6, y + row * 0.75, k);
  }
  for (int i = 0; i < r->nevents; i++) {
    const TpEvent *e = &r->events[i];
    if (e->kind == TP_INSN_SEND_ACT || e->kind == TP_INSN_SEND_GRAD) continue;
    double x = left + e->start * scale, w = (e->end - e->start) * scale, y = top + e->rank * row;
    char colour[48] = "#555555";
    if (e->mb >= 0) unit_colour(s, e, colour, sizeof colour);
    char chunk[24] = "";
    if (s->chunks > 1) snprintf(chunk, sizeof chunk, " chunk %d", e->chunk);
    fprintf(out,
            "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\" "
            "stroke=\"white\" stroke-width=\"0.3\"><title>%s mb %d slice %d%s: %.3f-%.3f ms</title></rect>\n",
            x, y, w > 0.2 ? w : 0.2, row - 1, colour, tp_insn_name(e->kind), e->mb, e->slice, chunk, e->start * 1e3,
            e->end * 1e3);
    if (s->chunks > 1 && e->mb >= 0 && w >= 8 && row >= 10) /* which virtual stage: the chunk's number */
      fprintf(out, "<text x=\"%.2f\" y=\"%.1f\" font-size=\"8\" text-anchor=\"middle\">%d</text>\n", x + w / 2,
              y + row * 0.65, e->chunk);
    const char *pattern = e->kind == TP_INSN_BACKWARD || e->kind == TP_INSN_BACKWARD_INPUT ? "bw"
                          : e->kind == TP_INSN_BACKWARD_WEIGHT                             ? "wg"
                                                                                           : NULL;
    if (pattern)
      fprintf(out, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"url(#%s)\"/>\n", x, y,
              w > 0.2 ? w : 0.2, row - 1, pattern);
  }
  double y = top + row * S + 18;
  fprintf(out,
          "<text x=\"%.0f\" y=\"%.1f\">0 s</text><text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.4g s</text>\n",
          left, y, width - 20, y, r->time_s);
  fprintf(out,
          "<text x=\"%.0f\" y=\"%.1f\">light = forward, dark hatched = backward (split: its input part), "
          "darkest dotted = its weight part; hue = microbatch, lighter = earlier slice; grey = idle "
          "(bubble)%s</text>\n",
          left, y + 18, s->chunks > 1 ? "; number = chunk (virtual stage chunk x ranks + rank)" : "");
  fprintf(out, "</svg>\n");
}

void tp_write_trace(const TpSimResult *r, const TpSchedule *s, FILE *out) {
  fprintf(out, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
  for (int k = 0; k < s->stages; k++)
    fprintf(out, "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": \"rank %d\"}},\n", k,
            k);
  for (int i = 0; i < r->nevents; i++) {
    const TpEvent *e = &r->events[i];
    bool send = e->kind == TP_INSN_SEND_ACT || e->kind == TP_INSN_SEND_GRAD;
    fprintf(out, "{\"name\": \"%s", tp_insn_name(e->kind));
    if (e->mb >= 0) fprintf(out, " mb%d.s%d", e->mb, e->slice);
    if (e->mb >= 0 && s->chunks > 1) fprintf(out, ".c%d", e->chunk);
    fprintf(out, "\", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f", e->rank, send ? 1 : 0,
            e->start * 1e6, (e->end - e->start) * 1e6);
    if (e->mb >= 0) fprintf(out, ", \"args\": {\"microbatch\": %d, \"slice\": %d", e->mb, e->slice);
    if (e->mb >= 0 && s->chunks > 1) fprintf(out, ", \"chunk\": %d", e->chunk);
    if (e->mb >= 0) fputc('}', out);
    fprintf(out, "}%s\n", i + 1 < r->nevents ? "," : "");
  }
  fprintf(out, "]}\n");
}
