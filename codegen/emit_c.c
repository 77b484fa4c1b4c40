/* C emission (see codegen.h): requires a module after the training pipeline (op placement,
 * loss and gradient map) and its memory plan; provides plan.c, the program's half that
 * knows the model: a forward and a backward function per stage that call the runtime's
 * kernels (runtime/cpu, or a device's: codegen/target.h) one op at a time, the constants,
 * and the TpPlan tables the trainer runtime (runtime/train/plan.h) reads.
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
 * on nothing but the module: no addresses, no times, no hash orders. Runs of ops that
 * several units run alike (layers, middle stages) are written once, as shared bodies the
 * units call (see "shared bodies" below). */
#include "codegen.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "target.h"

/* What the tables need of a profiling probe. */
typedef struct {
  int nslices, probed; /* the probed slice; the ones before it are the setup */
  int64_t b;
  int64_t *arena_bytes; /* per stage */
} ProbeInfo;

typedef struct {
  const TpModule *m;
  const TpMemoryPlan *mem;
  const TpEmitOptions *o;
  const TpPipeline *pipe;
  TpDiag *d;
  const char *prefix; /* of the unit functions and constant arrays: "" or "probeP_" */
  const int *param_map; /* probes: per parameter of mem, the main plan's index */
  ProbeInfo *probe;   /* the main emitter: per probe of o */
  FILE *out;          /* the current function's body */
  char **name;        /* per value: the identifier of its TpTensor view */
  char **array;       /* per CONST value: the identifier of its static array */
  bool *referenced;   /* per CONST value: its array is used */
  bool *declared;     /* per value: declared in the current function */
  bool *here;         /* per op: part of the current function */
  bool signature;     /* rendering a run's signature: no comments (see run_signature) */
  const TpTarget *target; /* how kernel calls are spelled */
  unsigned headers;       /* a bit per header of the target the plan uses */
  bool uses_check, uses_math, uses_arena, uses_bad;
  int rc;
  int tensor; /* the ranks of the tensor group (1: none) */
} Emitter;

/* ---- identifiers ---- */

typedef struct {
  char **slots;
  size_t cap, count;
} NameSet;

