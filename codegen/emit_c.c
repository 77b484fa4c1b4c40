/* C emission (see codegen.h): requires a module after the training pipeline (op placement,
 * loss and gradient map) and its memory plan; provides plan.c, the program's half that
 * knows the model: a forward and a backward function per stage that call the runtime's
 * kernels (runtime/cpu, or a device's: codegen/target.h) one op at a time, the constants,
 * and the TpPlan tables the trainer runtime (runtime/train/plan.h) reads.
 *
 * Code generation runs in three steps, and this file is the last: lowering
 * (codegen/lower.c) turns each unit's ops into statements with their memory, outlining
 * (codegen/outline.c) finds the runs that several units share, and this file names and
 * prints them; the tables are codegen/plan_tables.c's. Nothing here decides what runs.
 *
 * On a device target the views hold device pointers, so the plan never reads tensor data
 * on the host: constants are the device copies of their arrays (target->constant), the
 * loss is copied to io->loss by the stream (target->copy_to_host), a scalar operand is
 * passed as its device pointer (target.c), and every call is queued on io->stream.
 *
 * Every value is a TpTensor view named after its ONNX name (sanitised, unique), declared
 * at the top of a function when it comes from outside (a parameter, the tokens, a forward
 * activation read by the backward) and else just before the op that computes it. Each
 * op's call is preceded by a comment naming the ONNX node it came from. The output depends
 * on nothing but the module: no addresses, no times, no hash orders. */
#include "codegen.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "emit.h"
#include "lower.h"
#include "outline.h"

typedef struct {
  const TpModule *m;
  const TpMemoryPlan *mem;
  const TpEmitOptions *o;
  TpDiag *d;
  const char *prefix;     /* of the unit functions and constant arrays: "" or "probeP_" */
  TpLowering lowering;    /* how this plan's ops become statements */
  TpProbeInfo *probe;     /* the main emitter: per probe of o */
  char **name;            /* per value: the identifier of its TpTensor view */
  char **array;           /* per CONST value: the identifier of its static array */
  bool *referenced;       /* per CONST value: its array is used */
  const TpTarget *target; /* how kernel calls are spelled */
  unsigned headers;       /* a bit per header of the target the plan uses */
  bool uses_check, uses_math;
  int rc;
  int tensor; /* the ranks of the tensor group (1: none) */
} Emitter;

/* ---- identifiers ---- */

/* ---- identifiers ---- */

typedef struct {
  char **slots;
  size_t cap, count;
} NameSet;

static bool set_has(const NameSet *s, const char *name) {
  if (!s->cap) return false;
  for (size_t i = tp_hash_str(name) & (s->cap - 1); s->slots[i]; i = (i + 1) & (s->cap - 1))
    if (strcmp(s->slots[i], name) == 0) return true;
  return false;
}

static void set_add(NameSet *s, char *name) {
  if (2 * (s->count + 1) > s->cap) {
    NameSet bigger = {calloc(s->cap ? 2 * s->cap : 256, sizeof(char *)), s->cap ? 2 * s->cap : 256, 0};
    TP_ASSERT(bigger.slots);
    for (size_t i = 0; i < s->cap; i++)
      if (s->slots[i]) set_add(&bigger, s->slots[i]);
    free(s->slots);
    *s = bigger;
  }
  size_t i = tp_hash_str(name) & (s->cap - 1);
  while (s->slots[i]) i = (i + 1) & (s->cap - 1);
  s->slots[i] = name;
  s->count++;
}

/* Identifiers a value must not take: C keywords, object-like macros of the headers the plan
 * includes, and the plan's own names. Anything starting with tp_, TP_ or Tp is the runtime's. */
static const char *const reserved[] = {"auto",
                                       "break",
                                       "case",
                                       "char",
                                       "const",
                                       "continue",
                                       "default",
                                       "do",
                                       "double",
                                       "else",
                                       "enum",
                                       "extern",
                                       "float",
                                       "for",
                                       "goto",
                                       "if",
                                       "inline",
                                       "int",
                                       "long",
                                       "register",
                                       "restrict",
                                       "return",
                                       "short",
                                       "signed",
                                       "sizeof",
                                       "static",
                                       "struct",
                                       "switch",
                                       "typedef",
                                       "union",
                                       "unsigned",
                                       "void",
                                       "volatile",
                                       "while",
                                       "bool",
                                       "true",
                                       "false",
                                       "errno",
                                       "math_errhandling",
                                       "io",
                                       "arena",
                                       "bad",
                                       "main",
                                       "params",
                                       "derived",
                                       "arena_bytes",
                                       "forward",
                                       "backward",
                                       "kernel_failed",
                                       "stages",
                                       "slice_len",
                                       "probes",
                                       "stage_cuts",
                                       "transient",
                                       "transient_bytes",
                                       NULL};

/* "/h.0/attn/MatMul_output_0" -> "h_0_attn_MatMul": letters, digits and single
 * underscores; the exporter's "_output_0" suffixes dropped. */
static char *sanitize(const char *text) {
  size_t n = strlen(text);
  char *s = malloc(n + 3);
  TP_ASSERT(s);
  size_t len = 0;
  for (const char *p = text; *p; p++) {
    if (isalnum((unsigned char)*p)) s[len++] = *p;
    else if (len && s[len - 1] != '_') s[len++] = '_';
  }
  while (len && s[len - 1] == '_') len--;
  s[len] = 0;
  static const char suffix[] = "_output_0";
  for (char *hit; (hit = strstr(s, suffix)) != NULL;) {
    char *after = hit + sizeof suffix - 1;
    if (*after && *after != '_') break; /* _output_01: keep */
    memmove(hit, after, strlen(after) + 1);
  }
  return s;
}

static bool is_reserved(const char *s) {
  if (!*s || isdigit((unsigned char)s[0])) return true;
  if (strncmp(s, "tp_", 3) == 0 || strncmp(s, "TP_", 3) == 0 || strncmp(s, "Tp", 2) == 0) return true;
  bool upper = true; /* might be a macro */
  for (const char *p = s; *p; p++) upper &= !islower((unsigned char)*p);
  if (upper) return true;
  for (const char *const *r = reserved; *r; r++)
    if (strcmp(*r, s) == 0) return true;
  return (strncmp(s, "stage", 5) == 0 && isdigit((unsigned char)s[5])) ||
         (strncmp(s, "probe", 5) == 0 && isdigit((unsigned char)s[5]));
}

