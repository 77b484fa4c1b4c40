/* Module construction, lookup, attributes, compaction and topological order. */
#include "ir.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* ---- arena: a list of chunks, freed together with the module ---- */
struct TpArena {
  struct TpArena *next;
  size_t used, size;
  _Alignas(16) unsigned char data[];
};

static void *arena_alloc(TpArena **head, size_t bytes) {
  bytes = (bytes + 15) & ~(size_t)15;
  TpArena *a = *head;
  if (!a || a->size - a->used < bytes) {
    size_t size = bytes > 65536 ? bytes : 65536;
    TpArena *fresh = malloc(sizeof *fresh + size);
    TP_ASSERT(fresh);
    fresh->next = a;
    fresh->used = 0;
    fresh->size = size;
    *head = a = fresh;
  }
  void *p = a->data + a->used;
  a->used += bytes;
  memset(p, 0, bytes);
  return p;
}

void *tp_alloc(TpModule *m, size_t bytes) { return arena_alloc(&m->arena, bytes ? bytes : 1); }

const char *tp_strdup(TpModule *m, const char *s) {
  if (!s) return NULL;
  size_t n = strlen(s) + 1;
  char *p = tp_alloc(m, n);
  memcpy(p, s, n);
  return p;
}

const char *tp_strfmt(TpModule *m, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *s = tp_alloc(m, (size_t)n + 1);
  va_start(ap, fmt);
  vsnprintf(s, (size_t)n + 1, fmt, ap);
  va_end(ap);
  return s;
}

/* Grows *arr (elements of `size` bytes) to hold at least n+1 elements. */
static void grow(void **arr, int *cap, int n, size_t size) {
  if (n < *cap) return;
  int fresh = *cap ? *cap * 2 : 16;
  void *p = realloc(*arr, (size_t)fresh * size);
  TP_ASSERT(p);
  *arr = p;
  *cap = fresh;
}

TpModule *tp_module_new(const char *source) {
  TpModule *m = calloc(1, sizeof *m);
  TP_ASSERT(m);
  m->source = tp_strdup(m, source);
  m->loss = -1;
  return m;
}

void tp_module_free(TpModule *m) {
  if (!m) return;
  for (int i = 0; i < m->nblobs; i++) {
    TpBlob *b = &m->blobs[i];
    tp_unmap_input(&b->file);
    if (b->owned) free((void *)b->base);
  }
  for (TpArena *a = m->arena, *next; a; a = next) {
    next = a->next;
    free(a);
  }
  free(m->values);
  free(m->ops);
  free(m->blobs);
  free(m->inputs);
  free(m->outputs);
  free(m->name_table);
  free(m->grads);
  free(m);
}