static uint64_t hash_str(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static bool set_has(const NameSet *s, const char *name) {
  if (!s->cap) return false;
  for (size_t i = hash_str(name) & (s->cap - 1); s->slots[i]; i = (i + 1) & (s->cap - 1))
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
  size_t i = hash_str(name) & (s->cap - 1);
  while (s->slots[i]) i = (i + 1) & (s->cap - 1);
  s->slots[i] = name;
  s->count++;
}

/* Identifiers a value must not take: C keywords, object-like macros of the headers the plan
 * includes, and the plan's own names. Anything starting with tp_, TP_ or Tp is the runtime's. */
static const char *const reserved[] = {
    "auto", "break", "case", "char", "const", "continue", "default", "do", "double", "else",
    "enum", "extern", "float", "for", "goto", "if", "inline", "int", "long", "register",
    "restrict", "return", "short", "signed", "sizeof", "static", "struct", "switch", "typedef",
    "union", "unsigned", "void", "volatile", "while", "bool", "true", "false", "errno",
    "math_errhandling", "io", "arena", "bad", "main", "params", "derived", "arena_bytes",
    "forward", "backward", "kernel_failed", "stages", "slice_len", "probes", "stage_cuts", NULL};

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
#define TP_X(name, num, spelling, size) \
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

/* Where value v's bytes are, as a C expression of type void * (or char *). */
static void put_data(Emitter *E, FILE *out, int v) {
  const TpMemSlot *s = &E->mem->value[v];
  switch (s->kind) {
  case TP_MEM_ARENA:
    E->uses_arena = true;
    fprintf(out, "arena + %lld", (long long)s->offset);
    break;
  case TP_MEM_VIEW:
    if (E->declared[s->index]) fprintf(out, "%s.data", E->name[s->index]);
    else put_data(E, out, s->index);
    break;
  case TP_MEM_PARAM: fprintf(out, "io->param[%d]", E->param_map ? E->param_map[s->index] : s->index); break;
  case TP_MEM_GRAD: fprintf(out, "io->grad[%d]", E->param_map ? E->param_map[s->index] : s->index); break;
  case TP_MEM_CONST:
    E->referenced[v] = true;
    if (E->target->constant)
      fprintf(out, "(void *)%s(io->stream, %s, sizeof %s)", E->target->constant, E->array[v], E->array[v]);
    else fprintf(out, "(void *)%s", E->array[v]);
    break;
  case TP_MEM_TOKENS: fputs("(void *)io->tokens", out); break;
  case TP_MEM_TARGETS: fputs("(void *)io->targets", out); break;
  case TP_MEM_NONE: TP_ASSERT(!"a used value has no storage");
  }
}

/* TpTensor NAME = {TP_F32, 3, {2, 16, 32}, DATA}; */
static void declare(Emitter *E, FILE *out, int v) {
  const TpType *t = &E->m->values[v].type;
  fprintf(out, "  TpTensor %s = {%s, %d, {", E->name[v], dtype_enum(t->dtype), t->rank);
  for (int i = 0; i < t->rank; i++) fprintf(out, "%s%lld", i ? ", " : "", (long long)t->dims[i]);
  if (t->rank == 0) fputs("0", out);
  fputs("}, ", out);
  put_data(E, out, v);
  fputs("};\n", out);
  E->declared[v] = true;
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

/* A statement of the current function's body, printf-like with value directives:
 *   %v value's data pointer (name.data, or NULL for -1)   %t &value (or NULL)
 *   %n the value's view itself                            %I int64_t literal
 *   %B bool literal (int)    %F float literal (double)    %G double literal
 *   %L (const int64_t[]){...} from (const int64_t *, int)  %s string  %% percent */
static void emit(Emitter *E, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *line = NULL;
  size_t line_len = 0;
  FILE *out = open_memstream(&line, &line_len);
  TP_ASSERT(out);
  fputs("  ", out);
  for (const char *p = fmt; *p; p++) {
    if (*p != '%') {
      fputc(*p, out);
      continue;
    }
    switch (*++p) {
    case 'v':
    case 't':
    case 'n': {
      int v = va_arg(ap, int);
      if (v < 0) {
        TP_ASSERT(*p != 'n');
        fputs("NULL", out);
        break;
      }
      TP_ASSERT(E->declared[v]);
      fprintf(out, *p == 'v' ? "%s.data" : *p == 't' ? "&%s" : "%s", E->name[v]);
      break;
    }
    case 'I': put_int(out, va_arg(ap, int64_t)); break;
    case 'B': fputs(va_arg(ap, int) ? "true" : "false", out); break;
    case 'F': put_float(E, out, (float)va_arg(ap, double)); break;
    case 'G': put_double(E, out, va_arg(ap, double)); break;
    case 'L': {
      const int64_t *xs = va_arg(ap, const int64_t *);
      int n = va_arg(ap, int);
      fputs("(const int64_t[]){", out);
      for (int i = 0; i < n; i++) {
        if (i) fputs(", ", out);
        put_int(out, xs[i]);
      }
      fputc('}', out);
      break;
    }
    case 's': fputs(va_arg(ap, const char *), out); break;
    case '%': fputc('%', out); break;
    default: TP_ASSERT(!"bad emit directive");
    }
  }
  va_end(ap);
  fclose(out);
  bool broke = false;
  put_wrapped(E->out, line, (int)line_len, 0, &broke);
  fputc('\n', E->out);
  free(line);
}

/* ---- ops ---- */

static const TpType *type_of(const Emitter *E, int v) { return &E->m->values[v].type; }

static int in(const Emitter *E, int op, int i) {
  const TpOp *o = &E->m->ops[op];
  return i < o->ninputs ? o->inputs[i] : -1;
}

static int res(const Emitter *E, int op, int i) {
  const TpOp *o = &E->m->ops[op];
  return i < o->noutputs ? o->outputs[i] : -1;
}

static const char *node_name(const TpModule *m, int op) {
  const TpOp *o = &m->ops[op];
  return o->origin.node ? o->origin.node : tp_op_info[o->kind].name;
}

static int unsupported(Emitter *E, int op, const char *why) {
  const TpOp *o = &E->m->ops[op];
  return E->rc = tp_internal(E->d, "codegen: op %s (node '%s') is not supported%s%s",
                             tp_op_info[o->kind].name, node_name(E->m, op), why ? ": " : "",
                             why ? why : "");
}

/* The flat kernels take f32 arrays: every float operand and result must be f32. */
static bool f32_only(Emitter *E, int op) {
  const TpOp *o = &E->m->ops[op];
  for (int k = 0; k < o->ninputs + o->noutputs; k++) {
    int v = k < o->ninputs ? o->inputs[k] : o->outputs[k - o->ninputs];
    if (v >= 0 && tp_dtype_is_float(type_of(E, v)->dtype) && type_of(E, v)->dtype != TP_F32) {
      char why[96];
      snprintf(why, sizeof why, "'%s' is %s; the kernel takes f32", E->m->values[v].name,
               tp_dtype_name(type_of(E, v)->dtype));
      unsupported(E, op, why);
      return false;
    }
  }
  return true;
}

/* Integer ids read by a flat kernel must be i64. */
static bool i64_ids(Emitter *E, int op, int v) {
  if (type_of(E, v)->dtype == TP_I64) return true;
  char why[96];
  snprintf(why, sizeof why, "ids '%s' are %s; the kernel takes i64", E->m->values[v].name,
           tp_dtype_name(type_of(E, v)->dtype));
  unsupported(E, op, why);
  return false;
}

/* A Reshape whose result shares its operand's bytes: nothing to run. */
static bool reshape_is_view(const TpMemoryPlan *p, int op, const TpModule *m) {
  const TpMemSlot *y = &p->value[m->ops[op].outputs[0]], *x = &p->value[m->ops[op].inputs[0]];
  return y->kind == TP_MEM_VIEW || (y->kind == TP_MEM_GRAD && x->kind == TP_MEM_GRAD && x->index == y->index);
}

static const char *const unary_names[] = {
    [TP_UNARY_SQRT] = "TP_UNARY_SQRT", [TP_UNARY_NEG] = "TP_UNARY_NEG",   [TP_UNARY_RECIPROCAL] = "TP_UNARY_RECIPROCAL",
    [TP_UNARY_EXP] = "TP_UNARY_EXP",   [TP_UNARY_LOG] = "TP_UNARY_LOG",   [TP_UNARY_ERF] = "TP_UNARY_ERF",
    [TP_UNARY_TANH] = "TP_UNARY_TANH", [TP_UNARY_RELU] = "TP_UNARY_RELU", [TP_UNARY_SIGMOID] = "TP_UNARY_SIGMOID",
    [TP_UNARY_SIN] = "TP_UNARY_SIN",   [TP_UNARY_COS] = "TP_UNARY_COS",   [TP_UNARY_NOT] = "TP_UNARY_NOT",
    [TP_UNARY_GELU] = "TP_UNARY_GELU", [TP_UNARY_GELU_TANH] = "TP_UNARY_GELU_TANH",
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

static const char *const reduction_names[] = {
    [TP_REDUCE_NONE] = "TP_REDUCE_NONE", [TP_REDUCE_SUM] = "TP_REDUCE_SUM", [TP_REDUCE_MEAN] = "TP_REDUCE_MEAN"};

/* The operands and results of the op being printed, as the views its binder saw. */
typedef struct {
  int op;
  const TpTensor *in, *out;
  int nin, nout;
} Views;

/* The value a view of the bound struct stands for (-1: none). */
static int value_of(const Emitter *E, const Views *w, const TpTensor *t) {
  if (!t) return -1;
  if (t >= w->in && t < w->in + w->nin) return in(E, w->op, (int)(t - w->in));
  TP_ASSERT(t >= w->out && t < w->out + w->nout);
  return res(E, w->op, (int)(t - w->out));
}

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

/* One argument of the call of bound op b (w: its views). */
static void put_arg(Emitter *E, FILE *out, const TpArgSpelling *s, const TpBound *b, const Views *w) {
  const char *base = (const char *)b;
  const void *f = base + s->offset;
  const TpTensor *t = s->kind <= TP_ARG_DIMS ? *(const TpTensor *const *)f : NULL;
  int v = value_of(E, w, t);
  switch (s->kind) {
  case TP_ARG_VIEW: v < 0 ? fputs("NULL", out) : fprintf(out, "&%s", E->name[v]); break;
  case TP_ARG_DATA: v < 0 ? fputs("NULL", out) : fprintf(out, "%s.data", E->name[v]); break;
  case TP_ARG_SCALAR: fprintf(out, "*(const float *)%s.data", E->name[v]); break;
  case TP_ARG_SCRATCH:
    if (v >= 0) fprintf(out, "%s.data", E->name[v]);
    else fprintf(out, "(float *)(arena + %lld)", (long long)E->mem->scratch[w->op].offset), E->uses_arena = true;
    break;
  case TP_ARG_RANK: put_int(out, t->rank); break;
  case TP_ARG_DIMS: put_ints(out, t->dims, t->rank); break;
  case TP_ARG_I64: put_int(out, *(const int64_t *)f); break;
  case TP_ARG_INT: put_int(out, *(const int *)f); break;
  case TP_ARG_BOOL: fputs(*(const bool *)f ? "true" : "false", out); break;
  case TP_ARG_F32: put_float(E, out, *(const float *)f); break;
  case TP_ARG_F64: put_double(E, out, *(const double *)f); break;
  case TP_ARG_I64S: put_ints(out, *(const int64_t *const *)f, *(const int *)(base + s->aux)); break;
  case TP_ARG_VIEWS_IN:
  case TP_ARG_VIEWS_OUT: {
    const TpTensor *xs = *(const TpTensor *const *)f;
    fputs(s->kind == TP_ARG_VIEWS_IN ? "(const TpTensor[]){" : "(TpTensor[]){", out);
    for (int i = 0, n = *(const int *)(base + s->aux); i < n; i++)
      fprintf(out, "%s%s", i ? ", " : "", E->name[value_of(E, w, &xs[i])]);
    fputc('}', out);
    break;
  }
  case TP_ARG_UNARY_OP: fputs(unary_names[*(const TpUnaryOp *)f], out); break;
  case TP_ARG_BINARY_OP: fputs(binary_names[*(const TpBinaryOp *)f], out); break;
  case TP_ARG_ATTENTION: put_attention(E, out, f, value_of(E, w, *(const TpTensor *const *)(base + s->aux))); break;
  case TP_ARG_LOSS: {
    const TpLossOptions *o = f;
    int weight = value_of(E, w, *(const TpTensor *const *)(base + s->aux));
    fprintf(out, "&(TpLossOptions){.weight = %s%s, .has_ignore = %s, .ignore_index = %lld, .reduction = %s}",
            weight >= 0 ? E->name[weight] : "NULL", weight >= 0 ? ".data" : "", o->has_ignore ? "true" : "false",
            o->has_ignore ? (long long)o->ignore_index : 0LL, reduction_names[o->reduction]);
    break;
  }
  case TP_ARG_BAD:
    E->uses_bad = true;
    fputs("&bad", out);
    break;
  case TP_ARG_STREAM: fputs("io->stream", out); break;
  }
}

/* CHECK(kernel(args...)); of bound op b in the target's spelling. */
static void emit_call(Emitter *E, const TpBound *b, const Views *w) {
  const TpKernelSpelling *k = &E->target->kernels[b->kernel];
  TP_ASSERT(k->name[0]);
  char *text = NULL;
  size_t len = 0;
  FILE *out = open_memstream(&text, &len);
  TP_ASSERT(out);
  fprintf(out, "CHECK(%s(", k->name);
  for (int i = 0; i < k->nargs; i++) {
    if (i) fputs(", ", out);
    put_arg(E, out, &k->args[i], b, w);
  }
  fputs("));", out);
  fclose(out);
  E->headers |= 1u << k->header;
  E->uses_check = true;
  emit(E, "%s", text);
  free(text);
}

/* Whether the plan has a tensor group for op to work over; else the error. */
static bool has_tensor_group(Emitter *E, int op) {
  if (E->tensor > 1) return true;
  E->rc = tp_error_op(E->d, E->m, op, "codegen: %s works over the tensor group, but the module has none (tokpipec "
                      "--tensor N)", tp_op_info[E->m->ops[op].kind].name);
  return false;
}

/* TensorRank (passes/shard_tensor.c): this rank's place in its tensor group, which the
 * runtime gives in io->tensor_rank, stored in the i64 scalar for the vocabulary-parallel
 * ops that read it (queued on the stream on a device target: its buffer is the device's). */
static void emit_tensor_rank(Emitter *E, int op) {
  int y = res(E, op, 0);
  if (!has_tensor_group(E, op)) return;
  if (strcmp(tp_attr_string(E->m, op, "group", "tensor"), "tensor") != 0 || type_of(E, y)->dtype != TP_I64 ||
      type_of(E, y)->rank != 0) {
    unsupported(E, op, "only the i64 scalar rank in the tensor group is");
    return;
  }
  if (E->target->fill_i64) {
    E->uses_check = true;
    emit(E, "CHECK(%s(%v, io->tensor_rank, io->stream));", E->target->fill_i64, y);
  } else {
    emit(E, "*(int64_t *)%v = io->tensor_rank;", y);
  }
}

/* The tensor group's ops (passes/shard_tensor.c). TensorCopy is the identity on every
 * rank: its result is a view of its operand (memory.c), nothing runs. AllReduce sums its
 * operand over the group in place through the runtime's io->tensor_allreduce (the same
 * call on every target: the runtime picks the transport), first copying it into the
 * result's own buffer where the memory plan could not alias them. */
static void emit_tensor_op(Emitter *E, int op) {
  const TpModule *m = E->m;
  int x = in(E, op, 0), y = res(E, op, 0);
  if (!f32_only(E, op) || !has_tensor_group(E, op)) return;
  if (strcmp(tp_attr_string(m, op, "group", "tensor"), "tensor") != 0 ||
      (m->ops[op].kind == TP_OP_AllReduce && strcmp(tp_attr_string(m, op, "reduce", "sum"), "sum") != 0)) {
    unsupported(E, op, "only sums over the tensor group are");
    return;
  }
  if (E->mem->value[y].kind != TP_MEM_VIEW) {
    TpTensor views[2] = {tp_value_tensor(m, x), tp_value_tensor(m, y)};
    Views w = {op, views, views + 1, 1, 1};
    TpBound b = {.kernel = TP_K_RESHAPE};
    b.a.reshape = (TpCopyArgs){&views[0], &views[1]};
    emit_call(E, &b, &w);
  }
  if (m->ops[op].kind == TP_OP_AllReduce) emit(E, "io->tensor_allreduce(io, %v, %I);", y, tp_type_numel(type_of(E, y)));
}

/* The call of one op; its results are declared already. The op's binder (bind/bind.c) gives
 * the kernel and its arguments from views of the operands' types; what is decided here is
 * the plan's memory: a Reshape that is a view runs nothing, and a token slice's keys and
 * values are appended to, and read in place from, their context buffers. */
static void emit_op(Emitter *E, int op) {
  const TpModule *m = E->m;
  const TpOp *o = &m->ops[op];
  const TpOpBinding *r = tp_op_binding(o->kind);
  if (o->kind == TP_OP_Reshape && reshape_is_view(E->mem, op, m)) return;
  if (o->kind == TP_OP_TensorCopy || o->kind == TP_OP_AllReduce) {
    emit_tensor_op(E, op);
    return;
  }
  if (o->kind == TP_OP_TensorRank) {
    emit_tensor_rank(E, op);
    return;
  }
  if (!r->bind) {
    unsupported(E, op, NULL);
    return;
  }
  if ((r->dtypes == TP_BIND_F32 || r->dtypes == TP_BIND_F32_COPY) && !f32_only(E, op)) return;
  if (r->ids && !i64_ids(E, op, in(E, op, r->ids - 1))) return;
  TpTensor views[128];
  TP_ASSERT(o->ninputs + o->noutputs <= 128);
  Views w = {op, views, views + o->ninputs, o->ninputs, o->noutputs};
  for (int k = 0; k < o->ninputs + o->noutputs; k++) {
    int v = k < o->ninputs ? o->inputs[k] : o->outputs[k - o->ninputs];
    views[k] = v >= 0 ? tp_value_tensor(m, v) : (TpTensor){0};
  }
  TpBound b;
  int rc = tp_bind_op(m, op, w.in, views + o->ninputs, &b, E->d);
  if (rc != TP_OK) {
    E->rc = rc;
    return;
  }
  if (b.kernel == TP_K_CONCAT && tp_context_rows(m, o->outputs[0])) {
    /* only the slice's own rows are new in the buffer */
    const TpConcatArgs *c = &b.a.concat;
    const TpTensor *own = &c->xs[c->n - 1];
    b.kernel = TP_K_CONTEXT_APPEND;
    b.a.context_append = (TpContextAppendArgs){own, c->axis, c->y->dims[c->axis] - own->dims[c->axis],
                                               tp_context_rows(m, o->outputs[0]), c->y};
  }
  if (b.kernel == TP_K_ATTENTION || b.kernel == TP_K_ATTENTION_BACKWARD) {
    TpAttentionArgs *a = &b.a.attention;
    if (a->past_k) {
      unsupported(E, op, "past keys and values");
      return;
    }
    int64_t rows = tp_context_rows(m, value_of(E, &w, a->k));
    if (rows != tp_context_rows(m, value_of(E, &w, a->v))) {
      unsupported(E, op, "K and V must both be token-slice contexts, or neither");
      return;
    }
    a->p.kv_rows = rows;
  }
  emit_call(E, &b, &w);
}

/* ---- functions and tables ---- */

/* Is value v read by one of the ops ops[0..n) of the current function (or is it the loss)? */
static bool read_after(const Emitter *E, const int *ops, int n, int v) {
  if (v == E->m->loss) return true;
  for (int i = 0; i < n; i++)
    for (int k = 0; E->here[ops[i]] && k < E->m->ops[ops[i]].ninputs; k++)
      if (E->m->ops[ops[i]].inputs[k] == v) return true;
  return false;
}

/* The name of stage s's function of (phase, slice): stageS_forward in unsliced plans,
 * else stageS_forward_sliceI; a probe's with its prefix (probeP_stageS_...). */
static void unit_name_of(const char *prefix, int nslices, int s, bool backward, int slice, char *buf, size_t n) {
  if (nslices == 1) snprintf(buf, n, "%.16sstage%d_%s", prefix, s, backward ? "backward" : "forward");
  else snprintf(buf, n, "%.16sstage%d_%s_slice%d", prefix, s, backward ? "backward" : "forward", slice);
}

static void unit_name(const Emitter *E, int s, bool backward, int slice, char *buf, size_t n) {
  unit_name_of(E->prefix, E->mem->nslices, s, backward, slice, buf, n);
}

/* The body of stage s's forward (or backward) function of one slice: the declarations of
 * what it reads from outside (top) and its ops (body). Boundary copies run no code: the
 * runtime receives their values into the arena before the unit runs. */
typedef struct {
  char *top, *body;
  size_t top_len, body_len;
  int nops;
  bool uses_arena, uses_bad;
} UnitText;

/* A run of a unit's ops that the unit runs by calling a shared body (see emit_units):
 * positions [begin, end) of its stage's order, and the call's statement. */
typedef struct {
  int begin, end;
  const char *call;
} UnitCall;

/* The text of the ops at positions [from, to) of stage s's order (a unit, or a run of one),
 * those of calls[0, ncalls) (in order, inside the range) replaced by their calls. */
static void render_ops(Emitter *E, int s, bool backward, int from, int to, const UnitCall *calls, int ncalls,
                       UnitText *u) {
  const TpModule *m = E->m;
  const TpMemoryPlan *p = E->mem;
  memset(E->declared, 0, (size_t)m->nvalues * sizeof *E->declared);
  memset(E->here, 0, (size_t)m->nops * sizeof *E->here);
  int nops = 0;
  for (int i = from, c = 0; i < to; i++) {
    if (tp_is_boundary_op(m, p->order[s][i])) continue;
    nops++;
    while (c < ncalls && calls[c].end <= i) c++;
    if (c == ncalls || i < calls[c].begin) E->here[p->order[s][i]] = true;
  }
  E->uses_arena = E->uses_bad = false;

  /* What the function reads from outside, in order of first use. */
  char *top_text = NULL, *body_text = NULL;
  size_t top_len = 0, body_len = 0;
  FILE *top = open_memstream(&top_text, &top_len);
  FILE *body = open_memstream(&body_text, &body_len);
  TP_ASSERT(top && body);
  for (int i = from; i < to; i++) {
    const TpOp *o = &m->ops[p->order[s][i]];
    if (!E->here[p->order[s][i]]) continue;
    for (int k = 0; k < o->ninputs; k++) {
      int v = o->inputs[k];
      if (v < 0 || E->declared[v]) continue;
      int def = m->values[v].kind == TP_VAL_RESULT ? m->values[v].def : -1;
      if (def >= 0 && E->here[def]) continue;
      declare(E, top, v);
    }
  }
  E->out = body;
  for (int i = from, c = 0; i < to && E->rc == TP_OK; i++) {
    int op = p->order[s][i];
    const TpOp *o = &m->ops[op];
    if (c < ncalls && i == calls[c].begin) {
      if (ftell(top) > 0 || ftell(body) > 0) fputc('\n', body);
      emit(E, "%s", calls[c].call);
      i = calls[c++].end - 1;
      continue;
    }
    if (!E->here[op]) continue;
    /* A Reshape that runs nothing is only worth a line where its result is read here. */
    if (o->kind == TP_OP_Reshape && reshape_is_view(p, op, m) && !read_after(E, p->order[s] + i + 1, to - i - 1, o->outputs[0]))
      continue;
    fputc('\n', body);
    const char *what = o->role == TP_ROLE_RETIE ? tp_op_role_names[o->role] : o->origin.op_type;
    if (E->signature) {
      /* no comment: node names differ between the runs of a shared body */
    } else if (o->origin.node)
      fprintf(body, "  /* %s (%s)%s */\n", o->origin.node, what ? what : "?",
              o->kind == TP_OP_Reshape && reshape_is_view(p, op, m) ? ": a view" : "");
    else
      fprintf(body, "  /* %s */\n", tp_op_info[o->kind].name);
    for (int k = 0; k < o->noutputs; k++)
      if (o->outputs[k] >= 0) declare(E, body, o->outputs[k]);
    emit_op(E, op);
  }
  if (!backward && m->loss >= 0 && m->values[m->loss].def >= 0 && E->here[m->values[m->loss].def]) {
    fputc('\n', body);
    if (E->target->copy_to_host) { /* the runtime synchronizes before it reads io->loss */
      E->uses_check = true;
      emit(E, "CHECK(%s(&io->loss, %v, sizeof(float), io->stream));", E->target->copy_to_host, m->loss);
    } else {
      fprintf(body, "  io->loss = *(const float *)%s.data;\n", E->name[m->loss]);
    }
  }
  fclose(top);
  fclose(body);
  *u = (UnitText){top_text, body_text, top_len, body_len, nops, E->uses_arena, E->uses_bad};
}

/* The first lines of a unit function's body: the arena, the id report, what it reads. */
static void put_unit_top(const UnitText *u, FILE *out) {
  if (u->uses_arena) fputs("  char *arena = io->arena;\n", out);
  if (u->uses_bad) fputs("  int64_t bad; /* where the kernels report an id out of range */\n", out);
  if (!u->nops) fputs("  (void)io; /* nothing to do */\n", out);
  if (u->top_len) fputs("  /* computed elsewhere: */\n", out);
  fputs(u->top, out);
}

/* The comment above stage s's unit function (without its closing). */
static void put_unit_comment(const Emitter *E, int s, bool backward, int slice, int nops, FILE *out) {
  if (E->param_map) /* a probe's */
    fprintf(out, "\n/* %.*s: stage %d, %s of slice %d: %d ops", (int)strlen(E->prefix) - 1, E->prefix, s,
            backward ? "backward" : "forward", slice, nops);
  else if (E->mem->nslices == 1) fprintf(out, "\n/* Stage %d, %s: %d ops", s, backward ? "backward" : "forward", nops);
  else fprintf(out, "\n/* Stage %d, %s of slice %d: %d ops", s, backward ? "backward" : "forward", slice, nops);
}

/* Stage s's forward (or backward) function of one slice into `out`, the runs of calls[0,
 * ncalls) as their calls. */
static void emit_unit(Emitter *E, int s, bool backward, int slice, const UnitCall *calls, int ncalls, FILE *out) {
  int unit = (backward ? E->mem->nslices : 0) + slice;
  UnitText u;
  render_ops(E, s, backward, E->mem->unit_begin[s][unit], E->mem->unit_end[s][unit], calls, ncalls, &u);
  char name[64];
  unit_name(E, s, backward, slice, name, sizeof name);
  put_unit_comment(E, s, backward, slice, u.nops, out);
  fprintf(out, ". */\nstatic void %s(TpStepIO *io) {\n", name);
  put_unit_top(&u, out);
  fputs(u.body, out);
  fputs("}\n", out);
  free(u.top);
  free(u.body);
}

/* "text" with C escapes. */
static void put_string(FILE *out, const char *s) {
  fputc('"', out);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(out, "\\%c", c);
    else if (c < 32 || c >= 127) fprintf(out, "\\%03o", c);
    else fputc(c, out);
  }
  fputc('"', out);
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
  case TP_U16: case TP_F16: case TP_BF16: ctype = "uint16_t"; break;
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
    case TP_U16: case TP_F16: case TP_BF16: fprintf(out, "0x%04x", x.u16); break;
    default: fprintf(out, "%u", x.u8); break;
    }
  }
  if (n == 0) fputs("0", out);
  fputs("};\n", out);
}

