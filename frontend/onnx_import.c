/* ONNX ModelProto -> IR module: decoding, tensors (raw, typed, external), graph inputs and
 * outputs, topological order, and the helpers the op lowerings of onnx_ops.c share.
 * Requires: a ModelProto at opset <= 23 (each node's op version current at opset 13..23). Provides: a compacted module in canonical form,
 * shape arithmetic folded to constants, weights referenced (never copied) where the bytes
 * lie in the model file or an external-data file. */
#include "import.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_OPSET = 23 };

/* ---- diagnostics ---- */

/* An error at a node (at != NULL) or about the model as a whole. */
static int verr_at(TpDiag *d, const TpOrigin *at, int opset, const char *fmt, va_list ap) {
  char msg[400];
  vsnprintf(msg, sizeof msg, fmt, ap);
  return at ? tp_error_at(d, *at, opset, "%s", msg) : tp_error(d, "%s", msg);
}

static int err_at(TpDiag *d, const TpOrigin *at, int opset, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int err_at(TpDiag *d, const TpOrigin *at, int opset, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = verr_at(d, at, opset, fmt, ap);
  va_end(ap);
  return rc;
}

int node_error(Importer *I, const Node *N, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = verr_at(I->d, &N->at, I->opset, fmt, ap);
  va_end(ap);
  return rc;
}

/* ---- ONNX name -> value ---- */

static uint64_t hash_str(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
  return h;
}

/* Slot of key, or the empty slot where it would go. */
static int map_slot(const NameMap *t, const char *key) {
  int i = (int)(hash_str(key) & (uint64_t)(t->cap - 1));
  while (t->keys[i] && strcmp(t->keys[i], key) != 0) i = (i + 1) & (t->cap - 1);
  return i;
}

int map_get(const NameMap *t, const char *key) {
  if (!t->cap) return -1;
  int i = map_slot(t, key);
  return t->keys[i] ? t->vals[i] : -1;
}

static bool map_has(const NameMap *t, const char *key) { return t->cap && t->keys[map_slot(t, key)] != NULL; }

void map_put(NameMap *t, const char *key, int val) {
  if (2 * (t->count + 1) > t->cap) {
    NameMap g = {0};
    g.cap = t->cap ? 2 * t->cap : 64;
    g.keys = calloc((size_t)g.cap, sizeof *g.keys);
    g.vals = calloc((size_t)g.cap, sizeof *g.vals);
    TP_ASSERT(g.keys && g.vals);
    for (int i = 0; i < t->cap; i++)
      if (t->keys[i]) map_put(&g, t->keys[i], t->vals[i]);
    free(t->keys);
    free(t->vals);
    *t = g;
  }
  int i = map_slot(t, key);
  if (!t->keys[i]) t->count++;
  t->keys[i] = key;
  t->vals[i] = val;
}

void map_free(NameMap *t) {
  free(t->keys);
  free(t->vals);
  memset(t, 0, sizeof *t);
}

void add_override(Importer *I, int node, int operand, int value) {
  if (I->noverrides == I->cap_overrides) {
    I->cap_overrides = I->cap_overrides ? 2 * I->cap_overrides : 16;
    I->overrides = realloc(I->overrides, (size_t)I->cap_overrides * sizeof *I->overrides);
    TP_ASSERT(I->overrides);
  }
  I->overrides[I->noverrides++] = (Override){node, operand, value};
}

int override_of(const Importer *I, int node, int operand) {
  for (int i = 0; i < I->noverrides; i++)
    if (I->overrides[i].node == node && I->overrides[i].operand == operand) return I->overrides[i].value;
  return -1;
}

/* ---- locating raw_data in the model bytes ----
 * protobuf-c copies bytes fields; to reference weights in place we find each initializer's
 * raw_data with a small walk of the wire format: ModelProto.graph (7) -> GraphProto.
 * initializer (5) -> TensorProto.raw_data (9). Repeated occurrences of a message field are
 * merged by protobuf (initializers concatenate; the last raw_data wins), and so here. Any
 * surprise makes the walk give up; the importer then copies the bytes instead. */

bool wire_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
  *v = 0;
  for (int shift = 0; shift < 64 && *p < end; shift += 7) {
    uint8_t b = *(*p)++;
    *v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) return true;
  }
  return false;
}

/* Next field: number, wire type, and for length-delimited ones the payload. */
bool wire_field(const uint8_t **p, const uint8_t *end, uint64_t *field, const uint8_t **payload, uint64_t *len) {
  uint64_t key, v;
  if (!wire_varint(p, end, &key)) return false;
  *field = key >> 3;
  *payload = NULL;
  *len = 0;
  switch (key & 7) {
  case 0: return wire_varint(p, end, &v);
  case 1:
    if (end - *p < 8) return false;
    *p += 8;
    return true;
  case 5:
    if (end - *p < 4) return false;
    *p += 4;
    return true;
  case 2:
    if (!wire_varint(p, end, len) || *len > (uint64_t)(end - *p)) return false;
    *payload = *p;
    *p += *len;
    return true;
  default: return false; /* groups: not in ONNX */
  }
}