/* A fresh identifier from `base`: prefix + base, then _2, _3, ... until unused. */
static char *unique_ident(NameSet *set, const char *prefix, const char *base) {
  char *clean = sanitize(base);
  size_t n = strlen(prefix) + strlen(clean) + 24;
  char *id = malloc(n);
  TP_ASSERT(id);
  snprintf(id, n, "%s%s", prefix, clean);
  if (!*prefix && is_reserved(id)) snprintf(id, n, "v_%s", clean);
  size_t base_len = strlen(id);
  for (int k = 2; set_has(set, id); k++) snprintf(id + base_len, n - base_len, "_%d", k);
  free(clean);
  set_add(set, id);
  return id;
}

static void name_values(Emitter *E) {
  const TpModule *m = E->m;
  NameSet set = {0};
  char array_prefix[48];
  snprintf(array_prefix, sizeof array_prefix, "%sk_", E->prefix);
  for (int v = 0; v < m->nvalues; v++) {
    if (E->mem->value[v].kind == TP_MEM_NONE) continue;
    E->name[v] = unique_ident(&set, "", m->values[v].name);
    if (E->mem->value[v].kind == TP_MEM_CONST) E->array[v] = unique_ident(&set, array_prefix, m->values[v].name);
  }
  free(set.slots); /* the strings belong to E->name and E->array */
}

/* ---- writing ---- */

static const char *dtype_enum(TpDType t) {
  switch (t) {
#define TP_X(name, num, spelling, size)                                                                             \
  case TP_##name: return "TP_" #name;
    TP_DTYPES(TP_X)
#undef TP_X
  default: return "TP_UNDEF";
  }
}

/* The literal of finite f that reads back as exactly f: %.9g round-trips every float; a
 * point keeps "1" from becoming the invalid "1f". Returns buf. */
static const char *float_literal(char buf[40], float f) {
  char digits[32];
  snprintf(digits, sizeof digits, "%.9g", f);
  snprintf(buf, 40, "%s%sf", digits, strpbrk(digits, ".e") ? "" : ".0");
  return buf;
}

static void put_float(Emitter *E, FILE *out, float f) {
  char buf[40];
  if (isnan(f)) {
    E->uses_math = true;
    fputs("NAN", out);
  } else if (isinf(f)) {
    E->uses_math = true;
    fputs(f < 0 ? "-INFINITY" : "INFINITY", out);
  } else {
    fputs(float_literal(buf, f), out);
  }
}

static void put_double(Emitter *E, FILE *out, double f) {
  if (isnan(f) || isinf(f)) {
    E->uses_math = true;
    fputs(isnan(f) ? "NAN" : f < 0 ? "-INFINITY" : "INFINITY", out);
  } else {
    char buf[40];
    snprintf(buf, sizeof buf, "%.17g", f);
    fprintf(out, "%s%s", buf, strpbrk(buf, ".e") ? "" : ".0");
  }
}

static void put_int(FILE *out, int64_t v) {
  if (v == INT64_MIN) fputs("(-9223372036854775807 - 1)", out);
  else fprintf(out, "%lld", (long long)v);
}

/* Prints s[0, n) from column col, breaking it after the commas of its outermost argument
 * list so that lines stay within WRAP columns where they can: continuation lines align
 * with the list, and an argument still too long is broken the same way inside. Returns
 * the column it ends at; *broke is set if it broke a line. */
#define WRAP 100
static int put_wrapped(FILE *out, const char *s, int n, int col, bool *broke) {
  int depth = 0, min_depth = INT32_MAX, open = -1, stack[64], top = 0;
  for (int i = 0; i < n; i++) {
    if (s[i] == '(' || s[i] == '{') {
      if (top < 64) stack[top++] = i;
      depth++;
    } else if (s[i] == ')' || s[i] == '}') {
      if (top) top--;
      depth--;
    } else if (s[i] == ',' && depth > 0 && depth < min_depth) {
      min_depth = depth;
      open = top ? stack[top - 1] : -1; /* the bracket of the list this comma separates */
    }
  }
  if (col + n <= WRAP || open < 0) {
    fwrite(s, 1, (size_t)n, out);
    return col + n;
  }
  fwrite(s, 1, (size_t)open + 1, out);
  int indent = col + open + 1, start = open + 1;
  col = indent;
  depth = 0;
  for (int i = 0; i <= n; i++) {
    if (i < n && (s[i] == '(' || s[i] == '{')) depth++;
    if (i < n && (s[i] == ')' || s[i] == '}')) depth--;
    /* a piece ends at a comma of the list, or where the list closes */
    bool end = i == n || (depth == min_depth - 1 && (s[i] == ')' || s[i] == '}')) ||
               (depth == min_depth && s[i] == ',' && i > open);
    if (!end || i <= open) continue;
    bool comma = i < n && s[i] == ',';
    int len = i + comma - start, tail = comma ? 0 : n - i; /* what follows the list */
    if (col > indent && col + len + tail > WRAP) {
      fprintf(out, "\n%*s", indent, "");
      col = indent;
      *broke = true;
      while (len > 0 && s[start] == ' ') start++, len--;
    }
    bool inner = false;
    col = put_wrapped(out, s + start, len, col, &inner);
    if (inner) col = WRAP + 1, *broke = true; /* the next argument starts a line of its own */
    start = i + comma;
    if (!comma) { /* the rest after the list closes */
      fwrite(s + start, 1, (size_t)(n - start), out);
      return col + n - start;
    }
  }
  return col;
}

static const char *const unary_names[] = {
    [TP_UNARY_SQRT] = "TP_UNARY_SQRT",
    [TP_UNARY_NEG] = "TP_UNARY_NEG",
    [TP_UNARY_RECIPROCAL] = "TP_UNARY_RECIPROCAL",
    [TP_UNARY_EXP] = "TP_UNARY_EXP",
    [TP_UNARY_LOG] = "TP_UNARY_LOG",
    [TP_UNARY_ERF] = "TP_UNARY_ERF",
    [TP_UNARY_TANH] = "TP_UNARY_TANH",
    [TP_UNARY_RELU] = "TP_UNARY_RELU",
    [TP_UNARY_SIGMOID] = "TP_UNARY_SIGMOID",
    [TP_UNARY_SIN] = "TP_UNARY_SIN",
    [TP_UNARY_COS] = "TP_UNARY_COS",
    [TP_UNARY_NOT] = "TP_UNARY_NOT",
    [TP_UNARY_GELU] = "TP_UNARY_GELU",
    [TP_UNARY_GELU_TANH] = "TP_UNARY_GELU_TANH",
};