/* The vocabulary: the classes of the loss (the whole vocabulary's where it is split over
 * the tensor ranks), else of the first output [B, T, V]. */
static int64_t vocab_size(const TpModule *m) {
  for (int op = 0; op < m->nops; op++) {
    TpOpKind k = m->ops[op].kind;
    if (k == TP_OP_CrossEntropy || k == TP_OP_SoftmaxCrossEntropyLoss || k == TP_OP_NegativeLogLikelihoodLoss)
      return tp_loss_classes(m, op);
  }
  if (m->noutputs && m->values[m->outputs[0]].type.rank == 3) return m->values[m->outputs[0]].type.dims[2];
  return 0;
}

/* The length of each token slice: from the module's slicing, else from the token axis of
 * a forward result of the slice. */
static int64_t slice_length(const Emitter *E, int slice, int64_t seq) {
  const TpModule *m = E->m;
  if (E->mem->nslices == 1) return seq;
  if (m->nslices == E->mem->nslices && m->slice_len) return m->slice_len[slice];
  for (int op = 0; op < m->nops; op++)
    if (m->ops[op].slice == slice && m->ops[op].phase == TP_PHASE_FORWARD)
      for (int k = 0; k < m->ops[op].noutputs; k++) {
        int v = m->ops[op].outputs[k], axis = v >= 0 ? tp_token_axis(m, v) : -1;
        if (axis >= 0) return m->values[v].type.dims[axis];
      }
  return 0;
}

