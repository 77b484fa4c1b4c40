/* The textual IR ("tir") printer; ir/parse.c reads the same format back. One statement
 * per line, `//` comments:
 *
 *   tir 1 opset 17 source "gpt.onnx"                      header: format version, module
 *   blob 0 "gpt.onnx"                                     a file holding weights
 *   input %idx : i64[batch=2, seq=8]                      graph inputs, in order
 *   param %wte : f32[256, 64] = blob 0 offset 1234 size 65536 loc("wte" initializer)
 *   param %wte.stage1 : f32[256, 64] = blob 0 offset 1234 size 65536 @tied(%wte) loc("wte" initializer)
 *   param %wpe : bf16[8, 64] = f32 blob 0 offset 99 size 2048     data of another dtype (TpValue.data_dtype)
 *   const %c : f32[] = dense<0.5> loc("/Constant" Constant)
 *   %"/wte/Gather_output_0" : f32[batch=2, seq=8, 64] = Gather(%wte, %idx) {axis = 0} loc("/wte/Gather" Gather)
 *   %y : f32[2, 8], none, %inv : f32[2, 1] loc() = LayerNorm(%x, %s, none) {axis = 1, epsilon = 1e-05}
 *   %dx : f32[2, 8] = Neg(%dy) @stage(1) @slice(0) @backward loc("/neg" Neg)
 *   %h.stage1 : f32[2, 8] = Reshape(%h) @stage(1) @boundary loc("/h" Add)
 *   output %"/wte/Gather_output_0"                        graph outputs, in order
 *   loss %loss                                            the training loss (after add-loss)
 *   grad %wte = %wte.grad                                 d loss / d param, in param order
 *
 * An op's placement follows its attributes, each part only where it is not the default:
 * `@stage(S)` (default 0), `@slice(K)` (default -1: not sliced), `@backward` (default:
 * the forward phase), `@weight` (a backward op of a split backward's weight part), then its role (TpOpRole): `@boundary`, `@retie` or `@recompute`
 * (default: compute).
 * A param that is a tied copy of another names it after its data: `@tied(%param)`; one
 * split over the tensor group says how: `@shard(axis=1, parts=2, ranks=2)` (TpShard).
 * Values are %name, quoted (%"a/b") unless [A-Za-z0-9_.]+; op types, attribute and dim
 * names are quoted unless [A-Za-z_][A-Za-z0-9_]*. In strings '"' and '\' are escaped
 * with a backslash, control and non-ASCII bytes as \xHH. A type is dtype[dims] with
 * `name=` before a symbolic dim, `?` for an unknown dim or a type not inferred yet.
 * `none` is an absent optional operand or result. Attributes are sorted by name: ints,
 * floats (always with '.', 'e', inf or nan), [int lists], "strings". loc("node" OpType)
 * is the ONNX origin (`none` for no node name; loc() for no origin); a result's own loc is
 * printed only where it differs from its op's.
 *
 * Params and constants come before the ops, in module order. Data in files is referenced
 * (file blobs are renumbered 0..k-1 in module order); module-owned data is printed inline:
 * `dense<x>` fills the tensor with one element, `dense<[a, b, ...]>` lists up to
 * TP_PRINT_MAX_ELEMS elements, `dense<0x...>` gives the raw little-endian bytes. Floats
 * are printed in the shortest form that reads back to the same bits, so
 * print(parse(print(m))) == print(m) byte for byte. */
#include "ir.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { TP_PRINT_MAX_ELEMS = 64 };

static bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.';
}

/* A quoted string with C escapes for '"', '\\' and bytes outside printable ASCII. */
static void print_string(FILE *out, const char *s) {
  fputc('"', out);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') fprintf(out, "\\%c", *p);
    else if (*p < 0x20 || *p >= 0x7f) fprintf(out, "\\x%02x", *p);
    else fputc(*p, out);
  }
  fputc('"', out);
}

