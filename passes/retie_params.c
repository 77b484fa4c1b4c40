/* retie-params: requires a module before assign-stages; provides a module where no PARAM
 * is an exact copy or an exact 2-D transpose of another. Exporters fold weight tying away:
 * a tied LM head becomes a second, transposed copy of the embedding table
 * (onnx::MatMul_374 = wte^T). Training the two separately would untie them, so the later
 * PARAM (in initializer order; the original comes first in PyTorch's exports) becomes the
 * result of Transpose(first) {perm = [1, 0]} (Reshape(first) to the same shape for a
 * copy), a re-tie view (TP_ROLE_RETIE, printed `@retie`). The value keeps its name and
 * uses; the op and the value get origin (the duplicate's initializer name, no op type),
 * from which codegen recovers the derived initializer.
 *
 * A torch.export-based export records the parameter a folded initializer came from
 * (TpValue.folded_from): where that parameter is in the module too, the two are tied
 * without reading data. Otherwise the export keeps nothing else of the tying: a tied head
 * and an untied one (hf_gpt2, hf_llama) have the same kind of name, shape and uses, so
 * only the data can tell them apart. Metadata picks the candidates: parameters with a partner of the same dtype and
 * shape, or of the transposed 2-D shape. Of the candidates, first the first and last
 * elements are compared (equal in a copy and in a transpose: two pages of each, also of
 * external-data files, which stay mapped, not read), then only those still paired are read
 * whole: exactly, bit for bit, after a hash that ignores element order (so a tensor and its
 * transpose hash alike). A large model's weights are thus never read to compile, but for
 * the few that are copies of each other (the tied head). Skipped: parameters whose elements are all equal (fresh ones/zeros: equal by
 * coincidence, not tying; those in a sparse file's holes, a model exported to plan
 * whose weights were never written, without a read) and Identity aliases (the exporter's
 * merge of such tensors, deliberately separate parameters). */
#include "../ir/ir.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
  int value;
  uint64_t key; /* the shape, then its corner elements, then the element multiset */
} Candidate;

static uint64_t mix64(uint64_t x) { /* splitmix64's finaliser */
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static uint64_t element(const uint8_t *p, size_t size) {
  uint64_t bits = 0;
  memcpy(&bits, p, size);
  return bits;
}

/* v's data (NULL when its elements are wider than the 8 bytes hashed), *size the bytes
 * of an element, *n their count. */
static const uint8_t *elements(const TpModule *m, int v, size_t *size, int64_t *n) {
  const TpType *t = &m->values[v].type;
  *size = tp_dtype_size(t->dtype);
  *n = tp_type_numel(t);
  return *size <= 8 ? tp_value_data(m, v) : NULL;
}

/* Mixes the sum of mixed element bits into *key: equal for any permutation of the same
 * elements. Returns false when every element is the same. */
static bool multiset_hash(const TpModule *m, int v, uint64_t *key) {
  size_t size;
  int64_t n;
  const uint8_t *data = elements(m, v, &size, &n);
  if (!data || n < 2) return false;
  uint64_t sum = 0;
  bool varied = false;
  for (int64_t i = 0; i < n; i++) {
    sum += mix64(element(data + i * (int64_t)size, size));
    varied |= memcmp(data, data + i * (int64_t)size, size) != 0;
  }
  *key = mix64(sum ^ *key);
  return varied;
}

/* Equal for shapes that may hold a copy or a 2-D transpose of each other. */
static uint64_t shape_key(const TpType *t) {
  uint64_t key = mix64((uint64_t)t->dtype << 8 | (uint64_t)t->rank);
  int64_t d0 = t->rank == 2 && t->dims[1] < t->dims[0] ? t->dims[1] : t->dims[0];
  for (int i = 0; i < t->rank; i++)
    key = mix64(key ^ (uint64_t)(t->rank == 2 ? (i == 0 ? d0 : t->dims[0] + t->dims[1] - d0) : t->dims[i]));
  return key;
}

static int by_key(const void *a, const void *b) {
  const Candidate *x = a, *y = b;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return (x->value > y->value) - (x->value < y->value);
}

static bool is_copy(const TpModule *m, int a, int b) {
  const TpType *t = &m->values[a].type;
  size_t bytes = (size_t)tp_type_numel(t) * tp_dtype_size(t->dtype);
  return tp_type_equal(t, &m->values[b].type) && memcmp(tp_value_data(m, a), tp_value_data(m, b), bytes) == 0;
}

/* b[j][i] == a[i][j] bit for bit, a [R, C] and b [C, R]. */
static bool is_transpose(const TpModule *m, int a, int b) {
  const TpType *ta = &m->values[a].type, *tb = &m->values[b].type;
  if (ta->rank != 2 || tb->rank != 2 || ta->dtype != tb->dtype || ta->dims[0] != tb->dims[1] ||
      ta->dims[1] != tb->dims[0])
    return false;
  const uint8_t *pa = tp_value_data(m, a), *pb = tp_value_data(m, b);
  size_t size = tp_dtype_size(ta->dtype);
  int64_t rows = ta->dims[0], cols = ta->dims[1];
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < cols; j++)
      if (memcmp(pa + (i * cols + j) * (int64_t)size, pb + (j * rows + i) * (int64_t)size, size) != 0) return false;
  return true;
}