static bool walk_tensor(Importer *I, const uint8_t *base, const uint8_t *p, const uint8_t *end) {
  RawSpan span = {-1, 0};
  uint64_t field, len;
  const uint8_t *payload;
  while (p < end) {
    if (!wire_field(&p, end, &field, &payload, &len)) return false;
    if (field == 9 && payload) span = (RawSpan){payload - base, (int64_t)len};
  }
  RawSpan *grown = realloc(I->raw, (size_t)(I->nraw + 1) * sizeof *grown);
  TP_ASSERT(grown);
  I->raw = grown;
  I->raw[I->nraw++] = span;
  return true;
}

static bool walk_graph(Importer *I, const uint8_t *base, const uint8_t *p, const uint8_t *end) {
  uint64_t field, len;
  const uint8_t *payload;
  while (p < end) {
    if (!wire_field(&p, end, &field, &payload, &len)) return false;
    if (field == 5 && payload && !walk_tensor(I, base, payload, payload + len)) return false;
  }
  return true;
}

static void locate_raw_data(Importer *I, const uint8_t *base, size_t size) {
  const uint8_t *p = base, *end = base + size, *payload;
  uint64_t field, len;
  while (p < end) {
    if (!wire_field(&p, end, &field, &payload, &len) ||
        (field == 7 && payload && !walk_graph(I, base, payload, payload + len))) {
      I->nraw = -1; /* give up: copy instead */
      return;
    }
  }
}

/* ---- tensors (decoded by runtime/onnx/onnx_tensor.c) ---- */

/* External data of the model: files of its folder, mapped as module blobs. */
static int map_external(void *ctx, const char *location, const uint8_t **bytes, size_t *size, char *why,
                        size_t why_size) {
  Importer *I = ctx;
  int blob = tp_add_folder_blob(I->m, I->dir, location, "the model's folder", why, why_size);
  if (blob >= 0) *bytes = I->m->blobs[blob].base, *size = I->m->blobs[blob].size;
  return blob;
}

/* Decodes t; an error is reported at the node `at` (NULL: about the model). */
static int decode_tensor(Importer *I, const TpOrigin *at, const Onnx__TensorProto *t, const char *what,
                         const TpOnnxData *data, TpOnnxTensor *out) {
  char err[TP_ONNX_ERR_SIZE];
  int rc = tp_onnx_tensor_decode(t, what, data, out, err, sizeof err);
  return rc ? err_at(I->d, at, I->opset, "%s", err) : TP_OK;
}

int read_small_tensor(Importer *I, const Node *N, const Onnx__TensorProto *t, const char *what, TpType *type,
                      void **data) {
  TpOnnxTensor dec;
  const TpOnnxData no_external = {.refused = "is not supported here"};
  int rc = decode_tensor(I, &N->at, t, what, &no_external, &dec);
  if (rc) return rc;
  *type = tp_type_make(dec.t.dtype, dec.t.rank, dec.t.dims);
  *data = tp_onnx_tensor_take(&dec);
  return TP_OK;
}

/* A TensorProto as a PARAM/CONST value. raw_index: its position among the graph's
 * initializers (raw_data then references the model bytes), or -1 (the data is copied). */
int import_tensor_value(Importer *I, const Onnx__TensorProto *t, const char *name, TpValueKind kind, TpOrigin at,
                        int raw_index, int *value) {
  TpModule *m = I->m;
  char what[300];
  snprintf(what, sizeof what, "%s '%s'", at.node ? "tensor" : "initializer", name);
  const TpOnnxData external = {.map = I->dir ? map_external : NULL, .ctx = I, .refused = "needs the model's folder"};
  TpOnnxTensor dec;
  int rc = decode_tensor(I, at.node ? &at : NULL, t, what, &external, &dec);
  if (rc) return rc;
  int64_t bytes = (int64_t)tp_tensor_bytes(&dec.t), esize = (int64_t)tp_dtype_size(dec.t.dtype);
  int blob = dec.file;
  int64_t offset = dec.offset;
  /* weights stay in the model file; small non-float constants (shapes, indices) that
   * constant folding reads are copied when misaligned there */
  if (dec.raw && raw_index >= 0 && raw_index < I->nraw && I->model_blob >= 0 && I->raw[raw_index].size == bytes &&
      I->raw[raw_index].offset >= 0 && (kind == TP_VAL_PARAM || I->raw[raw_index].offset % esize == 0)) {
    blob = I->model_blob;
    offset = I->raw[raw_index].offset;
  } else if (blob < 0) {
    blob = tp_add_owned_blob(m, dec.t.data, (size_t)bytes);
    offset = 0;
  }
  free(dec.owned);
  TpType type = tp_type_make(dec.t.dtype, dec.t.rank, dec.t.dims);
  *value = tp_add_data_value(m, name, kind, type, blob, offset, at.node ? at : (TpOrigin){0});
  return TP_OK;
}

/* ---- attributes ---- */

const Onnx__AttributeProto *node_attr(const Node *N, const char *name) {
  for (size_t i = 0; i < N->n->n_attribute; i++)
    if (N->n->attribute[i]->name && strcmp(N->n->attribute[i]->name, name) == 0) return N->n->attribute[i];
  return NULL;
}

static const char *attr_type_name(int type) {
  static const char *const names[] = {"undefined",      "float",      "int",        "string",
                                      "tensor",         "graph",      "floats",     "ints",
                                      "strings",        "tensors",    "graphs",     "sparse tensor",
                                      "sparse tensors", "type proto", "type protos"};
  return type >= 0 && type < (int)(sizeof names / sizeof *names) ? names[type] : "unknown";
}

