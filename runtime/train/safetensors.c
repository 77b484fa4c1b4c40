#include "safetensors.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian");

enum { MAX_HEADER = 100 << 20 }; /* the reference implementation's limit */

static const struct {
  TpDType dtype;
  const char *name;
} dtype_names[] = {
    {TP_F32, "F32"}, {TP_F16, "F16"}, {TP_BF16, "BF16"}, {TP_F64, "F64"}, {TP_I64, "I64"},
    {TP_I32, "I32"}, {TP_I16, "I16"}, {TP_I8, "I8"},     {TP_U8, "U8"},   {TP_U16, "U16"},
    {TP_U32, "U32"}, {TP_U64, "U64"}, {TP_BOOL, "BOOL"},
};

const char *tp_safetensors_dtype_name(TpDType t) {
  for (size_t i = 0; i < sizeof dtype_names / sizeof *dtype_names; i++)
    if (dtype_names[i].dtype == t) return dtype_names[i].name;
  return NULL;
}

static TpDType dtype_from_name(const char *s) {
  for (size_t i = 0; i < sizeof dtype_names / sizeof *dtype_names; i++)
    if (strcmp(dtype_names[i].name, s) == 0) return dtype_names[i].dtype;
  return TP_UNDEF;
}

/* ---- CRC-32C (Castagnoli), slicing by 8 ---- */

static uint32_t crc_table[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = c & 1 ? c >> 1 ^ 0x82f63b78u : c >> 1;
    crc_table[0][i] = c;
  }
  for (int t = 1; t < 8; t++)
    for (int i = 0; i < 256; i++)
      crc_table[t][i] = crc_table[t - 1][i] >> 8 ^ crc_table[0][crc_table[t - 1][i] & 0xff];
}

#if defined(__x86_64__)
#include <nmmintrin.h>
/* SSE4.2's crc32 instruction computes this very CRC, about ten times faster than the table
 * (a checkpoint of GPT-2 124M with its AdamW moments is 1.5 GB, checksummed on every save
 * and load). */
__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const uint8_t *p, size_t size) {
  uint64_t c = crc;
  for (; size >= 8; size -= 8, p += 8) {
    uint64_t x;
    memcpy(&x, p, 8);
    c = _mm_crc32_u64(c, x);
  }
  for (; size; size--) c = _mm_crc32_u8((uint32_t)c, *p++);
  return (uint32_t)c;
}
#endif

uint32_t tp_crc32c(uint32_t crc, const void *data, size_t size) {
  const uint8_t *p = data;
  crc = ~crc;
#if defined(__x86_64__)
  if (__builtin_cpu_supports("sse4.2")) return ~crc32c_sse42(crc, p, size);
#endif
  pthread_once(&crc_once, crc_init);
  for (; size >= 8; size -= 8, p += 8) {
    uint64_t x;
    memcpy(&x, p, 8);
    x ^= crc;
    crc = crc_table[7][x & 0xff] ^ crc_table[6][x >> 8 & 0xff] ^ crc_table[5][x >> 16 & 0xff] ^
          crc_table[4][x >> 24 & 0xff] ^ crc_table[3][x >> 32 & 0xff] ^ crc_table[2][x >> 40 & 0xff] ^
          crc_table[1][x >> 48 & 0xff] ^ crc_table[0][x >> 56];
  }
  for (; size; size--) crc = crc >> 8 ^ crc_table[0][(crc ^ *p++) & 0xff];
  return ~crc;
}

static int by_key(const void *a, const void *b) {
  return strcmp(**(const char *const *const *)a, **(const char *const *const *)b);
}

/* The CRC-32C of metadata pairs (key, value, key, value, ...; npairs of them) but the
 * checksums' own: each key and value with its NUL, in key order, so that a writer that
 * reorders the JSON object (it has no order) keeps it. */
static uint32_t meta_crc(const char *const *pairs, int npairs) {
  const char *const **sorted = malloc((size_t)(npairs ? npairs : 1) * sizeof *sorted);
  TP_ASSERT(sorted);
  int n = 0;
  for (int i = 0; i < npairs; i++)
    if (strcmp(pairs[2 * i], TP_SAFETENSORS_CRC_KEY) != 0) sorted[n++] = &pairs[2 * i];
  qsort(sorted, (size_t)n, sizeof *sorted, by_key);
  uint32_t crc = 0;
  for (int i = 0; i < n; i++)
    for (int k = 0; k < 2; k++) crc = tp_crc32c(crc, sorted[i][k], strlen(sorted[i][k]) + 1);
  free(sorted);
  return crc;
}

