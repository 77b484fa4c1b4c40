/* Checks the memory plan of models after the training pipeline: every value an op reads or
 * writes has storage; buffers are aligned and inside their region (the arena or the
 * transient region); two buffers of a region whose live ranges overlap never share a byte;
 * a buffer is live from its op to its last reader; a transient buffer lives inside one
 * unit, and one that lives inside one unit but is in the arena does not raise it above
 * the buffers that cross units; arena and transient region together are no smaller than
 * the live peak. Prints one line per model with the figures,
 * and the first violation in full.
 *   check_memory_plan MODEL.onnx [--dim N=V ...] [MODEL.onnx ...] */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"
#include "frontend/frontend.h"

static int fail(const char *model, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(const char *model, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s: ", model);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  return 1;
}

/* The unit running position `at` of stage s (-1: none). */
static int unit_at(const TpMemoryPlan *p, int s, int at) {
  for (int u = 0; u < 2 * p->nslices; u++)
    if (p->unit_begin[s][u] <= at && at < p->unit_end[s][u]) return u;
  return -1;
}

/* The position of op `op` in its stage's run order. */
static int position(const TpMemoryPlan *p, int stage, int op) {
  for (int i = 0; i < p->norder[stage]; i++)
    if (p->order[stage][i] == op) return i;
  return -1;
}

static int check(const char *model, TpDimBinding *dims, int ndims) {
  TpDiag d;
  tp_diag_init(&d, "check_memory_plan", model, stderr);
  TpImportOptions o = {.dims = dims, .ndims = ndims};
  TpModule *m = NULL;
  int n = 0;
  while (tp_default_pipeline[n]) n++;
  if (tp_import_onnx_file(model, &o, &m, &d) || tp_run_passes(m, tp_default_pipeline, n, NULL, &d)) return 1;
  TpMemoryPlan p;
  if (tp_plan_memory(m, NULL, &p, &d)) return 1;
  int bad = 0;
  /* storage of everything the ops touch, and live ranges that cover each use */
  for (int op = 0; op < m->nops && !bad; op++) {
    const TpOp *o = &m->ops[op];
    int at = position(&p, o->stage, op);
    for (int k = 0; k < o->ninputs + o->noutputs && !bad; k++) {
      int v = k < o->ninputs ? o->inputs[k] : o->outputs[k - o->ninputs];
      if (v < 0) continue;
      if (p.value[v].kind == TP_MEM_NONE)
        bad = fail(model, "'%s' (used by %s) has no storage", m->values[v].name, tp_op_info[o->kind].name);
      while (p.value[v].kind == TP_MEM_VIEW) v = p.value[v].index;
      const TpMemSlot *s = &p.value[v];
      if (!bad && s->kind == TP_MEM_ARENA && (at < s->first || at > s->last))
        bad = fail(model, "'%s' is used by %s at position %d outside its live range [%d, %d]", m->values[v].name,
                   tp_op_info[o->kind].name, at, s->first, s->last);
    }
  }
  /* alignment, bounds, no overlap of buffers alive at once */
  int nbufs = 0;
  const TpMemSlot **bufs = malloc((size_t)(m->nvalues + m->nops) * sizeof *bufs);
  const char **names = malloc((size_t)(m->nvalues + m->nops) * sizeof *names);
  for (int v = 0; v < m->nvalues; v++)
    if (p.value[v].kind == TP_MEM_ARENA) bufs[nbufs] = &p.value[v], names[nbufs++] = m->values[v].name;
  for (int op = 0; op < m->nops; op++)
    if (p.scratch[op].kind == TP_MEM_ARENA) bufs[nbufs] = &p.scratch[op], names[nbufs++] = "(scratch)";
  /* per stage: the top of the arena's buffers that cross units (and the boundary buffers,
   * alive from the first position to the last), which the others may not raise */
  int64_t *kept_top = calloc((size_t)p.nstages, sizeof *kept_top);
  for (int i = 0; i < nbufs; i++) {
    const TpMemSlot *x = bufs[i];
    int u = unit_at(&p, x->stage, x->first);
    bool inside = u >= 0 && x->last < p.unit_end[x->stage][u];
    bool whole = x->first == 0 && x->last == p.norder[x->stage] - 1;
    if (!x->transient && (!inside || whole) && x->offset + x->bytes > kept_top[x->stage])
      kept_top[x->stage] = x->offset + x->bytes;
  }
  for (int i = 0; i < nbufs && !bad; i++) {
    const TpMemSlot *x = bufs[i];
    int64_t region = (x->transient ? p.transient_bytes : p.arena_bytes)[x->stage];
    if (x->offset % TP_ARENA_ALIGN || x->bytes % TP_ARENA_ALIGN || x->offset + x->bytes > region)
      bad = fail(model, "'%s' at offset %lld (+%lld) is misaligned or outside its %s", names[i],
                 (long long)x->offset, (long long)x->bytes, x->transient ? "transient region" : "arena");
    int u = unit_at(&p, x->stage, x->first);
    bool inside = u >= 0 && x->last < p.unit_end[x->stage][u];
    if (!bad && x->transient && !inside)
      bad = fail(model, "transient '%s' lives from position %d to %d, beyond its unit", names[i], x->first, x->last);
    if (!bad && !x->transient && inside && x->offset + x->bytes > kept_top[x->stage])
      bad = fail(model,
                 "'%s' lives inside one unit (%d to %d) but grows the arena past its kept buffers' %lld bytes",
                 names[i], x->first, x->last, (long long)kept_top[x->stage]);
    for (int j = i + 1; j < nbufs && !bad; j++) {
      const TpMemSlot *y = bufs[j];
      bool live = x->first <= y->last && y->first <= x->last;
      bool share = x->offset < y->offset + y->bytes && y->offset < x->offset + x->bytes;
      if (x->stage == y->stage && x->transient == y->transient && x->bytes && y->bytes && live && share)
        bad = fail(model, "'%s' and '%s' are alive together and share bytes at offsets %lld and %lld", names[i],
                   names[j], (long long)x->offset, (long long)y->offset);
    }
  }
  free(bufs);
  free(names);
  free(kept_top);
  for (int s = 0; s < p.nstages && !bad; s++)
    if (p.arena_bytes[s] + p.transient_bytes[s] < p.live_peak[s])
      bad = fail(model, "stage %d's arena of %lld bytes and transient region of %lld are below the live peak %lld",
                 s, (long long)p.arena_bytes[s], (long long)p.transient_bytes[s], (long long)p.live_peak[s]);
  if (!bad)
    printf("%s: %d stage(s), stage 0: %d buffers, arena %lld bytes, transient %lld, live peak %lld, no reuse %lld\n",
           model, p.nstages, p.nbuffers[0], (long long)p.arena_bytes[0], (long long)p.transient_bytes[0],
           (long long)p.live_peak[0], (long long)p.total_bytes[0]);
  tp_memory_plan_free(&p);
  tp_module_free(m);
  return bad;
}

int main(int argc, char **argv) {
  int failed = 0;
  for (int i = 1; i < argc;) {
    const char *model = argv[i++];
    TpDimBinding dims[8];
    int ndims = 0;
    while (i + 1 < argc && strcmp(argv[i], "--dim") == 0 && ndims < 8) {
      char *eq = strchr(argv[i + 1], '=');
      if (!eq) return 2;
      *eq = 0;
      dims[ndims++] = (TpDimBinding){argv[i + 1], atoll(eq + 1)};
      i += 2;
    }
    failed |= check(model, dims, ndims);
  }
  return failed;
}