static int attr_check(Importer *I, const Node *N, const Onnx__AttributeProto *a, int type) {
  if ((int)a->type == type) return TP_OK;
  return node_error(I, N, "attribute '%s' is %s, expected %s", a->name, attr_type_name(a->type),
                    attr_type_name(type));
}

int attr_int(Importer *I, const Node *N, const char *name, int64_t dflt, int64_t *out) {
  const Onnx__AttributeProto *a = node_attr(N, name);
  *out = dflt;
  if (!a) return TP_OK;
  if (attr_check(I, N, a, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT)) return TP_ERR_INPUT;
  *out = a->i;
  return TP_OK;
}

int attr_float(Importer *I, const Node *N, const char *name, double dflt, double *out) {
  const Onnx__AttributeProto *a = node_attr(N, name);
  *out = dflt;
  if (!a) return TP_OK;
  if (attr_check(I, N, a, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT)) return TP_ERR_INPUT;
  *out = a->f;
  return TP_OK;
}

int attr_string(Importer *I, const Node *N, const char *name, const char *dflt, const char **out) {
  const Onnx__AttributeProto *a = node_attr(N, name);
  *out = dflt;
  if (!a) return TP_OK;
  if (attr_check(I, N, a, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING)) return TP_ERR_INPUT;
  if (a->s.len && memchr(a->s.data, 0, a->s.len)) /* an empty string has no data */
    return node_error(I, N, "attribute '%s' holds a NUL byte", name);
  char *s = tp_alloc(I->m, a->s.len + 1);
  if (a->s.len) memcpy(s, a->s.data, a->s.len);
  *out = s;
  return TP_OK;
}

int attr_ints(Importer *I, const Node *N, const char *name, int64_t *out, int *n) {
  const Onnx__AttributeProto *a = node_attr(N, name);
  *n = -1;
  if (!a) return TP_OK;
  if (attr_check(I, N, a, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS)) return TP_ERR_INPUT;
  if (a->n_ints > TP_MAX_CONST_INTS)
    return node_error(I, N, "attribute '%s' has %zu values; tokpipec supports at most %d", name, a->n_ints,
                      TP_MAX_CONST_INTS);
  if (a->n_ints) memcpy(out, a->ints, a->n_ints * sizeof *out);
  *n = (int)a->n_ints;
  return TP_OK;
}

int norm_axis(Importer *I, const Node *N, const char *what, int64_t axis, int rank, int64_t *out) {
  if (axis < -rank || axis >= rank)
    return node_error(I, N, "%s %lld is out of range for rank %d", what, (long long)axis, rank);
  *out = axis < 0 ? axis + rank : axis;
  return TP_OK;
}

/* ---- operands ---- */

const TpType *value_type(Importer *I, int v) { return &I->m->values[v].type; }

static const TpInputBinding *find_binding(const Importer *I, const char *name) {
  for (int i = 0; I->o && i < I->o->nbound; i++)
    if (strcmp(I->o->bound_inputs[i].name, name) == 0) return &I->o->bound_inputs[i];
  return NULL;
}

/* Turns a bound graph input into a CONST holding its data (it leaves the inputs at the end). */
static void make_input_const(Importer *I, int v, const TpInputBinding *b) {
  TpValue *val = &I->m->values[v];
  size_t bytes = (size_t)tp_type_numel(&val->type) * tp_dtype_size(val->type.dtype);
  int blob = tp_add_owned_blob(I->m, b->value.data, bytes);
  val = &I->m->values[v];
  val->kind = TP_VAL_CONST;
  val->blob = blob;
  val->offset = 0;
}

int const_operand(Importer *I, const Node *N, int k, const char *what, TpTensor *t) {
  int v = k < N->nin ? N->in[k] : -1;
  if (v < 0) return node_error(I, N, "operand '%s' is missing", what);
  TpValue *val = &I->m->values[v];
  if (val->kind == TP_VAL_INPUT) {
    const TpInputBinding *b = find_binding(I, val->name);
    if (!b)
      return node_error(I, N,
                        "operand '%s' is graph input '%s', which is not a compile-time "
                        "constant (tokpipec needs shapes, axes and sizes at compile time)",
                        what, val->name);
    make_input_const(I, v, b);
  } else if (val->kind != TP_VAL_CONST && val->kind != TP_VAL_PARAM) {
    return node_error(I, N,
                      "operand '%s' ('%s') is not a compile-time constant (static shapes "
                      "are needed: fix symbolic dims with --dim)",
                      what, val->name);
  }
  *t = tp_value_tensor(I->m, v);
  return TP_OK;
}

int const_ints(Importer *I, const Node *N, int k, const char *what, int64_t *out, int *n) {
  TpTensor t;
  int rc = const_operand(I, N, k, what, &t);
  if (rc) return rc;
  if (t.dtype != TP_I64 && t.dtype != TP_I32)
    return node_error(I, N, "operand '%s' must be int64 or int32, not %s", what, tp_dtype_name(t.dtype));
  int64_t numel = tp_tensor_numel(&t);
  if (t.rank > 1 || numel > TP_MAX_CONST_INTS)
    return node_error(I, N, "operand '%s' must be a list of at most %d integers", what, TP_MAX_CONST_INTS);
  for (int64_t i = 0; i < numel; i++) {
    if (t.dtype == TP_I64) {
      memcpy(&out[i], (const char *)t.data + 8 * i, 8);
    } else {
      int32_t x;
      memcpy(&x, (const char *)t.data + 4 * i, 4);
      out[i] = x;
    }
  }
  *n = (int)numel;
  return TP_OK;
}