/* ---- writing ---- */

/* A growing text buffer. */
typedef struct {
  char *s;
  size_t len, cap;
} Buf;

static void buf_add(Buf *b, const char *s, size_t n) {
  if (b->len + n + 1 > b->cap) {
    b->cap = (b->len + n + 1) * 2;
    b->s = realloc(b->s, b->cap);
    TP_ASSERT(b->s);
  }
  memcpy(b->s + b->len, s, n);
  b->len += n;
  b->s[b->len] = 0;
}

static void buf_printf(Buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void buf_printf(Buf *b, const char *fmt, ...) {
  char tmp[128];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  TP_ASSERT(n >= 0 && (size_t)n < sizeof tmp);
  buf_add(b, tmp, (size_t)n);
}

static void buf_json_string(Buf *b, const char *s) {
  buf_add(b, "\"", 1);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') {
      char esc[2] = {'\\', (char)c};
      buf_add(b, esc, 2);
    } else if (c < 0x20) {
      buf_printf(b, "\\u%04x", c);
    } else {
      buf_add(b, (const char *)&c, 1);
    }
  }
  buf_add(b, "\"", 1);
}

static int by_name(const void *a, const void *b) {
  return strcmp(((const TpNamedTensor *)a)->name, ((const TpNamedTensor *)b)->name);
}

