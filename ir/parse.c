/* The textual IR ("tir") parser: reads what ir/print.c writes (the grammar is described
 * there) back into a module. One statement per line; `//` starts a comment. Operands may
 * name values defined further down (they are resolved at the end), so a use before its
 * definition parses and is left to the verifier to report. The first error stops parsing
 * and is reported as "file:LINE:COL: message"; bad text never crashes the parser.
 *
 * Trust: a .tir file is treated like an ONNX model with external data. Its `blob` lines
 * name files relative to the .tir file's own folder (the current folder for stdin), and
 * only files inside it: no absolute path, no '..', no symlink leading out
 * (tp_add_folder_blob, the rule of ONNX external data). Constant folding prints blob bytes
 * into its output, so a .tir from elsewhere must not reach files outside its folder.
 * Text parsed without a path (tp_parse_module with path NULL) may name no blob at all.
 * A folder the user names (tp_parse_file's blob_dir, the tools' --blob-dir) replaces the
 * .tir file's own, with the same confinement: IR written away from its model (tokpipe-opt
 * model.onnx -o elsewhere/x.tir) reads back with --blob-dir naming the model's folder. */
#include "ir.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A name read before the value it names was defined, resolved at the end. */
enum { FIX_OUTPUT = -1, FIX_LOSS = -2, FIX_GRAD_PARAM = -3, FIX_GRAD = -4 };
typedef struct {
  int op;   /* op index, or FIX_*: a graph output, the loss, a grad line's param or grad */
  int slot; /* operand index, graph output index, or grad line number */
  const char *name;
  size_t pos;
} Fixup;

/* A `grad %param = %grad` line; -2 while a name is unresolved. */
typedef struct {
  int param, grad;
  size_t pos;
} GradLine;

typedef struct {
  const char *text; /* NUL-terminated copy of the input */
  size_t len, pos;
  const char *path;
  char *dir;      /* the folder blob files lie in, or NULL: blobs refused */
  bool dir_given; /* dir is the user's --blob-dir, not the IR file's folder */
  TpDiag *d;
  TpModule *m;
  bool failed;
  char *word; /* the last word or string read (scratch, reused) */
  size_t word_cap;
  int *file_blobs; /* printed blob number -> module blob index */
  int nfile_blobs;
  Fixup *fixups;
  int nfixups, cap_fixups;
  bool has_loss;
  GradLine *grads;
  int ngrads;
} Parser;

static int fail_at(Parser *p, size_t pos, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* "path:LINE:COL" of a position in the text. */
static void location(const Parser *p, size_t pos, char *buf, size_t n) {
  int line = 1;
  size_t line_start = 0;
  for (size_t i = 0; i < pos && i < p->len; i++)
    if (p->text[i] == '\n') line++, line_start = i + 1;
  snprintf(buf, n, "%s:%d:%d", p->path, line, (int)(pos - line_start) + 1);
}

static int fail_at(Parser *p, size_t pos, const char *fmt, ...) {
  if (p->failed) return TP_ERR_INPUT;
  p->failed = true;
  char where[512], msg[400];
  location(p, pos, where, sizeof where);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  const char *file = p->d->file;
  p->d->file = where;
  tp_error(p->d, "%s", msg);
  p->d->file = file;
  return TP_ERR_INPUT;
}

/* An error at the next token. */
#define fail(p, ...) (skip_space(p), fail_at((p), (p)->pos, __VA_ARGS__))

static char peek(Parser *p) { return p->pos < p->len ? p->text[p->pos] : 0; }

/* Skips blanks and a trailing comment, never the end of the line. */
static void skip_space(Parser *p) {
  for (;;) {
    char c = peek(p);
    if (c == ' ' || c == '\t' || c == '\r') {
      p->pos++;
    } else if (c == '/' && p->pos + 1 < p->len && p->text[p->pos + 1] == '/') {
      while (p->pos < p->len && p->text[p->pos] != '\n') p->pos++;
    } else {
      return;
    }
  }
}

static bool accept(Parser *p, char c) {
  skip_space(p);
  if (peek(p) != c) return false;
  p->pos++;
  return true;
}

static int expect(Parser *p, char c) {
  if (accept(p, c)) return TP_OK;
  return fail(p, "expected '%c'", c);
}

static bool is_word_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.';
}

static void word_push(Parser *p, size_t n, char c) {
  if (n + 1 >= p->word_cap) {
    p->word_cap = p->word_cap ? 2 * p->word_cap : 64;
    p->word = realloc(p->word, p->word_cap);
    TP_ASSERT(p->word);
  }
  p->word[n] = c;
  p->word[n + 1] = 0;
}

static int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* A quoted string into p->word. */
static int parse_string(Parser *p) {
  skip_space(p);
  if (peek(p) != '"') return fail(p, "expected a quoted string");
  size_t start = p->pos++;
  size_t n = 0;
  word_push(p, 0, 0);
  for (;;) {
    char c = peek(p);
    if (c == 0 || c == '\n') return fail_at(p, start, "unterminated string");
    p->pos++;
    if (c == '"') return TP_OK;
    if (c == '\\') {
      size_t at = p->pos - 1;
      char e = peek(p);
      p->pos++;
      if (e == '"' || e == '\\') {
        c = e;
      } else if (e == 'n') {
        c = '\n';
      } else if (e == 't') {
        c = '\t';
      } else if (e == 'x' && hex_digit(peek(p)) >= 0 && p->pos + 1 < p->len && hex_digit(p->text[p->pos + 1]) >= 0) {
        c = (char)(hex_digit(p->text[p->pos]) * 16 + hex_digit(p->text[p->pos + 1]));
        p->pos += 2;
        if (c == 0) return fail_at(p, at, "NUL byte in string");
      } else {
        return fail_at(p, at, "bad escape in string");
      }
    }
    word_push(p, n++, c);
  }
}

