#include "tokens.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../base/atomic.h"
#include "safetensors.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token files are little-endian");

enum { HEADER_BYTES = TP_TOKENS_HEADER_INTS * 4, SCAN_TOKENS = 1 << 16 };

/* Errors about f's file name it. */
static int file_error(const TpTokenFile *f, TpDiag *d, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int file_error(const TpTokenFile *f, TpDiag *d, const char *fmt, ...) {
  const char *file = d->file;
  d->file = f->path;
  va_list ap;
  va_start(ap, fmt);
  int rc = tp_verror(d, TP_ERR_INPUT, NULL, fmt, ap);
  va_end(ap);
  d->file = file;
  return rc;
}

/* size bytes at offset, or how many there were before the end of the file (-1: errno). */
static int64_t read_at(int fd, void *buf, size_t size, int64_t offset) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = pread(fd, (char *)buf + done, size - done, (off_t)offset + (off_t)done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    if (n == 0) break;
    done += (size_t)n;
  }
  return (int64_t)done;
}

/* Room for n tokens in f->window. */
static int reserve(TpTokenFile *f, int64_t n, TpDiag *d) {
  if (n <= f->window_cap) return TP_OK;
  uint16_t *w = (uint64_t)n <= SIZE_MAX / 2 ? realloc(f->window, (size_t)n * 2) : NULL;
  if (!w) return file_error(f, d, "cannot allocate %" PRId64 " bytes for a batch of its tokens", n * 2);
  f->window = w, f->window_cap = n;
  return TP_OK;
}

/* Tokens [pos, pos + n) (no wrap-around) into out, each checked against the limit. */
static int read_tokens(TpTokenFile *f, int64_t pos, int64_t n, uint16_t *out, TpDiag *d) {
  int64_t offset = HEADER_BYTES + pos * 2, got = read_at(f->fd, out, (size_t)n * 2, offset);
  if (got < 0) return file_error(f, d, "cannot read: %s", strerror(errno));
  if (got < n * 2)
    return file_error(f, d,
                      "the file was truncated while in use: %" PRId64 " bytes at offset %" PRId64
                      " are gone (it held %" PRId64 " tokens)",
                      n * 2 - got, offset + got, f->count);
  for (int64_t i = 0; i < n; i++)
    if (out[i] >= f->limit) {
      char vocab[64];
      snprintf(vocab, sizeof vocab, "the model's vocabulary of %" PRId64, f->limit);
      return file_error(f, d, "token %u at position %" PRId64 " is outside %s", out[i], pos + i,
                        f->limit_of ? f->limit_of : vocab);
    }
  return TP_OK;
}

int tp_tokens_open(const char *path, int64_t limit, const char *limit_of, int64_t min_tokens, TpTokenFile *f,
                   TpDiag *d) {
  memset(f, 0, sizeof *f);
  f->path = path;
  f->limit = limit;
  f->limit_of = limit_of;
  char why[256];
  struct stat st;
  int rc = TP_OK;
  int32_t h[TP_TOKENS_HEADER_INTS];
  int64_t got;
  f->fd = tp_open_input(path, why, sizeof why);
  if (f->fd < 0) return file_error(f, d, "cannot read: %s", why);
  if (fstat(f->fd, &st) != 0) {
    rc = file_error(f, d, "cannot read: %s", strerror(errno));
  } else if (st.st_size < HEADER_BYTES) {
    rc = file_error(f, d, "not a token file: %lld bytes, shorter than the %d-byte header", (long long)st.st_size,
                    HEADER_BYTES);
  } else if ((got = read_at(f->fd, h, sizeof h, 0)) != (int64_t)sizeof h) {
    rc = file_error(f, d, "cannot read the header: %s", got < 0 ? strerror(errno) : "the file was truncated");
  } else if (h[0] != TP_TOKENS_MAGIC) {
    rc = file_error(f, d, "not a token file: magic %d, expected %d (llm.c's format)", h[0], TP_TOKENS_MAGIC);
  } else if (h[1] != TP_TOKENS_VERSION) {
    rc = file_error(f, d, "token file version %d is not supported (expected %d: uint16 tokens)", h[1],
                    TP_TOKENS_VERSION);
  } else if (h[2] < 0 || (st.st_size - HEADER_BYTES) != (int64_t)h[2] * 2) {
    rc = file_error(f, d, "the header says %d tokens but the file holds %lld bytes of tokens", h[2],
                    (long long)(st.st_size - HEADER_BYTES));
  } else if ((f->count = h[2]) < min_tokens) {
    rc = file_error(f, d, "%" PRId64 " tokens are too few: a batch needs %" PRId64 " (batch * seq + 1)", f->count,
                    min_tokens);
  }
  for (int64_t pos = 0; !rc && pos < f->count; pos += SCAN_TOKENS) {
    int64_t n = f->count - pos < SCAN_TOKENS ? f->count - pos : SCAN_TOKENS;
    if (!(rc = reserve(f, n, d)) && !(rc = read_tokens(f, pos, n, f->window, d)))
      f->crc32c = tp_crc32c(f->crc32c, f->window, (size_t)n * 2);
  }
  if (rc) tp_tokens_close(f);
  return rc;
}

void tp_tokens_close(TpTokenFile *f) {
  if (f->path && f->fd >= 0) close(f->fd); /* path: opened (a zeroed f holds fd 0) */
  free(f->window);
  memset(f, 0, sizeof *f);
}

int tp_tokens_batch(TpTokenFile *f, int64_t pos, int64_t B, int64_t T, int64_t *inputs, int64_t *targets,
                    TpDiag *d) {
  int64_t n = B * T + 1, first = f->count - pos < n ? f->count - pos : n;
  int rc = reserve(f, n, d);
  if (!rc) rc = read_tokens(f, pos, first, f->window, d);
  /* the rest wraps around to the start, as many times as the window is longer than the file */
  for (int64_t k = first; !rc && k < n; k += f->count)
    rc = read_tokens(f, 0, n - k < f->count ? n - k : f->count, f->window + k, d);
  if (rc) return rc;
  for (int64_t i = 0; i + 1 < n; i++) inputs[i] = f->window[i], targets[i] = f->window[i + 1];
  return TP_OK;
}

int tp_tokens_write(const char *path, const uint16_t *tokens, int64_t count, TpDiag *d) {
  if (count > INT32_MAX) return tp_error(d, "%" PRId64 " tokens do not fit a token file (at most 2^31 - 1)", count);
  int32_t header[TP_TOKENS_HEADER_INTS] = {TP_TOKENS_MAGIC, TP_TOKENS_VERSION, (int32_t)count};
  TpAtomicFile a;
  int rc = tp_atomic_open(&a, path, d);
  if (rc) return rc;
  tp_atomic_write(&a, header, sizeof header);
  tp_atomic_write(&a, tokens, (size_t)count * 2);
  return tp_atomic_commit(&a, d);
}