/* The duplicate `dup` becomes Transpose(keep) or Reshape(keep): same value, now a result. */
static void retie(TpModule *m, int keep, int dup, bool transpose) {
  TpOrigin at = {m->values[dup].name, NULL};
  const char *none = NULL;
  int op = tp_add_op(m, transpose ? TP_OP_Transpose : TP_OP_Reshape, &keep, 1, &none, 1, at);
  m->ops[op].role = TP_ROLE_RETIE;
  if (transpose) tp_set_attr_ints(m, op, "perm", (const int64_t[]){1, 0}, 2);
  TpValue *v = &m->values[dup];
  v->kind = TP_VAL_RESULT;
  v->def = op;
  v->blob = -1;
  v->offset = 0;
  v->origin = m->ops[op].origin;
  m->ops[op].outputs[0] = dup;
}

static bool is_alias(const TpValue *v) { return v->origin.op_type && strcmp(v->origin.op_type, "Identity") == 0; }

/* Sorts c[0..n) by key and keeps those whose key another one shares (in order); returns
 * how many. */
static int keep_paired(Candidate *c, int n) {
  qsort(c, (size_t)n, sizeof *c, by_key);
  int kept = 0;
  for (int i = 0; i < n; i++)
    if ((i > 0 && c[i - 1].key == c[i].key) || (i + 1 < n && c[i + 1].key == c[i].key)) c[kept++] = c[i];
  return kept;
}

/* Does v's data lie in a hole of a sparse file (zeros never written: known without a read)? */
static bool unwritten(const TpModule *m, int v) {
  const TpValue *val = &m->values[v];
  const TpType *t = &val->type;
  return tp_file_map_unwritten(&m->blobs[val->blob].file, (uint64_t)val->offset,
                               (uint64_t)tp_type_numel(t) * tp_dtype_size(t->dtype));
}

/* The parameters that may be re-tied, sorted by shape key, those without a partner of
 * their shape left out; *n their count. */
static Candidate *shape_candidates(const TpModule *m, int *n) {
  Candidate *c = malloc(((size_t)m->nvalues + 1) * sizeof *c);
  TP_ASSERT(c);
  int all = 0;
  for (int v = 0; v < m->nvalues; v++) {
    const TpValue *val = &m->values[v];
    if (val->kind == TP_VAL_PARAM && !val->dead && val->blob >= 0 && !is_alias(val) && !unwritten(m, v))
      c[all++] = (Candidate){.value = v, .key = shape_key(&val->type)};
  }
  *n = keep_paired(c, all);
  return c;
}

/* Mixes v's first and last elements into *key: the same for a copy and a 2-D transpose,
 * and read from two pages, so that only candidates that may be equal are read whole. */
static void corners(const TpModule *m, int v, uint64_t *key) {
  size_t size;
  int64_t n;
  const uint8_t *data = elements(m, v, &size, &n);
  if (!data || n < 1) return;
  *key = mix64(*key ^ mix64(element(data, size)) ^ element(data + (n - 1) * (int64_t)size, size));
}

/* What the export records (TpValue.folded_from): a PARAM folded from another PARAM of the
 * module alone, of its transposed 2-D shape, is its transpose; no data is read. Any other
 * shape (a square one holds a copy as well as a transpose) is left to the comparison. */
static int retie_recorded(TpModule *m) {
  int tied = 0;
  for (int v = 0; v < m->nvalues; v++) {
    const TpValue *val = &m->values[v];
    int p = val->kind == TP_VAL_PARAM && val->folded_from ? tp_find_value(m, val->folded_from) : -1;
    if (p < 0 || p == v || m->values[p].kind != TP_VAL_PARAM) continue;
    const TpType *tv = &val->type, *tp = &m->values[p].type;
    if (tv->rank == 2 && tp->rank == 2 && tv->dtype == tp->dtype && tv->dims[0] != tv->dims[1] &&
        tv->dims[0] == tp->dims[1] && tv->dims[1] == tp->dims[0])
      retie(m, p, v, true), tied++;
  }
  return tied;
}

int pass_retie_params(TpModule *m, TpPassOptions *opt, TpDiag *d) {
  (void)opt;
  /* assign-stages' tied copies duplicate their parameters on purpose */
  for (int v = 0; v < m->nvalues; v++)
    if (m->values[v].tied >= 0)
      return tp_error(d, "retie-params runs before assign-stages: %%%s is a stage's tied copy already",
                      m->values[v].name);
  int recorded = retie_recorded(m);
  int candidates, n = 0;
  Candidate *c = shape_candidates(m, &candidates);
  for (int i = 0; i < candidates; i++) corners(m, c[i].value, &c[i].key);
  candidates = keep_paired(c, candidates);
  for (int i = 0; i < candidates; i++) {
    c[n] = c[i];
    if (multiset_hash(m, c[i].value, &c[n].key)) n++;
  }
  qsort(c, (size_t)n, sizeof *c, by_key);
  int tied = 0;
  for (int lo = 0, hi; lo < n; lo = hi) {
    for (hi = lo + 1; hi < n && c[hi].key == c[lo].key; hi++) {}
    /* within a group (by value index): each one may duplicate an earlier survivor */
    for (int j = lo + 1; j < hi; j++)
      for (int i = lo; i < j; i++) {
        int keep = c[i].value, dup = c[j].value;
        if (m->values[keep].kind != TP_VAL_PARAM) continue; /* itself re-tied */
        bool copy = is_copy(m, keep, dup);
        if (copy || is_transpose(m, keep, dup)) {
          retie(m, keep, dup, !copy);
          tied++;
          break;
        }
      }
  }
  free(c);
  if (tied || recorded) tp_sort_ops(m);
  return TP_OK;
}