static const char *const binary_names[] = {
    [TP_BINARY_ADD] = "TP_BINARY_ADD",
    [TP_BINARY_SUB] = "TP_BINARY_SUB",
    [TP_BINARY_MUL] = "TP_BINARY_MUL",
    [TP_BINARY_DIV] = "TP_BINARY_DIV",
    [TP_BINARY_POW] = "TP_BINARY_POW",
    [TP_BINARY_MAX] = "TP_BINARY_MAX",
    [TP_BINARY_MIN] = "TP_BINARY_MIN",
    [TP_BINARY_AND] = "TP_BINARY_AND",
    [TP_BINARY_EQUAL] = "TP_BINARY_EQUAL",
    [TP_BINARY_LESS] = "TP_BINARY_LESS",
    [TP_BINARY_LESS_EQUAL] = "TP_BINARY_LESS_EQUAL",
    [TP_BINARY_GREATER] = "TP_BINARY_GREATER",
    [TP_BINARY_GREATER_EQUAL] = "TP_BINARY_GREATER_EQUAL",
};

static const char *const reduction_names[] =
    {[TP_REDUCE_NONE] = "TP_REDUCE_NONE", [TP_REDUCE_SUM] = "TP_REDUCE_SUM", [TP_REDUCE_MEAN] = "TP_REDUCE_MEAN"};

/* The TpAttention literal: the shape, causality and scale, then what is not 0. */
static void put_attention(Emitter *E, FILE *out, const TpAttention *p, int mask) {
  fprintf(out,
          "&(TpAttention){.batch = %lld, .q_heads = %lld, .kv_heads = %lld, .q_len = %lld, .kv_len = %lld, "
          ".head_size = %lld, .v_head_size = %lld, .packed = %s, .is_causal = %s, .scale = ",
          (long long)p->batch, (long long)p->q_heads, (long long)p->kv_heads, (long long)p->q_len,
          (long long)p->kv_len, (long long)p->head_size, (long long)p->v_head_size, p->packed ? "true" : "false",
          p->is_causal ? "true" : "false");
  put_float(E, out, p->scale);
  if (p->softcap != 0) fputs(", .softcap = ", out), put_float(E, out, p->softcap);
  if (p->causal_offset) fprintf(out, ", .causal_offset = %lld", (long long)p->causal_offset);
  if (p->window) fprintf(out, ", .window = %lld", (long long)p->window);
  if (p->kv_rows) fprintf(out, ", .kv_rows = %lld", (long long)p->kv_rows);
  if (p->qk_mode) fprintf(out, ", .qk_mode = %d", p->qk_mode);
  if (mask >= 0) {
    const int64_t *st = p->mask_strides;
    fprintf(out, ", .mask = %s.data, .mask_is_bool = %s, .mask_strides = {%lld, %lld, %lld, %lld}, .mask_len = %lld",
            E->name[mask], p->mask_is_bool ? "true" : "false", (long long)st[0], (long long)st[1], (long long)st[2],
            (long long)st[3], (long long)p->mask_len);
  }
  fputc('}', out);
}

static void put_ints(FILE *out, const int64_t *xs, int n) {
  fputs("(const int64_t[]){", out);
  for (int i = 0; i < n; i++) {
    if (i) fputs(", ", out);
    put_int(out, xs[i]);
  }
  fputc('}', out);
}

static void emit_constant(Emitter *E, int v, FILE *out) {
  const TpValue *val = &E->m->values[v];
  TpDType t = val->type.dtype;
  int64_t n = tp_type_numel(&val->type);
  const void *data = tp_value_data(E->m, v);
  const char *ctype;
  switch (t) {
  case TP_F32: ctype = "float"; break;
  case TP_F64: ctype = "double"; break;
  case TP_I64: ctype = "int64_t"; break;
  case TP_I32: ctype = "int32_t"; break;
  case TP_I16: ctype = "int16_t"; break;
  case TP_I8: ctype = "int8_t"; break;
  case TP_U64: ctype = "uint64_t"; break;
  case TP_U32: ctype = "uint32_t"; break;
  case TP_U16:
  case TP_F16:
  case TP_BF16: ctype = "uint16_t"; break;
  default: ctype = "uint8_t"; break; /* u8, bool */
  }
  char type[256];
  fprintf(out, "/* %s: %s */\n", val->origin.node ? val->origin.node : val->name,
          tp_type_str(&val->type, type, sizeof type));
  fprintf(out, "static const %s %s[%lld] = {", ctype, E->array[v], (long long)(n ? n : 1));
  size_t esize = tp_dtype_size(t);
  for (int64_t i = 0; i < n; i++) {
    const uint8_t *p = (const uint8_t *)data + i * (int64_t)esize;
    fputs(n <= 8 ? (i ? ", " : "") : i % 8 ? ", " : i ? ",\n    " : "\n    ", out);
    union {
      float f;
      double d;
      int64_t i64;
      int32_t i32;
      int16_t i16;
      int8_t i8;
      uint64_t u64;
      uint32_t u32;
      uint16_t u16;
      uint8_t u8;
    } x;
    memcpy(&x, p, esize); /* model bytes need not be aligned */
    switch (t) {
    case TP_F32: put_float(E, out, x.f); break;
    case TP_F64: put_double(E, out, x.d); break;
    case TP_I64: put_int(out, x.i64); break;
    case TP_I32: fprintf(out, "%d", x.i32); break;
    case TP_I16: fprintf(out, "%d", x.i16); break;
    case TP_I8: fprintf(out, "%d", x.i8); break;
    case TP_U64: fprintf(out, "%lluu", (unsigned long long)x.u64); break;
    case TP_U32: fprintf(out, "%uu", x.u32); break;
    case TP_U16:
    case TP_F16:
    case TP_BF16: fprintf(out, "0x%04x", x.u16); break;
    default: fprintf(out, "%u", x.u8); break;
    }
  }
  if (n == 0) fputs("0", out);
  fputs("};\n", out);
}

