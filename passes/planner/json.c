#include "json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ir/ir.h"

typedef struct {
  const char *p, *end, *start;
  char *err;
  size_t errsize;
  int depth;
} Parser;

static bool fail(Parser *ps, const char *what) {
  if (ps->err[0]) return false; /* keep the first message */
  int line = 1;
  for (const char *q = ps->start; q < ps->p && q < ps->end; q++) line += *q == '\n';
  snprintf(ps->err, ps->errsize, "line %d: %s", line, what);
  return false;
}

static void skip_space(Parser *ps) {
  while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')) ps->p++;
}

static bool literal(Parser *ps, const char *word) {
  size_t n = strlen(word);
  if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0) return false;
  ps->p += n;
  return true;
}

/* Strings: escapes are decoded; \uXXXX below 0x80 becomes that byte, others '?' (the
 * planner's files only hold names). Raw bytes must be UTF-8. */
static bool parse_string(Parser *ps, char **out) {
  ps->p++; /* opening quote */
  size_t cap = 16, n = 0;
  char *s = malloc(cap);
  TP_ASSERT(s);
  while (ps->p < ps->end && *ps->p != '"') {
    char c = *ps->p;
    size_t len = tp_utf8_length(ps->p, (size_t)(ps->end - ps->p));
    if ((unsigned char)c < 0x20) {
      free(s);
      return fail(ps, "control character in string");
    }
    if (!len) {
      free(s);
      return fail(ps, "invalid UTF-8 in string");
    }
    if (len > 1) { /* copied whole */
      if (n + len + 1 > cap) s = realloc(s, cap = 2 * cap + len);
      TP_ASSERT(s);
      memcpy(s + n, ps->p, len);
      n += len;
      ps->p += len;
      continue;
    }
    ps->p++;
    if (c == '\\') {
      if (ps->p >= ps->end) break;
      char e = *ps->p++;
      switch (e) {
      case 'n': c = '\n'; break;
      case 't': c = '\t'; break;
      case 'r': c = '\r'; break;
      case 'b': c = '\b'; break;
      case 'f': c = '\f'; break;
      case '"':
      case '\\':
      case '/': c = e; break;
      case 'u': {
        unsigned v = 0;
        for (int i = 0; i < 4; i++) {
          char h = ps->p < ps->end ? *ps->p++ : 0;
          int d = h >= '0' && h <= '9'   ? h - '0'
                  : h >= 'a' && h <= 'f' ? h - 'a' + 10
                  : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                         : -1;
          if (d < 0) {
            free(s);
            return fail(ps, "bad \\u escape");
          }
          v = v * 16 + (unsigned)d;
        }
        c = v < 0x80 ? (char)v : '?';
        break;
      }
      default: free(s); return fail(ps, "bad escape in string");
      }
    }
    if (n + 2 > cap) s = realloc(s, cap *= 2);
    TP_ASSERT(s);
    s[n++] = c;
  }
  if (ps->p >= ps->end) {
    free(s);
    return fail(ps, "unterminated string");
  }
  ps->p++;
  s[n] = 0;
  *out = s;
  return true;
}