/* ---- names ---- */
static uint64_t hash_name(const char *s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static void name_table_insert(TpModule *m, int value) {
  if (2 * (m->nvalues + 1) > m->name_table_cap) { /* rebuild at half load */
    free(m->name_table);
    m->name_table_cap = m->name_table_cap ? m->name_table_cap * 2 : 64;
    while (m->name_table_cap < 4 * m->nvalues) m->name_table_cap *= 2;
    m->name_table = malloc((size_t)m->name_table_cap * sizeof(int));
    TP_ASSERT(m->name_table);
    memset(m->name_table, 0xff, (size_t)m->name_table_cap * sizeof(int));
    for (int v = 0; v < m->nvalues; v++)
      if (v != value) name_table_insert(m, v);
  }
  size_t mask = (size_t)m->name_table_cap - 1;
  size_t i = hash_name(m->values[value].name) & mask;
  while (m->name_table[i] >= 0) i = (i + 1) & mask;
  m->name_table[i] = value;
}

int tp_find_value(const TpModule *m, const char *name) {
  if (!m->name_table) return -1;
  size_t mask = (size_t)m->name_table_cap - 1;
  for (size_t i = hash_name(name) & mask; m->name_table[i] >= 0; i = (i + 1) & mask)
    if (strcmp(m->values[m->name_table[i]].name, name) == 0) return m->name_table[i];
  return -1;
}

const char *tp_unique_name(TpModule *m, const char *base) {
  if (tp_find_value(m, base) < 0) return tp_strdup(m, base);
  size_t n = strlen(base) + 24;
  char *buf = tp_alloc(m, n);
  for (int k = 1;; k++) {
    snprintf(buf, n, "%s.%d", base, k);
    if (tp_find_value(m, buf) < 0) return buf;
  }
}

/* ---- blobs and values ---- */
int tp_add_blob(TpModule *m, TpBlob blob) {
  grow((void **)&m->blobs, &m->cap_blobs, m->nblobs, sizeof *m->blobs);
  blob.path = tp_strdup(m, blob.path);
  m->blobs[m->nblobs] = blob;
  return m->nblobs++;
}

int tp_add_owned_blob(TpModule *m, const void *data, size_t bytes) {
  void *copy = malloc(bytes ? bytes : 1);
  TP_ASSERT(copy);
  if (bytes) memcpy(copy, data, bytes);
  return tp_add_blob(m, (TpBlob){.base = copy, .size = bytes, .owned = true});
}

/* The blob named `name` (a file's name relative to the module's folder), or -1. */
static int find_file_blob(const TpModule *m, const char *name) {
  for (int i = 0; i < m->nblobs; i++)
    if (m->blobs[i].path && strcmp(m->blobs[i].path, name) == 0) return i;
  return -1;
}

static int add_mapped_blob(TpModule *m, const char *name, TpFileMap f) {
  return tp_add_blob(m, (TpBlob){.path = name, .base = f.base, .size = f.size, .file = f});
}

int tp_add_file_blob(TpModule *m, const char *path, const char *name, TpDiag *d) {
  char why[256];
  TpFileMap f;
  if (!name) name = path;
  int blob = find_file_blob(m, name);
  if (blob >= 0) return blob;
  if (tp_map_input(path, &f, why, sizeof why) < 0) {
    tp_error(d, "cannot open '%s': %s", path, why);
    return -1;
  }
  return add_mapped_blob(m, name, f);
}

int tp_add_folder_blob(TpModule *m, const char *dir, const char *name, const char *folder, char *why,
                       size_t why_size) {
  TpFileMap f;
  if (tp_map_in_folder(dir, name, folder, &f, why, why_size) < 0) return -1;
  int blob = find_file_blob(m, name); /* the same file named again: one blob */
  if (blob >= 0) {
    tp_unmap_input(&f);
    return blob;
  }
  return add_mapped_blob(m, name, f);
}

int tp_add_value(TpModule *m, const char *name, TpValueKind kind, TpType type, TpOrigin origin) {
  TP_ASSERT(name && tp_find_value(m, name) < 0);
  grow((void **)&m->values, &m->cap_values, m->nvalues, sizeof *m->values);
  TpValue *v = &m->values[m->nvalues];
  for (int i = 0; i < type.rank; i++) type.dimnames[i] = tp_strdup(m, type.dimnames[i]);
  *v = (TpValue){
      .name = tp_strdup(m, name),
      .type = type,
      .kind = kind,
      .def = -1,
      .blob = -1,
      .origin = {tp_strdup(m, origin.node), tp_strdup(m, origin.op_type)},
      .tied = -1,
  };
  m->nvalues++;
  name_table_insert(m, m->nvalues - 1);
  return m->nvalues - 1;
}

TpDType tp_data_dtype(const TpModule *m, int v) {
  return m->values[v].data_dtype != TP_UNDEF ? m->values[v].data_dtype : m->values[v].type.dtype;
}

int tp_add_data_value(TpModule *m, const char *name, TpValueKind kind, TpType type, int blob, int64_t offset,
                      TpOrigin origin) {
  TP_ASSERT(kind == TP_VAL_PARAM || kind == TP_VAL_CONST);
  TP_ASSERT(blob >= 0 && blob < m->nblobs);
  int v = tp_add_value(m, name, kind, type, origin);
  m->values[v].blob = blob;
  m->values[v].offset = offset;
  return v;
}

int tp_add_const(TpModule *m, const char *name, TpType type, const void *data, TpOrigin origin) {
  size_t bytes = (size_t)tp_type_numel(&type) * tp_dtype_size(type.dtype);
  int blob = tp_add_owned_blob(m, data, bytes);
  return tp_add_data_value(m, name, TP_VAL_CONST, type, blob, 0, origin);
}

void tp_add_input(TpModule *m, int value) {
  grow((void **)&m->inputs, &m->cap_inputs, m->ninputs, sizeof *m->inputs);
  m->inputs[m->ninputs++] = value;
}

int tp_grad_of(const TpModule *m, int param) { return param >= 0 && param < m->ngrads ? m->grads[param] : -1; }

void tp_set_grad(TpModule *m, int param, int grad) {
  TP_ASSERT(param >= 0 && param < m->nvalues);
  if (param >= m->ngrads) {
    int n = m->nvalues;
    m->grads = realloc(m->grads, (size_t)n * sizeof *m->grads);
    TP_ASSERT(m->grads);
    for (int i = m->ngrads; i < n; i++) m->grads[i] = -1;
    m->ngrads = n;
  }
  m->grads[param] = grad;
}

void tp_add_output(TpModule *m, int value) {
  grow((void **)&m->outputs, &m->cap_outputs, m->noutputs, sizeof *m->outputs);
  m->outputs[m->noutputs++] = value;
}

int tp_add_op(TpModule *m, TpOpKind kind, const int *inputs, int ninputs, const char *const *out_names, int noutputs,
              TpOrigin origin) {
  TP_ASSERT(kind >= 0 && kind < TP_OP_COUNT);
  grow((void **)&m->ops, &m->cap_ops, m->nops, sizeof *m->ops);
  int index = m->nops++;
  TpOp *op = &m->ops[index];
  *op = (TpOp){.kind = kind, .ninputs = ninputs, .noutputs = noutputs, .slice = -1};
  op->origin = (TpOrigin){tp_strdup(m, origin.node), tp_strdup(m, origin.op_type)};
  op->inputs = tp_alloc(m, (size_t)ninputs * sizeof(int));
  op->outputs = tp_alloc(m, (size_t)noutputs * sizeof(int));
  if (ninputs) memcpy(op->inputs, inputs, (size_t)ninputs * sizeof(int));
  for (int i = 0; i < noutputs; i++) {
    int r = -1;
    if (out_names[i]) {
      r = tp_add_value(m, tp_unique_name(m, out_names[i]), TP_VAL_RESULT, (TpType){0}, origin);
      m->values[r].def = index;
    }
    m->ops[index].outputs[i] = r; /* m->ops may not move here, but index it anyway */
  }
  return index;
}

/* ---- attributes ---- */
static TpAttr *attr_slot(TpModule *m, int op, const char *name) {
  TpOp *o = &m->ops[op];
  for (int i = 0; i < o->nattrs; i++)
    if (strcmp(o->attrs[i].name, name) == 0) return &o->attrs[i];
  /* insert keeping the array sorted by name */
  TpAttr *fresh = tp_alloc(m, (size_t)(o->nattrs + 1) * sizeof *fresh);
  int at = 0;
  while (at < o->nattrs && strcmp(o->attrs[at].name, name) < 0) at++;
  if (at) memcpy(fresh, o->attrs, (size_t)at * sizeof *fresh);
  if (o->nattrs > at) memcpy(fresh + at + 1, o->attrs + at, (size_t)(o->nattrs - at) * sizeof *fresh);
  fresh[at] = (TpAttr){.name = tp_strdup(m, name)};
  o->attrs = fresh;
  o->nattrs++;
  return &fresh[at];
}

void tp_set_attr_int(TpModule *m, int op, const char *name, int64_t v) {
  TpAttr *a = attr_slot(m, op, name);
  a->kind = TP_ATTR_INT;
  a->i = v;
}

void tp_set_attr_float(TpModule *m, int op, const char *name, double v) {
  TpAttr *a = attr_slot(m, op, name);
  a->kind = TP_ATTR_FLOAT;
  a->f = v;
}

void tp_set_attr_ints(TpModule *m, int op, const char *name, const int64_t *v, int n) {
  int64_t *copy = tp_alloc(m, (size_t)n * sizeof *copy);
  if (n) memcpy(copy, v, (size_t)n * sizeof *copy);
  TpAttr *a = attr_slot(m, op, name);
  a->kind = TP_ATTR_INTS;
  a->ints = copy;
  a->nints = n;
}

void tp_set_attr_string(TpModule *m, int op, const char *name, const char *v) {
  const char *copy = tp_strdup(m, v);
  TpAttr *a = attr_slot(m, op, name);
  a->kind = TP_ATTR_STRING;
  a->s = copy;
}

const TpAttr *tp_get_attr(const TpModule *m, int op, const char *name) {
  const TpOp *o = &m->ops[op];
  for (int i = 0; i < o->nattrs; i++)
    if (strcmp(o->attrs[i].name, name) == 0) return &o->attrs[i];
  return NULL;
}

int64_t tp_attr_int(const TpModule *m, int op, const char *name, int64_t dflt) {
  const TpAttr *a = tp_get_attr(m, op, name);
  return a && a->kind == TP_ATTR_INT ? a->i : dflt;
}

double tp_attr_float(const TpModule *m, int op, const char *name, double dflt) {
  const TpAttr *a = tp_get_attr(m, op, name);
  if (a && a->kind == TP_ATTR_FLOAT) return a->f;
  if (a && a->kind == TP_ATTR_INT) return (double)a->i;
  return dflt;
}

const char *tp_attr_string(const TpModule *m, int op, const char *name, const char *dflt) {
  const TpAttr *a = tp_get_attr(m, op, name);
  return a && a->kind == TP_ATTR_STRING ? a->s : dflt;
}

const int64_t *tp_attr_ints(const TpModule *m, int op, const char *name, int *n) {
  const TpAttr *a = tp_get_attr(m, op, name);
  if (!a || a->kind != TP_ATTR_INTS) {
    *n = 0;
    return NULL;
  }
  *n = a->nints;
  return a->ints;
}

void tp_copy_attrs(TpModule *m, int from, int to) {
  for (int k = 0; k < m->ops[from].nattrs; k++) {
    TpAttr at = m->ops[from].attrs[k];
    switch (at.kind) {
    case TP_ATTR_INT: tp_set_attr_int(m, to, at.name, at.i); break;
    case TP_ATTR_FLOAT: tp_set_attr_float(m, to, at.name, at.f); break;
    case TP_ATTR_INTS: tp_set_attr_ints(m, to, at.name, at.ints, at.nints); break;
    case TP_ATTR_STRING: tp_set_attr_string(m, to, at.name, at.s); break;
    }
  }
}

/* ---- data, uses, compaction ---- */
const void *tp_value_data(const TpModule *m, int value) {
  const TpValue *v = &m->values[value];
  if (v->blob < 0) return NULL;
  return m->blobs[v->blob].base + v->offset;
}

TpTensor tp_value_tensor(const TpModule *m, int value) {
  const TpValue *v = &m->values[value];
  TpTensor t = {.dtype = v->type.dtype, .rank = v->type.rank, .data = (void *)tp_value_data(m, value)};
  memcpy(t.dims, v->type.dims, sizeof t.dims);
  return t;
}

void tp_replace_uses(TpModule *m, int from, int to) {
  for (int o = 0; o < m->nops; o++)
    for (int i = 0; i < m->ops[o].ninputs; i++)
      if (m->ops[o].inputs[i] == from) m->ops[o].inputs[i] = to;
  for (int i = 0; i < m->noutputs; i++)
    if (m->outputs[i] == from) m->outputs[i] = to;
}

int tp_use_count(const TpModule *m, int value) {
  int n = 0;
  for (int o = 0; o < m->nops; o++)
    if (!m->ops[o].dead)
      for (int i = 0; i < m->ops[o].ninputs; i++) n += m->ops[o].inputs[i] == value;
  for (int i = 0; i < m->noutputs; i++) n += m->outputs[i] == value;
  return n;
}

bool tp_is_output(const TpModule *m, int value) {
  for (int i = 0; i < m->noutputs; i++)
    if (m->outputs[i] == value) return true;
  return false;
}

void tp_module_compact(TpModule *m) {
  int *vmap = malloc((size_t)(m->nvalues + 1) * sizeof *vmap);
  int *omap = malloc((size_t)(m->nops + 1) * sizeof *omap);
  TP_ASSERT(vmap && omap);
  /* a dead op's results die with it unless something turned them into constants */
  for (int o = 0; o < m->nops; o++)
    if (m->ops[o].dead)
      for (int i = 0; i < m->ops[o].noutputs; i++) {
        int r = m->ops[o].outputs[i];
        if (r >= 0 && m->values[r].kind == TP_VAL_RESULT && m->values[r].def == o) m->values[r].dead = true;
      }
  int nv = 0, no = 0;
  for (int v = 0; v < m->nvalues; v++) {
    vmap[v] = m->values[v].dead ? -1 : nv;
    if (!m->values[v].dead) m->values[nv++] = m->values[v];
  }
  for (int o = 0; o < m->nops; o++) {
    omap[o] = m->ops[o].dead ? -1 : no;
    if (!m->ops[o].dead) m->ops[no++] = m->ops[o];
  }
  m->nvalues = nv;
  m->nops = no;
  for (int v = 0; v < nv; v++) {
    if (m->values[v].def >= 0) {
      m->values[v].def = omap[m->values[v].def];
      TP_ASSERT(m->values[v].kind != TP_VAL_RESULT || m->values[v].def >= 0);
    }
    if (m->values[v].tied >= 0) m->values[v].tied = vmap[m->values[v].tied]; /* -1: its parameter died */
  }
  for (int o = 0; o < no; o++) {
    TpOp *op = &m->ops[o];
    for (int i = 0; i < op->ninputs; i++)
      if (op->inputs[i] >= 0) {
        TP_ASSERT(vmap[op->inputs[i]] >= 0); /* a dead value must be unused */
        op->inputs[i] = vmap[op->inputs[i]];
      }
    for (int i = 0; i < op->noutputs; i++)
      if (op->outputs[i] >= 0) op->outputs[i] = vmap[op->outputs[i]];
  }
  int ni = 0;
  for (int i = 0; i < m->ninputs; i++)
    if (vmap[m->inputs[i]] >= 0) m->inputs[ni++] = vmap[m->inputs[i]];
  m->ninputs = ni;
  for (int i = 0; i < m->noutputs; i++) {
    TP_ASSERT(vmap[m->outputs[i]] >= 0);
    m->outputs[i] = vmap[m->outputs[i]];
  }
  if (m->loss >= 0) {
    TP_ASSERT(vmap[m->loss] >= 0);
    m->loss = vmap[m->loss];
  }
  if (m->grads) { /* grads[param] = grad, both renumbered; a dead param loses its entry */
    int *grads = malloc((size_t)(nv ? nv : 1) * sizeof *grads);
    TP_ASSERT(grads);
    for (int v = 0; v < nv; v++) grads[v] = -1;
    for (int v = 0; v < m->ngrads; v++)
      if (m->grads[v] >= 0 && vmap[v] >= 0) {
        TP_ASSERT(vmap[m->grads[v]] >= 0);
        grads[vmap[v]] = vmap[m->grads[v]];
      }
    free(m->grads);
    m->grads = grads;
    m->ngrads = nv;
  }
  free(vmap);
  free(omap);
  /* rebuild the name table */
  free(m->name_table);
  m->name_table = NULL;
  m->name_table_cap = 0;
  int keep = m->nvalues;
  for (m->nvalues = 0; m->nvalues < keep;) {
    m->nvalues++;
    name_table_insert(m, m->nvalues - 1);
  }
}

/* ---- topological order ---- */
/* Iterative depth-first search from each op in order, emitting its producers first. */
void tp_sort_ops(TpModule *m) {
  int n = m->nops, count = 0;
  int *order = malloc(((size_t)n + 1) * sizeof *order), *stack = malloc(((size_t)n + 1) * sizeof *stack);
  int *next = calloc((size_t)n + 1, sizeof *next);
  char *state = calloc((size_t)n + 1, 1); /* 0 new, 1 on the stack, 2 emitted */
  TP_ASSERT(order && stack && next && state);
  for (int root = 0; root < n; root++) {
    if (state[root]) continue;
    int sp = 0;
    stack[sp++] = root;
    state[root] = 1;
    while (sp > 0) {
      int o = stack[sp - 1];
      if (next[o] < m->ops[o].ninputs) {
        int v = m->ops[o].inputs[next[o]++];
        int p = v >= 0 && m->values[v].kind == TP_VAL_RESULT ? m->values[v].def : -1;
        if (p < 0 || state[p] == 2) continue;
        TP_ASSERT(state[p] == 0); /* a cycle */
        state[p] = 1;
        stack[sp++] = p;
      } else {
        state[o] = 2;
        order[count++] = o;
        sp--;
      }
    }
  }
  TpOp *ops = malloc(((size_t)n + 1) * sizeof *ops);
  TP_ASSERT(ops);
  for (int i = 0; i < n; i++) {
    ops[i] = m->ops[order[i]];
    next[order[i]] = i; /* reused: old index -> new index */
  }
  if (n) memcpy(m->ops, ops, (size_t)n * sizeof *ops);
  for (int v = 0; v < m->nvalues; v++)
    if (m->values[v].def >= 0) m->values[v].def = next[m->values[v].def];
  free(ops);
  free(order);
  free(stack);
  free(next);
  free(state);
}

/* ---- placement ---- */
const char *const tp_op_role_names[TP_ROLE_COUNT] = {
    [TP_ROLE_COMPUTE] = "compute",
    [TP_ROLE_BOUNDARY] = "boundary",
    [TP_ROLE_RETIE] = "retie",
    [TP_ROLE_RECOMPUTE] = "recompute",
};

bool tp_is_boundary_op(const TpModule *m, int op) {
  return m->ops[op].role == TP_ROLE_BOUNDARY && m->ops[op].kind == TP_OP_Reshape;
}

int tp_tied_param(const TpModule *m, int v) { return m->values[v].kind == TP_VAL_PARAM ? m->values[v].tied : -1; }

int tp_token_axis(const TpModule *m, int v) {
  const TpType *t = &m->values[v].type;
  for (int a = 0; a < t->rank; a++)
    if (t->dimnames[a] && strcmp(t->dimnames[a], TP_TOKEN_DIM) == 0) return a;
  return -1;
}

/* ---- types ---- */
TpType tp_type_make(TpDType dtype, int rank, const int64_t *dims) {
  TP_ASSERT(rank >= 0 && rank <= TP_MAX_RANK);
  TpType t = {.dtype = dtype, .rank = rank};
  if (rank) memcpy(t.dims, dims, (size_t)rank * sizeof *dims);
  return t;
}

bool tp_type_equal(const TpType *a, const TpType *b) {
  if (a->dtype != b->dtype || a->rank != b->rank) return false;
  for (int i = 0; i < a->rank; i++)
    if (a->dims[i] != b->dims[i]) return false;
  return true;
}

int64_t tp_type_numel(const TpType *t) { return tp_numel(t->rank, t->dims); }

bool tp_type_size_ok(const TpType *t) { return tp_dims_size_ok(t->rank, t->dims); }

char *tp_type_str(const TpType *t, char *buf, size_t n) {
  const char *dt = tp_dtype_name(t->dtype);
  size_t len = (size_t)snprintf(buf, n, "%s[", dt ? dt : "?");
  for (int i = 0; i < t->rank && len < n; i++) {
    const char *sep = i ? ", " : "";
    if (t->dimnames[i])
      len += (size_t)snprintf(buf + len, n - len, "%s%s=%lld", sep, t->dimnames[i], (long long)t->dims[i]);
    else len += (size_t)snprintf(buf + len, n - len, "%s%lld", sep, (long long)t->dims[i]);
  }
  if (len < n) snprintf(buf + len, n - len, "]");
  return buf;
}