/* ---- statements ---- */

/* A shared body's numbers: its arena and transient region offsets and parameter indices are
 * printed as at[k] and p[k], k counting each in order of use. */
typedef struct {
  int at, p;
  bool regions; /* offsets of either region (odd: the transient region's): tp_plan_at */
} Numbering;

/* Where the bytes of address a are, as a C expression of type void * (or char *). */
static void put_addr(Emitter *E, FILE *out, TpAddr a, Numbering *num) {
  switch (a.kind) {
  case TP_ADDR_ARENA:
  case TP_ADDR_TRANSIENT: {
    const char *region = a.kind == TP_ADDR_ARENA ? "arena" : "transient";
    if (num && num->regions) fprintf(out, "tp_plan_at(io, at[%d])", num->at++);
    else if (num) fprintf(out, "arena + at[%d]", num->at++);
    else fprintf(out, "%s + %lld", region, (long long)a.n);
    break;
  }
  case TP_ADDR_VALUE: fprintf(out, "%s.data", E->name[a.n]); break;
  case TP_ADDR_PARAM:
  case TP_ADDR_GRAD: {
    const char *what = a.kind == TP_ADDR_PARAM ? "param" : "grad";
    if (num) fprintf(out, "io->%s[p[%d]]", what, num->p++);
    else fprintf(out, "io->%s[%d]", what, (int)a.n);
    break;
  }
  case TP_ADDR_CONST: {
    const char *array = E->array[a.n];
    E->referenced[a.n] = true;
    if (E->target->constant)
      fprintf(out, "(void *)%s(io->stream, %s, sizeof %s)", E->target->constant, array, array);
    else fprintf(out, "(void *)%s", array);
    break;
  }
  case TP_ADDR_TOKENS: fputs("(void *)io->tokens", out); break;
  case TP_ADDR_TARGETS: fputs("(void *)io->targets", out); break;
  /* a device plan's kernels read device memory only */
  case TP_ADDR_LOSS_SCALE:
    fputs(E->target->device ? "(void *)io->loss_scale_device" : "(void *)&io->loss_scale", out);
    break;
  }
}

/* TpTensor NAME = {TP_F32, 3, {2, 16, 32}, DATA}; */
static void put_declare(Emitter *E, FILE *out, const TpLowStmt *s, Numbering *num) {
  const TpType *t = &E->m->values[s->value].type;
  fprintf(out, "  TpTensor %s = {%s, %d, {", E->name[s->value], dtype_enum(t->dtype), t->rank);
  for (int i = 0; i < t->rank; i++) fprintf(out, "%s%lld", i ? ", " : "", (long long)t->dims[i]);
  if (t->rank == 0) fputs("0", out);
  fputs("}, ", out);
  put_addr(E, out, s->addr, num);
  fputs("};\n", out);
}

/* One argument of a kernel call. */
static void put_arg(Emitter *E, FILE *out, const TpLowArg *a, Numbering *num) {
  const char *name = a->value >= 0 ? E->name[a->value] : NULL;
  switch (a->kind) {
  case TP_ARG_VIEW: name ? fprintf(out, "&%s", name) : fputs("NULL", out); break;
  case TP_ARG_DATA: name ? fprintf(out, "%s.data", name) : fputs("NULL", out); break;
  case TP_ARG_SCALAR: fprintf(out, "*(const float *)%s.data", name); break;
  case TP_ARG_SCRATCH:
    if (name) fprintf(out, "%s.data", name);
    else if (num && num->regions) fprintf(out, "(float *)tp_plan_at(io, at[%d])", num->at++);
    else if (num) fprintf(out, "(float *)(arena + at[%d])", num->at++);
    else fprintf(out, "(float *)(%s + %lld)", a->transient ? "transient" : "arena", (long long)a->i);
    break;
  case TP_ARG_I64:
  case TP_ARG_INT: put_int(out, a->i); break;
  case TP_ARG_BOOL: fputs(a->i ? "true" : "false", out); break;
  case TP_ARG_F32: put_float(E, out, (float)a->f); break;
  case TP_ARG_F64: put_double(E, out, a->f); break;
  case TP_ARG_I64S: put_ints(out, a->ints, a->n); break;
  case TP_ARG_VIEWS_IN:
  case TP_ARG_VIEWS_OUT:
    fputs(a->kind == TP_ARG_VIEWS_IN ? "(const TpTensor[]){" : "(TpTensor[]){", out);
    for (int i = 0; i < a->n; i++) fprintf(out, "%s%s", i ? ", " : "", E->name[a->values[i]]);
    fputc('}', out);
    break;
  case TP_ARG_UNARY_OP: fputs(unary_names[a->i], out); break;
  case TP_ARG_BINARY_OP: fputs(binary_names[a->i], out); break;
  case TP_ARG_ATTENTION: put_attention(E, out, &a->attention, a->aux); break;
  case TP_ARG_LOSS: {
    const TpLossOptions *o = &a->loss;
    fprintf(out, "&(TpLossOptions){.weight = %s%s, .has_ignore = %s, .ignore_index = %lld, .reduction = %s}",
            a->aux >= 0 ? E->name[a->aux] : "NULL", a->aux >= 0 ? ".data" : "", o->has_ignore ? "true" : "false",
            o->has_ignore ? (long long)o->ignore_index : 0LL, reduction_names[o->reduction]);
    break;
  }
  case TP_ARG_BAD: fputs("&bad", out); break;
  case TP_ARG_STREAM: fputs("io->stream", out); break;
  case TP_ARG_RANK:
  case TP_ARG_DIMS: TP_ASSERT(!"lowered to numbers"); break;
  }
}

/* A statement line: two spaces, then text, wrapped at the commas of its argument lists. */
static void put_line(FILE *out, const char *text) {
  size_t len = strlen(text);
  char *line = malloc(len + 3);
  TP_ASSERT(line);
  memcpy(line, "  ", 2);
  memcpy(line + 2, text, len + 1);
  bool broke = false;
  put_wrapped(out, line, (int)len + 2, 0, &broke);
  fputc('\n', out);
  free(line);
}