/* ---- results ---- */

void bind_output(Importer *I, const Node *N, int k, int v) {
  const char *name = k < N->nout ? N->n->output[k] : NULL;
  if (name && *name) map_put(&I->names, name, v);
}

int new_op(Importer *I, const Node *N, TpOpKind kind, const int *inputs, int ninputs, int noutputs) {
  const char *names[TP_MAX_CONST_INTS];
  TP_ASSERT(noutputs <= TP_MAX_CONST_INTS);
  for (int k = 0; k < noutputs; k++) {
    const char *s = k < N->nout ? N->n->output[k] : NULL;
    names[k] = s && *s ? s : NULL;
  }
  return tp_add_op(I->m, kind, inputs, ninputs, names, noutputs, N->at);
}

int finish_op(Importer *I, const Node *N, int op) {
  int rc = tp_infer_op(I->m, op, I->d);
  if (rc) return rc;
  bool folded;
  if ((rc = tp_fold_op(I->m, op, &folded, I->d))) return rc;
  const TpOp *o = &I->m->ops[op];
  for (int k = 0; k < o->noutputs; k++)
    if (o->outputs[k] >= 0) bind_output(I, N, k, o->outputs[k]);
  return TP_OK;
}

int add_output_const(Importer *I, const Node *N, int k, TpType type, const void *data) {
  const char *name = k < N->nout ? N->n->output[k] : NULL;
  if (!name || !*name) return TP_OK;
  int v = tp_add_const(I->m, tp_unique_name(I->m, name), type, data, N->at);
  bind_output(I, N, k, v);
  return TP_OK;
}

/* ---- graph inputs ---- */

static int64_t dim_binding(const Importer *I, const char *name) {
  for (int i = 0; I->o && i < I->o->ndims; i++)
    if (strcmp(I->o->dims[i].name, name) == 0) return I->o->dims[i].value;
  /* a dim named like one of the token input's that --batch/--seq fixed */
  for (int i = 0; I->o && i < I->m->ninputs; i++) {
    const TpType *t = &I->m->values[I->m->inputs[i]].type;
    if (!tp_dtype_is_integer(t->dtype) || t->rank != 2) continue;
    for (int k = 0; k < 2; k++)
      if (I->o->token_dims[k] > 0 && t->dimnames[k] && strcmp(t->dimnames[k], name) == 0) return I->o->token_dims[k];
    break;
  }
  return -1;
}

/* TpImportOptions.token_dims when `type` (dtype and rank known) is the token input and the
 * options fix its dims; NULL otherwise. */
static const int64_t *token_input_dims(const Importer *I, const TpType *type) {
  if (!I->o || (I->o->token_dims[0] <= 0 && I->o->token_dims[1] <= 0)) return NULL;
  if (!tp_dtype_is_integer(type->dtype) || type->rank != 2) return NULL;
  for (int i = 0; i < I->m->ninputs; i++) { /* only the first such input */
    const TpType *t = &I->m->values[I->m->inputs[i]].type;
    if (tp_dtype_is_integer(t->dtype) && t->rank == 2) return NULL;
  }
  return I->o->token_dims;
}

static int import_input(Importer *I, const Onnx__ValueInfoProto *vi) {
  TpDiag *d = I->d;
  const char *name = vi->name;
  const Onnx__TypeProto *tp = vi->type;
  if (!tp || tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !tp->tensor_type)
    return tp_error(d, "input '%s' is not a tensor", name);
  const Onnx__TypeProto__Tensor *tt = tp->tensor_type;
  TpType type = {0};
  type.dtype = tp_onnx_dtype(tt->elem_type);
  if (type.dtype == TP_UNDEF)
    return tp_error(d, "input '%s' has unsupported element type %d", name, (int)tt->elem_type);
  const TpInputBinding *b = find_binding(I, name);
  if (!tt->shape) {
    if (!b) return tp_error(d, "input '%s' has no shape", name);
    type.rank = b->value.rank;
    memcpy(type.dims, b->value.dims, sizeof type.dims);
  } else {
    if (tt->shape->n_dim > TP_MAX_RANK)
      return tp_error(d, "input '%s' has rank %zu; tokpipec supports rank <= %d", name, tt->shape->n_dim,
                      TP_MAX_RANK);
    type.rank = (int)tt->shape->n_dim;
    const int64_t *token_dims = token_input_dims(I, &type);
    if (b && b->value.rank != type.rank)
      return tp_error(d, "input '%s' has rank %d, its bound data rank %d", name, type.rank, b->value.rank);
    for (int i = 0; i < type.rank; i++) {
      const Onnx__TensorShapeProto__Dimension *dim = tt->shape->dim[i];
      int64_t n = -1;
      if (dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE) {
        n = dim->dim_value;
        if (n < 0) return tp_error(d, "input '%s' dim %d is negative (%lld)", name, i, (long long)n);
      } else if (dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM && dim->dim_param &&
                 *dim->dim_param) {
        type.dimnames[i] = tp_strdup(I->m, dim->dim_param);
        n = dim_binding(I, dim->dim_param);
        if (n < 0 && token_dims && token_dims[i] > 0) n = token_dims[i];
        if (n < 0 && b) n = b->value.dims[i];
        if (n < 0)
          return tp_error(d, "input '%s' dim %d '%s' is symbolic: pass --dim %s=N", name, i, dim->dim_param,
                          dim->dim_param);
      } else {
        if (!b) return tp_error(d, "input '%s' dim %d has no size", name, i);
        n = b->value.dims[i];
      }
      type.dims[i] = n;
      if (token_dims && token_dims[i] > 0 && n != token_dims[i] && !(i == 0 && I->o->rebatch))
        return tp_error(d, "token input '%s' dim %d is %lld in the model but %s %lld%s", name, i, (long long)n,
                        i ? "--seq is" : "a microbatch (--batch / (--dp x --microbatches)) has",
                        (long long)token_dims[i], i ? "" : " rows");
    }
  }
  if (!tp_type_size_ok(&type)) return tp_error(d, "input '%s' is too large or has a negative dim", name);
  if (b) {
    TpType bt = tp_type_make(b->value.dtype, b->value.rank, b->value.dims);
    if (!tp_type_equal(&type, &bt)) {
      char want[128], got[128];
      return tp_error(d, "input '%s' is %s but its bound data is %s", name, tp_type_str(&type, want, sizeof want),
                      tp_type_str(&bt, got, sizeof got));
    }
  }
  int v = tp_add_value(I->m, name, TP_VAL_INPUT, type, (TpOrigin){0});
  tp_add_input(I->m, v);
  map_put(&I->names, name, v);
  return TP_OK;
}