static const char *const insn_enum[TP_INSN_COUNT] = {
    "TP_PLAN_FORWARD",   "TP_PLAN_BACKWARD",       "TP_PLAN_SEND_ACT",
    "TP_PLAN_RECV_ACT",  "TP_PLAN_SEND_GRAD",      "TP_PLAN_RECV_GRAD",
    "TP_PLAN_ALLREDUCE_TIED", "TP_PLAN_ALLREDUCE", "TP_PLAN_OPTIMIZER_STEP"};
static const char *const message_names[TP_MSG_COUNT] = {"recv_act", "send_act", "recv_grad", "send_grad"};

/* Does stage s have the neighbour that message kind k goes to or comes from? */
static bool has_peer(const TpMemoryPlan *p, int s, int k) {
  return k == TP_MSG_RECV_ACT || k == TP_MSG_SEND_GRAD ? s > 0 : s + 1 < p->nstages;
}

/* The io->tensor_allreduce calls of stage s's unit (phase, slice): its AllReduce ops. */
static int unit_reduces(const TpModule *m, const TpMemoryPlan *p, int s, bool backward, int slice) {
  int unit = (backward ? p->nslices : 0) + slice, n = 0;
  for (int i = p->unit_begin[s][unit]; i < p->unit_end[s][unit]; i++)
    n += m->ops[p->order[s][i]].kind == TP_OP_AllReduce;
  return n;
}

/* Stage s's stageS_forward_reduces and stageS_backward_reduces: per slice, the calls of
 * its units, which the runtime checks (runtime/train/plan.h). */
static void emit_reduce_tables(const Emitter *E, FILE *out, int s) {
  for (int b = 0; b < 2; b++) {
    fprintf(out, "static const int stage%d_%s_reduces[] = {", s, b ? "backward" : "forward");
    for (int i = 0; i < E->mem->nslices; i++) fprintf(out, "%s%d", i ? ", " : "", unit_reduces(E->m, E->mem, s, b, i));
    fputs("};\n", out);
  }
}

/* The schedule's tables: per stage its unit functions, boundary messages and instruction
 * list, then the stages. */
static void emit_pipeline(Emitter *E, FILE *out, int64_t seq) {
  const TpModule *m = E->m;
  const TpMemoryPlan *p = E->mem;
  const TpPipeline *pl = E->pipe;
  int N = p->nslices, S = p->nstages;
  char name[64];
  fputs("\n/* The token slices, first to last. */\nstatic const int64_t slice_len[] = {", out);
  for (int i = 0; i < N; i++) fprintf(out, "%s%lld", i ? ", " : "", (long long)slice_length(E, i, seq));
  fputs("};\n", out);
  fputs("\n/* Per stage: one microbatch's arena (activations, their gradients, boundary buffers). */\n", out);
  fputs("static const size_t arena_bytes[] = {", out);
  for (int s = 0; s < S; s++) fprintf(out, "%s%lld", s ? ", " : "", (long long)p->arena_bytes[s]);
  fputs("};\n", out);
  if (N == 1) {
    fputs("static const TpStageFn forward[] = {", out);
    for (int s = 0; s < S; s++) fprintf(out, "%sstage%d_forward", s ? ", " : "", s);
    fputs("};\nstatic const TpStageFn backward[] = {", out);
    for (int s = 0; s < S; s++) fprintf(out, "%sstage%d_backward", s ? ", " : "", s);
    fputs("};\n", out);
  }
  for (int s = 0; s < S; s++) {
    fprintf(out, "\n/* Stage %d: ", s);
    if (N > 1) fputs("its functions per slice, ", out);
    if (S > 1) fputs("what it receives and sends per slice (arena offset, bytes), ", out);
    fputs("its instructions for one step. */\n", out);
    for (int b = 0; N > 1 && b < 2; b++) {
      fprintf(out, "static const TpUnitFn stage%d_%s_units[] = {", s, b ? "backward" : "forward");
      for (int i = 0; i < N; i++) {
        unit_name(E, s, b, i, name, sizeof name);
        fprintf(out, "%s%s", i ? ", " : "", name);
      }
      fputs("};\n", out);
    }
    for (int k = 0; k < TP_MSG_COUNT; k++) {
      if (!has_peer(p, s, k)) continue;
      for (int i = 0; i < N; i++) {
        const TpMemMessage *msg = &p->messages[s][k * N + i];
        if (!msg->n) continue;
        fprintf(out, "static const TpPlanBuffer stage%d_%s_%d[] = {", s, message_names[k], i);
        for (int j = 0; j < msg->n; j++) {
          int v = msg->values[j], at = v;
          while (p->value[at].kind == TP_MEM_VIEW) at = p->value[at].index;
          const TpType *t = &m->values[v].type;
          fprintf(out, "%s{%lld, %lld}", j ? ", " : "", (long long)p->value[at].offset,
                  (long long)(tp_type_numel(t) * (int64_t)tp_dtype_size(t->dtype)));
        }
        fputs("};\n", out);
      }
      fprintf(out, "static const TpPlanMessage stage%d_%s[] = {", s, message_names[k]);
      for (int i = 0; i < N; i++) {
        const TpMemMessage *msg = &p->messages[s][k * N + i];
        if (msg->n) fprintf(out, "%s{%d, stage%d_%s_%d}", i ? ", " : "", msg->n, s, message_names[k], i);
        else fprintf(out, "%s{0, NULL}", i ? ", " : "");
      }
      fputs("};\n", out);
    }
    fprintf(out, "static const TpPlanInsn stage%d_schedule[] = {\n", s);
    for (int i = 0; i < pl->schedule.count[s]; i++) {
      const TpInsn *x = &pl->schedule.insn[s][i];
      fprintf(out, "    {%s, %d, %d, %d},\n", insn_enum[x->kind], x->mb, x->slice, x->peer);
    }
    fputs("};\n", out);
    if (E->tensor > 1) emit_reduce_tables(E, out, s);
  }
  fputs("\nstatic const TpPlanStage stages[] = {\n", out);
  for (int s = 0; s < S; s++) {
    if (N == 1) fprintf(out, "    {.forward = forward + %d,\n     .backward = backward + %d,\n", s, s);
    else fprintf(out, "    {.forward = stage%d_forward_units,\n     .backward = stage%d_backward_units,\n", s, s);
    fprintf(out, "     .arena_bytes = %lld,\n     .arenas = %d,\n", (long long)p->arena_bytes[s], pl->arenas[s]);
    for (int k = 0; k < TP_MSG_COUNT; k++)
      if (has_peer(p, s, k)) fprintf(out, "     .%s = stage%d_%s,\n", message_names[k], s, message_names[k]);
    if (E->tensor > 1)
      fprintf(out, "     .forward_reduces = stage%d_forward_reduces,\n"
                   "     .backward_reduces = stage%d_backward_reduces,\n", s, s);
    fprintf(out, "     .ninsns = %d,\n     .insns = stage%d_schedule,\n     .memory_bytes = %lld},\n",
            pl->schedule.count[s], s, (long long)pl->peak[s]);
  }
  fputs("};\n", out);
}

