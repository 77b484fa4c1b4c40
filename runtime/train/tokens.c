#include "tokens.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "atomic.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token files are little-endian");

enum { HEADER_BYTES = TP_TOKENS_HEADER_INTS * 4 };

int tp_tokens_open(const char *path, int64_t vocab, int64_t min_tokens, TpTokenFile *f, TpDiag *d) {
  memset(f, 0, sizeof *f);
  const char *file = d->file;
  d->file = path;
  int rc = TP_OK;
  struct stat st;
  int fd = open(path, O_RDONLY);
  if (fd < 0 || fstat(fd, &st) != 0) {
    rc = tp_error(d, "cannot read: %s", strerror(errno));
    goto done;
  }
  if (!S_ISREG(st.st_mode)) {
    rc = tp_error(d, "not a regular file");
    goto done;
  }
  if (st.st_size < HEADER_BYTES) {
    rc = tp_error(d, "not a token file: %lld bytes, shorter than the %d-byte header",
                  (long long)st.st_size, HEADER_BYTES);
    goto done;
  }
  f->map_size = (size_t)st.st_size;
  f->map = mmap(NULL, f->map_size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (f->map == MAP_FAILED) {
    f->map = NULL;
    rc = tp_error(d, "cannot map: %s", strerror(errno));
    goto done;
  }
  const int32_t *h = f->map;
  if (h[0] != TP_TOKENS_MAGIC) {
    rc = tp_error(d, "not a token file: magic %d, expected %d (llm.c's format)", h[0], TP_TOKENS_MAGIC);
    goto done;
  }
  if (h[1] != TP_TOKENS_VERSION) {
    rc = tp_error(d, "token file version %d is not supported (expected %d: uint16 tokens)", h[1],
                  TP_TOKENS_VERSION);
    goto done;
  }
  f->count = h[2];
  int64_t have = (st.st_size - HEADER_BYTES) / 2;
  if (h[2] < 0 || have != h[2] || (st.st_size - HEADER_BYTES) % 2) {
    rc = tp_error(d, "the header says %d tokens but the file holds %lld bytes of tokens", h[2],
                  (long long)(st.st_size - HEADER_BYTES));
    goto done;
  }
  if (f->count < min_tokens) {
    rc = tp_error(d, "%" PRId64 " tokens are too few: a batch needs %" PRId64 " (batch * seq + 1)",
                  f->count, min_tokens);
    goto done;
  }
  f->tokens = (const uint16_t *)((const char *)f->map + HEADER_BYTES);
  for (int64_t i = 0; i < f->count; i++)
    if (f->tokens[i] >= vocab) {
      rc = tp_error(d, "token %u at position %" PRId64 " is outside the model's vocabulary of %" PRId64,
                    f->tokens[i], i, vocab);
      goto done;
    }
done:
  if (fd >= 0) close(fd);
  if (rc) tp_tokens_close(f);
  d->file = file;
  return rc;
}

void tp_tokens_close(TpTokenFile *f) {
  if (f->map) munmap(f->map, f->map_size);
  memset(f, 0, sizeof *f);
}

void tp_tokens_batch(const TpTokenFile *f, int64_t pos, int64_t B, int64_t T, int64_t *inputs,
                     int64_t *targets) {
  int64_t n = B * T;
  for (int64_t i = 0; i < n; i++) {
    inputs[i] = f->tokens[(pos + i) % f->count];
    targets[i] = f->tokens[(pos + i + 1) % f->count];
  }
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