/* ONNX lets a graph input share its name with an initializer (the initializer is then the
 * input's default value); tokpipec takes the initializer, so the input must declare its
 * type, where it declares one. */
static int check_initializer_input(Importer *I, const Onnx__ValueInfoProto *vi, const Onnx__TensorProto *init) {
  TpTensor shape;
  char what[300], err[TP_ONNX_ERR_SIZE];
  snprintf(what, sizeof what, "initializer '%s'", vi->name);
  if (tp_onnx_tensor_type(init, what, &shape, err, sizeof err)) return tp_error(I->d, "%s", err);
  TpType it = tp_type_make(shape.dtype, shape.rank, shape.dims);
  const Onnx__TypeProto *tp = vi->type;
  if (!tp || tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !tp->tensor_type) return TP_OK;
  const Onnx__TypeProto__Tensor *tt = tp->tensor_type;
  TpDType dtype = tt->elem_type ? tp_onnx_dtype(tt->elem_type) : it.dtype;
  bool differs = dtype != it.dtype;
  /* the declared type as text: a symbolic dim by its name, matching any size */
  char declared[200], have[160];
  const char *dt = tp_dtype_name(dtype);
  size_t len = dt ? (size_t)snprintf(declared, sizeof declared, "%s", dt)
                  : (size_t)snprintf(declared, sizeof declared, "element type %d", (int)tt->elem_type);
  if (tt->shape) {
    differs |= tt->shape->n_dim != (size_t)it.rank;
    for (size_t i = 0; i < tt->shape->n_dim && len < sizeof declared; i++) {
      const Onnx__TensorShapeProto__Dimension *dim = tt->shape->dim[i];
      bool fixed = dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
      differs |= fixed && (i >= (size_t)it.rank || dim->dim_value != it.dims[i]);
      const char *sep = i ? ", " : "[";
      if (fixed)
        len += (size_t)snprintf(declared + len, sizeof declared - len, "%s%lld", sep, (long long)dim->dim_value);
      else
        len += (size_t)snprintf(declared + len, sizeof declared - len, "%s%s", sep,
                                dim->dim_param && *dim->dim_param ? dim->dim_param : "?");
    }
    if (len < sizeof declared) snprintf(declared + len, sizeof declared - len, tt->shape->n_dim ? "]" : "[]");
  }
  if (!differs) return TP_OK;
  return tp_error(I->d, "graph input '%s' is declared %s but its initializer (the value tokpipec uses) is %s",
                  vi->name, declared, tp_type_str(&it, have, sizeof have));
}

/* ---- nodes ---- */

static TpOrigin node_origin(Importer *I, const Onnx__NodeProto *n, size_t index) {
  const char *op = n->op_type ? n->op_type : "";
  TpOrigin at = {NULL, tp_strdup(I->m, op)};
  if (n->name && *n->name) {
    at.node = tp_strdup(I->m, n->name);
  } else { /* stable synthesized name for diagnostics */
    char buf[160];
    snprintf(buf, sizeof buf, "%.100s_%zu", op, index);
    at.node = tp_strdup(I->m, buf);
  }
  return at;
}

static bool is_default_domain(const char *domain) { return !domain || !*domain || strcmp(domain, "ai.onnx") == 0; }

/* NonZero's result has as many rows as its operand has nonzero entries: no static plan holds
 * it. A mixture's experts exported by TorchScript with transformers' eager experts route
 * tokens so (OneHot, NonZero, ScatterElements), its OneHot first: this names the NonZero
 * before any other node stops the import, with the export that works. */
static int refuse_data_dependent(Importer *I, const Onnx__NodeProto *n, size_t index) {
  if (!is_default_domain(n->domain) || !n->op_type || strcmp(n->op_type, "NonZero") != 0) return TP_OK;
  Node N = {.n = n, .at = node_origin(I, n, index)};
  return node_error(I, &N,
                    "NonZero has a data-dependent shape, which tokpipec does not support (a mixture of "
                    "experts' eager routing); export with torch.onnx.export(..., dynamo=True) and the model "
                    "loaded with experts_implementation=\"batched_mm\"");
}