/* The profiling probes' tables: per probe and stage its setup units, probed units and
 * arena, then the probes; the stage cuts. */
static void emit_probe_tables(Emitter *E, FILE *out) {
  const TpEmitOptions *o = E->o;
  int S = E->mem->nstages;
  char name[64], prefix[32];
  fputs("\n/* Profiling probes (--profile-grid): the same model for one microbatch sliced as [c, l, rest],\n"
        " * per stage the forwards of the context slices (setup), the forward and backward of the\n"
        " * probed slice, and their arena. */\n", out);
  for (int k = 0; k < o->nprobes; k++) {
    const ProbeInfo *info = &E->probe[k];
    snprintf(prefix, sizeof prefix, "probe%d_", k);
    for (int s = 0; s < S && info->probed; s++) {
      fprintf(out, "static const TpUnitFn probe%d_stage%d_setup[] = {", k, s);
      for (int i = 0; i < info->probed; i++) {
        unit_name_of(prefix, info->nslices, s, false, i, name, sizeof name);
        fprintf(out, "%s%s", i ? ", " : "", name);
      }
      fputs("};\n", out);
    }
    fprintf(out, "static const TpPlanProbeStage probe%d_stages[] = {\n", k);
    for (int s = 0; s < S; s++) {
      fprintf(out, "    {.arena_bytes = %lld,", (long long)info->arena_bytes[s]);
      if (info->probed) fprintf(out, " .nsetup = %d, .setup = probe%d_stage%d_setup,", info->probed, k, s);
      unit_name_of(prefix, info->nslices, s, false, info->probed, name, sizeof name);
      fprintf(out, "\n     .forward = %s, ", name);
      unit_name_of(prefix, info->nslices, s, true, info->probed, name, sizeof name);
      fprintf(out, ".backward = %s},\n", name);
    }
    fputs("};\n", out);
  }
  fputs("static const TpPlanProbe probes[] = {\n", out);
  for (int k = 0; k < o->nprobes; k++)
    fprintf(out, "    {%lld, %lld, %lld, probe%d_stages},\n", (long long)E->probe[k].b, (long long)o->probes[k].l,
            (long long)o->probes[k].c, k);
  fputs("};\n", out);
  if (o->stage_cuts) {
    fputs("\n/* The first layer of each stage. */\nstatic const int stage_cuts[] = {", out);
    for (int s = 0; s < S; s++) fprintf(out, "%s%d", s ? ", " : "", o->stage_cuts[s]);
    fputs("};\n", out);
  }
}

static void emit_tables(Emitter *E, FILE *out) {
  const TpModule *m = E->m;
  const TpMemoryPlan *p = E->mem;
  int64_t batch = 0, seq = 0;
  for (int v = 0; v < m->nvalues; v++)
    if (p->value[v].kind == TP_MEM_TOKENS) batch = m->values[v].type.dims[0], seq = m->values[v].type.dims[1];

  fputs("\n/* The parameters: ONNX name, the initializer --init reads, shape, trainable, the stage\n"
        " * holding it, the last stage if it holds a tied copy too. */\n", out);
  fprintf(out, "static const TpPlanParam params[%d] = {\n", p->nparams ? p->nparams : 1);
  for (int i = 0; i < p->nparams; i++) {
    const TpValue *val = &m->values[p->params[i]];
    bool alias = val->origin.op_type && strcmp(val->origin.op_type, "Identity") == 0 && val->origin.node;
    fputs("    {", out);
    put_string(out, val->name);
    fputs(", ", out);
    put_string(out, alias ? val->origin.node : val->name);
    fprintf(out, ", %d, {", val->type.rank);
    for (int k = 0; k < val->type.rank; k++) fprintf(out, "%s%lld", k ? ", " : "", (long long)val->type.dims[k]);
    fprintf(out, "%s}, %d, %d, %d, {%d, %d, %d}},\n", val->type.rank ? "" : "0",
            m->grads && tp_grad_of(m, p->params[i]) >= 0, p->param_stage[i], p->param_tied_stage[i],
            val->shard.axis, val->shard.parts, val->shard.chunks);
  }
  fputs("};\n", out);

  /* Re-tied initializers: the forward re-tie views (a Transpose or Reshape of a parameter,
   * the initializer named by their origin). */
  int nderived = 0;
  for (int op = 0; op < m->nops; op++) {
    const TpOp *o = &m->ops[op];
    if (o->role != TP_ROLE_RETIE || o->phase != TP_PHASE_FORWARD) continue;
    int src = o->inputs[0];
    if (!nderived++)
      fputs("\n/* Initializers re-tied to a parameter: name, parameter, transposed. */\n"
            "static const TpPlanDerived derived[] = {\n",
            out);
    fputs("    {", out);
    put_string(out, o->origin.node);
    fprintf(out, ", %d, %d},\n", p->value[src].index, o->kind == TP_OP_Transpose);
  }
  if (nderived) fputs("};\n", out);

  emit_pipeline(E, out, seq);
  if (E->o->nprobes) emit_probe_tables(E, out);
  fputs("\nconst TpPlan tp_plan = {\n    .abi = TP_PLAN_ABI,\n    .model = ", out);
  put_string(out, E->o->model ? E->o->model : m->source ? m->source : "");
  fputs(",\n    .tokpipec_version = ", out);
  put_string(out, E->o->version ? E->o->version : "");
  fprintf(out, ",\n    .batch = %lld,\n    .seq = %lld,\n    .vocab = %lld,\n", (long long)batch,
          (long long)seq, (long long)vocab_size(m));
  char limit_of[512];
  int64_t limit = tp_token_limit(m, p, limit_of, sizeof limit_of);
  if (limit) {
    fprintf(out, "    .token_limit = %lld,\n    .token_limit_of = ", (long long)limit);
    put_string(out, limit_of);
    fputs(",\n", out);
  }
  fprintf(out, "    .nparams = %d,\n    .params = params,\n", p->nparams);
  if (nderived) fprintf(out, "    .nderived = %d,\n    .derived = derived,\n", nderived);
  fprintf(out, "    .nstages = %d,\n    .arena_bytes = arena_bytes,\n", p->nstages);
  if (p->nslices == 1) fputs("    .forward = forward,\n    .backward = backward,\n", out);
  const TpPipeline *pl = E->pipe;
  fprintf(out, "    .global_batch = %lld,\n    .microbatches = %d,\n    .dp = %d,\n    .nslices = %d,\n"
               "    .slice_len = slice_len,\n    .schedule = %s,\n    .stages = stages,\n",
          (long long)(batch * pl->o.microbatches * pl->o.dp), pl->o.microbatches, pl->o.dp, p->nslices,
          pl->o.kind == TP_SCHEDULE_GPIPE ? "TP_PLAN_GPIPE" : "TP_PLAN_1F1B");
  if (E->o->nprobes)
    fprintf(out, "    .stage_cuts = %s,\n    .nprobes = %d,\n    .probes = probes,\n",
            E->o->stage_cuts ? "stage_cuts" : "NULL", E->o->nprobes);
  if (E->target->device) {
    fprintf(out, "    .device = &%s,\n", E->target->device);
    E->headers |= 1u << E->target->device_header;
  }
  if (E->tensor > 1) fprintf(out, "    .tensor = %d,\n", E->tensor);
  fputs("};\n", out);
  fputs("\nint main(int argc, char **argv) { return tp_trainer_main(&tp_plan, argc, argv); }\n", out);
}

/* ---- shared bodies ----
 * A unit's ops fall into runs that other units run too, up to the names of their values,
 * their arena offsets and their parameter indices: a layer (the kernels of layer 5 are
 * those of layer 4 on other parameters, at other offsets), or a middle stage's whole unit.
 * Each distinct run is written once, as a function taking those numbers (a shared body),
 * and every unit running it calls it with its own. The plan thus grows with the distinct
 * layer shapes and (slice length, context) pairs, not with layers x slices. A unit with
 * no run that another shares is written whole, as before.
 *
 * Runs are found on op keys (kind, attributes, operand types and storage kinds): the
 * repeats within a unit (its layers), else a unit's whole op list where other units have
 * the same one (a middle stage). Runs are then compared by their text, with the values
 * named by their place in the run and the numbers taken out (run_signature): only runs
 * whose texts are equal share a body, so the key only decides where to look. */