static int compare_keys(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Two members of one object with the same name: which one a reader takes would be a guess.
 * Sorted copies of the names, so a large object costs n log n. */
static bool check_duplicates(Parser *ps, const TpJson *v) {
  if (v->count < 2) return true;
  const char **keys = malloc(sizeof *keys * (size_t)v->count);
  TP_ASSERT(keys);
  for (int i = 0; i < v->count; i++) keys[i] = v->items[i].key;
  qsort(keys, (size_t)v->count, sizeof *keys, compare_keys);
  const char *dup = NULL;
  for (int i = 1; i < v->count && !dup; i++)
    if (!strcmp(keys[i - 1], keys[i])) dup = keys[i];
  bool ok = true;
  if (dup) {
    char what[128], name[80];
    tp_escape_text(name, sizeof name, dup);
    snprintf(what, sizeof what, "member \"%.60s\" appears twice in one object", name);
    ok = fail(ps, what);
  }
  free(keys);
  return ok;
}

static bool parse_value(Parser *ps, TpJson *v);

static bool parse_items(Parser *ps, TpJson *v, char close, bool keyed) {
  ps->p++;
  int cap = 0;
  skip_space(ps);
  if (ps->p < ps->end && *ps->p == close) {
    ps->p++;
    return true;
  }
  for (;;) {
    if (v->count == cap) {
      cap = cap ? cap * 2 : 8;
      v->items = realloc(v->items, (size_t)cap * sizeof *v->items);
      TP_ASSERT(v->items);
    }
    TpJson *item = &v->items[v->count];
    memset(item, 0, sizeof *item);
    skip_space(ps);
    if (keyed) {
      if (ps->p >= ps->end || *ps->p != '"') return fail(ps, "expected a member name");
      if (!parse_string(ps, &item->key)) return false;
      skip_space(ps);
      if (ps->p >= ps->end || *ps->p != ':') {
        free(item->key);
        return fail(ps, "expected ':'");
      }
      ps->p++;
    }
    v->count++; /* counted before parsing so a failure frees what was read */
    if (!parse_value(ps, item)) return false;
    skip_space(ps);
    if (ps->p < ps->end && *ps->p == ',') {
      ps->p++;
      continue;
    }
    if (ps->p < ps->end && *ps->p == close) {
      ps->p++;
      return !keyed || check_duplicates(ps, v);
    }
    return fail(ps, keyed ? "expected ',' or '}'" : "expected ',' or ']'");
  }
}

static size_t digits(const char *p, const char *end) {
  size_t n = 0;
  while (p + n < end && p[n] >= '0' && p[n] <= '9') n++;
  return n;
}

/* JSON's number grammar exactly: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?, and the
 * value must be a finite double (no NaN, Infinity or 1e999). */
static bool parse_number(Parser *ps, TpJson *v) {
  const char *p = ps->p, *end = ps->end;
  p += p < end && *p == '-';
  size_t n = digits(p, end);
  if (n == 0 || (n > 1 && *p == '0')) return fail(ps, "bad number");
  p += n;
  if (p < end && *p == '.') {
    if (!(n = digits(++p, end))) return fail(ps, "bad number");
    p += n;
  }
  if (p < end && (*p == 'e' || *p == 'E')) {
    p++;
    p += p < end && (*p == '+' || *p == '-');
    if (!(n = digits(p, end))) return fail(ps, "bad number");
    p += n;
  }
  char buf[512];
  if ((size_t)(p - ps->p) >= sizeof buf) return fail(ps, "number longer than 511 characters");
  memcpy(buf, ps->p, (size_t)(p - ps->p));
  buf[p - ps->p] = 0;
  v->kind = TP_JSON_NUMBER;
  v->number = strtod(buf, NULL);
  if (!isfinite(v->number)) return fail(ps, "number out of range");
  ps->p = p;
  return true;
}

static bool parse_value(Parser *ps, TpJson *v) {
  skip_space(ps);
  if (ps->p >= ps->end) return fail(ps, "unexpected end of input");
  if (++ps->depth > 64) return fail(ps, "nesting deeper than 64");
  bool ok = true;
  char c = *ps->p;
  if (c == '{') {
    v->kind = TP_JSON_OBJECT;
    ok = parse_items(ps, v, '}', true);
  } else if (c == '[') {
    v->kind = TP_JSON_ARRAY;
    ok = parse_items(ps, v, ']', false);
  } else if (c == '"') {
    v->kind = TP_JSON_STRING;
    ok = parse_string(ps, &v->string);
  } else if (literal(ps, "null")) v->kind = TP_JSON_NULL;
  else if (literal(ps, "true")) {
    v->kind = TP_JSON_BOOL;
    v->number = 1;
  } else if (literal(ps, "false")) v->kind = TP_JSON_BOOL;
  else if (c == '-' || (c >= '0' && c <= '9')) ok = parse_number(ps, v);
  else ok = fail(ps, "unexpected character");
  ps->depth--;
  return ok;
}
static void free_items(TpJson *j) {
  for (int i = 0; i < j->count; i++) free_items(&j->items[i]);
  free(j->items);
  free(j->string);
  free(j->key);
}

void tp_json_free(TpJson *j) {
  if (!j) return;
  free_items(j);
  free(j);
}

TpJson *tp_json_parse(const char *text, size_t len, char *err, size_t errsize) {
  Parser ps = {text, text + len, text, err, errsize, 0};
  err[0] = 0;
  TpJson *root = calloc(1, sizeof *root);
  bool ok = parse_value(&ps, root);
  if (ok) {
    skip_space(&ps);
    if (ps.p != ps.end) ok = fail(&ps, "text after the JSON value");
  }
  if (!ok) {
    tp_json_free(root);
    return NULL;
  }
  return root;
}

TpJson *tp_json_parse_file(const char *path, char *err, size_t errsize) {
  struct stat st; /* refused before it is read into memory; tp_read_input refuses FIFOs */
  if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > TP_JSON_MAX_BYTES) {
    snprintf(err, errsize, "larger than %d MiB (%lld bytes)", TP_JSON_MAX_BYTES >> 20, (long long)st.st_size);
    return NULL;
  }
  size_t n;
  char why[256];
  char *text = tp_read_input(path, &n, why, sizeof why);
  if (!text) {
    snprintf(err, errsize, "cannot open: %s", why);
    return NULL;
  }
  TpJson *j = NULL;
  if (n > TP_JSON_MAX_BYTES) snprintf(err, errsize, "larger than %d MiB", TP_JSON_MAX_BYTES >> 20);
  else j = tp_json_parse(text, n, err, errsize);
  free(text);
  return j;
}

const TpJson *tp_json_get(const TpJson *j, const char *key) {
  if (!j || j->kind != TP_JSON_OBJECT) return NULL;
  for (int i = 0; i < j->count; i++)
    if (strcmp(j->items[i].key, key) == 0) return &j->items[i];
  return NULL;
}

double tp_json_number(const TpJson *j, const char *key, double fallback, bool *ok) {
  const TpJson *v = tp_json_get(j, key);
  if (!v) return fallback;
  if (v->kind != TP_JSON_NUMBER) {
    if (ok) *ok = false;
    return fallback;
  }
  return v->number;
}