static int import_node(Importer *I, const Onnx__NodeProto *n, size_t index) {
  Node N = {.n = n, .at = node_origin(I, n, index)};
  const char *op = N.at.op_type;
  if (!is_default_domain(n->domain))
    return node_error(I, &N,
                      "op domain '%s' is not supported: tokpipec reads standard ONNX "
                      "ops only; export the model without onnxruntime's optimizations "
                      "(the unoptimized export)",
                      n->domain);
  int first = 0;
  const OpRow *row = tp_onnx_find_op(op, I->opset, &first);
  if (!row) {
    if (first > 0)
      return node_error(I, &N, "unsupported op: %s needs opset >= %d, the model imports opset %d", op, first,
                        I->opset);
    return node_error(I, &N, "unsupported op '%s'", op);
  }
  N.since = row->since;
  N.kind = row->kind;
  if (n->n_input > TP_MAX_CONST_INTS || n->n_output > TP_MAX_CONST_INTS)
    return node_error(I, &N, "too many inputs or outputs (at most %d)", TP_MAX_CONST_INTS);
  N.nin = (int)n->n_input;
  N.nout = (int)n->n_output;
  for (int k = 0; k < N.nin; k++) {
    int merged = override_of(I, (int)index, k);
    N.in[k] = merged >= 0 ? merged : *n->input[k] ? map_get(&I->names, n->input[k]) : -1;
    TP_ASSERT(!*n->input[k] || N.in[k] >= 0); /* topo_order checked it */
  }
  /* trailing absent operands and results are as good as missing */
  while (N.nin > 0 && N.in[N.nin - 1] < 0) N.nin--;
  while (N.nout > 0 && !*n->output[N.nout - 1]) N.nout--;
  if (N.nin > row->max_in) return node_error(I, &N, "has %d inputs, expected at most %d", N.nin, row->max_in);
  if (N.nout > row->max_out) return node_error(I, &N, "has %d outputs, expected at most %d", N.nout, row->max_out);
  for (int k = 0; k < row->min_in; k++)
    if (k >= N.nin || N.in[k] < 0) return node_error(I, &N, "input %d is missing", k);
  if (N.nout < 1 || !*n->output[0]) return node_error(I, &N, "has no output");
  int rc = row->fn(I, &N);
  if (rc) return rc;
  for (int k = 0; k < N.nout; k++)
    if (*n->output[k] && map_get(&I->names, n->output[k]) < 0)
      return tp_internal(I->d, "node '%s' (%s): output '%s' was not produced", N.at.node, op, n->output[k]);
  return TP_OK;
}

/* Node indices in an order where producers come first (the file's order when it already
 * is one); reports undefined operands and cycles. */
static int topo_order(Importer *I, const Onnx__GraphProto *g, int *order) {
  int nn = (int)g->n_node, rc = TP_OK, count = 0;
  NameMap producer = {0};
  for (int i = 0; i < nn; i++) {
    const Onnx__NodeProto *n = g->node[i];
    for (size_t k = 0; k < n->n_output; k++) {
      const char *s = n->output[k];
      if (!*s) continue;
      if (map_has(&I->names, s) || map_has(&producer, s)) {
        TpOrigin at = node_origin(I, n, (size_t)i);
        rc = err_at(I->d, &at, I->opset, "value '%s' is defined twice", s);
        goto done;
      }
      map_put(&producer, s, i);
    }
  }
  for (int i = 0; i < nn; i++) {
    const Onnx__NodeProto *n = g->node[i];
    for (size_t k = 0; k < n->n_input; k++) {
      const char *s = n->input[k];
      if (*s && !map_has(&I->names, s) && !map_has(&producer, s)) {
        TpOrigin at = node_origin(I, n, (size_t)i);
        rc = err_at(I->d, &at, I->opset, "input '%s' is not defined (missing initializer?)", s);
        goto done;
      }
    }
  }
  /* iterative depth-first search; state 0 new, 1 on the stack, 2 done */
  char *state = calloc((size_t)nn + 1, 1);
  int *stack = malloc(((size_t)nn + 1) * sizeof *stack), *next = calloc((size_t)nn + 1, sizeof *next);
  TP_ASSERT(state && stack && next);
  for (int root = 0; root < nn && !rc; root++) {
    if (state[root]) continue;
    int sp = 0;
    stack[sp++] = root;
    state[root] = 1;
    while (sp > 0 && !rc) {
      int i = stack[sp - 1];
      const Onnx__NodeProto *n = g->node[i];
      if ((size_t)next[i] < n->n_input) {
        const char *s = n->input[next[i]++];
        int p = *s ? map_get(&producer, s) : -1;
        if (p < 0 || state[p] == 2) continue;
        if (state[p] == 1) {
          TpOrigin at = node_origin(I, g->node[p], (size_t)p);
          rc = tp_error(I->d, "graph has a cycle through node '%s'", at.node);
          break;
        }
        state[p] = 1;
        stack[sp++] = p;
      } else {
        state[i] = 2;
        order[count++] = i;
        sp--;
      }
    }
  }
  free(state);
  free(stack);
  free(next);
done:
  map_free(&producer);
  return rc;
}

/* ---- graph outputs ---- */