/* Keywords, op types, attribute and dimension names: bare if [A-Za-z_][A-Za-z0-9_]*. */
static void print_word(FILE *out, const char *s) {
  bool bare = (s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z') || s[0] == '_';
  for (const char *p = s; *p && bare; p++) bare = is_name_char(*p) && *p != '.';
  if (bare) fputs(s, out);
  else print_string(out, s);
}

static void print_value_name(FILE *out, const TpModule *m, int v) {
  if (v < 0) {
    fputs("none", out);
    return;
  }
  const char *s = m->values[v].name;
  bool bare = s[0] != 0;
  for (const char *p = s; *p && bare; p++) bare = is_name_char(*p);
  fputc('%', out);
  if (bare) fputs(s, out);
  else print_string(out, s);
}

static void print_type(FILE *out, const TpType *t) {
  const char *dt = tp_dtype_name(t->dtype);
  if (!dt) {
    fputc('?', out);
    return;
  }
  fprintf(out, "%s[", dt);
  for (int i = 0; i < t->rank; i++) {
    if (i) fputs(", ", out);
    if (t->dimnames[i]) {
      print_word(out, t->dimnames[i]);
      fputc('=', out);
    }
    if (t->dims[i] < 0) fputc('?', out);
    else fprintf(out, "%lld", (long long)t->dims[i]);
  }
  fputc(']', out);
}

static bool origin_equal(TpOrigin a, TpOrigin b) {
  bool node = a.node == b.node || (a.node && b.node && strcmp(a.node, b.node) == 0);
  bool type = a.op_type == b.op_type || (a.op_type && b.op_type && strcmp(a.op_type, b.op_type) == 0);
  return node && type;
}

/* loc("node" OpType); `none` for a missing node; nothing at all without an origin. */
static void print_origin(FILE *out, TpOrigin o) {
  if (!o.node && !o.op_type) return;
  fputs(" loc(", out);
  if (o.node) print_string(out, o.node);
  else fputs("none", out);
  if (o.op_type) {
    fputc(' ', out);
    print_word(out, o.op_type);
  }
  fputc(')', out);
}

/* Shortest "%.Ng" (N = 1..17) for which `same` says the text reads back exactly. */
typedef bool (*RoundTrip)(const char *text, const void *orig);

static void shortest(char *buf, size_t n, double v, RoundTrip same, const void *orig) {
  if (isnan(v)) {
    snprintf(buf, n, "nan");
    return;
  }
  if (isinf(v)) {
    snprintf(buf, n, v < 0 ? "-inf" : "inf");
    return;
  }
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(buf, n, "%.*g", prec, v);
    if (!same(buf, orig)) continue;
    /* "1e+01" is short but odd: write numbers below 1e9 out ("10"); more digits still
     * read back the same */
    const char *e = strchr(buf, 'e');
    int exp10 = e ? atoi(e + 1) : -1;
    if (exp10 >= prec && exp10 < 9) snprintf(buf, n, "%.*g", exp10 + 1, v);
    return;
  }
  TP_ASSERT(!"a double must round-trip at 17 digits");
}

static bool same_f64(const char *s, const void *o) { return strtod(s, NULL) == *(const double *)o; }
static bool same_f32(const char *s, const void *o) { return strtof(s, NULL) == *(const float *)o; }
static bool same_f16(const char *s, const void *o) { return tp_f32_to_f16(strtof(s, NULL)) == *(const uint16_t *)o; }
static bool same_bf16(const char *s, const void *o) {
  return tp_f32_to_bf16(strtof(s, NULL)) == *(const uint16_t *)o;
}

/* The float of an attribute: always with '.', 'e', "inf" or "nan" so it reads as a float. */
static void print_attr_float(FILE *out, double v) {
  char buf[64];
  shortest(buf, sizeof buf, v, same_f64, &v);
  fputs(buf, out);
  if (!strpbrk(buf, ".ein")) fputs(".0", out);
}

static void print_elem(FILE *out, TpDType dt, const uint8_t *p) {
  char buf[64];
  switch (dt) {
  case TP_F32: {
    float f;
    memcpy(&f, p, 4);
    shortest(buf, sizeof buf, f, same_f32, &f);
    fputs(buf, out);
    return;
  }
  case TP_F64: {
    double f;
    memcpy(&f, p, 8);
    shortest(buf, sizeof buf, f, same_f64, &f);
    fputs(buf, out);
    return;
  }
  case TP_F16: {
    uint16_t h;
    memcpy(&h, p, 2);
    shortest(buf, sizeof buf, tp_f16_to_f32(h), same_f16, &h);
    fputs(buf, out);
    return;
  }
  case TP_BF16: {
    uint16_t h;
    memcpy(&h, p, 2);
    shortest(buf, sizeof buf, tp_bf16_to_f32(h), same_bf16, &h);
    fputs(buf, out);
    return;
  }
  case TP_BOOL: fputs(*p ? "true" : "false", out); return;
  case TP_U8: fprintf(out, "%u", (unsigned)*p); return;
  case TP_I8: fprintf(out, "%d", (int)(int8_t)*p); return;
  case TP_U16: {
    uint16_t x;
    memcpy(&x, p, 2);
    fprintf(out, "%u", (unsigned)x);
    return;
  }
  case TP_I16: {
    int16_t x;
    memcpy(&x, p, 2);
    fprintf(out, "%d", (int)x);
    return;
  }
  case TP_U32: {
    uint32_t x;
    memcpy(&x, p, 4);
    fprintf(out, "%lu", (unsigned long)x);
    return;
  }
  case TP_I32: {
    int32_t x;
    memcpy(&x, p, 4);
    fprintf(out, "%ld", (long)x);
    return;
  }
  case TP_U64: {
    uint64_t x;
    memcpy(&x, p, 8);
    fprintf(out, "%llu", (unsigned long long)x);
    return;
  }
  case TP_I64: {
    int64_t x;
    memcpy(&x, p, 8);
    fprintf(out, "%lld", (long long)x);
    return;
  }
  default: TP_ASSERT(!"print_elem: unknown dtype");
  }
}