/* The numbers a run's text addresses memory with, in order of appearance. */
typedef struct {
  int64_t *at; /* arena offsets */
  int *p;      /* parameter indices (of io->param and io->grad) */
  int nat, np, cap_at, cap_p;
} RunNumbers;

/* Does text[i..] start with `word` at an identifier boundary? */
static bool starts_word(const char *text, size_t len, size_t i, const char *word) {
  size_t n = strlen(word);
  if (i + n > len || memcmp(text + i, word, n) != 0) return false;
  return i == 0 || !(isalnum((unsigned char)text[i - 1]) || text[i - 1] == '_');
}

/* text[0, len) with each arena offset (`arena + N`) written `arena + at[k]` and each
 * parameter index (`io->param[N]`, `io->grad[N]`) `p[k]`, comments left alone; the
 * numbers are appended to *nums. Whatever call a statement is (a kernel's, a collective's),
 * the arena and parameter addresses it takes are covered. Returns a malloc'd string. */
static char *parameterise(const char *text, size_t len, RunNumbers *nums) {
  char *res = NULL;
  size_t res_len = 0;
  FILE *out = open_memstream(&res, &res_len);
  TP_ASSERT(out);
  for (size_t i = 0; i < len;) {
    if (i + 1 < len && text[i] == '/' && text[i + 1] == '*') {
      const char *end = strstr(text + i + 2, "*/");
      size_t n = end ? (size_t)(end + 2 - (text + i)) : len - i;
      fwrite(text + i, 1, n, out);
      i += n;
      continue;
    }
    static const char *const words[] = {"arena + ", "io->param[", "io->grad["};
    int w = 0;
    while (w < 3 && !starts_word(text, len, i, words[w])) w++;
    size_t digits = w < 3 ? i + strlen(words[w]) : i;
    if (w == 3 || digits >= len || !isdigit((unsigned char)text[digits])) {
      fputc(text[i++], out);
      continue;
    }
    char *end;
    long long x = strtoll(text + digits, &end, 10);
    fwrite(text + i, 1, digits - i, out);
    if (w == 0) {
      if (nums->nat == nums->cap_at) {
        nums->cap_at = nums->cap_at ? 2 * nums->cap_at : 32;
        nums->at = realloc(nums->at, (size_t)nums->cap_at * sizeof *nums->at);
        TP_ASSERT(nums->at);
      }
      fprintf(out, "at[%d]", nums->nat);
      nums->at[nums->nat++] = x;
    } else {
      if (nums->np == nums->cap_p) {
        nums->cap_p = nums->cap_p ? 2 * nums->cap_p : 32;
        nums->p = realloc(nums->p, (size_t)nums->cap_p * sizeof *nums->p);
        TP_ASSERT(nums->p);
      }
      fprintf(out, "p[%d]", nums->np);
      nums->p[nums->np++] = (int)x;
    }
    i = (size_t)(end - text);
  }
  fclose(out);
  return res;
}

/* A unit of the plan: its ops' keys (boundary copies left out) and its runs. */
typedef struct {
  int s, slice;
  bool backward;
  int n;          /* ops with keys */
  int *pos;       /* their positions in the stage's order */
  uint64_t *key;
  int first_run, nruns;
} Unit;

/* A run of a unit's ops: key indices [begin, end) of units[unit]. */
typedef struct {
  int unit, begin, end;
  int body;        /* the shared body it calls, or -1: written inline */
  RunNumbers nums; /* its numbers, for the call */
  int table;       /* its arena offsets: table `table` of its body's (runs on stages alike share one) */
  int prev_table;  /* if new_table: the first run of the body's table before, or -1 */
  bool new_table;  /* the first run with that table */
} Run;

/* A distinct run text: its signature, the runs with it, its function's name once shared. */
typedef struct {
  char *key;
  uint64_t hash;
  int first, count, nops;
  int ntables;    /* distinct arena offset lists of its runs */
  bool contexts;  /* its runs follow contexts of different lengths (so its name has none) */
  int last_table; /* the first run with its last table */
  char *name;
} Body;

static uint64_t mix(uint64_t h, uint64_t x) { return (h ^ x) * 1099511628211ull; }