/* A bare word [A-Za-z0-9_.]+ or a quoted string, into p->word. */
static int parse_word(Parser *p, const char *what) {
  skip_space(p);
  if (peek(p) == '"') return parse_string(p);
  if (!is_word_char(peek(p))) return fail(p, "expected %s", what);
  size_t n = 0;
  while (is_word_char(peek(p))) word_push(p, n++, p->text[p->pos++]);
  return TP_OK;
}

/* True if the next bare word is `kw`. */
static bool at_keyword(Parser *p, const char *kw) {
  skip_space(p);
  size_t n = strlen(kw);
  if (p->pos + n > p->len || memcmp(p->text + p->pos, kw, n) != 0) return false;
  return p->pos + n == p->len || !is_word_char(p->text[p->pos + n]);
}

static bool accept_keyword(Parser *p, const char *kw) {
  if (!at_keyword(p, kw)) return false;
  p->pos += strlen(kw);
  return true;
}

static int expect_keyword(Parser *p, const char *kw) {
  if (accept_keyword(p, kw)) return TP_OK;
  return fail(p, "expected '%s'", kw);
}

/* The text of a number: [-+]digits[.digits][e[-+]digits], or [-]inf, nan. Sets *is_float. */
static int number_text(Parser *p, char *buf, size_t n, bool *is_float) {
  skip_space(p);
  size_t start = p->pos, i = p->pos;
  const char *t = p->text;
  *is_float = false;
  if (t[i] == '-' || t[i] == '+') i++;
  if (strncmp(t + i, "inf", 3) == 0 || strncmp(t + i, "nan", 3) == 0) {
    i += 3;
    *is_float = true;
  } else {
    size_t digits = 0;
    while (t[i] >= '0' && t[i] <= '9') i++, digits++;
    if (t[i] == '.') {
      *is_float = true;
      for (i++; t[i] >= '0' && t[i] <= '9'; i++) digits++;
    }
    if (digits == 0) return fail(p, "expected a number");
    if (t[i] == 'e' || t[i] == 'E') {
      *is_float = true;
      i++;
      if (t[i] == '-' || t[i] == '+') i++;
      if (!(t[i] >= '0' && t[i] <= '9')) return fail_at(p, i, "bad exponent");
      while (t[i] >= '0' && t[i] <= '9') i++;
    }
  }
  if (is_word_char(t[i])) return fail_at(p, start, "bad number");
  if (i - start >= n) return fail_at(p, start, "number too long");
  memcpy(buf, t + start, i - start);
  buf[i - start] = 0;
  p->pos = i;
  return TP_OK;
}

static int parse_int(Parser *p, int64_t *v) {
  char buf[64];
  bool is_float;
  size_t at = (skip_space(p), p->pos);
  if (number_text(p, buf, sizeof buf, &is_float)) return TP_ERR_INPUT;
  if (is_float) return fail_at(p, at, "expected an integer, got '%s'", buf);
  errno = 0;
  long long x = strtoll(buf, NULL, 10);
  if (errno == ERANGE) return fail_at(p, at, "integer '%s' out of range", buf);
  *v = x;
  return TP_OK;
}

/* An integer in [lo, hi]. */
static int parse_int_in(Parser *p, int64_t lo, int64_t hi, const char *what, int64_t *v) {
  size_t at = (skip_space(p), p->pos);
  if (parse_int(p, v)) return TP_ERR_INPUT;
  if (*v < lo || *v > hi)
    return fail_at(p, at, "%s %lld out of range [%lld, %lld]", what, (long long)*v, (long long)lo, (long long)hi);
  return TP_OK;
}

static int parse_float(Parser *p, double *v) {
  char buf[64];
  bool is_float;
  size_t at = (skip_space(p), p->pos);
  if (number_text(p, buf, sizeof buf, &is_float)) return TP_ERR_INPUT;
  const char *s = buf + (buf[0] == '-' || buf[0] == '+');
  if (strcmp(s, "nan") == 0) *v = NAN;
  else if (strcmp(s, "inf") == 0) *v = buf[0] == '-' ? -INFINITY : INFINITY;
  else *v = strtod(buf, NULL);
  if (isinf(*v) && strcmp(s, "inf") != 0) return fail_at(p, at, "number '%s' out of range", buf);
  return TP_OK;
}

static int expect_eol(Parser *p) {
  skip_space(p);
  if (p->pos >= p->len) return TP_OK;
  if (peek(p) != '\n') return fail(p, "expected end of line");
  p->pos++;
  return TP_OK;
}

/* ---- types, origins, values ---- */

/* Elements of a type: -1 if a dim is unknown, -2 if the non-zero dims make 2^40 or more
 * (bounding the dims of an empty tensor too). */
static int64_t known_numel(const TpType *t) {
  int64_t n = 1;
  bool empty = false;
  for (int i = 0; i < t->rank; i++) {
    if (t->dims[i] < 0) return -1;
    if (t->dims[i] && n > (INT64_C(1) << 40) / t->dims[i]) return -2;
    if (t->dims[i]) n *= t->dims[i];
    empty |= t->dims[i] == 0;
  }
  return empty ? 0 : n;
}