/* The statement of s other than a declaration, an op's comment or an outlined call, as a
 * wrapped line. */
static void put_code(Emitter *E, FILE *out, const TpLowStmt *s, Numbering *num) {
  char *text = NULL;
  size_t len = 0;
  FILE *line = open_memstream(&text, &len);
  TP_ASSERT(line);
  const char *name = s->value >= 0 ? E->name[s->value] : NULL;
  switch (s->kind) {
  case TP_LOW_CALL: {
    const TpKernelSpelling *k = &E->target->kernels[s->kernel];
    fprintf(line, "CHECK(%s(", k->name);
    for (int i = 0; i < s->nargs; i++) {
      if (i) fputs(", ", line);
      put_arg(E, line, &s->args[i], num);
    }
    fputs("));", line);
    E->headers |= 1u << k->header;
    E->uses_check = true;
    break;
  }
  case TP_LOW_ALLREDUCE:
    fprintf(line, "io->tensor_allreduce(io, %s.data, ", name);
    put_int(line, s->count);
    fputs(");", line);
    break;
  case TP_LOW_RANK_FILL:
    E->uses_check = true;
    fprintf(line, "CHECK(%s(%s.data, io->tensor_rank, io->stream));", E->target->fill_i64, name);
    break;
  case TP_LOW_RANK_STORE: fprintf(line, "*(int64_t *)%s.data = io->tensor_rank;", name); break;
  case TP_LOW_LOSS_COPY: /* the runtime synchronizes before it reads io->loss */
    E->uses_check = true;
    fprintf(line, "CHECK(%s(&io->loss, %s.data, sizeof(float), io->stream));", E->target->copy_to_host, name);
    break;
  default: TP_ASSERT(!"not a line of code");
  }
  fclose(line);
  put_line(out, text);
  free(text);
}

/* The body of a function lowered into f: the arena, the id report, what it reads from
 * elsewhere, then its ops; calls[k] is the statement of its outlined range k. */
static void put_function_body(Emitter *E, const TpLowFunc *f, char *const *calls, Numbering *num, FILE *out) {
  const TpModule *m = E->m;
  if (num && !num->regions && (f->uses_arena || f->uses_transient)) fputs("  char *arena = io->arena;\n", out);
  if (!num && f->uses_arena) fputs("  char *arena = io->arena;\n", out);
  if (!num && f->uses_transient) fputs("  char *transient = io->transient;\n", out);
  if (f->uses_bad) fputs("  int64_t bad; /* where the kernels report an id out of range */\n", out);
  if (!f->nops) fputs("  (void)io; /* nothing to do */\n", out);
  bool any = false; /* a line printed after the top ones */
  for (int i = 0; i < f->n; i++) {
    const TpLowStmt *s = &f->stmts[i];
    if (s->kind == TP_LOW_DECLARE && s->top) {
      if (!any) fputs("  /* computed elsewhere: */\n", out);
      put_declare(E, out, s, num);
      any = true;
      continue;
    }
    switch (s->kind) {
    case TP_LOW_OUTLINED:
      if (any) fputc('\n', out);
      put_line(out, calls[s->call]);
      break;
    case TP_LOW_OP: {
      const TpOp *o = &m->ops[s->op];
      const char *what = o->role == TP_ROLE_RETIE ? tp_op_role_names[o->role] : o->origin.op_type;
      if (o->origin.node)
        fprintf(out, "\n  /* %s (%s)%s */\n", o->origin.node, what ? what : "?", s->view ? ": a view" : "");
      else fprintf(out, "\n  /* %s */\n", tp_op_info[o->kind].name);
      break;
    }
    case TP_LOW_DECLARE: put_declare(E, out, s, num); break;
    case TP_LOW_LOSS_STORE: fprintf(out, "\n  io->loss = *(const float *)%s.data;\n", E->name[s->value]); break;
    case TP_LOW_LOSS_COPY:
      fputc('\n', out);
      put_code(E, out, s, num);
      break;
    default: put_code(E, out, s, num); break;
    }
    any = true;
  }
}

/* ---- unit functions ---- */

/* "forward", "backward", "backward input" or "backward weight" */
static const char *unit_words(const Emitter *E, const TpUnitId *u) {
  return !u->backward ? "forward" : !E->mem->split ? "backward" : u->weight ? "backward weight" : "backward input";
}

/* The comment above stage s's unit function (without its closing). */
static void put_unit_comment(const Emitter *E, const TpUnitId *u, int nops, FILE *out) {
  if (E->lowering.param_map) /* a probe's */
    fprintf(out, "\n/* %.*s: stage %d, %s of slice %d: %d ops", (int)strlen(E->prefix) - 1, E->prefix, u->s,
            unit_words(E, u), u->slice, nops);
  else if (E->mem->nslices == 1) fprintf(out, "\n/* Stage %d, %s: %d ops", u->s, unit_words(E, u), nops);
  else fprintf(out, "\n/* Stage %d, %s of slice %d: %d ops", u->s, unit_words(E, u), u->slice, nops);
}

/* Stage s's forward (or backward) function of one slice into `out`, the ranges[0, n) as
 * the calls calls[0, n). Boundary copies run no code: the runtime receives their values
 * into the arena before the unit runs. */
static void emit_unit(Emitter *E, const TpUnitId *u, const TpLowRange *ranges, char *const *calls, int n,
                      FILE *out) {
  int unit = tp_unit_index(E->mem, u->backward, u->weight, u->slice);
  TpLowFunc f;
  E->rc = tp_lower_range(&E->lowering, u->s, u->backward, E->mem->unit_begin[u->s][unit],
                         E->mem->unit_end[u->s][unit], ranges, n, &f);
  if (E->rc == TP_OK) {
    char name[64];
    tp_unit_name(E->prefix, E->mem->nslices, u->s, tp_unit_phase(u->backward, u->weight, E->mem->split), u->slice,
                 name, sizeof name);
    put_unit_comment(E, u, f.nops, out);
    fprintf(out, ". */\nstatic void %s(TpStepIO *io) {\n", name);
    put_function_body(E, &f, calls, NULL, out);
    fputs("}\n", out);
  }
  tp_low_func_free(&f);
}

/* ---- shared bodies ---- */