static bool is_nan_elem(TpDType dt, const uint8_t *p) {
  switch (dt) {
  case TP_F32: {
    float f;
    memcpy(&f, p, 4);
    return isnan(f);
  }
  case TP_F64: {
    double f;
    memcpy(&f, p, 8);
    return isnan(f);
  }
  case TP_F16: {
    uint16_t h;
    memcpy(&h, p, 2);
    return isnan(tp_f16_to_f32(h));
  }
  case TP_BF16: {
    uint16_t h;
    memcpy(&h, p, 2);
    return isnan(tp_bf16_to_f32(h));
  }
  default: return false;
  }
}

/* Equal as printed: all NaNs print as `nan` and every nonzero bool as `true`. */
static bool same_elem(TpDType dt, const uint8_t *a, const uint8_t *b, size_t size) {
  if (dt == TP_BOOL) return (*a != 0) == (*b != 0);
  return memcmp(a, b, size) == 0 || (is_nan_elem(dt, a) && is_nan_elem(dt, b));
}

static void print_dense(FILE *out, TpDType dt, const uint8_t *data, int64_t numel) {
  size_t size = tp_dtype_size(dt);
  bool splat = numel > 0;
  for (int64_t i = 1; i < numel && splat; i++) splat = same_elem(dt, data, data + i * size, size);
  fputs("dense<", out);
  if (splat) {
    print_elem(out, dt, data);
  } else if (numel <= TP_PRINT_MAX_ELEMS) {
    fputc('[', out);
    for (int64_t i = 0; i < numel; i++) {
      if (i) fputs(", ", out);
      print_elem(out, dt, data + i * size);
    }
    fputc(']', out);
  } else {
    fputs("0x", out);
    for (int64_t i = 0; i < numel * (int64_t)size; i++) fprintf(out, "%02x", data[i]);
  }
  fputc('>', out);
}

static void print_attr(FILE *out, const TpAttr *a) {
  print_word(out, a->name);
  fputs(" = ", out);
  switch (a->kind) {
  case TP_ATTR_INT: fprintf(out, "%lld", (long long)a->i); break;
  case TP_ATTR_FLOAT: print_attr_float(out, a->f); break;
  case TP_ATTR_STRING: print_string(out, a->s); break;
  case TP_ATTR_INTS:
    fputc('[', out);
    for (int i = 0; i < a->nints; i++) fprintf(out, "%s%lld", i ? ", " : "", (long long)a->ints[i]);
    fputc(']', out);
    break;
  }
}

/* File blobs are numbered in module order, skipping the owned ones printed inline. */
static int file_blob_number(const TpModule *m, int blob) {
  int n = 0;
  for (int i = 0; i < blob; i++) n += m->blobs[i].path != NULL;
  return n;
}

static void print_data_value(FILE *out, const TpModule *m, int v) {
  const TpValue *val = &m->values[v];
  fputs(val->kind == TP_VAL_PARAM ? "param " : "const ", out);
  print_value_name(out, m, v);
  fputs(" : ", out);
  print_type(out, &val->type);
  fputs(" = ", out);
  TpDType data = tp_data_dtype(m, v);
  if (data != val->type.dtype) fprintf(out, "%s ", tp_dtype_name(data));
  int64_t bytes = tp_type_numel(&val->type) * (int64_t)tp_dtype_size(data);
  const TpBlob *b = val->blob >= 0 && val->blob < m->nblobs ? &m->blobs[val->blob] : NULL;
  if (b && b->path)
    fprintf(out, "blob %d offset %lld size %lld", file_blob_number(m, val->blob), (long long)val->offset,
            (long long)bytes);
  else if (b && val->offset >= 0 && (uint64_t)(val->offset + bytes) <= b->size)
    print_dense(out, data, b->base + val->offset, tp_type_numel(&val->type));
  else fputs("<invalid data>", out); /* the verifier reports it; keep dumps of bad IR going */
  if (val->kind == TP_VAL_PARAM && val->tied >= 0) {
    fputs(" @tied(", out);
    print_value_name(out, m, val->tied);
    fputc(')', out);
  }
  const TpShard *sh = &val->shard;
  if (val->kind == TP_VAL_PARAM && sh->parts > 0) {
    fprintf(out, " @shard(axis=%d, parts=%d, ranks=%d", sh->axis, sh->parts, sh->ranks);
    if (sh->chunks > 1) fprintf(out, ", chunks=%d", sh->chunks);
    if (sh->pad > 0) fprintf(out, ", pad=%d", sh->pad);
    fputc(')', out);
  }
  print_origin(out, val->origin);
  fputc('\n', out);
}