/* dtype[dim, name=dim, ...] or `?` for a type not inferred yet. */
static int parse_type(Parser *p, TpType *t) {
  memset(t, 0, sizeof *t);
  if (accept(p, '?')) return TP_OK;
  size_t at = (skip_space(p), p->pos);
  if (parse_word(p, "a type")) return TP_ERR_INPUT;
  t->dtype = tp_dtype_from_name(p->word);
  if (t->dtype == TP_UNDEF) return fail_at(p, at, "unknown element type '%s'", p->word);
  if (expect(p, '[')) return TP_ERR_INPUT;
  if (accept(p, ']')) return TP_OK;
  do {
    skip_space(p);
    if (t->rank == TP_MAX_RANK) return fail(p, "rank above %d", TP_MAX_RANK);
    char c = peek(p);
    if (!(c >= '0' && c <= '9') && c != '?') {
      if (parse_word(p, "a dimension")) return TP_ERR_INPUT;
      t->dimnames[t->rank] = tp_strdup(p->m, p->word);
      if (expect(p, '=')) return TP_ERR_INPUT;
    }
    int64_t dim = -1;
    if (!accept(p, '?') && parse_int_in(p, 0, INT64_MAX, "dimension", &dim)) return TP_ERR_INPUT;
    t->dims[t->rank++] = dim;
  } while (accept(p, ','));
  if (known_numel(t) == -2) return fail_at(p, at, "tensor too large (its non-zero dims multiply to 2^40 or more)");
  return expect(p, ']');
}

/* loc("node" OpType), loc(none OpType), loc("node"), loc(); absent = no origin. */
static int parse_origin(Parser *p, TpOrigin *o, bool *present) {
  memset(o, 0, sizeof *o);
  *present = accept_keyword(p, "loc");
  if (!*present) return TP_OK;
  if (expect(p, '(')) return TP_ERR_INPUT;
  if (accept(p, ')')) return TP_OK;
  if (!accept_keyword(p, "none")) {
    if (parse_string(p)) return TP_ERR_INPUT;
    o->node = tp_strdup(p->m, p->word);
  }
  if (accept(p, ')')) return TP_OK;
  if (parse_word(p, "an op type")) return TP_ERR_INPUT;
  o->op_type = tp_strdup(p->m, p->word);
  return expect(p, ')');
}

/* %name or %"quoted name" into p->word. */
static int parse_value_name(Parser *p) {
  skip_space(p);
  if (peek(p) != '%') return fail(p, "expected a value name (%%name)");
  p->pos++;
  if (peek(p) != '"' && !is_word_char(peek(p))) return fail(p, "expected a value name after '%%'");
  return parse_word(p, "a value name");
}

/* A new value's name: must not be taken. */
static int parse_new_value_name(Parser *p, const char **name) {
  size_t at = (skip_space(p), p->pos);
  if (parse_value_name(p)) return TP_ERR_INPUT;
  if (tp_find_value(p->m, p->word) >= 0) return fail_at(p, at, "redefinition of value %%%s", p->word);
  *name = tp_strdup(p->m, p->word);
  return TP_OK;
}

static void add_fixup(Parser *p, int op, int slot, const char *name, size_t pos) {
  if (p->nfixups == p->cap_fixups) {
    p->cap_fixups = p->cap_fixups ? 2 * p->cap_fixups : 16;
    p->fixups = realloc(p->fixups, (size_t)p->cap_fixups * sizeof *p->fixups);
    TP_ASSERT(p->fixups);
  }
  p->fixups[p->nfixups++] = (Fixup){op, slot, name, pos};
}

/* A use of a value: its index, -1 for `none` (if allowed), or -2 = resolve at the end. */
static int parse_use(Parser *p, bool allow_none, int *v, size_t *at) {
  *at = (skip_space(p), p->pos);
  if (allow_none && accept_keyword(p, "none")) {
    *v = -1;
    return TP_OK;
  }
  if (parse_value_name(p)) return TP_ERR_INPUT;
  *v = tp_find_value(p->m, p->word);
  if (*v < 0) *v = -2;
  return TP_OK;
}

/* ---- constant data ---- */

