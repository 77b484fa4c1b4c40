/* Outlining (see outline.h): requires the memory plan of a module and the units to write;
 * provides their runs, which of them share a body, and each run's arena offsets and
 * parameter indices. Runs are compared on their lowered statements, never on printed text:
 * a run's key is its statements with each value numbered by its first use in the run and
 * the arena offsets and parameter indices taken out (whatever statement holds them: a view's
 * declaration, a kernel's scratch; and their regions, arena or transient region, which a
 * run's offsets say: odd for the transient region's), so two runs share a body exactly when
 * one is the other on other values, at other offsets, on other parameters. */
#include "outline.h"

#include <stdlib.h>
#include <string.h>

uint64_t tp_hash_str(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static uint64_t mix(uint64_t h, uint64_t x) { return (h ^ x) * 1099511628211ull; }

/* A unit's ops with keys (boundary copies left out) and its runs. */
typedef struct {
  int n;    /* ops with keys */
  int *pos; /* their positions in the stage's order */
  uint64_t *key;
  int first_run, nruns;
} Unit;

/* What an op's code depends on besides the names and numbers of its values. */
static uint64_t op_key(const TpModule *m, const TpMemoryPlan *mem, int op) {
  const TpOp *o = &m->ops[op];
  uint64_t h = mix(1469598103934665603ull, (uint64_t)o->kind);
  h = mix(mix(mix(h, (uint64_t)o->role), (uint64_t)o->ninputs), (uint64_t)o->noutputs);
  for (int k = 0; k < o->ninputs + o->noutputs; k++) {
    int v = k < o->ninputs ? o->inputs[k] : o->outputs[k - o->ninputs];
    if (v < 0) {
      h = mix(h, 7);
      continue;
    }
    const TpType *t = &m->values[v].type;
    h = mix(mix(mix(h, (uint64_t)t->dtype), (uint64_t)t->rank), (uint64_t)mem->value[v].kind);
    for (int i = 0; i < t->rank; i++) h = mix(h, (uint64_t)t->dims[i]);
  }
  for (int a = 0; a < o->nattrs; a++) {
    const TpAttr *x = &o->attrs[a];
    uint64_t f;
    memcpy(&f, &x->f, sizeof f);
    h = mix(mix(mix(mix(h, tp_hash_str(x->name)), (uint64_t)x->kind), (uint64_t)x->i), f);
    for (int i = 0; i < x->nints; i++) h = mix(h, (uint64_t)x->ints[i]);
    if (x->s) h = mix(h, tp_hash_str(x->s));
  }
  return h;
}

/* The fewest ops a layer found by repetition has (fewer repeat by chance: two Transposes). */
#define MIN_LAYER_OPS 6

/* The largest run of repeats in keys[0, n): *start and *period of the repeated list, or 0
 * in *period if nothing repeats. */
static void find_repeats(const uint64_t *key, int n, int *start, int *period) {
  int best = 0;
  *start = *period = 0;
  for (int P = MIN_LAYER_OPS; 2 * P <= n; P++) {
    for (int i = 0, stretch = 0; i + P < n; i++) { /* stretch: keys so far with key[j] == key[j + P] */
      stretch = key[i] == key[i + P] ? stretch + 1 : 0;
      int covered = (stretch / P + 1) * P;
      if (stretch >= P && covered > best) best = covered, *start = i + 1 - stretch, *period = P;
    }
  }
}

/* A candidate run: a list of keys that units[unit] proposes (from first, len long), and
 * how many units propose the same list. */
typedef struct {
  int unit, first, len, count;
  uint64_t hash;
} Proposal;

static bool same_keys(const Unit *units, const Proposal *a, const Proposal *b) {
  return a->len == b->len && memcmp(units[a->unit].key + a->first, units[b->unit].key + b->first,
                                    (size_t)a->len * sizeof(uint64_t)) == 0;
}

/* Most proposed first, then longest, then first proposed: deterministic. */
static int proposal_order(const void *x, const void *y) {
  const Proposal *a = x, *b = y;
  if (a->count != b->count) return a->count > b->count ? -1 : 1;
  if (a->len != b->len) return a->len > b->len ? -1 : 1;
  return a->unit != b->unit ? (a->unit < b->unit ? -1 : 1) : (a->first < b->first ? -1 : a->first > b->first);
}

/* Cuts every unit into runs: each unit proposes its repeated list (its layer) or, without
 * one, its whole op list; proposals are tried on every unit, most proposed first, and each
 * match not overlapping an earlier one is a run. */
/* The polynomial hash of keys[0, len): that of a window follows from prefix hashes. */
#define KEY_BASE 0x9e3779b97f4a7c15ull
static uint64_t keys_hash(const uint64_t *key, int len) {
  uint64_t h = 0;
  for (int i = 0; i < len; i++) h = h * KEY_BASE + key[i];
  return h;
}

/* A place where proposal k matches a unit's keys, from key i. */
typedef struct {
  int k, i;
} Match;

static int match_order(const void *x, const void *y) {
  const Match *a = x, *b = y;
  return a->k != b->k ? (a->k < b->k ? -1 : 1) : (a->i < b->i ? -1 : a->i > b->i);
}

static TpRun *find_runs(Unit *units, int nunits, int *nruns) {
  Proposal *props = calloc((size_t)nunits + 1, sizeof *props);
  TP_ASSERT(props);
  int nprops = 0;
  for (int u = 0; u < nunits; u++) {
    int start, period;
    find_repeats(units[u].key, units[u].n, &start, &period);
    bool repeats = period > 0;
    Proposal p = {u, start, repeats ? period : units[u].n, 1, 0};
    if (!p.len) continue;
    p.hash = keys_hash(units[u].key + p.first, p.len);
    int k = 0;
    while (k < nprops && !(props[k].hash == p.hash && same_keys(units, &props[k], &p))) k++;
    if (k < nprops) props[k].count++;
    else props[nprops++] = p, props[k].count = repeats ? 2 : 1; /* a unit's own repeats count */
  }
  qsort(props, (size_t)nprops, sizeof *props, proposal_order);
  while (nprops && props[nprops - 1].count < 2) nprops--; /* proposed by one unit, repeated nowhere */

  /* the proposals by (length, hash), and their lengths */
  int cap = 64, nlens = 0;
  while (cap < 2 * nprops) cap *= 2;
  int *table = malloc((size_t)cap * sizeof *table), *lens = malloc(((size_t)nprops + 1) * sizeof *lens);
  TP_ASSERT(table && lens);
  memset(table, -1, (size_t)cap * sizeof *table);
  for (int k = 0; k < nprops; k++) {
    size_t at = (props[k].hash ^ (uint64_t)props[k].len) & (size_t)(cap - 1);
    while (table[at] >= 0) at = (at + 1) & (size_t)(cap - 1);
    table[at] = k;
    int l = 0;
    while (l < nlens && lens[l] != props[k].len) l++;
    if (l == nlens) lens[nlens++] = props[k].len;
  }

  int nrun = 0, cap_runs = 64;
  TpRun *runs = malloc((size_t)cap_runs * sizeof *runs);
  TP_ASSERT(runs);
  for (int u = 0; u < nunits; u++) {
    Unit *U = &units[u];
    uint64_t *prefix = malloc(((size_t)U->n + 1) * sizeof *prefix);
    unsigned char *taken = calloc((size_t)U->n + 1, 1);
    TP_ASSERT(prefix && taken);
    prefix[0] = 0;
    for (int i = 0; i < U->n; i++) prefix[i + 1] = prefix[i] * KEY_BASE + U->key[i];
    Match *matches = NULL;
    int nmatches = 0, cap_matches = 0;
    for (int l = 0; l < nlens; l++) {
      int len = lens[l];
      uint64_t power = 1;
      for (int i = 0; i < len; i++) power *= KEY_BASE;
      for (int i = 0; i + len <= U->n; i++) {
        uint64_t h = prefix[i + len] - prefix[i] * power;
        for (size_t at = (h ^ (uint64_t)len) & (size_t)(cap - 1); table[at] >= 0;
             at = (at + 1) & (size_t)(cap - 1)) {
          const Proposal *p = &props[table[at]];
          if (p->len != len || p->hash != h ||
              memcmp(U->key + i, units[p->unit].key + p->first, (size_t)len * sizeof *U->key) != 0)
            continue;
          if (nmatches == cap_matches) {
            cap_matches = cap_matches ? 2 * cap_matches : 16;
            matches = realloc(matches, (size_t)cap_matches * sizeof *matches);
            TP_ASSERT(matches);
          }
          matches[nmatches++] = (Match){table[at], i};
        }
      }
    }
    /* most proposed first, left to right, each where nothing is taken yet */
    if (nmatches) qsort(matches, (size_t)nmatches, sizeof *matches, match_order);
    int first = nrun;
    for (int m = 0; m < nmatches; m++) {
      int i = matches[m].i, len = props[matches[m].k].len;
      bool free_keys = true;
      for (int j = i; free_keys && j < i + len; j++) free_keys = !taken[j];
      if (!free_keys) continue;
      memset(taken + i, 1, (size_t)len);
      if (nrun == cap_runs) {
        cap_runs *= 2;
        runs = realloc(runs, (size_t)cap_runs * sizeof *runs);
        TP_ASSERT(runs);
      }
      runs[nrun++] = (TpRun){.unit = u, .begin = i, .end = i + len, .body = -1};
    }
    free(matches);
    free(prefix);
    free(taken);
    /* in unit order */
    for (int a = first + 1; a < nrun; a++)
      for (int b = a; b > first && runs[b - 1].begin > runs[b].begin; b--) {
        TpRun t = runs[b];
        runs[b] = runs[b - 1];
        runs[b - 1] = t;
      }
    U->first_run = first;
    U->nruns = nrun - first;
  }
  free(table);
  free(lens);
  free(props);
  *nruns = nrun;
  return runs;
}

/* ---- the key of a lowered run ---- */

typedef struct {
  uint64_t *w;
  size_t n, cap;
  int *canon; /* per value: its number in the run, or -1 */
  int *used;  /* the values numbered, in order */
  int next;
} Key;

static void put(Key *k, uint64_t x) {
  if (k->n == k->cap) {
    k->cap = k->cap ? 2 * k->cap : 256;
    k->w = realloc(k->w, k->cap * sizeof *k->w);
    TP_ASSERT(k->w);
  }
  k->w[k->n++] = x;
}

/* Value v by its place of first use in the run (-1 stays -1). */
static void put_value(Key *k, int v) {
  if (v < 0) {
    put(k, UINT64_MAX);
    return;
  }
  if (k->canon[v] < 0) k->used[k->next] = v, k->canon[v] = k->next++;
  put(k, (uint64_t)k->canon[v]);
}

static void put_float_bits(Key *k, float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  put(k, x);
}

static void put_double_bits(Key *k, double f) {
  uint64_t x;
  memcpy(&x, &f, sizeof x);
  put(k, x);
}

/* Everything about argument a that its printed call shows, arena offsets excepted. */
static void put_arg(Key *k, const TpLowArg *a) {
  put(k, (uint64_t)a->kind);
  switch (a->kind) {
  case TP_ARG_VIEW:
  case TP_ARG_DATA:
  case TP_ARG_SCALAR:
  case TP_ARG_SCRATCH: put_value(k, a->value); break; /* a scratch's offset and region: a number */
  case TP_ARG_I64:
  case TP_ARG_INT:
  case TP_ARG_UNARY_OP:
  case TP_ARG_BINARY_OP: put(k, (uint64_t)a->i); break;
  case TP_ARG_BOOL: put(k, a->i != 0); break;
  case TP_ARG_F32: put_float_bits(k, (float)a->f); break;
  case TP_ARG_F64: put_double_bits(k, a->f); break;
  case TP_ARG_I64S:
    put(k, (uint64_t)a->n);
    for (int i = 0; i < a->n; i++) put(k, (uint64_t)a->ints[i]);
    break;
  case TP_ARG_VIEWS_IN:
  case TP_ARG_VIEWS_OUT:
    put(k, (uint64_t)a->n);
    for (int i = 0; i < a->n; i++) put_value(k, a->values[i]);
    break;
  case TP_ARG_ATTENTION: {
    const TpAttention *p = &a->attention;
    const int64_t shape[] = {p->batch,     p->q_heads,     p->kv_heads, p->q_len,     p->kv_len,
                             p->head_size, p->v_head_size, p->packed,   p->is_causal, p->causal_offset,
                             p->window,    p->kv_rows,     p->qk_mode};
    for (size_t i = 0; i < sizeof shape / sizeof *shape; i++) put(k, (uint64_t)shape[i]);
    put_float_bits(k, p->scale);
    put_float_bits(k, p->softcap);
    put_value(k, a->aux);
    if (a->aux >= 0) {
      put(k, p->mask_is_bool);
      for (int i = 0; i < 4; i++) put(k, (uint64_t)p->mask_strides[i]);
      put(k, (uint64_t)p->mask_len);
    }
    break;
  }
  case TP_ARG_LOSS:
    put_value(k, a->aux);
    put(k, a->loss.has_ignore);
    put(k, a->loss.has_ignore ? (uint64_t)a->loss.ignore_index : 0);
    put(k, (uint64_t)a->loss.reduction);
    break;
  case TP_ARG_RANK:
  case TP_ARG_DIMS: TP_ASSERT(!"lowered to numbers"); break;
  case TP_ARG_BAD:
  case TP_ARG_STREAM: break;
  }
}

/* Appends an arena offset (a parameter index) to run r's numbers; *cap: the room. */
static void add_offset(TpRun *r, int64_t at, int *cap) {
  if (r->nat == *cap) {
    *cap = *cap ? 2 * *cap : 32;
    r->at = realloc(r->at, (size_t)*cap * sizeof *r->at);
    TP_ASSERT(r->at);
  }
  r->at[r->nat++] = at;
}

static void add_param(TpRun *r, int p, int *cap) {
  if (r->np == *cap) {
    *cap = *cap ? 2 * *cap : 32;
    r->p = realloc(r->p, (size_t)*cap * sizeof *r->p);
    TP_ASSERT(r->p);
  }
  r->p[r->np++] = p;
}

/* The key of lowered run f (see the file's comment), and its numbers into r, in the order
 * the printed body uses them (codegen/emit_c.c numbers them alike). */
static void run_key(const TpModule *m, const TpLowFunc *f, Key *k, TpRun *r) {
  int cap_at = 0, cap_p = 0;
  k->n = 0;
  k->next = 0;
  put(k, (uint64_t)(f->uses_arena || f->uses_transient) << 1 | f->uses_bad);
  for (int i = 0; i < f->n; i++) {
    const TpLowStmt *s = &f->stmts[i];
    put(k, (uint64_t)s->kind);
    switch (s->kind) {
    case TP_LOW_OP: put(k, s->view); break; /* its node: a comment, not code */
    case TP_LOW_DECLARE: {
      const TpType *t = &m->values[s->value].type;
      put_value(k, s->value);
      put(k, s->top);
      put(k, (uint64_t)t->dtype);
      put(k, (uint64_t)t->rank);
      for (int d = 0; d < t->rank; d++) put(k, (uint64_t)t->dims[d]);
      bool region = s->addr.kind == TP_ADDR_ARENA || s->addr.kind == TP_ADDR_TRANSIENT;
      put(k, (uint64_t)(region ? TP_ADDR_ARENA : s->addr.kind));
      if (s->addr.kind == TP_ADDR_CONST) put(k, (uint64_t)s->addr.n); /* the very array */
      if (s->addr.kind == TP_ADDR_VALUE) put_value(k, (int)s->addr.n);
      if (region) add_offset(r, s->addr.n | (s->addr.kind == TP_ADDR_TRANSIENT), &cap_at);
      if (s->addr.kind == TP_ADDR_PARAM || s->addr.kind == TP_ADDR_GRAD) { add_param(r, (int)s->addr.n, &cap_p); }
      break;
    }
    case TP_LOW_CALL:
      put(k, (uint64_t)s->kernel);
      put(k, (uint64_t)s->nargs);
      for (int a = 0; a < s->nargs; a++) {
        put_arg(k, &s->args[a]);
        if (s->args[a].kind == TP_ARG_SCRATCH && s->args[a].value < 0)
          add_offset(r, s->args[a].i | s->args[a].transient, &cap_at);
      }
      break;
    case TP_LOW_ALLREDUCE:
      put_value(k, s->value);
      put(k, (uint64_t)s->count);
      break;
    case TP_LOW_RANK_STORE:
    case TP_LOW_RANK_FILL:
    case TP_LOW_LOSS_STORE:
    case TP_LOW_LOSS_COPY: put_value(k, s->value); break;
    case TP_LOW_OUTLINED: TP_ASSERT(!"a run calls no run"); break;
    }
  }
}

/* A distinct run key, while outlining. */
typedef struct {
  uint64_t *w;
  size_t n;
  uint64_t hash;
} Seen;

int tp_outline(const TpLowering *L, const TpUnitId *list, int n, TpOutline *o) {
  const TpModule *m = L->m;
  const TpMemoryPlan *mem = L->mem;
  *o = (TpOutline){.nunits = n};
  o->units = malloc(((size_t)n + 1) * sizeof *o->units);
  o->first_run = calloc((size_t)n + 1, sizeof *o->first_run);
  o->nruns = calloc((size_t)n + 1, sizeof *o->nruns);
  Unit *units = calloc((size_t)n + 1, sizeof *units);
  TP_ASSERT(o->units && o->first_run && o->nruns && units);
  memcpy(o->units, list, (size_t)n * sizeof *list);
  for (int i = 0; i < n; i++) {
    Unit *u = &units[i];
    int s = list[i].s, unit = tp_unit_index(mem, list[i].backward, list[i].weight, list[i].slice);
    int from = mem->unit_begin[s][unit], to = mem->unit_end[s][unit];
    u->pos = malloc(((size_t)(to - from) + 1) * sizeof *u->pos);
    u->key = malloc(((size_t)(to - from) + 1) * sizeof *u->key);
    TP_ASSERT(u->pos && u->key);
    for (int k = from; k < to; k++)
      if (!tp_is_boundary_op(m, mem->order[s][k]))
        u->pos[u->n] = k, u->key[u->n++] = op_key(m, mem, mem->order[s][k]);
  }
  o->runs = find_runs(units, n, &o->nrun);
  for (int i = 0; i < n; i++) {
    o->first_run[i] = units[i].first_run, o->nruns[i] = units[i].nruns;
    for (int r = units[i].first_run; r < units[i].first_run + units[i].nruns; r++) /* key indices to positions */
      o->runs[r].begin = units[i].pos[o->runs[r].begin], o->runs[r].end = units[i].pos[o->runs[r].end - 1] + 1;
    free(units[i].pos);
    free(units[i].key);
  }
  free(units);

  /* each run lowered alone, and which are equal */
  int rc = TP_OK, cap = 64;
  while (cap < 2 * o->nrun) cap *= 2;
  int *table = malloc((size_t)cap * sizeof *table); /* open addressing over the bodies */
  Seen *seen = calloc((size_t)o->nrun + 1, sizeof *seen);
  o->bodies = calloc((size_t)o->nrun + 1, sizeof *o->bodies);
  Key key = {.canon = malloc(((size_t)m->nvalues + 1) * sizeof(int)),
             .used = malloc(((size_t)m->nvalues + 1) * sizeof(int))};
  TP_ASSERT(table && seen && o->bodies && key.canon && key.used);
  memset(table, -1, (size_t)cap * sizeof *table);
  memset(key.canon, -1, ((size_t)m->nvalues + 1) * sizeof(int));
  for (int r = 0; r < o->nrun && rc == TP_OK; r++) {
    TpRun *x = &o->runs[r];
    const TpUnitId *u = &list[x->unit];
    rc = tp_lower_range(L, u->s, u->backward, x->begin, x->end, NULL, 0, &x->low);
    if (rc != TP_OK) break;
    run_key(m, &x->low, &key, x);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < key.n; i++) h = (h ^ key.w[i]) * 1099511628211ull;
    size_t at = h & (size_t)(cap - 1);
    while (table[at] >= 0 && (seen[table[at]].hash != h || seen[table[at]].n != key.n ||
                              memcmp(seen[table[at]].w, key.w, key.n * sizeof *key.w) != 0))
      at = (at + 1) & (size_t)(cap - 1);
    if (table[at] < 0) {
      table[at] = o->nbodies;
      seen[o->nbodies].w = malloc((key.n + 1) * sizeof *key.w);
      TP_ASSERT(seen[o->nbodies].w);
      memcpy(seen[o->nbodies].w, key.w, key.n * sizeof *key.w);
      seen[o->nbodies].n = key.n, seen[o->nbodies].hash = h;
      o->bodies[o->nbodies++] = (TpBody){.first = r};
    } else {
      tp_low_func_free(&x->low); /* printed from its body's first run */
    }
    x->body = table[at];
    o->bodies[x->body].count++;
    for (int i = 0; i < key.next; i++) key.canon[key.used[i]] = -1; /* forget the places for the next run */
  }
  for (int b = 0; b < o->nbodies; b++) free(seen[b].w);
  free(seen);
  free(table);
  free(key.w);
  free(key.canon);
  free(key.used);
  if (rc != TP_OK) return rc;

  int64_t *context = malloc(((size_t)mem->nslices + 1) * sizeof *context); /* per slice */
  TP_ASSERT(context);
  int64_t seq = 0;
  for (int v = 0; v < m->nvalues; v++)
    if (mem->value[v].kind == TP_MEM_TOKENS) seq = m->values[v].type.dims[1];
  for (int i = 0; i < mem->nslices; i++) context[i] = tp_slice_context(m, mem, i, seq);
  for (int r = 0; r < o->nrun; r++) {
    TpBody *body = &o->bodies[o->runs[r].body];
    body->contexts |= context[list[o->runs[r].unit].slice] != context[list[o->runs[body->first].unit].slice];
  }
  free(context);
  for (int r = 0; r < o->nrun; r++)
    if (o->bodies[o->runs[r].body].count < 2) o->runs[r].body = -1; /* run by one unit: lowered with it */

  /* the distinct arena offset lists of each body: runs on stages laid out alike share one */
  int *last_table = malloc(((size_t)o->nbodies + 1) * sizeof *last_table); /* per body: the first run of its last */
  int *prev_table = malloc(((size_t)o->nrun + 1) * sizeof *prev_table);    /* per run: that of the list before */
  TP_ASSERT(last_table && prev_table);
  for (int b = 0; b < o->nbodies; b++) last_table[b] = -1;
  for (int r = 0; r < o->nrun; r++) {
    TpRun *x = &o->runs[r];
    prev_table[r] = -1;
    if (x->body < 0) continue;
    TpBody *body = &o->bodies[x->body];
    int q = last_table[x->body];
    while (q >= 0 && x->nat && memcmp(o->runs[q].at, x->at, (size_t)x->nat * sizeof *x->at) != 0) q = prev_table[q];
    x->new_table = q < 0;
    if (x->new_table) x->table = body->ntables++, prev_table[r] = last_table[x->body], last_table[x->body] = r;
    else x->table = o->runs[q].table;
    for (int i = 0; i < x->nat; i++) body->regions |= x->at[i] & 1;
  }
  free(last_table);
  free(prev_table);
  return TP_OK;
}

void tp_outline_free(TpOutline *o) {
  for (int r = 0; r < o->nrun; r++) {
    tp_low_func_free(&o->runs[r].low);
    free(o->runs[r].at);
    free(o->runs[r].p);
  }
  free(o->runs);
  free(o->bodies);
  free(o->units);
  free(o->first_run);
  free(o->nruns);
  *o = (TpOutline){0};
}

TpLowRange *tp_outline_calls(const TpOutline *o, int u, int *calls, int *n) {
  TpLowRange *ranges = calloc((size_t)o->nruns[u] + 1, sizeof *ranges);
  TP_ASSERT(ranges);
  *n = 0;
  for (int r = o->first_run[u]; r < o->first_run[u] + o->nruns[u]; r++)
    if (o->runs[r].body >= 0) calls[*n] = r, ranges[(*n)++] = (TpLowRange){o->runs[r].begin, o->runs[r].end};
  return ranges;
}