/* ` @stage(S) @slice(K) @backward @role`, each only where it is not the default. */
static void print_placement(FILE *out, const TpOp *op) {
  if (op->stage != 0) fprintf(out, " @stage(%d)", op->stage);
  if (op->slice != -1) fprintf(out, " @slice(%d)", op->slice);
  if (op->phase == TP_PHASE_BACKWARD) fputs(" @backward", out);
  if (op->weight) fputs(" @weight", out);
  if (op->role != TP_ROLE_COMPUTE)
    fprintf(out, " @%s", op->role > TP_ROLE_COMPUTE && op->role < TP_ROLE_COUNT ? tp_op_role_names[op->role] : "?");
}

static void print_op(FILE *out, const TpModule *m, int o) {
  const TpOp *op = &m->ops[o];
  for (int i = 0; i < op->noutputs; i++) {
    int v = op->outputs[i];
    if (i) fputs(", ", out);
    print_value_name(out, m, v);
    if (v < 0) continue;
    fputs(" : ", out);
    print_type(out, &m->values[v].type);
    if (!origin_equal(m->values[v].origin, op->origin)) {
      if (!m->values[v].origin.node && !m->values[v].origin.op_type) fputs(" loc()", out);
      else print_origin(out, m->values[v].origin);
    }
  }
  fprintf(out, " = %s(", op->kind < TP_OP_COUNT ? tp_op_info[op->kind].name : "?");
  for (int i = 0; i < op->ninputs; i++) {
    if (i) fputs(", ", out);
    print_value_name(out, m, op->inputs[i]);
  }
  fputc(')', out);
  if (op->nattrs) {
    fputs(" {", out);
    for (int i = 0; i < op->nattrs; i++) {
      if (i) fputs(", ", out);
      print_attr(out, &op->attrs[i]);
    }
    fputc('}', out);
  }
  print_placement(out, op);
  print_origin(out, op->origin);
  fputc('\n', out);
}

void tp_print_module(const TpModule *m, FILE *out) {
  fprintf(out, "tir 1 opset %d", m->opset);
  if (m->source) {
    fputs(" source ", out);
    print_string(out, m->source);
  }
  fputc('\n', out);
  for (int i = 0, n = 0; i < m->nblobs; i++) {
    if (!m->blobs[i].path) continue;
    fprintf(out, "blob %d ", n++);
    print_string(out, m->blobs[i].path);
    fputc('\n', out);
  }
  for (int i = 0; i < m->ninputs; i++) {
    int v = m->inputs[i];
    fputs("input ", out);
    print_value_name(out, m, v);
    fputs(" : ", out);
    print_type(out, &m->values[v].type);
    print_origin(out, m->values[v].origin);
    fputc('\n', out);
  }
  for (int v = 0; v < m->nvalues; v++) {
    TpValueKind k = m->values[v].kind;
    if ((k == TP_VAL_PARAM || k == TP_VAL_CONST) && !m->values[v].dead) print_data_value(out, m, v);
  }
  for (int o = 0; o < m->nops; o++)
    if (!m->ops[o].dead) print_op(out, m, o);
  for (int i = 0; i < m->noutputs; i++) {
    fputs("output ", out);
    print_value_name(out, m, m->outputs[i]);
    fputc('\n', out);
  }
  if (m->loss >= 0) {
    fputs("loss ", out);
    print_value_name(out, m, m->loss);
    fputc('\n', out);
  }
  for (int v = 0; v < m->ngrads; v++) {
    if (m->grads[v] < 0) continue;
    fputs("grad ", out);
    print_value_name(out, m, v);
    fputs(" = ", out);
    print_value_name(out, m, m->grads[v]);
    fputc('\n', out);
  }
}