static int parse_elem(Parser *p, TpDType dt, uint8_t *dst) {
  size_t at = (skip_space(p), p->pos);
  if (dt == TP_BOOL) {
    if (accept_keyword(p, "true")) *dst = 1;
    else if (accept_keyword(p, "false")) *dst = 0;
    else return fail(p, "expected true or false");
    return TP_OK;
  }
  if (tp_dtype_is_float(dt)) {
    double v;
    if (parse_float(p, &v)) return TP_ERR_INPUT;
    float f = (float)v;
    if (dt != TP_F64 && isinf(f) && !isinf(v))
      return fail_at(p, at, "number out of range for %s", tp_dtype_name(dt));
    uint16_t h;
    switch (dt) {
    case TP_F64: memcpy(dst, &v, 8); break;
    case TP_F32: memcpy(dst, &f, 4); break;
    case TP_F16:
      h = tp_f32_to_f16(f);
      memcpy(dst, &h, 2);
      break;
    default:
      h = tp_f32_to_bf16(f);
      memcpy(dst, &h, 2);
      break;
    }
    return TP_OK;
  }
  if (dt == TP_U64) { /* the one type beyond int64 */
    char buf[64];
    bool is_float;
    if (number_text(p, buf, sizeof buf, &is_float)) return TP_ERR_INPUT;
    errno = 0;
    unsigned long long x = strtoull(buf, NULL, 10);
    if (is_float || buf[0] == '-' || errno == ERANGE) return fail_at(p, at, "bad u64 '%s'", buf);
    uint64_t u = x;
    memcpy(dst, &u, 8);
    return TP_OK;
  }
  int64_t lo, hi, x;
  switch (dt) {
  case TP_U8: lo = 0, hi = UINT8_MAX; break;
  case TP_I8: lo = INT8_MIN, hi = INT8_MAX; break;
  case TP_U16: lo = 0, hi = UINT16_MAX; break;
  case TP_I16: lo = INT16_MIN, hi = INT16_MAX; break;
  case TP_U32: lo = 0, hi = UINT32_MAX; break;
  case TP_I32: lo = INT32_MIN, hi = INT32_MAX; break;
  default: lo = INT64_MIN, hi = INT64_MAX; break;
  }
  if (parse_int_in(p, lo, hi, tp_dtype_name(dt), &x)) return TP_ERR_INPUT;
  uint8_t u8 = (uint8_t)x;
  uint16_t u16 = (uint16_t)x;
  uint32_t u32 = (uint32_t)x;
  switch (tp_dtype_size(dt)) {
  case 1: memcpy(dst, &u8, 1); break;
  case 2: memcpy(dst, &u16, 2); break;
  case 4: memcpy(dst, &u32, 4); break;
  default: memcpy(dst, &x, 8); break;
  }
  return TP_OK;
}

/* After `dense<`: one element (filling the tensor), [e, e, ...], or 0x<bytes>; then '>'. */
static int parse_dense(Parser *p, const TpType *t, uint8_t *data, int64_t numel) {
  size_t size = tp_dtype_size(t->dtype);
  skip_space(p);
  if (peek(p) == '0' && p->pos + 1 < p->len && p->text[p->pos + 1] == 'x') {
    p->pos += 2;
    int64_t n = 0;
    while (hex_digit(peek(p)) >= 0) {
      size_t at = p->pos;
      int hi = hex_digit(p->text[p->pos++]), lo = hex_digit(peek(p));
      if (lo < 0) return fail(p, "odd number of hex digits");
      p->pos++;
      if (n == numel * (int64_t)size) return fail_at(p, at, "more than %lld bytes of data", (long long)n);
      data[n++] = (uint8_t)(hi * 16 + lo);
    }
    if (n != numel * (int64_t)size)
      return fail(p, "%lld bytes of data for a type of %lld bytes", (long long)n,
                  (long long)(numel * (int64_t)size));
  } else if (accept(p, '[')) {
    int64_t n = 0;
    if (!accept(p, ']')) {
      do {
        if (n == numel) return fail(p, "more than %lld elements", (long long)numel);
        if (parse_elem(p, t->dtype, data + n++ * size)) return TP_ERR_INPUT;
      } while (accept(p, ','));
      if (expect(p, ']')) return TP_ERR_INPUT;
    }
    if (n != numel) return fail(p, "%lld elements for a type of %lld", (long long)n, (long long)numel);
  } else {
    if (numel > 0 && parse_elem(p, t->dtype, data)) return TP_ERR_INPUT;
    for (int64_t have = 1; have < numel; have *= 2) /* doubling copies: a big splat fills fast */
      memcpy(data + have * size, data, (size_t)(have < numel - have ? have : numel - have) * size);
  }
  return expect(p, '>');
}

/* (axis=A, parts=P, ranks=N[, chunks=C][, pad=K]) after `@shard`, at `at`; parts, ranks and
 * chunks >= 1, the axis and pad >= 0. */
static int parse_shard(Parser *p, TpValueKind kind, size_t at, TpShard *shard) {
  if (kind != TP_VAL_PARAM) return fail_at(p, at, "a const cannot be @shard: only a param is split over ranks");
  static const char *const keys[] = {"axis", "parts", "ranks", "chunks", "pad"};
  int64_t v[5] = {0, 0, 0, 1, 0};
  if (expect(p, '(')) return TP_ERR_INPUT;
  for (int k = 0; k < 5; k++) {
    if (k >= 3) { /* chunks and pad are optional, in that order */
      if (!accept(p, ',')) break;
      if (k == 3 && !at_keyword(p, keys[3])) k = 4;
    } else if (k > 0 && expect(p, ',')) {
      return TP_ERR_INPUT;
    }
    if (expect_keyword(p, keys[k]) || expect(p, '=') || parse_int_in(p, k > 0 && k < 4, 1 << 20, keys[k], &v[k]))
      return TP_ERR_INPUT;
  }
  *shard =
      (TpShard){.axis = (int)v[0], .parts = (int)v[1], .ranks = (int)v[2], .chunks = (int)v[3], .pad = (int)v[4]};
  return expect(p, ')');
}

/* @tied(%param) after a param's data: the param it is a tied copy of, defined above it;
 * *tied stays -1 without one. Then @shard(axis=A, parts=P, ranks=N[, chunks=C]): how the
 * param is split over the tensor group (TpShard; the verifier checks the numbers). */