static int check_output_type(Importer *I, const Onnx__ValueInfoProto *vi, int v) {
  const Onnx__TypeProto *tp = vi->type;
  if (!tp || tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !tp->tensor_type) return TP_OK;
  const Onnx__TypeProto__Tensor *tt = tp->tensor_type;
  const TpType *have = value_type(I, v);
  TpType want = *have;
  bool differs = false;
  if (tt->elem_type) {
    want.dtype = tp_onnx_dtype(tt->elem_type);
    differs |= want.dtype != have->dtype;
  }
  if (tt->shape) {
    if (tt->shape->n_dim != (size_t)have->rank) {
      differs = true;
      want.rank = tt->shape->n_dim > TP_MAX_RANK ? TP_MAX_RANK : (int)tt->shape->n_dim;
    }
    for (int i = 0; i < want.rank; i++) {
      const Onnx__TensorShapeProto__Dimension *dim = tt->shape->dim[i];
      int64_t n = -1;
      if (dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE) n = dim->dim_value;
      else if (dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM && dim->dim_param)
        n = dim_binding(I, dim->dim_param);
      if (n >= 0 || i >= have->rank) {
        want.dims[i] = n;
        differs |= i >= have->rank || n != have->dims[i];
      }
    }
  }
  if (!differs) return TP_OK;
  char a[160], b[160];
  if (want.dtype == TP_UNDEF) snprintf(a, sizeof a, "element type %d", (int)tt->elem_type);
  else tp_type_str(&want, a, sizeof a);
  return tp_error(I->d, "output '%s' is declared %s but the model computes %s", vi->name, a,
                  tp_type_str(have, b, sizeof b));
}

/* ---- the model ---- */

static int read_opset(Importer *I, const Onnx__ModelProto *model) {
  int64_t opset = -1;
  for (size_t i = 0; i < model->n_opset_import; i++) {
    const Onnx__OperatorSetIdProto *os = model->opset_import[i];
    if (is_default_domain(os->domain) && opset < 0) opset = os->has_version ? os->version : 0;
  }
  if (opset < 0) return tp_error(I->d, "the model imports no default-domain (ai.onnx) opset");
  /* older opsets are fine where each node's version is still current at 13 (the op table
     decides per node); newer ones may change semantics we do not know */
  if (opset < 1 || opset > MAX_OPSET)
    return tp_error(I->d,
                    "opset %lld is not supported: tokpipec reads opsets up to %d; re-export "
                    "the model with opset_version in 13..%d",
                    (long long)opset, MAX_OPSET, MAX_OPSET);
  I->opset = (int)opset;
  I->m->opset = I->opset;
  return TP_OK;
}

/* Removes inputs that became constants (bound and used as shapes). */
static void drop_const_inputs(TpModule *m) {
  int n = 0;
  for (int i = 0; i < m->ninputs; i++)
    if (m->values[m->inputs[i]].kind == TP_VAL_INPUT) m->inputs[n++] = m->inputs[i];
  m->ninputs = n;
}

static int import_graph(Importer *I, const Onnx__ModelProto *model) {
  TpModule *m = I->m;
  const Onnx__GraphProto *g = model->graph;
  int rc;
  if (!g) return tp_error(I->d, "the model has no graph");
  if ((rc = read_opset(I, model))) return rc;
  if (g->n_sparse_initializer)
    return tp_error(I->d, "sparse initializer '%s' is not supported",
                    g->sparse_initializer[0]->values && g->sparse_initializer[0]->values->name
                        ? g->sparse_initializer[0]->values->name
                        : "");
  if (I->nraw >= 0 && (size_t)I->nraw != g->n_initializer) I->nraw = -1;
  /* initializer names first (as -2 - index): a graph input that has one is not an input */
  for (size_t i = 0; i < g->n_initializer; i++) {
    const char *name = g->initializer[i]->name;
    if (!name || !*name) return tp_error(I->d, "initializer %zu has no name", i);
    if (map_has(&I->names, name)) return tp_error(I->d, "initializer '%s' is defined twice", name);
    map_put(&I->names, name, -2 - (int)i);
  }
  for (size_t i = 0; i < g->n_input; i++) {
    const char *name = g->input[i]->name;
    if (!name || !*name) return tp_error(I->d, "input %zu has no name", i);
    if (map_has(&I->names, name)) {
      int v = map_get(&I->names, name);
      if (v >= 0) return tp_error(I->d, "input '%s' is listed twice", name);
      if ((rc = check_initializer_input(I, g->input[i], g->initializer[-2 - v]))) return rc;
      continue;
    }
    if ((rc = import_input(I, g->input[i]))) return rc;
  }
  for (int i = 0; I->o && i < I->o->nbound; i++) {
    const char *name = I->o->bound_inputs[i].name;
    int v = map_get(&I->names, name);
    if (v < 0 || I->m->values[v].kind != TP_VAL_INPUT)
      return tp_error(I->d, "input data '%s' names no graph input of the model", name);
  }
  InitClass *cls = malloc((g->n_initializer + 1) * sizeof *cls);
  int *values = malloc((g->n_initializer + 1) * sizeof *values);
  TP_ASSERT(cls && values);
  rc = classify_initializers(I, g, cls);
  for (size_t i = 0; rc == TP_OK && i < g->n_initializer; i++) {
    const Onnx__TensorProto *t = g->initializer[i];
    rc = import_tensor_value(I, t, t->name, cls[i].kind, (TpOrigin){0}, (int)i, &values[i]);
    if (rc) break;
    I->m->values[values[i]].why = cls[i].why;
    I->m->values[values[i]].folded_from = cls[i].alone ? cls[i].source : NULL;
    map_put(&I->names, t->name, values[i]);
  }
  if (rc == TP_OK) rc = split_merged_params(I, g, cls, values);
  free(cls);
  free(values);
  if (rc) return rc;
  int *order = malloc((g->n_node + 1) * sizeof *order);
  TP_ASSERT(order);
  rc = topo_order(I, g, order);
  for (size_t i = 0; !rc && i < g->n_node; i++) rc = refuse_data_dependent(I, g->node[order[i]], (size_t)order[i]);
  for (size_t i = 0; !rc && i < g->n_node; i++) rc = import_node(I, g->node[order[i]], (size_t)order[i]);
  free(order);
  if (rc) return rc;
  if (!g->n_output) return tp_error(I->d, "the graph has no outputs");
  for (size_t i = 0; i < g->n_output; i++) {
    const char *name = g->output[i]->name;
    int v = name ? map_get(&I->names, name) : -1;
    if (v < 0) return tp_error(I->d, "output '%s' is not defined", name ? name : "");
    if ((rc = check_output_type(I, g->output[i], v))) return rc;
    tp_add_output(m, v);
  }
  drop_const_inputs(m);
  tp_module_compact(m); /* folded ops first: pass_dce recomputes every op's dead flag */
  return pass_dce(m, &(TpPassOptions){0}, I->d);
}

