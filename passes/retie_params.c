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
 * Data is compared exactly, bit for bit, after a hash that ignores element order (so a
 * tensor and its transpose hash alike). Skipped: parameters whose elements are all equal
 * (fresh ones/zeros: equal by coincidence, not tying) and Identity aliases (the exporter's
 * merge of such tensors, deliberately separate parameters). */
#include "../ir/ir.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
  int value;
  uint64_t key; /* dtype, element count and the element multiset */
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

/* Sum of mixed element bits: equal for any permutation of the same elements. Returns false
 * when every element is the same. */
static bool multiset_hash(const TpModule *m, int v, uint64_t *key) {
  const TpType *t = &m->values[v].type;
  const uint8_t *data = tp_value_data(m, v);
  size_t size = tp_dtype_size(t->dtype);
  int64_t n = tp_type_numel(t);
  if (!data || n < 2 || size > 8) return false;
  uint64_t sum = 0;
  bool varied = false;
  for (int64_t i = 0; i < n; i++) {
    sum += mix64(element(data + i * (int64_t)size, size));
    varied |= memcmp(data, data + i * (int64_t)size, size) != 0;
  }
  *key = mix64(sum ^ mix64(((uint64_t)t->dtype << 48) ^ (uint64_t)n));
  return varied;
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

int pass_retie_params(TpModule *m, TpDiag *d) {
  /* assign-stages' tied copies duplicate their parameters on purpose */
  for (int v = 0; v < m->nvalues; v++)
    if (m->values[v].tied >= 0)
      return tp_error(d, "retie-params runs before assign-stages: %%%s is a stage's tied copy already",
                      m->values[v].name);
  Candidate *c = malloc(((size_t)m->nvalues + 1) * sizeof *c);
  TP_ASSERT(c);
  int n = 0;
  for (int v = 0; v < m->nvalues; v++) {
    const TpValue *val = &m->values[v];
    if (val->kind == TP_VAL_PARAM && !val->dead && !is_alias(val) && multiset_hash(m, v, &c[n].key))
      c[n++].value = v;
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
  if (tied) tp_sort_ops(m);
  return TP_OK;
}