static int parse_tied(Parser *p, TpValueKind kind, int *tied, TpShard *shard) {
  static const char *const kind_names[] = {"an input", "a param", "a const", "an op's result"};
  *tied = -1;
  *shard = (TpShard){0};
  size_t at = (skip_space(p), p->pos);
  if (!accept(p, '@')) return TP_OK;
  if (accept_keyword(p, "shard")) return parse_shard(p, kind, at, shard);
  if (!accept_keyword(p, "tied")) return fail(p, "expected 'tied' or 'shard' after '@'");
  if (kind != TP_VAL_PARAM) return fail_at(p, at, "a const cannot be @tied: only a param can be a tied copy");
  if (expect(p, '(')) return TP_ERR_INPUT;
  size_t name_at = (skip_space(p), p->pos);
  if (parse_value_name(p)) return TP_ERR_INPUT;
  int v = tp_find_value(p->m, p->word);
  if (v < 0) return fail_at(p, name_at, "@tied(%%%s): no value of that name is defined above", p->word);
  if (p->m->values[v].kind != TP_VAL_PARAM)
    return fail_at(p, name_at, "@tied(%%%s): %%%s is %s, not a param", p->word, p->word,
                   kind_names[p->m->values[v].kind]);
  *tied = v;
  if (expect(p, ')')) return TP_ERR_INPUT;
  at = (skip_space(p), p->pos);
  if (!accept(p, '@')) return TP_OK;
  if (!accept_keyword(p, "shard")) return fail(p, "expected 'shard' after '@'");
  return parse_shard(p, kind, at, shard);
}

/* param|const %name : type = [dtype] blob N offset O size S | [dtype] dense<...>  [@tied(%p)] [loc(...)]
 * (a param's data may have another dtype than its type: TpValue.data_dtype) */
static int parse_data_value(Parser *p, TpValueKind kind) {
  const char *name;
  TpType t;
  if (parse_new_value_name(p, &name) || expect(p, ':')) return TP_ERR_INPUT;
  size_t type_at = (skip_space(p), p->pos);
  if (parse_type(p, &t) || expect(p, '=')) return TP_ERR_INPUT;
  int64_t numel = known_numel(&t);
  if (t.dtype == TP_UNDEF || numel == -1)
    return fail_at(p, type_at, "constant data needs a type with known dimensions");
  skip_space(p);
  size_t data_at = p->pos;
  TpType stored = t; /* the data's dtype: the type's unless named before it */
  if (!at_keyword(p, "blob") && !at_keyword(p, "dense")) {
    if (parse_word(p, "'blob', 'dense' or a dtype")) return TP_ERR_INPUT;
    stored.dtype = tp_dtype_from_name(p->word);
    if (stored.dtype == TP_UNDEF)
      return fail_at(p, data_at, "expected 'blob', 'dense' or a dtype, got '%s'", p->word);
    if (kind != TP_VAL_PARAM) return fail_at(p, data_at, "a constant's data has its type's dtype");
    skip_space(p);
    data_at = p->pos;
  }
  int64_t bytes = numel * (int64_t)tp_dtype_size(stored.dtype), file_blob = -1;
  int blob;
  int64_t offset = 0;
  if (accept_keyword(p, "blob")) {
    int64_t n, size;
    if (parse_int_in(p, 0, p->nfile_blobs - 1, "blob number", &n) || expect_keyword(p, "offset") ||
        parse_int_in(p, 0, INT64_MAX, "offset", &offset) || expect_keyword(p, "size"))
      return TP_ERR_INPUT;
    size_t size_at = (skip_space(p), p->pos);
    if (parse_int(p, &size)) return TP_ERR_INPUT;
    if (size != bytes)
      return fail_at(p, size_at, "size %lld does not match the type (%lld bytes)", (long long)size,
                     (long long)bytes);
    blob = p->file_blobs[n], file_blob = n;
  } else if (accept_keyword(p, "dense")) {
    if (expect(p, '<')) return TP_ERR_INPUT;
    /* the largest constant tokpipec makes itself is 256 MiB (importer; folding: 64 MiB): a
       bigger splat is a few bytes of text that would cost seconds and gigabytes */
    if (bytes > (INT64_C(1) << 28)) return fail_at(p, type_at, "inline constant above 256 MiB");
    uint8_t *data = calloc(1, bytes ? (size_t)bytes : 1);
    if (!data) return fail_at(p, type_at, "out of memory for an inline constant");
    int rc = parse_dense(p, &stored, data, numel);
    if (rc) {
      free(data);
      return rc;
    }
    blob = tp_add_blob(p->m, (TpBlob){.base = data, .size = (size_t)bytes, .owned = true}); /* no second copy */
  } else {
    return fail(p, "expected 'blob' or 'dense'");
  }
  TpOrigin o;
  bool present;
  int tied;
  TpShard shard;
  if (parse_tied(p, kind, &tied, &shard) || parse_origin(p, &o, &present)) return TP_ERR_INPUT;
  /* the file holds a padded vocabulary's true rows only (TpShard.pad; verify checks the rest) */
  int64_t along = shard.pad > 0 && shard.axis >= 0 && shard.axis < t.rank ? t.dims[shard.axis] : 0;
  int64_t held = along > shard.pad ? bytes / along * (along - shard.pad) : bytes;
  if (file_blob >= 0 &&
      ((uint64_t)offset > p->m->blobs[blob].size || (uint64_t)held > p->m->blobs[blob].size - (uint64_t)offset))
    return fail_at(p, data_at, "bytes [%lld, %lld) lie outside blob %lld (%zu bytes)", (long long)offset,
                   (long long)(offset + held), (long long)file_blob, p->m->blobs[blob].size);
  int v = tp_add_data_value(p->m, name, kind, t, blob, offset, o);
  p->m->values[v].tied = tied;
  p->m->values[v].shard = shard;
  if (stored.dtype != t.dtype) p->m->values[v].data_dtype = stored.dtype;
  return TP_OK;
}