/* (slice, stage) pairs in order. */
static int pair_order(const void *x, const void *y) {
  const int *a = x, *b = y;
  return a[0] != b[0] ? (a[0] < b[0] ? -1 : 1) : (a[1] < b[1] ? -1 : a[1] > b[1]);
}

/* " 4-7 (slice 2), 9 (slice 2)": the stages whose units call body b, as ranges per slice,
 * wrapped as a comment's lines. */
static void put_body_users(const Emitter *E, const TpOutline *ol, int b, FILE *out) {
  int col = 24, count = 0, n = 0;
  int(*pairs)[2] = malloc(((size_t)ol->nrun + 1) * sizeof *pairs);
  TP_ASSERT(pairs);
  for (int r = 0; r < ol->nrun; r++)
    if (ol->runs[r].body == b) {
      const TpUnitId *u = &ol->units[ol->runs[r].unit];
      pairs[n][0] = u->slice, pairs[n++][1] = u->s;
    }
  qsort(pairs, (size_t)n, sizeof *pairs, pair_order);
  for (int i = 0, j; i < n; i = j) { /* a range of stages of one slice */
    for (j = i + 1; j < n && pairs[j][0] == pairs[i][0] && pairs[j][1] <= pairs[j - 1][1] + 1;) j++;
    char text[64];
    int len = pairs[j - 1][1] > pairs[i][1] ? snprintf(text, sizeof text, "%d-%d", pairs[i][1], pairs[j - 1][1])
                                            : snprintf(text, sizeof text, "%d", pairs[i][1]);
    if (E->mem->nslices > 1) len += snprintf(text + len, sizeof text - (size_t)len, " (slice %d)", pairs[i][0]);
    fputs(count++ ? "," : "", out);
    if (col + len > 96) fputs("\n *", out), col = 2;
    fprintf(out, " %s", text);
    col += len + 2;
  }
  free(pairs);
}

/* The function of shared body b (named name[b]), printed from its first run, and its runs'
 * arena offset lists. */
static void emit_shared_body(Emitter *E, const TpOutline *ol, int b, char *const *names, int64_t seq, FILE *out) {
  const TpBody *body = &ol->bodies[b];
  const TpRun *r = &ol->runs[body->first];
  const TpUnitId *u = &ol->units[r->unit];
  const char *name = names[b];
  fprintf(out, "\n/* %s: %d ops of the %s of a %lld-token slice", name, r->low.nops, unit_words(E, u),
          (long long)tp_slice_length(E->m, E->mem, u->slice, seq));
  if (E->mem->nslices > 1 && !body->contexts)
    fprintf(out, " after %lld tokens", (long long)tp_slice_context(E->m, E->mem, u->slice, seq));
  fprintf(out, ",\n * run %d times by stages", body->count);
  put_body_users(E, ol, b, out);
  fprintf(out,
          ",\n * with the arena offsets (at) and parameters (p) of each. Values are named after stage %d's. */\n"
          "static void %s(TpStepIO *io",
          u->s, name);
  if (r->nat) fputs(", const int64_t *at", out);
  if (r->np) fputs(", const int *p", out);
  fputs(") {\n", out);
  Numbering num = {0, 0, body->regions};
  put_function_body(E, &r->low, NULL, &num, out);
  fputs("}\n", out);
  TP_ASSERT(num.at == r->nat && num.p == r->np);
  if (!r->nat) return;
  fprintf(out, "/* %s's arena offsets (units on stages alike share a list%s): */\n", name,
          body->regions ? ";\n * an odd one is a transient region offset + 1" : "");
  for (int q = body->first; q < ol->nrun; q++) {
    const TpRun *x = &ol->runs[q];
    if (x->body != b || !x->new_table) continue;
    int col = fprintf(out, "static const int64_t %s_at%d[] = {", name, x->table);
    for (int i = 0; i < x->nat; i++) {
      char n[24];
      int len = snprintf(n, sizeof n, "%lld", (long long)x->at[i]);
      if (i && col + len + 3 > WRAP) col = fprintf(out, ",\n    ") - 2;
      else if (i) col += fprintf(out, ", ");
      col += fprintf(out, "%s", n);
    }
    fputs("};\n", out);
  }
}

/* The call of shared body `name` with run r's numbers (a malloc'd statement). */
static char *body_call(const TpRun *r, const char *name) {
  char *call = NULL;
  size_t call_len = 0;
  FILE *text = open_memstream(&call, &call_len);
  TP_ASSERT(text);
  fprintf(text, "%s(io", name);
  if (r->nat) fprintf(text, ", %s_at%d", name, r->table);
  if (r->np) {
    fputs(", (const int[]){", text);
    for (int i = 0; i < r->np; i++) fprintf(text, "%s%d", i ? ", " : "", r->p[i]);
    fputc('}', text);
  }
  fputs(");", text);
  fclose(text);
  return call;
}

/* The functions of the units of list[0, n), in that order, with the shared bodies they
 * call each written before its first caller. A body is named after the slice it runs on:
 * block_forward_l128_c256 (a 128-token slice after 256 tokens; without the context when
 * its runs follow different ones). */