void tp_safetensors_write(TpAtomicFile *a, const TpNamedTensor *tensors, int n, const char *const *meta) {
  TpNamedTensor *sorted = malloc((size_t)(n ? n : 1) * sizeof *sorted);
  TP_ASSERT(sorted);
  if (n) memcpy(sorted, tensors, (size_t)n * sizeof *sorted);
  qsort(sorted, (size_t)n, sizeof *sorted, by_name);
  Buf h = {0}, crcs = {0};
  int npairs = 0;
  while (meta && meta[2 * npairs]) npairs++;
  buf_printf(&crcs, "%08" PRIx32, meta_crc(meta, npairs));
  for (int i = 0; i < n; i++)
    buf_printf(&crcs, ",%08" PRIx32, tp_crc32c(0, sorted[i].t.data, tp_tensor_bytes(&sorted[i].t)));
  buf_add(&h, "{\"__metadata__\":{", 17);
  for (int i = 0; meta && meta[i]; i += 2) {
    TP_ASSERT(strcmp(meta[i], TP_SAFETENSORS_CRC_KEY) != 0);
    buf_json_string(&h, meta[i]);
    buf_add(&h, ":", 1);
    buf_json_string(&h, meta[i + 1]);
    buf_add(&h, ",", 1);
  }
  buf_json_string(&h, TP_SAFETENSORS_CRC_KEY);
  buf_add(&h, ":", 1);
  buf_json_string(&h, crcs.s);
  buf_add(&h, "}", 1);
  free(crcs.s);
  uint64_t offset = 0;
  for (int i = 0; i < n; i++) {
    const TpTensor *t = &sorted[i].t;
    TP_ASSERT(i == 0 || strcmp(sorted[i - 1].name, sorted[i].name) != 0);
    const char *dtype = tp_safetensors_dtype_name(t->dtype);
    TP_ASSERT(dtype);
    if (h.len > 1) buf_add(&h, ",", 1);
    buf_json_string(&h, sorted[i].name);
    buf_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[", dtype);
    for (int k = 0; k < t->rank; k++) buf_printf(&h, "%s%" PRId64, k ? "," : "", t->dims[k]);
    uint64_t bytes = tp_tensor_bytes(t);
    buf_printf(&h, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", offset, offset + bytes);
    offset += bytes;
  }
  buf_add(&h, "}", 1);
  while (h.len % 8) buf_add(&h, " ", 1); /* the data starts 8-byte aligned */
  uint64_t hlen = h.len;
  tp_atomic_write(a, &hlen, 8);
  tp_atomic_write(a, h.s, h.len);
  for (int i = 0; i < n; i++) tp_atomic_write(a, sorted[i].t.data, tp_tensor_bytes(&sorted[i].t));
  free(h.s);
  free(sorted);
}

int tp_safetensors_save(const char *path, const TpNamedTensor *tensors, int n, const char *const *meta, TpDiag *d) {
  TpAtomicFile a;
  int rc = tp_atomic_open(&a, path, d);
  if (rc) return rc;
  tp_safetensors_write(&a, tensors, n, meta);
  return tp_atomic_commit(&a, d);
}

/* ---- reading ---- */

typedef struct {
  const char *p, *begin, *end;
  TpDiag *d;
} Json;

static int json_error(Json *J, const char *what) {
  return tp_error(J->d, "bad safetensors header at byte %ld: %s", (long)(J->p - J->begin) + 8, what);
}

static void ws(Json *J) {
  while (J->p < J->end && (*J->p == ' ' || *J->p == '\t' || *J->p == '\n' || *J->p == '\r')) J->p++;
}

static bool eat(Json *J, char c) {
  ws(J);
  if (J->p < J->end && *J->p == c) {
    J->p++;
    return true;
  }
  return false;
}

static void add_utf8(Buf *b, uint32_t c) {
  char u[4];
  size_t n;
  if (c < 0x80) u[0] = (char)c, n = 1;
  else if (c < 0x800) u[0] = (char)(0xc0 | c >> 6), u[1] = (char)(0x80 | (c & 0x3f)), n = 2;
  else if (c < 0x10000)
    u[0] = (char)(0xe0 | c >> 12), u[1] = (char)(0x80 | (c >> 6 & 0x3f)), u[2] = (char)(0x80 | (c & 0x3f)), n = 3;
  else
    u[0] = (char)(0xf0 | c >> 18), u[1] = (char)(0x80 | (c >> 12 & 0x3f)), u[2] = (char)(0x80 | (c >> 6 & 0x3f)),
    u[3] = (char)(0x80 | (c & 0x3f)), n = 4;
  buf_add(b, u, n);
}

static bool hex4(Json *J, uint32_t *v) {
  *v = 0;
  for (int i = 0; i < 4; i++, J->p++) {
    if (J->p >= J->end) return false;
    char c = *J->p;
    int x = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (x < 0) return false;
    *v = *v << 4 | (uint32_t)x;
  }
  return true;
}

/* A string into *out (malloc'ed, NUL-free UTF-8). */
static int string(Json *J, char **out) {
  *out = NULL;
  if (!eat(J, '"')) return json_error(J, "expected a string");
  Buf b = {0};
  buf_add(&b, "", 0);
  while (J->p < J->end && *J->p != '"') {
    char c = *J->p++;
    if ((unsigned char)c < 0x20) break;
    if (c != '\\') {
      buf_add(&b, &c, 1);
      continue;
    }
    if (J->p >= J->end) break;
    c = *J->p++;
    const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t", *at = strchr(from, c);
    uint32_t u, lo;
    if (c && at) {
      buf_add(&b, &to[at - from], 1);
    } else if (c == 'u' && hex4(J, &u)) {
      if (u >= 0xd800 && u < 0xdc00 && J->end - J->p >= 6 && J->p[0] == '\\' && J->p[1] == 'u') {
        J->p += 2;
        if (!hex4(J, &lo) || lo < 0xdc00 || lo > 0xdfff) break;
        u = 0x10000 + ((u - 0xd800) << 10) + (lo - 0xdc00);
      }
      if (u == 0 || (u >= 0xd800 && u < 0xe000)) break;
      add_utf8(&b, u);
    } else {
      break;
    }
  }
  if (J->p >= J->end || *J->p != '"') {
    free(b.s);
    return json_error(J, "bad string");
  }
  J->p++;
  *out = b.s;
  return TP_OK;
}

static int integer(Json *J, int64_t *out) {
  ws(J);
  int64_t v = 0;
  const char *start = J->p;
  while (J->p < J->end && *J->p >= '0' && *J->p <= '9') {
    if (v > (INT64_MAX - 9) / 10) return json_error(J, "number too large");
    v = v * 10 + (*J->p++ - '0');
  }
  if (J->p == start) return json_error(J, "expected a non-negative integer");
  *out = v;
  return TP_OK;
}

/* [n, n, ...] with at most `max` numbers. */
static int int_list(Json *J, int64_t *out, int max, int *n) {
  *n = 0;
  if (!eat(J, '[')) return json_error(J, "expected '['");
  if (eat(J, ']')) return TP_OK;
  do {
    if (*n == max) return json_error(J, "list too long");
    int rc = integer(J, &out[(*n)++]);
    if (rc) return rc;
  } while (eat(J, ','));
  return eat(J, ']') ? TP_OK : json_error(J, "expected ']'");
}

/* Any JSON value, ignored (unknown fields). */
static int skip_value(Json *J, int depth) {
  ws(J);
  if (J->p >= J->end) return json_error(J, "unexpected end");
  if (depth > 64) return json_error(J, "nested too deeply");
  char c = *J->p, *s;
  if (c == '"') {
    int rc = string(J, &s);
    free(s);
    return rc;
  }
  if (c == '{' || c == '[') {
    char close = c == '{' ? '}' : ']';
    J->p++;
    if (eat(J, close)) return TP_OK;
    do {
      int rc;
      if (c == '{') {
        if ((rc = string(J, &s))) return rc;
        free(s);
        if (!eat(J, ':')) return json_error(J, "expected ':'");
      }
      if ((rc = skip_value(J, depth + 1))) return rc;
    } while (eat(J, ','));
    return eat(J, close) ? TP_OK : json_error(J, "bad object or list");
  }
  const char *start = J->p; /* number, true, false, null */
  while (J->p < J->end && strchr("+-.0123456789eEtruefalsn", *J->p)) J->p++;
  return J->p > start ? TP_OK : json_error(J, "unexpected character");
}

typedef struct {
  char *name;
  TpDType dtype;
  int rank;
  int64_t dims[TP_MAX_RANK];
  int64_t begin, end;
} Entry;

static int entry(Json *J, Entry *e) {
  bool have_dtype = false, have_shape = false, have_offsets = false;
  int rc;
  if (!eat(J, '{')) return json_error(J, "expected '{'");
  if (eat(J, '}')) return json_error(J, "empty tensor entry");
  do {
    char *key;
    if ((rc = string(J, &key))) return rc;
    if (!eat(J, ':')) rc = json_error(J, "expected ':'");
    else if (strcmp(key, "dtype") == 0) {
      char *s;
      if (!(rc = string(J, &s))) {
        e->dtype = dtype_from_name(s);
        if (e->dtype == TP_UNDEF) rc = tp_error(J->d, "tensor '%s' has unsupported dtype '%s'", e->name, s);
        free(s);
      }
      have_dtype = true;
    } else if (strcmp(key, "shape") == 0) {
      rc = int_list(J, e->dims, TP_MAX_RANK, &e->rank);
      have_shape = true;
    } else if (strcmp(key, "data_offsets") == 0) {
      int64_t off[2];
      int n;
      if (!(rc = int_list(J, off, 2, &n)) && n != 2) rc = json_error(J, "data_offsets needs two numbers");
      e->begin = off[0], e->end = off[1];
      have_offsets = true;
    } else {
      rc = skip_value(J, 1);
    }
    free(key);
    if (rc) return rc;
  } while (eat(J, ','));
  if (!eat(J, '}')) return json_error(J, "expected '}'");
  if (!have_dtype || !have_shape || !have_offsets)
    return tp_error(J->d, "tensor '%s' lacks dtype, shape or data_offsets", e->name);
  return TP_OK;
}

static int metadata(Json *J, TpSafetensors *st) {
  if (!eat(J, '{')) return json_error(J, "__metadata__ must be an object");
  if (eat(J, '}')) return TP_OK;
  do {
    char *k, *v;
    int rc = string(J, &k);
    if (rc) return rc;
    if (!eat(J, ':')) rc = json_error(J, "expected ':'");
    else rc = string(J, &v);
    if (!rc && tp_safetensors_meta(st, k)) {
      free(v);
      rc = tp_error(J->d, "metadata key '%s' is listed twice", k);
    }
    if (rc) {
      free(k);
      return rc;
    }
    st->meta = realloc(st->meta, (size_t)(st->nmeta + 1) * 2 * sizeof *st->meta);
    TP_ASSERT(st->meta);
    st->meta[2 * st->nmeta] = k;
    st->meta[2 * st->nmeta + 1] = v;
    st->nmeta++;
  } while (eat(J, ','));
  return eat(J, '}') ? TP_OK : json_error(J, "expected '}'");
}

static int by_begin(const void *a, const void *b) {
  int64_t x = ((const Entry *)a)->begin, y = ((const Entry *)b)->begin;
  return x < y ? -1 : x > y;
}

static int by_entry_name(const void *a, const void *b) {
  return strcmp(((const Entry *)a)->name, ((const Entry *)b)->name);
}

/* Parses the header and checks every entry against the data size. */
static int parse_header(Json *J, int64_t data_size, Entry **out, int *count, TpSafetensors *st) {
  Entry *es = NULL;
  int n = 0, rc = TP_OK;
  if (!eat(J, '{')) {
    rc = json_error(J, "expected '{'");
  } else if (!eat(J, '}')) {
    do {
      char *key;
      if ((rc = string(J, &key))) break;
      if (!eat(J, ':')) {
        free(key);
        rc = json_error(J, "expected ':'");
        break;
      }
      if (strcmp(key, "__metadata__") == 0) {
        free(key);
        if ((rc = metadata(J, st))) break;
        continue;
      }
      es = realloc(es, (size_t)(n + 1) * sizeof *es);
      TP_ASSERT(es);
      memset(&es[n], 0, sizeof *es);
      es[n++].name = key;
      if ((rc = entry(J, &es[n - 1]))) break;
    } while (eat(J, ','));
    if (!rc && !eat(J, '}')) rc = json_error(J, "expected '}'");
  }
  if (!rc) {
    ws(J);
    if (J->p != J->end) rc = json_error(J, "text after the header object");
  }
  for (int i = 0; i < n && !rc; i++) {
    Entry *e = &es[i];
    int64_t numel = 1;
    for (int k = 0; k < e->rank; k++) {
      if (e->dims[k] && numel > INT64_MAX / 16 / e->dims[k]) {
        rc = tp_error(J->d, "tensor '%s' is too large", e->name);
        break;
      }
      numel *= e->dims[k];
    }
    if (rc) break;
    int64_t bytes = numel * (int64_t)tp_dtype_size(e->dtype);
    if (e->begin > e->end || e->end > data_size)
      rc = tp_error(J->d,
                    "tensor '%s' has data_offsets [%" PRId64 ", %" PRId64 "] outside the %" PRId64 " data bytes",
                    e->name, e->begin, e->end, data_size);
    else if (e->end - e->begin != bytes)
      rc = tp_error(J->d, "tensor '%s' has %" PRId64 " data bytes, its shape needs %" PRId64, e->name,
                    e->end - e->begin, bytes);
  }
  if (!rc && n > 1) {
    qsort(es, (size_t)n, sizeof *es, by_begin);
    int last = -1; /* the non-empty tensor ending last so far */
    for (int i = 0; i < n && !rc; i++) {
      if (es[i].begin == es[i].end) continue;
      if (last >= 0 && es[i].begin < es[last].end)
        rc = tp_error(J->d, "tensors '%s' and '%s' overlap", es[last].name, es[i].name);
      if (last < 0 || es[i].end > es[last].end) last = i;
    }
    qsort(es, (size_t)n, sizeof *es, by_entry_name);
    for (int i = 1; i < n && !rc; i++)
      if (strcmp(es[i].name, es[i - 1].name) == 0) rc = tp_error(J->d, "tensor '%s' is listed twice", es[i].name);
  }
  *out = es;
  *count = n;
  return rc;
}

bool tp_crc32c_parse(const char *text, uint32_t *out) {
  *out = 0;
  for (int i = 0; i < 8; i++) {
    char c = text[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
    *out = *out << 4 | (uint32_t)(c <= '9' ? c - '0' : c - 'a' + 10);
  }
  return true;
}

/* Checksum k of a list of 8 lowercase hex digits each, comma-separated, into *out; false
 * if malformed. */
static bool crc_entry(const char *list, int k, uint32_t *out) {
  const char *p = list + (size_t)k * 9;
  return tp_crc32c_parse(p, out) && (p[8] == ',' || p[8] == 0);
}

int tp_safetensors_verify(const TpSafetensors *st, TpDiag *d) {
  const char *list = tp_safetensors_meta(st, TP_SAFETENSORS_CRC_KEY);
  if (!list) return TP_OK;
  uint32_t stored, have;
  bool ok = strlen(list) == (size_t)(st->n + 1) * 9 - 1;
  for (int i = 0; ok && i <= st->n; i++) ok = crc_entry(list, i, &stored);
  if (!ok)
    return tp_error(d,
                    "metadata '%s' is not %d checksums (8 lowercase hex digits each, comma-separated): "
                    "one of the metadata, one per tensor",
                    TP_SAFETENSORS_CRC_KEY, st->n + 1);
  crc_entry(list, 0, &stored);
  if ((have = meta_crc((const char *const *)st->meta, st->nmeta)) != stored)
    return tp_error(d,
                    "the metadata fails its CRC-32C check (stored %08" PRIx32 ", computed %08" PRIx32
                    "): the file is corrupt",
                    stored, have);
  for (int i = 0; i < st->n; i++) {
    const TpNamedTensor *t = &st->tensors[i];
    crc_entry(list, i + 1, &stored);
    have = tp_crc32c(0, t->t.data, tp_tensor_bytes(&t->t));
    if (have != stored)
      return tp_error(d,
                      "tensor '%s' fails its CRC-32C check (stored %08" PRIx32 ", computed %08" PRIx32
                      "): the file is corrupt",
                      t->name, stored, have);
  }
  return TP_OK;
}

int tp_safetensors_parse(const void *bytes, size_t size, TpSafetensors *st, TpDiag *d) {
  memset(st, 0, sizeof *st);
  const uint8_t *buf = bytes;
  Entry *es = NULL;
  int n = 0, rc = TP_OK;
  uint64_t hlen = 0;
  if (size < 8) return tp_error(d, "not a safetensors file: %zu bytes, shorter than its 8-byte header length", size);
  memcpy(&hlen, buf, 8);
  if (hlen > (uint64_t)size - 8 || hlen > MAX_HEADER)
    return tp_error(d, "not a safetensors file: header length %" PRIu64 " exceeds the file (%zu bytes)", hlen, size);
  Json J = {(const char *)buf + 8, (const char *)buf + 8, (const char *)buf + 8 + hlen, d};
  const uint8_t *data = buf + 8 + hlen;
  if ((rc = parse_header(&J, (int64_t)(size - 8 - hlen), &es, &n, st))) goto done;
  st->tensors = calloc((size_t)(n ? n : 1), sizeof *st->tensors);
  TP_ASSERT(st->tensors);
  for (int i = 0; i < n; i++) { /* each tensor gets its own aligned copy */
    TpNamedTensor *t = &st->tensors[i];
    size_t bytes = (size_t)(es[i].end - es[i].begin);
    t->name = es[i].name;
    es[i].name = NULL;
    t->t = (TpTensor){.dtype = es[i].dtype, .rank = es[i].rank};
    memcpy(t->t.dims, es[i].dims, sizeof t->t.dims);
    t->t.data = malloc(bytes ? bytes : 1);
    TP_ASSERT(t->t.data);
    if (bytes) memcpy(t->t.data, data + es[i].begin, bytes);
    st->n++;
  }
done:
  for (int i = 0; i < n; i++) free(es[i].name);
  free(es);
  if (rc) tp_safetensors_free(st);
  return rc;
}

int tp_safetensors_load(const char *path, TpSafetensors *st, TpDiag *d) {
  memset(st, 0, sizeof *st);
  const char *file = d->file;
  d->file = path;
  char why[256];
  size_t size;
  char *buf = tp_read_input(path, &size, why, sizeof why);
  int rc = buf ? tp_safetensors_parse(buf, size, st, d) : tp_error(d, "cannot read: %s", why);
  free(buf);
  if (!rc && (rc = tp_safetensors_verify(st, d))) tp_safetensors_free(st);
  d->file = file;
  return rc;
}

const TpTensor *tp_safetensors_find(const TpSafetensors *st, const char *name) {
  int lo = 0, hi = st->n - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2, c = strcmp(st->tensors[mid].name, name);
    if (c == 0) return &st->tensors[mid].t;
    if (c < 0) lo = mid + 1;
    else hi = mid - 1;
  }
  return NULL;
}

const char *tp_safetensors_meta(const TpSafetensors *st, const char *key) {
  for (int i = 0; i < st->nmeta; i++)
    if (strcmp(st->meta[2 * i], key) == 0) return st->meta[2 * i + 1];
  return NULL;
}

void tp_safetensors_free(TpSafetensors *st) {
  for (int i = 0; i < st->n; i++) {
    free((char *)st->tensors[i].name);
    free(st->tensors[i].t.data);
  }
  for (int i = 0; i < 2 * st->nmeta; i++) free(st->meta[i]);
  free(st->tensors);
  free(st->meta);
  memset(st, 0, sizeof *st);
}