/* ---- ops ---- */

static int parse_attrs(Parser *p, int op) {
  if (!accept(p, '{')) return TP_OK;
  if (accept(p, '}')) return TP_OK;
  do {
    size_t at = (skip_space(p), p->pos);
    if (parse_word(p, "an attribute name")) return TP_ERR_INPUT;
    if (tp_get_attr(p->m, op, p->word)) return fail_at(p, at, "duplicate attribute '%s'", p->word);
    const char *name = tp_strdup(p->m, p->word);
    if (expect(p, '=')) return TP_ERR_INPUT;
    skip_space(p);
    if (peek(p) == '"') {
      if (parse_string(p)) return TP_ERR_INPUT;
      tp_set_attr_string(p->m, op, name, p->word);
    } else if (accept(p, '[')) {
      int64_t *v = NULL;
      int n = 0, cap = 0, rc = TP_OK;
      if (!accept(p, ']')) {
        do {
          if (n == cap) {
            cap = cap ? 2 * cap : 8;
            v = realloc(v, (size_t)cap * sizeof *v);
            TP_ASSERT(v);
          }
          rc = parse_int(p, &v[n++]);
        } while (rc == TP_OK && accept(p, ','));
        if (rc == TP_OK) rc = expect(p, ']');
      }
      if (rc == TP_OK) tp_set_attr_ints(p->m, op, name, v, n);
      free(v);
      if (rc) return rc;
    } else {
      char buf[64];
      bool is_float;
      size_t num_at = p->pos;
      if (number_text(p, buf, sizeof buf, &is_float)) return TP_ERR_INPUT;
      p->pos = num_at; /* re-read it as what it is */
      if (is_float) {
        double f;
        if (parse_float(p, &f)) return TP_ERR_INPUT;
        tp_set_attr_float(p->m, op, name, f);
      } else {
        int64_t i;
        if (parse_int(p, &i)) return TP_ERR_INPUT;
        tp_set_attr_int(p->m, op, name, i);
      }
    }
  } while (accept(p, ','));
  return expect(p, '}');
}

/* @stage(S) @slice(K) @backward @weight and one role (@boundary, @retie, @recompute), in any
 * order, each at most once. */
static int parse_placement(Parser *p, int op) {
  bool seen[5] = {false, false, false, false, false};
  while (accept(p, '@')) {
    size_t at = p->pos - 1;
    int which = accept_keyword(p, "stage")      ? 0
                : accept_keyword(p, "slice")    ? 1
                : accept_keyword(p, "backward") ? 2
                : accept_keyword(p, "weight")   ? 4
                                                : -1;
    TpOpRole role = TP_ROLE_COMPUTE;
    for (int r = TP_ROLE_COMPUTE + 1; which < 0 && r < TP_ROLE_COUNT; r++)
      if (accept_keyword(p, tp_op_role_names[r])) which = 3, role = (TpOpRole)r;
    if (which < 0)
      return fail(p, "expected stage, slice, backward or weight after '@', or a role (boundary, retie, recompute)");
    if (seen[which])
      return fail_at(p, at,
                     which == 3 ? "an op has one role: @boundary, @retie or @recompute" : "placement given twice");
    seen[which] = true;
    if (which == 2) {
      p->m->ops[op].phase = TP_PHASE_BACKWARD;
      continue;
    }
    if (which == 3) {
      p->m->ops[op].role = role;
      continue;
    }
    if (which == 4) {
      p->m->ops[op].weight = true;
      continue;
    }
    int64_t n;
    if (expect(p, '(') || parse_int_in(p, 0, INT32_MAX, which ? "slice" : "stage", &n) || expect(p, ')'))
      return TP_ERR_INPUT;
    if (which == 0) p->m->ops[op].stage = (int)n;
    else p->m->ops[op].slice = (int)n;
  }
  return TP_OK;
}

enum { MAX_RESULTS = 64, MAX_OPERANDS = 64 };

