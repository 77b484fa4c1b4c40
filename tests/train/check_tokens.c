/* The token-file reader (runtime/train/tokens.c) on files written here:
 *   check_tokens WORK_DIR
 * batches wrap around the end of the file (also windows longer than the file); a file
 * truncated after it was opened, or rewritten with an id out of range, gives one error
 * naming it at the next batch (the mapped reader died of SIGBUS); a FIFO is refused at
 * once. Prints "ok ..." lines, or "FAIL ..." and exits 1. */
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/train/tokens.h"

enum { N = 23 };

static int failures;

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("FAIL ");
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  failures++;
}

/* One batch read must fail with a diagnostic holding `want`. */
static void expect_error(TpTokenFile *f, const char *what, const char *want, TpDiag *d) {
  int64_t in[2 * 4], tg[2 * 4];
  d->last[0] = 0;
  int rc = tp_tokens_batch(f, 3, 2, 4, in, tg, d);
  if (rc != TP_ERR_INPUT || !strstr(d->last, want) || !strstr(d->last, f->path))
    fail("%s: rc %d, message '%s' (expected one holding '%s' and the file)", what, rc, d->last, want);
  else printf("ok %s: %s\n", what, d->last);
}

int main(int argc, char **argv) {
  if (argc != 2 || chdir(argv[1]) != 0) {
    fprintf(stderr, "usage: check_tokens WORK_DIR (an existing folder)\n");
    return 2;
  }
  TpDiag d;
  tp_diag_init(&d, "check_tokens", NULL, NULL);
  uint16_t tokens[N];
  for (int i = 0; i < N; i++) tokens[i] = (uint16_t)(i * 7 % 50);
  if (tp_tokens_write("t.bin", tokens, N, &d)) return fail("cannot write t.bin: %s", d.last), 1;

  /* wrap-around: window k of B x T at position pos is tokens (pos + k) % N */
  TpTokenFile f;
  if (tp_tokens_open("t.bin", 50, NULL, 1, &f, &d)) return fail("open: %s", d.last), 1;
  int64_t in[60], tg[60];
  const int64_t shapes[][3] = {{0, 2, 4}, {20, 2, 4}, {22, 1, 1}, {5, 3, 20}}; /* pos, B, T; the last: 61 > N */
  for (int s = 0; s < 4; s++) {
    int64_t pos = shapes[s][0], n = shapes[s][1] * shapes[s][2], bad = -1;
    if (tp_tokens_batch(&f, pos, shapes[s][1], shapes[s][2], in, tg, &d)) {
      fail("batch at %lld: %s", (long long)pos, d.last);
      continue;
    }
    for (int64_t k = 0; k < n && bad < 0; k++)
      if (in[k] != tokens[(pos + k) % N] || tg[k] != tokens[(pos + k + 1) % N]) bad = k;
    if (bad >= 0)
      fail("batch at %lld of %lld tokens: token %lld differs", (long long)pos, (long long)n, (long long)bad);
    else printf("ok batch at %lld of %lld tokens wraps around the %d-token file\n", (long long)pos, (long long)n, N);
  }

  /* rewritten in place with an id the model has no row for */
  int fd = open("t.bin", O_WRONLY);
  uint16_t big = 60;
  if (fd < 0 || pwrite(fd, &big, 2, TP_TOKENS_HEADER_INTS * 4 + 2 * 5) != 2) return fail("cannot rewrite t.bin"), 1;
  expect_error(&f, "rewritten while open", "token 60 at position 5 is outside the model's vocabulary of 50", &d);
  /* truncated while open */
  if (ftruncate(fd, TP_TOKENS_HEADER_INTS * 4 + 2 * 4) != 0) return fail("cannot truncate t.bin"), 1;
  close(fd);
  expect_error(&f, "truncated while open", "the file was truncated while in use", &d);
  tp_tokens_close(&f);

  /* the limit's phrase from the plan */
  if (tp_tokens_write("t.bin", tokens, N, &d)) return fail("cannot write t.bin: %s", d.last), 1;
  if (tp_tokens_open("t.bin", 40, "the 40 rows of table 'wte'", 1, &f, &d) != TP_ERR_INPUT ||
      !strstr(d.last, "token 42 at position 6 is outside the 40 rows of table 'wte'"))
    fail("limit below the ids: '%s'", d.last);
  else printf("ok ids checked against the plan's limit at open: %s\n", d.last);

  /* a FIFO: refused, not waited on (a blocked open would hang the test: ctest's timeout) */
  unlink("fifo.bin");
  if (mkfifo("fifo.bin", 0600) != 0) return fail("cannot make a FIFO"), 1;
  if (tp_tokens_open("fifo.bin", 50, NULL, 1, &f, &d) != TP_ERR_INPUT || !strstr(d.last, "it is a FIFO"))
    fail("FIFO: '%s'", d.last);
  else printf("ok FIFO refused: %s\n", d.last);
  unlink("fifo.bin");
  return failures ? 1 : 0;
}