/* What an op's code depends on besides the names and numbers of its values. */
static uint64_t op_key(const Emitter *E, int op) {
  const TpOp *o = &E->m->ops[op];
  uint64_t h = mix(1469598103934665603ull, (uint64_t)o->kind);
  h = mix(mix(mix(h, (uint64_t)o->role), (uint64_t)o->ninputs), (uint64_t)o->noutputs);
  for (int k = 0; k < o->ninputs + o->noutputs; k++) {
    int v = k < o->ninputs ? o->inputs[k] : o->outputs[k - o->ninputs];
    if (v < 0) {
      h = mix(h, 7);
      continue;
    }
    const TpType *t = &E->m->values[v].type;
    h = mix(mix(mix(h, (uint64_t)t->dtype), (uint64_t)t->rank), (uint64_t)E->mem->value[v].kind);
    for (int i = 0; i < t->rank; i++) h = mix(h, (uint64_t)t->dims[i]);
  }
  for (int a = 0; a < o->nattrs; a++) {
    const TpAttr *x = &o->attrs[a];
    uint64_t f;
    memcpy(&f, &x->f, sizeof f);
    h = mix(mix(mix(mix(h, hash_str(x->name)), (uint64_t)x->kind), (uint64_t)x->i), f);
    for (int i = 0; i < x->nints; i++) h = mix(h, (uint64_t)x->ints[i]);
    if (x->s) h = mix(h, hash_str(x->s));
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
  return a->len == b->len &&
         memcmp(units[a->unit].key + a->first, units[b->unit].key + b->first, (size_t)a->len * sizeof(uint64_t)) == 0;
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

static Run *find_runs(Unit *units, int nunits, int *nruns) {
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
  Run *runs = malloc((size_t)cap_runs * sizeof *runs);
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
        for (size_t at = (h ^ (uint64_t)len) & (size_t)(cap - 1); table[at] >= 0; at = (at + 1) & (size_t)(cap - 1)) {
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
      runs[nrun++] = (Run){u, i, i + len, -1, {0}, 0, -1, false};
    }
    free(matches);
    free(prefix);
    free(taken);
    /* in unit order */
    for (int a = first + 1; a < nrun; a++)
      for (int b = a; b > first && runs[b - 1].begin > runs[b].begin; b--) {
        Run t = runs[b];
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

/* The signature of run r: its text with each value named by its place of first use in
 * the run (v0, v1, ...) and without comments, parameterised; the numbers go to r->nums. */
static char *run_signature(Emitter *E, const Unit *u, Run *r, char **canon, char **positional, int *nops) {
  const TpModule *m = E->m;
  const int *order = E->mem->order[u->s];
  int from = u->pos[r->begin], to = u->pos[r->end - 1] + 1, next = 0;
  for (int i = from; i < to; i++) {
    const TpOp *o = &m->ops[order[i]];
    for (int k = 0; k < o->ninputs + o->noutputs; k++) {
      int v = k < o->ninputs ? o->inputs[k] : o->outputs[k - o->ninputs];
      if (v >= 0 && E->name[v] && !canon[v]) canon[v] = positional[next++];
    }
  }
  char **names = E->name;
  E->name = canon;
  E->signature = true;
  UnitText t;
  render_ops(E, u->s, u->backward, from, to, NULL, 0, &t);
  E->name = names;
  E->signature = false;
  *nops = t.nops;
  char *all = malloc(t.top_len + t.body_len + 4);
  TP_ASSERT(all);
  snprintf(all, t.top_len + t.body_len + 4, "%c%c%s%s", t.uses_arena ? 'A' : '-', t.uses_bad ? 'B' : '-', t.top,
           t.body);
  char *key = parameterise(all, strlen(all), &r->nums);
  free(all);
  free(t.top);
  free(t.body);
  for (int i = from; i < to; i++) { /* forget the places for the next run */
    const TpOp *o = &m->ops[order[i]];
    for (int k = 0; k < o->ninputs + o->noutputs; k++) {
      int v = k < o->ninputs ? o->inputs[k] : o->outputs[k - o->ninputs];
      if (v >= 0) canon[v] = NULL;
    }
  }
  return key;
}

/* The context of slice i: the tokens of the slices before it. */
static int64_t slice_context(const Emitter *E, int slice, int64_t seq) {
  int64_t c = 0;
  for (int i = 0; i < slice; i++) c += slice_length(E, i, seq);
  return c;
}

/* (slice, stage) pairs in order. */
static int pair_order(const void *x, const void *y) {
  const int *a = x, *b = y;
  return a[0] != b[0] ? (a[0] < b[0] ? -1 : 1) : (a[1] < b[1] ? -1 : a[1] > b[1]);
}

/* " 4-7 (slice 2), 9 (slice 2)": the stages whose units call body b, as ranges per slice,
 * wrapped as a comment's lines. */
static void put_body_users(const Emitter *E, const Unit *units, const Run *runs, int nruns, int b, FILE *out) {
  int col = 24, count = 0, n = 0;
  int (*pairs)[2] = malloc(((size_t)nruns + 1) * sizeof *pairs);
  TP_ASSERT(pairs);
  for (int r = 0; r < nruns; r++)
    if (runs[r].body == b) pairs[n][0] = units[runs[r].unit].slice, pairs[n++][1] = units[runs[r].unit].s;
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

/* The function of shared body b, whose first run is r, and its runs' arena offset lists. */
static void emit_shared_body(Emitter *E, const Unit *units, const Run *runs, int nruns,
                             const Body *body, int b, int64_t seq, FILE *out) {
  const Run *r = &runs[body->first];
  const Unit *u = &units[r->unit];
  UnitText t;
  render_ops(E, u->s, u->backward, u->pos[r->begin], u->pos[r->end - 1] + 1, NULL, 0, &t);
  RunNumbers nums = {0};
  char *top = parameterise(t.top, t.top_len, &nums);
  char *text = parameterise(t.body, t.body_len, &nums);
  TP_ASSERT(nums.nat == r->nums.nat && nums.np == r->nums.np);
  free(t.top);
  free(t.body);
  t.top = top, t.top_len = strlen(top);
  fprintf(out, "\n/* %s: %d ops of the %s of a %lld-token slice", body->name, body->nops,
          u->backward ? "backward" : "forward", (long long)slice_length(E, u->slice, seq));
  if (E->mem->nslices > 1 && !body->contexts)
    fprintf(out, " after %lld tokens", (long long)slice_context(E, u->slice, seq));
  fprintf(out, ",\n * run %d times by stages", body->count);
  put_body_users(E, units, runs, nruns, b, out);
  fprintf(out, ",\n * with the arena offsets (at) and parameters (p) of each. Values are named after stage %d's. */\n"
          "static void %s(TpStepIO *io", u->s, body->name);
  if (nums.nat) fputs(", const int64_t *at", out);
  if (nums.np) fputs(", const int *p", out);
  fputs(") {\n", out);
  put_unit_top(&t, out);
  fputs(text, out);
  fputs("}\n", out);
  free(t.top);
  free(text);
  free(nums.at);
  free(nums.p);
  if (!r->nums.nat) return;
  fprintf(out, "/* %s's arena offsets (units on stages alike share a list): */\n", body->name);
  for (int q = body->first; q < nruns; q++) {
    if (runs[q].body != b || !runs[q].new_table) continue;
    int col = fprintf(out, "static const int64_t %s_at%d[] = {", body->name, runs[q].table);
    for (int i = 0; i < runs[q].nums.nat; i++) {
      char x[24];
      int len = snprintf(x, sizeof x, "%lld", (long long)runs[q].nums.at[i]);
      if (i && col + len + 3 > WRAP) col = fprintf(out, ",\n    ") - 2;
      else if (i) col += fprintf(out, ", ");
      col += fprintf(out, "%s", x);
    }
    fputs("};\n", out);
  }
}

/* The call of shared body `body` with run r's numbers (a malloc'd statement). */
static char *body_call(const Run *r, const Body *body) {
  char *call = NULL;
  size_t call_len = 0;
  FILE *text = open_memstream(&call, &call_len);
  TP_ASSERT(text);
  fprintf(text, "%s(io", body->name);
  if (r->nums.nat) fprintf(text, ", %s_at%d", body->name, r->table);
  if (r->nums.np) {
    fputs(", (const int[]){", text);
    for (int i = 0; i < r->nums.np; i++) fprintf(text, "%s%d", i ? ", " : "", r->nums.p[i]);
    fputc('}', text);
  }
  fputs(");", text);
  fclose(text);
  return call;
}

/* Unit u's function: its own ops, and a call for each of its runs with a shared body. */
static void emit_unit_calls(Emitter *E, const Unit *u, const Run *runs, const Body *bodies, FILE *out) {
  UnitCall *calls = calloc((size_t)u->nruns + 1, sizeof *calls);
  TP_ASSERT(calls);
  int ncalls = 0;
  for (int i = 0; i < u->nruns; i++) {
    const Run *r = &runs[u->first_run + i];
    if (r->body >= 0) calls[ncalls++] = (UnitCall){u->pos[r->begin], u->pos[r->end - 1] + 1, body_call(r, &bodies[r->body])};
  }
  emit_unit(E, u->s, u->backward, u->slice, calls, ncalls, out);
  for (int i = 0; i < ncalls; i++) free((char *)calls[i].call);
  free(calls);
}

/* The functions of the units (s, backward, slice) of list[0, n), in that order, with the
 * shared bodies they call each written before its first caller. */
static void emit_units(Emitter *E, const int (*list)[3], int n, FILE *out) {
  const TpModule *m = E->m;
  const TpMemoryPlan *p = E->mem;
  int64_t seq = 0;
  for (int v = 0; v < m->nvalues; v++)
    if (p->value[v].kind == TP_MEM_TOKENS) seq = m->values[v].type.dims[1];
  Unit *units = calloc((size_t)n + 1, sizeof *units);
  TP_ASSERT(units);
  for (int i = 0; i < n; i++) {
    Unit *u = &units[i];
    *u = (Unit){.s = list[i][0], .backward = list[i][1], .slice = list[i][2]};
    int unit = (u->backward ? p->nslices : 0) + u->slice;
    int from = p->unit_begin[u->s][unit], to = p->unit_end[u->s][unit];
    u->pos = malloc(((size_t)(to - from) + 1) * sizeof *u->pos);
    u->key = malloc(((size_t)(to - from) + 1) * sizeof *u->key);
    TP_ASSERT(u->pos && u->key);
    for (int k = from; k < to; k++)
      if (!tp_is_boundary_op(m, p->order[u->s][k])) u->pos[u->n] = k, u->key[u->n++] = op_key(E, p->order[u->s][k]);
  }
  int nruns;
  Run *runs = find_runs(units, n, &nruns);

  /* the runs' texts, and which are equal */
  char **canon = calloc((size_t)m->nvalues + 1, sizeof *canon);
  char **positional = malloc(((size_t)m->nvalues + 1) * sizeof *positional);
  Body *bodies = calloc((size_t)nruns + 1, sizeof *bodies);
  int nbodies = 0, cap = 64;
  while (cap < 2 * nruns) cap *= 2;
  int *table = malloc((size_t)cap * sizeof *table); /* open addressing over the bodies */
  TP_ASSERT(canon && positional && bodies && table);
  memset(table, -1, (size_t)cap * sizeof *table);
  for (int v = 0; v < m->nvalues; v++) {
    char id[24];
    snprintf(id, sizeof id, "v%d", v);
    positional[v] = strdup(id);
    TP_ASSERT(positional[v]);
  }
  for (int r = 0; r < nruns && E->rc == TP_OK; r++) {
    int nops;
    char *key = run_signature(E, &units[runs[r].unit], &runs[r], canon, positional, &nops);
    uint64_t h = hash_str(key);
    size_t at = h & (size_t)(cap - 1);
    while (table[at] >= 0 && (bodies[table[at]].hash != h || strcmp(bodies[table[at]].key, key) != 0))
      at = (at + 1) & (size_t)(cap - 1);
    if (table[at] < 0) {
      table[at] = nbodies;
      bodies[nbodies++] = (Body){key, h, r, 0, nops, 0, false, -1, NULL};
    } else {
      free(key);
    }
    runs[r].body = table[at];
    bodies[runs[r].body].count++;
  }
  int64_t *context = malloc(((size_t)p->nslices + 1) * sizeof *context); /* per slice */
  TP_ASSERT(context);
  for (int i = 0; i < p->nslices; i++) context[i] = slice_context(E, i, seq);
  for (int r = 0; r < nruns; r++) {
    Body *body = &bodies[runs[r].body];
    body->contexts |= context[units[runs[r].unit].slice] != context[units[runs[body->first].unit].slice];
  }
  free(context);
  NameSet names = {0};
  for (int b = 0; b < nbodies; b++) {
    if (bodies[b].count < 2) continue;
    const Unit *u = &units[runs[bodies[b].first].unit];
    char base[96];
    int len = snprintf(base, sizeof base, "block_%s_l%lld", u->backward ? "backward" : "forward",
                       (long long)slice_length(E, u->slice, seq));
    if (p->nslices > 1 && !bodies[b].contexts)
      snprintf(base + len, sizeof base - (size_t)len, "_c%lld", (long long)slice_context(E, u->slice, seq));
    bodies[b].name = unique_ident(&names, E->prefix, base);
  }
  free(names.slots); /* the strings belong to the bodies */
  for (int r = 0; r < nruns; r++)
    if (!bodies[runs[r].body].name) runs[r].body = -1; /* run by one unit: written inline */
  for (int r = 0; r < nruns; r++) { /* the distinct arena offset lists of each body */
    Run *x = &runs[r];
    if (x->body < 0) continue;
    Body *body = &bodies[x->body];
    int q = body->last_table;
    while (q >= 0 && x->nums.nat && memcmp(runs[q].nums.at, x->nums.at, (size_t)x->nums.nat * sizeof *x->nums.at) != 0)
      q = runs[q].prev_table;
    x->new_table = q < 0;
    if (x->new_table) x->table = body->ntables++, x->prev_table = body->last_table, body->last_table = r;
    else x->table = runs[q].table;
  }

  for (int i = 0; i < n && E->rc == TP_OK; i++) {
    const Unit *u = &units[i];
    bool any = false;
    for (int k = 0; k < u->nruns; k++) {
      const Run *r = &runs[u->first_run + k];
      if (r->body < 0) continue;
      any = true;
      if (bodies[r->body].first == u->first_run + k) emit_shared_body(E, units, runs, nruns, &bodies[r->body], r->body, seq, out);
    }
    if (any) emit_unit_calls(E, u, runs, bodies, out);
    else emit_unit(E, u->s, u->backward, u->slice, NULL, 0, out);
  }
  for (int b = 0; b < nbodies; b++) {
    free(bodies[b].key);
    free(bodies[b].name);
  }
  for (int r = 0; r < nruns; r++) {
    free(runs[r].nums.at);
    free(runs[r].nums.p);
  }
  for (int i = 0; i < n; i++) {
    free(units[i].pos);
    free(units[i].key);
  }
  for (int v = 0; v < m->nvalues; v++) free(positional[v]);
  free(positional);
  free(canon);
  free(bodies);
  free(table);
  free(runs);
  free(units);
}

static void emitter_init(Emitter *E, const TpModule *m, const TpMemoryPlan *mem, const TpEmitOptions *o,
                         TpDiag *d, const char *prefix) {
  *E = (Emitter){.m = m, .mem = mem, .o = o, .d = d, .prefix = prefix};
  E->target = tp_target_find(o->target ? o->target : "cpu", o->precision);
  TP_ASSERT(E->target); /* tp_emit_c checked the name */
  E->name = calloc((size_t)m->nvalues + 1, sizeof *E->name);
  E->array = calloc((size_t)m->nvalues + 1, sizeof *E->array);
  E->referenced = calloc((size_t)m->nvalues + 1, sizeof *E->referenced);
  E->declared = calloc((size_t)m->nvalues + 1, sizeof *E->declared);
  E->here = calloc((size_t)m->nops + 1, sizeof *E->here);
  TP_ASSERT(E->name && E->array && E->referenced && E->declared && E->here);
  E->tensor = tp_tensor_ranks(m);
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
  free(E->declared);
  free(E->here);
}

/* The main plan's index of probe parameter i (matched by ONNX name), checked to be held
 * by the same stages; -1 after reporting a mismatch. */
static int main_param(const Emitter *E, const TpModule *pm, const TpMemoryPlan *pp, int i) {
  const char *name = pm->values[pp->params[i]].name;
  for (int j = 0; j < E->mem->nparams; j++) {
    if (strcmp(E->m->values[E->mem->params[j]].name, name) != 0) continue;
    if (pp->param_stage[i] == E->mem->param_stage[j] && pp->param_tied_stage[i] == E->mem->param_tied_stage[j])
      return j;
    tp_internal(E->d, "codegen: probe parameter '%s' is held by stage %d, in the plan by stage %d: the stage "
                "cuts differ", name, pp->param_stage[i], E->mem->param_stage[j]);
    return -1;
  }
  tp_internal(E->d, "codegen: probe parameter '%s' is not a parameter of the plan", name);
  return -1;
}

/* Probe k of E->o: its units into fns, its constants into consts; what the tables need
 * into E->probe[k]. */
static int emit_probe(Emitter *E, int k, FILE *fns, FILE *consts) {
  const TpEmitProbe *pr = &E->o->probes[k];
  const TpModule *pm = pr->m;
  TpMemoryPlan plan;
  int rc = tp_plan_memory(pm, &plan, E->d);
  if (rc != TP_OK) return rc;
  if (plan.nstages != E->mem->nstages)
    rc = tp_internal(E->d, "codegen: probe (l %lld, c %lld) has %d stages, the plan %d", (long long)pr->l,
                     (long long)pr->c, plan.nstages, E->mem->nstages);
  int *map = calloc((size_t)plan.nparams + 1, sizeof *map);
  TP_ASSERT(map);
  for (int i = 0; i < plan.nparams && rc == TP_OK; i++)
    if ((map[i] = main_param(E, pm, &plan, i)) < 0) rc = TP_ERR_INTERNAL;
  ProbeInfo *info = &E->probe[k];
  info->nslices = plan.nslices;
  info->probed = pr->c > 0 ? 1 : 0;
  info->arena_bytes = calloc((size_t)plan.nstages + 1, sizeof *info->arena_bytes);
  TP_ASSERT(info->arena_bytes);
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
  P.param_map = map;
  int (*units)[3] = calloc((size_t)(plan.nstages * (info->probed + 2)) + 1, sizeof *units);
  TP_ASSERT(units);
  int nunits = 0;
  for (int s = 0; s < plan.nstages; s++) {
    info->arena_bytes[s] = plan.arena_bytes[s];
    for (int i = 0; i <= info->probed; i++) units[nunits][0] = s, units[nunits][1] = 0, units[nunits++][2] = i;
    units[nunits][0] = s, units[nunits][1] = 1, units[nunits++][2] = info->probed;
  }
  emit_units(&P, (const int(*)[3])units, nunits, fns);
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
  if (!tp_target_find(o->target ? o->target : "cpu", o->precision))
    return tp_error(d, "no code generation target '%s'%s%s", o->target ? o->target : "cpu",
                    o->precision ? " in precision " : "", o->precision ? o->precision : "");
  TpMemoryPlan plan;
  int rc = tp_plan_memory(m, &plan, d);
  if (rc != TP_OK) return rc;
  TpPipeline pipe;
  rc = tp_pipeline_build(m, &plan, o->pipeline, &pipe, d);
  if (rc != TP_OK) {
    tp_memory_plan_free(&plan);
    return rc;
  }
  Emitter E;
  emitter_init(&E, m, &plan, o, d, "");
  E.pipe = &pipe;
  E.probe = calloc((size_t)o->nprobes + 1, sizeof *E.probe);
  TP_ASSERT(E.probe);

  char *fn_text = NULL, *const_text = NULL, *table_text = NULL;
  size_t fn_len = 0, const_len = 0, table_len = 0;
  FILE *fns = open_memstream(&fn_text, &fn_len);
  FILE *consts = open_memstream(&const_text, &const_len);
  TP_ASSERT(fns && consts);
  int (*units)[3] = calloc((size_t)(2 * plan.nstages * plan.nslices) + 1, sizeof *units);
  TP_ASSERT(units);
  int nunits = 0;
  for (int s = 0; s < plan.nstages; s++) {
    for (int i = 0; i < plan.nslices; i++) units[nunits][0] = s, units[nunits][1] = 0, units[nunits++][2] = i;
    for (int i = plan.nslices - 1; i >= 0; i--) units[nunits][0] = s, units[nunits][1] = 1, units[nunits++][2] = i;
  }
  emit_units(&E, (const int(*)[3])units, nunits, fns);
  free(units);
  for (int v = 0; v < m->nvalues && E.rc == TP_OK; v++)
    if (E.referenced[v]) emit_constant(&E, v, consts);
  for (int k = 0; k < o->nprobes && E.rc == TP_OK; k++) E.rc = emit_probe(&E, k, fns, consts);
  fclose(fns);
  FILE *tables = open_memstream(&table_text, &table_len);
  TP_ASSERT(tables);
  if (E.rc == TP_OK) emit_tables(&E, tables);
  fclose(consts);
  fclose(tables);
  if (E.rc == TP_OK) {
    int64_t params = 0, arena = 0;
    for (int i = 0; i < plan.nparams; i++) params += tp_type_numel(&m->values[plan.params[i]].type);
    for (int s = 0; s < plan.nstages; s++) arena += plan.arena_bytes[s];
    fprintf(out, "/* The training step of %s,\n * generated by tokpipec %s. Do not edit.\n",
            E.o->model ? E.o->model : m->source ? m->source : "a module", E.o->version ? E.o->version : "");
    fprintf(out, " * %d stage%s, %d parameters (%lld floats), %lld arena bytes%s.\n", plan.nstages,
            plan.nstages == 1 ? "" : "s", plan.nparams, (long long)params, (long long)arena,
            m->loss < 0 ? "; forward only (no loss)" : "");
    if (m->nslices > 1) { /* passes/split_sequence.c */
      int64_t T = 0;
      fprintf(out, " * Token slices (%d):", m->nslices);
      for (int i = 0; i < m->nslices; i++) fprintf(out, "%s %lld", i ? "," : "", (long long)m->slice_len[i]), T += m->slice_len[i];
      fprintf(out, " of %lld tokens.\n", (long long)T);
    }
    if (E.o->slicing && *E.o->slicing) fprintf(out, " * (%s)\n", E.o->slicing);
    for (int k = 0; k < o->nprobes; k++)
      fprintf(out, "%s(%lld, %lld)%s", k % 8 ? " " : k ? "\n *   " : " * Profiling probes (--profile-grid), (l, c):\n *   ",
              (long long)o->probes[k].l, (long long)o->probes[k].c, k + 1 < o->nprobes ? "," : ".\n");
    if (E.target->precision)
      fprintf(out, " * Target %s, precision %s.\n", E.target->name, E.target->precision);
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
  for (int k = 0; k < o->nprobes; k++) free(E.probe[k].arena_bytes);
  free(E.probe);
  emitter_free(&E);
  tp_pipeline_free(&pipe);
  tp_memory_plan_free(&plan);
  return E.rc;
}