/* results = Op(operands) {attrs} loc(...) */
static int parse_op(Parser *p) {
  const char *names[MAX_RESULTS];
  TpType types[MAX_RESULTS];
  TpOrigin origins[MAX_RESULTS];
  bool has_origin[MAX_RESULTS];
  int nres = 0;
  do {
    size_t at = (skip_space(p), p->pos);
    if (nres == MAX_RESULTS) return fail(p, "more than %d results", MAX_RESULTS);
    has_origin[nres] = false;
    if (accept_keyword(p, "none")) {
      names[nres++] = NULL;
      continue;
    }
    if (parse_new_value_name(p, &names[nres]) || expect(p, ':') || parse_type(p, &types[nres])) return TP_ERR_INPUT;
    for (int i = 0; i < nres; i++)
      if (names[i] && strcmp(names[i], names[nres]) == 0)
        return fail_at(p, at, "redefinition of value %%%s", names[nres]);
    if (parse_origin(p, &origins[nres], &has_origin[nres])) return TP_ERR_INPUT;
    nres++;
  } while (accept(p, ','));
  if (expect(p, '=')) return TP_ERR_INPUT;
  size_t kind_at = (skip_space(p), p->pos);
  if (parse_word(p, "an op name")) return TP_ERR_INPUT;
  TpOpKind kind = tp_op_from_name(p->word);
  if (kind == TP_OP_COUNT) return fail_at(p, kind_at, "unknown op '%s'", p->word);
  if (expect(p, '(')) return TP_ERR_INPUT;
  int inputs[MAX_OPERANDS], nin = 0;
  size_t input_at[MAX_OPERANDS];
  const char *input_names[MAX_OPERANDS];
  if (!accept(p, ')')) {
    do {
      if (nin == MAX_OPERANDS) return fail(p, "more than %d operands", MAX_OPERANDS);
      if (parse_use(p, true, &inputs[nin], &input_at[nin])) return TP_ERR_INPUT;
      input_names[nin] = inputs[nin] == -2 ? tp_strdup(p->m, p->word) : NULL;
      nin++;
    } while (accept(p, ','));
    if (expect(p, ')')) return TP_ERR_INPUT;
  }
  /* Operands not defined yet are resolved at the end; -1 stands in until then. */
  int known[MAX_OPERANDS];
  for (int i = 0; i < nin; i++) known[i] = inputs[i] == -2 ? -1 : inputs[i];
  int op = tp_add_op(p->m, kind, known, nin, names, nres, (TpOrigin){0});
  for (int i = 0; i < nin; i++)
    if (inputs[i] == -2) add_fixup(p, op, i, input_names[i], input_at[i]);
  if (parse_attrs(p, op) || parse_placement(p, op)) return TP_ERR_INPUT;
  TpOrigin o;
  bool present;
  if (parse_origin(p, &o, &present)) return TP_ERR_INPUT;
  TpOp *opp = &p->m->ops[op];
  opp->origin = o;
  for (int i = 0; i < nres; i++) {
    int v = opp->outputs[i];
    if (v < 0) continue;
    p->m->values[v].type = types[i];
    p->m->values[v].origin = has_origin[i] ? origins[i] : o;
  }
  return TP_OK;
}

/* ---- statements ---- */

static int parse_header(Parser *p) {
  int64_t version, opset;
  if (expect_keyword(p, "tir")) return TP_ERR_INPUT;
  size_t at = (skip_space(p), p->pos);
  if (parse_int(p, &version)) return TP_ERR_INPUT;
  if (version != 1) return fail_at(p, at, "unsupported tir version %lld (this reads 1)", (long long)version);
  if (expect_keyword(p, "opset") || parse_int_in(p, 0, 1000, "opset", &opset)) return TP_ERR_INPUT;
  p->m->opset = (int)opset;
  p->m->source = NULL;
  if (accept_keyword(p, "source")) {
    if (parse_string(p)) return TP_ERR_INPUT;
    p->m->source = tp_strdup(p->m, p->word);
  }
  return expect_eol(p);
}

static int parse_blob(Parser *p) {
  int64_t n;
  size_t at = (skip_space(p), p->pos);
  if (parse_int(p, &n)) return TP_ERR_INPUT;
  if (n != p->nfile_blobs) return fail_at(p, at, "expected blob %d next", p->nfile_blobs);
  size_t path_at = (skip_space(p), p->pos);
  if (parse_string(p)) return TP_ERR_INPUT;
  if (!p->dir) return fail_at(p, path_at, "blob files are refused here (the text has no folder)");
  if (!*p->word) return fail_at(p, path_at, "blob file name is empty");
  char why[300];
  int blob = tp_add_folder_blob(p->m, p->dir, p->word,
                                p->dir_given ? "the --blob-dir folder" : "the IR file's folder", why, sizeof why);
  char missing[128];
  snprintf(missing, sizeof missing, "cannot be opened: %s", strerror(ENOENT));
  if (blob < 0 && !p->dir_given && strcmp(why, missing) == 0) {
    /* not there: most likely written away from its model, so say where blobs may be */
    char *from = p->m->source ? tp_folder_of(p->m->source) : NULL;
    int rc = fail_at(p, path_at,
                     "blob file '%s' %s; blob files are read from the IR file's folder '%s': pass --blob-dir "
                     "DIR naming the folder that holds it%s%s%s",
                     p->word, why, p->dir, from ? " (the IR was printed from '" : "", from ? p->m->source : "",
                     from ? "')" : "");
    free(from);
    return rc;
  }
  if (blob < 0) return fail_at(p, path_at, "blob file '%s' %s", p->word, why);
  p->file_blobs = realloc(p->file_blobs, (size_t)(p->nfile_blobs + 1) * sizeof *p->file_blobs);
  TP_ASSERT(p->file_blobs);
  p->file_blobs[p->nfile_blobs++] = blob;
  return TP_OK;
}

/* grad %param = %gradient */
static int parse_grad(Parser *p) {
  GradLine g = {.pos = (skip_space(p), p->pos)};
  size_t at;
  int line = p->ngrads;
  p->grads = realloc(p->grads, (size_t)(line + 1) * sizeof *p->grads);
  TP_ASSERT(p->grads);
  if (parse_use(p, false, &g.param, &at)) return TP_ERR_INPUT;
  if (g.param < 0) add_fixup(p, FIX_GRAD_PARAM, line, tp_strdup(p->m, p->word), at);
  if (expect(p, '=') || parse_use(p, false, &g.grad, &at)) return TP_ERR_INPUT;
  if (g.grad < 0) add_fixup(p, FIX_GRAD, line, tp_strdup(p->m, p->word), at);
  p->grads[p->ngrads++] = g;
  return TP_OK;
}