const char *model_file_name(const char *path) {
  const char *slash = strrchr(path, '/');
  return slash ? slash + 1 : path;
}

/* Decodes bytes[0..size) (the content of model_blob, or -1 when not mapped). */
static int import_bytes(const uint8_t *bytes, size_t size, const char *path, int model_blob,
                        const TpImportOptions *o, TpModule *m, TpDiag *d) {
  Importer I = {.m = m, .d = d, .o = o, .path = path, .model_blob = model_blob};
  int rc;
  Onnx__ModelProto *model = onnx__model_proto__unpack(NULL, size, bytes);
  if (!model) return tp_error(d, "cannot decode the file as an ONNX model (truncated, or not protobuf)");
  if (path) I.dir = tp_folder_of(path);
  locate_raw_data(&I, bytes, size);
  rc = import_graph(&I, model);
  onnx__model_proto__free_unpacked(model, NULL);
  map_free(&I.names);
  free(I.raw);
  free(I.overrides);
  map_free(&I.infos);
  map_free(&I.placeholders);
  free(I.dir);
  return rc;
}

/* Diagnostics name the model file while importing. */
static int import_with(TpModule *m, const void *data, size_t size, const char *path, int blob,
                       const TpImportOptions *o, TpModule **out, TpDiag *d) {
  const char *file = d->file;
  if (path) d->file = path;
  int rc = import_bytes(data, size, path, blob, o, m, d);
  d->file = file;
  if (rc) {
    tp_module_free(m);
    return rc;
  }
  *out = m;
  return TP_OK;
}

int tp_import_onnx_file(const char *path, const TpImportOptions *o, TpModule **out, TpDiag *d) {
  *out = NULL;
  TpModule *m = tp_module_new(path);
  const char *file = d->file;
  d->file = path;
  int blob = tp_add_file_blob(m, path, model_file_name(path), d);
  d->file = file;
  if (blob < 0) {
    tp_module_free(m);
    return TP_ERR_INPUT;
  }
  return import_with(m, m->blobs[blob].base, m->blobs[blob].size, path, blob, o, out, d);
}

int tp_import_onnx_buffer(const void *data, size_t size, const char *path, const TpImportOptions *o, TpModule **out,
                          TpDiag *d) {
  *out = NULL;
  TpModule *m = tp_module_new(path);
  int blob = tp_add_owned_blob(m, size ? data : "", size);
  return import_with(m, m->blobs[blob].base, m->blobs[blob].size, path, blob, o, out, d);
}

int tp_read_tensor_pb(const char *path, TpTensor *out, char **name, TpDiag *d) {
  memset(out, 0, sizeof *out);
  if (name) *name = NULL;
  const char *file = d->file;
  d->file = path;
  int rc = TP_OK;
  char why[256];
  size_t len;
  char *buf = tp_read_input(path, &len, why, sizeof why); /* a FIFO is refused, not waited on */
  if (!buf) {
    rc = tp_error(d, "cannot open: %s", why);
    d->file = file;
    return rc;
  }
  Onnx__TensorProto *t = onnx__tensor_proto__unpack(NULL, len, (const uint8_t *)buf);
  free(buf);
  if (!t) {
    rc = tp_error(d, "cannot decode the file as an ONNX TensorProto");
    d->file = file;
    return rc;
  }
  const char *what = t->name && *t->name ? t->name : "tensor";
  const TpOnnxData no_external = {.refused = "is not supported in tensor files"};
  TpOnnxTensor dec;
  char err[TP_ONNX_ERR_SIZE];
  if ((rc = tp_onnx_tensor_decode(t, what, &no_external, &dec, err, sizeof err))) {
    tp_error(d, "%s", err);
    goto done;
  }
  *out = dec.t;
  out->data = tp_onnx_tensor_take(&dec);
  if (name) {
    *name = strdup(t->name ? t->name : "");
    TP_ASSERT(*name);
  }
done:
  onnx__tensor_proto__free_unpacked(t, NULL);
  d->file = file;
  return rc;
}