static void emit_units(Emitter *E, const TpUnitId *list, int n, FILE *out) {
  const TpModule *m = E->m;
  const TpMemoryPlan *p = E->mem;
  int64_t seq = 0;
  for (int v = 0; v < m->nvalues; v++)
    if (p->value[v].kind == TP_MEM_TOKENS) seq = m->values[v].type.dims[1];
  TpOutline ol;
  E->rc = tp_outline(&E->lowering, list, n, &ol);
  char **names = calloc((size_t)ol.nbodies + 1, sizeof *names);
  TP_ASSERT(names);
  NameSet set = {0};
  for (int b = 0; b < ol.nbodies && E->rc == TP_OK; b++) {
    if (ol.bodies[b].count < 2) continue;
    const TpUnitId *u = &list[ol.runs[ol.bodies[b].first].unit];
    char base[96];
    int len = snprintf(base, sizeof base, "block_%s_l%lld", tp_unit_phase(u->backward, u->weight, p->split),
                       (long long)tp_slice_length(m, p, u->slice, seq));
    if (p->nslices > 1 && !ol.bodies[b].contexts)
      snprintf(base + len, sizeof base - (size_t)len, "_c%lld", (long long)tp_slice_context(m, p, u->slice, seq));
    names[b] = unique_ident(&set, E->prefix, base);
  }
  free(set.slots); /* the strings belong to names */
  for (int i = 0; i < n && E->rc == TP_OK; i++) {
    int *runs = calloc((size_t)ol.nruns[i] + 1, sizeof *runs), ncalls;
    TP_ASSERT(runs);
    TpLowRange *ranges = tp_outline_calls(&ol, i, runs, &ncalls);
    char **calls = calloc((size_t)ncalls + 1, sizeof *calls);
    TP_ASSERT(calls);
    for (int k = 0; k < ncalls; k++) {
      const TpRun *r = &ol.runs[runs[k]];
      if (ol.bodies[r->body].first == runs[k]) emit_shared_body(E, &ol, r->body, names, seq, out);
      calls[k] = body_call(r, names[r->body]);
    }
    emit_unit(E, &list[i], ranges, calls, ncalls, out);
    for (int k = 0; k < ncalls; k++) free(calls[k]);
    free(calls);
    free(ranges);
    free(runs);
  }
  for (int b = 0; b < ol.nbodies; b++) free(names[b]);
  free(names);
  tp_outline_free(&ol);
}

static void emitter_init(Emitter *E, const TpModule *m, const TpMemoryPlan *mem, const TpEmitOptions *o, TpDiag *d,
                         const char *prefix) {
  *E = (Emitter){.m = m, .mem = mem, .o = o, .d = d, .prefix = prefix};
  E->target = tp_target_find(o->target ? o->target : "cpu", o->precision);
  TP_ASSERT(E->target); /* tp_emit_c checked the name */
  E->name = calloc((size_t)m->nvalues + 1, sizeof *E->name);
  E->array = calloc((size_t)m->nvalues + 1, sizeof *E->array);
  E->referenced = calloc((size_t)m->nvalues + 1, sizeof *E->referenced);
  TP_ASSERT(E->name && E->array && E->referenced);
  E->tensor = tp_tensor_ranks(m);
  E->lowering = (TpLowering){m, mem, E->target, NULL, E->tensor, d, E->target->gelu_epilogues && !o->no_epilogues};
  name_values(E);
}

static void emitter_free(Emitter *E) {
  for (int v = 0; v < E->m->nvalues; v++) {
    free(E->name[v]);
    free(E->array[v]);
  }
  free(E->name);
  free(E->array);
  free(E->referenced);
}

/* Probe k of E->o: its units into fns, its constants into consts; what the tables need
 * into E->probe[k]. */
static int emit_probe(Emitter *E, int k, FILE *fns, FILE *consts) {
  const TpEmitProbe *pr = &E->o->probes[k];
  const TpModule *pm = pr->m;
  TpMemoryPlan plan;
  const TpMemoryOptions mo = {tp_target_reads_bf16(E->target)};
  int rc = tp_plan_memory(pm, &mo, &plan, E->d);
  if (rc != TP_OK) return rc;
  if (plan.nstages != E->mem->nstages)
    rc = tp_internal(E->d, "codegen: probe (l %lld, c %lld) has %d stages, the plan %d", (long long)pr->l,
                     (long long)pr->c, plan.nstages, E->mem->nstages);
  int *map = calloc((size_t)plan.nparams + 1, sizeof *map);
  TP_ASSERT(map);
  if (rc == TP_OK) rc = tp_lower_param_map(E->m, E->mem, pm, &plan, map, E->d);
  TpProbeInfo *info = &E->probe[k];
  info->nslices = plan.nslices;
  info->probed = pr->c > 0 ? 1 : 0;
  info->arena_bytes = calloc((size_t)plan.nstages + 1, sizeof *info->arena_bytes);
  info->transient_bytes = calloc((size_t)plan.nstages + 1, sizeof *info->transient_bytes);
  TP_ASSERT(info->arena_bytes && info->transient_bytes);
  for (int v = 0; v < pm->nvalues; v++)
    if (plan.value[v].kind == TP_MEM_TOKENS) info->b = pm->values[v].type.dims[0];
  if (rc == TP_OK && info->probed >= plan.nslices)
    rc = tp_internal(E->d, "codegen: probe (l %lld, c %lld) has %d slice%s", (long long)pr->l, (long long)pr->c,
                     plan.nslices, plan.nslices == 1 ? "" : "s");
  if (rc != TP_OK) {
    free(map);
    tp_memory_plan_free(&plan);
    return rc;
  }
  char prefix[32];
  snprintf(prefix, sizeof prefix, "probe%d_", k);
  Emitter P;
  emitter_init(&P, pm, &plan, E->o, E->d, prefix);
  P.lowering.param_map = map;
  TpUnitId *units = calloc((size_t)(plan.nstages * (info->probed + 2)) + 1, sizeof *units);
  TP_ASSERT(units);
  int nunits = 0;
  for (int s = 0; s < plan.nstages; s++) {
    info->arena_bytes[s] = plan.arena_bytes[s];
    info->transient_bytes[s] = plan.transient_bytes[s];
    for (int i = 0; i <= info->probed; i++) units[nunits++] = (TpUnitId){s, i, false, false};
    units[nunits++] = (TpUnitId){s, info->probed, true, false};
  }
  emit_units(&P, units, nunits, fns);
  free(units);
  for (int v = 0; v < pm->nvalues && P.rc == TP_OK; v++)
    if (P.referenced[v]) emit_constant(&P, v, consts);
  E->headers |= P.headers;
  E->uses_check |= P.uses_check;
  E->uses_math |= P.uses_math;
  rc = P.rc;
  emitter_free(&P);
  free(map);
  tp_memory_plan_free(&plan);
  return rc;
}