static int parse_statement(Parser *p) {
  skip_space(p);
  if (accept_keyword(p, "blob")) return parse_blob(p);
  if (accept_keyword(p, "param")) return parse_data_value(p, TP_VAL_PARAM);
  if (accept_keyword(p, "const")) return parse_data_value(p, TP_VAL_CONST);
  if (accept_keyword(p, "input")) {
    const char *name;
    TpType t;
    TpOrigin o;
    bool present;
    if (parse_new_value_name(p, &name) || expect(p, ':') || parse_type(p, &t) || parse_origin(p, &o, &present))
      return TP_ERR_INPUT;
    tp_add_input(p->m, tp_add_value(p->m, name, TP_VAL_INPUT, t, o));
    return TP_OK;
  }
  if (accept_keyword(p, "output")) {
    int v;
    size_t at;
    if (parse_use(p, false, &v, &at)) return TP_ERR_INPUT;
    tp_add_output(p->m, v < 0 ? 0 : v);
    if (v < 0) add_fixup(p, FIX_OUTPUT, p->m->noutputs - 1, tp_strdup(p->m, p->word), at);
    return TP_OK;
  }
  if (accept_keyword(p, "loss")) {
    int v;
    size_t at;
    if (p->has_loss) return fail(p, "the loss is given twice");
    if (parse_use(p, false, &v, &at)) return TP_ERR_INPUT;
    p->has_loss = true;
    p->m->loss = v;
    if (v < 0) add_fixup(p, FIX_LOSS, 0, tp_strdup(p->m, p->word), at);
    return TP_OK;
  }
  if (accept_keyword(p, "grad")) return parse_grad(p);
  if (peek(p) == '%' || at_keyword(p, "none")) return parse_op(p);
  return fail(p, "expected a statement (blob, input, param, const, output, loss, grad or an op)");
}

static int parse_all(Parser *p) {
  while (skip_space(p), accept(p, '\n')) {} /* leading blank and comment lines */
  if (parse_header(p)) return TP_ERR_INPUT;
  for (;;) {
    skip_space(p);
    if (p->pos >= p->len) break;
    if (accept(p, '\n')) continue;
    if (peek(p) == 0) return fail(p, "unexpected NUL byte");
    if (parse_statement(p) || expect_eol(p)) return TP_ERR_INPUT;
  }
  for (int i = 0; i < p->nfixups; i++) {
    Fixup *f = &p->fixups[i];
    int v = tp_find_value(p->m, f->name);
    if (v < 0) return fail_at(p, f->pos, "use of undefined value %%%s", f->name);
    switch (f->op) {
    case FIX_OUTPUT: p->m->outputs[f->slot] = v; break;
    case FIX_LOSS: p->m->loss = v; break;
    case FIX_GRAD_PARAM: p->grads[f->slot].param = v; break;
    case FIX_GRAD: p->grads[f->slot].grad = v; break;
    default: p->m->ops[f->op].inputs[f->slot] = v; break;
    }
  }
  for (int i = 0; i < p->ngrads; i++) { /* the verifier checks kinds and types */
    const GradLine *g = &p->grads[i];
    if (tp_grad_of(p->m, g->param) >= 0)
      return fail_at(p, g->pos, "second gradient of %%%s", p->m->values[g->param].name);
    tp_set_grad(p->m, g->param, g->grad);
  }
  return TP_OK;
}

/* blob_dir: as tp_parse_file's; only with a path */
static int parse_text(const char *text, size_t len, const char *path, const char *blob_dir, TpModule **out,
                      TpDiag *d) {
  char *copy = malloc(len + 1);
  TP_ASSERT(copy);
  memcpy(copy, text, len);
  copy[len] = 0;
  Parser p = {.text = copy, .len = len, .path = path ? path : "<input>", .d = d};
  if (path) p.dir = blob_dir ? strdup(blob_dir) : tp_folder_of(path); /* blob files lie there */
  p.dir_given = path && blob_dir;
  TP_ASSERT(!path || p.dir);
  p.m = tp_module_new(NULL);
  int rc = parse_all(&p);
  if (rc == TP_OK && p.failed) rc = TP_ERR_INPUT;
  free(copy);
  free(p.dir);
  free(p.word);
  free(p.file_blobs);
  free(p.fixups);
  free(p.grads);
  if (rc) {
    tp_module_free(p.m);
    *out = NULL;
    return rc;
  }
  *out = p.m;
  return TP_OK;
}

int tp_parse_module(const char *text, size_t len, const char *path, TpModule **out, TpDiag *d) {
  return parse_text(text, len, path, NULL, out, d);
}

int tp_parse_file(const char *path, const char *blob_dir, TpModule **out, TpDiag *d) {
  *out = NULL;
  if (strcmp(path, "-") == 0) { /* stdin: whatever it is, the user asked for it */
    char *text = NULL;
    size_t len = 0, cap = 0, n;
    do {
      if (len == cap) {
        cap = cap ? 2 * cap : 1 << 16;
        text = realloc(text, cap);
        TP_ASSERT(text);
      }
      n = fread(text + len, 1, cap - len, stdin);
      len += n;
    } while (n > 0);
    int rc = ferror(stdin) ? tp_error(d, "cannot read stdin") : parse_text(text, len, "<stdin>", blob_dir, out, d);
    free(text);
    return rc;
  }
  char why[256];
  size_t len;
  char *text = tp_read_input(path, &len, why, sizeof why); /* a FIFO is refused, not waited on */
  if (!text) return tp_error(d, "cannot open '%s': %s", path, why);
  int rc = parse_text(text, len, path, blob_dir, out, d);
  free(text);
  return rc;
}
