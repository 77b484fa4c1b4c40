#define _GNU_SOURCE /* program_invocation_short_name */
#include "diag.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Named after the program that failed (any tool or trainer links this). */
void tp_internal_error(const char *file, int line, const char *what) {
  fprintf(stderr, "%s: internal error: %s:%d: assertion failed: %s\n", program_invocation_short_name, file, line,
          what);
  abort();
}

void tp_diag_init(TpDiag *d, const char *tool, const char *file, FILE *stream) {
  memset(d, 0, sizeof *d);
  d->tool = tool;
  d->file = file;
  d->stream = stream;
}

/* Appends to d->last at *len, truncating at its end. */
static void append(TpDiag *d, size_t *len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(d->last + *len, sizeof d->last - *len, fmt, ap);
  va_end(ap);
  if (n > 0) *len += (size_t)n < sizeof d->last - *len ? (size_t)n : sizeof d->last - 1 - *len;
}

size_t tp_utf8_length(const char *text, size_t avail) {
  const unsigned char *p = (const unsigned char *)text;
  size_t n = !avail                         ? 0
             : p[0] < 0x80                  ? 1
             : p[0] >= 0xc2 && p[0] <= 0xdf ? 2
             : p[0] >= 0xe0 && p[0] <= 0xef ? 3
             : p[0] >= 0xf0 && p[0] <= 0xf4 ? 4
                                            : 0;
  if (!n || avail < n) return 0;
  for (size_t i = 1; i < n; i++)
    if ((p[i] & 0xc0) != 0x80) return 0;
  if ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] > 0x9f) || (p[0] == 0xf0 && p[1] < 0x90) ||
      (p[0] == 0xf4 && p[1] > 0x8f))
    return 0;
  return n;
}

void tp_escape_text(char *dst, size_t dst_size, const char *src) {
  const unsigned char *s = (const unsigned char *)src;
  size_t out = 0;
  while (*s && out + 1 < dst_size) {
    size_t n = tp_utf8_length((const char *)s, strnlen((const char *)s, 4));
    if (n == 1 && (*s < 0x20 || *s == 0x7f)) n = 0;   /* a control byte */
    if (n == 2 && s[0] == 0xc2 && s[1] < 0xa0) n = 0; /* a C1 control: some terminals obey it like ESC */
    if (n == 0) {
      if (out + 5 > dst_size) break;
      snprintf(dst + out, 5, "\\x%02x", *s++);
      out += 4;
      continue;
    }
    if (out + n + 1 > dst_size) break;
    memcpy(dst + out, s, n);
    out += n;
    s += n;
  }
  dst[out] = 0;
}

void tp_json_write_string(FILE *f, const char *s) {
  fputc('"', f);
  while (*s) {
    unsigned char c = (unsigned char)*s;
    size_t n = c >= 0x80 ? tp_utf8_length(s, strnlen(s, 4)) : 0;
    if (n) fwrite(s, 1, n, f), s += n; /* UTF-8 as it is: the reader takes it */
    else if (c == '"' || c == '\\') fprintf(f, "\\%c", c), s++;
    else if (c < 32 || c > 126) fprintf(f, "\\u%04x", c), s++; /* a byte that is not UTF-8: as Latin-1 */
    else fputc(c, f), s++;
  }
  fputc('"', f);
}

static void print_escaped_line(FILE *stream, const char *fmt, va_list ap) {
  char raw[1024], line[1024];
  vsnprintf(raw, sizeof raw, fmt, ap);
  tp_escape_text(line, sizeof line, raw);
  fprintf(stream, "%s\n", line);
}

void tp_print_line(FILE *stream, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  print_escaped_line(stream, fmt, ap);
  va_end(ap);
}

int tp_vusage_error(FILE *stream, const char *tool, const char *fmt, va_list ap) {
  char msg[1024];
  vsnprintf(msg, sizeof msg, fmt, ap);
  tp_print_line(stream, "%s: error: %s", tool, msg);
  fprintf(stream, "Try '%s --help'.\n", tool);
  return TP_ERR_USAGE;
}

int tp_usage_error(FILE *stream, const char *tool, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = tp_vusage_error(stream, tool, fmt, ap);
  va_end(ap);
  return rc;
}

int tp_verror(TpDiag *d, int code, const char *prefix, const char *fmt, va_list ap) {
  size_t len = 0;
  char raw[sizeof d->last];
  d->last[0] = 0;
  if (d->file) append(d, &len, "%s: ", d->file);
  if (prefix) append(d, &len, "%s", prefix);
  vsnprintf(d->last + len, sizeof d->last - len, fmt, ap);
  memcpy(raw, d->last, sizeof raw);
  tp_escape_text(d->last, sizeof d->last, raw);
  d->errors++;
  if (d->stream)
    fprintf(d->stream, "%s: %s: %s\n", d->tool ? d->tool : "tokpipec",
            code == TP_ERR_INTERNAL ? "internal error" : "error", d->last);
  return code;
}

int tp_error(TpDiag *d, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = tp_verror(d, TP_ERR_INPUT, NULL, fmt, ap);
  va_end(ap);
  return rc;
}

int tp_internal(TpDiag *d, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = tp_verror(d, TP_ERR_INTERNAL, NULL, fmt, ap);
  va_end(ap);
  return rc;
}