int tp_emit_c(const TpModule *m, const TpEmitOptions *o, FILE *out, TpDiag *d) {
  static const TpEmitOptions none = {0};
  if (!o) o = &none;
  const TpTarget *target = tp_target_find(o->target ? o->target : "cpu", o->precision);
  if (!target)
    return tp_error(d, "no code generation target '%s'%s%s", o->target ? o->target : "cpu",
                    o->precision ? " in precision " : "", o->precision ? o->precision : "");
  TpMemoryPlan plan;
  const TpMemoryOptions mo = {tp_target_reads_bf16(target)};
  int rc = tp_plan_memory(m, &mo, &plan, d);
  if (rc != TP_OK) return rc;
  TpPipeline pipe;
  rc = tp_pipeline_build(m, &plan, o->pipeline, &pipe, d);
  if (rc != TP_OK) {
    tp_memory_plan_free(&plan);
    return rc;
  }
  Emitter E;
  emitter_init(&E, m, &plan, o, d, "");
  E.probe = calloc((size_t)o->nprobes + 1, sizeof *E.probe);
  TP_ASSERT(E.probe);

  char *fn_text = NULL, *const_text = NULL, *table_text = NULL;
  size_t fn_len = 0, const_len = 0, table_len = 0;
  FILE *fns = open_memstream(&fn_text, &fn_len);
  FILE *consts = open_memstream(&const_text, &const_len);
  TP_ASSERT(fns && consts);
  TpUnitId *units = calloc((size_t)(3 * plan.nstages * plan.nslices) + 1, sizeof *units);
  TP_ASSERT(units);
  int nunits = 0;
  for (int s = 0; s < plan.nstages; s++) {
    for (int i = 0; i < plan.nslices; i++) units[nunits++] = (TpUnitId){s, i, false, false};
    for (int i = plan.nslices - 1; i >= 0; i--) units[nunits++] = (TpUnitId){s, i, true, false};
    for (int i = plan.nslices - 1; plan.split && i >= 0; i--) units[nunits++] = (TpUnitId){s, i, true, true};
  }
  emit_units(&E, units, nunits, fns);
  free(units);
  for (int v = 0; v < m->nvalues && E.rc == TP_OK; v++)
    if (E.referenced[v]) emit_constant(&E, v, consts);
  for (int k = 0; k < o->nprobes && E.rc == TP_OK; k++) E.rc = emit_probe(&E, k, fns, consts);
  fclose(fns);
  FILE *tables = open_memstream(&table_text, &table_len);
  TP_ASSERT(tables);
  if (E.rc == TP_OK) {
    TpPlanTables t = {m, &plan, o, &pipe, E.probe, E.target, E.tensor};
    tp_emit_plan_tables(&t, tables);
    if (E.target->device) E.headers |= 1u << E.target->device_header;
  }
  fclose(consts);
  fclose(tables);
  if (E.rc == TP_OK) {
    int64_t params = 0, arena = 0, transient = 0;
    for (int i = 0; i < plan.nparams; i++) params += tp_type_numel(&m->values[plan.params[i]].type);
    for (int s = 0; s < plan.nstages; s++) arena += plan.arena_bytes[s], transient += plan.transient_bytes[s];
    fprintf(out, "/* The training step of %s,\n * generated by tokpipec %s. Do not edit.\n",
            E.o->model  ? E.o->model
            : m->source ? m->source
                        : "a module",
            E.o->version ? E.o->version : "");
    fprintf(out, " * %d stage%s, %d parameters (%lld floats), %lld arena bytes, %lld transient bytes%s.\n",
            plan.nstages, plan.nstages == 1 ? "" : "s", plan.nparams, (long long)params, (long long)arena,
            (long long)transient, m->loss < 0 ? "; forward only (no loss)" : "");
    if (m->nslices > 1) { /* passes/split_sequence.c */
      int64_t T = 0;
      fprintf(out, " * Token slices (%d):", m->nslices);
      for (int i = 0; i < m->nslices; i++)
        fprintf(out, "%s %lld", i ? "," : "", (long long)m->slice_len[i]), T += m->slice_len[i];
      fprintf(out, " of %lld tokens.\n", (long long)T);
    }
    if (E.o->slicing && *E.o->slicing) fprintf(out, " * (%s)\n", E.o->slicing);
    for (int k = 0; k < o->nprobes; k++)
      fprintf(out, "%s(%lld, %lld)%s",
              k % 8 ? " "
              : k   ? "\n *   "
                    : " * Profiling probes (--profile-grid), (l, c):\n *   ",
              (long long)o->probes[k].l, (long long)o->probes[k].c, k + 1 < o->nprobes ? "," : ".\n");
    if (E.target->precision) fprintf(out, " * Target %s, precision %s.\n", E.target->name, E.target->precision);
    if (pipe.chunks > 1)
      fprintf(out, " * Interleaved: %d ranks of %d virtual stages each (rank k runs stages k, k + %d, ..).\n",
              plan.nstages / pipe.chunks, pipe.chunks, plan.nstages / pipe.chunks);
    if (E.tensor > 1)
      fprintf(out, " * Tensor parallel over %d ranks per stage: shapes and parameter figures are one rank's.\n",
              E.tensor);
    fprintf(out, " * Build: %s */\n", E.target->build);
    if (E.uses_check) fputs("#include <stdio.h>\n#include <stdlib.h>\n", out);
    if (E.uses_math) fputs("#include <math.h>\n", out);
    fputs("\n#include \"train/plan.h\"\n", out);
    for (int h = 0; h < E.target->nheaders; h++)
      if (E.headers & (1u << h)) fprintf(out, "#include \"%s\"\n", E.target->headers[h]);
    if (E.uses_check) {
      fputs("\n/* The compiler fixed every shape and dtype, so a kernel refusing its operands is a\n"
            " * compiler bug (and an id out of range one the trainer let through): stop at the line. */\n"
            "static void kernel_failed(int line) {\n"
            "  fprintf(stderr, \"%s:%d: kernel failed\\n\", __FILE__, line);\n"
            "  abort();\n"
            "}\n",
            out);
      fputs("#define CHECK(status) ((status) == TP_KERNEL_OK ? (void)0 : kernel_failed(__LINE__))\n", out);
    }
    if (const_len) {
      fputs("\n", out);
      fputs(const_text, out);
    }
    fputs(fn_text, out);
    fputs(table_text, out);
  }
  free(fn_text);
  free(const_text);
  free(table_text);
  for (int k = 0; k < o->nprobes; k++) free(E.probe[k].arena_bytes), free(E.probe[k].transient_bytes);
  free(E.probe);
  emitter_free(&E);
  tp_pipeline_free(&pipe);
  tp_memory_plan_free(&plan);
  return E.rc;
}
