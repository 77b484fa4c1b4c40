/* libFuzzer target for the token-file reader (runtime/train/tokens.c): any bytes as a token
 * file must open or give one diagnostic, never a crash, a leak or a sanitizer report. A
 * file that opens must give batches whose ids are below the limit and whose targets are
 * the inputs shifted by one, at any position; after the file is cut short (as a run's data
 * file truncated under it), a batch reads or fails with a diagnostic, never a signal.
 *
 * The reader's other inputs come from header words the format leaves 0 (the fuzzer
 * controls them too): word 3 the id limit, word 4 the batch shape, word 5 a position,
 * word 6 where to cut the file. */
#define _GNU_SOURCE /* memfd_create */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "runtime/train/tokens.h"

static uint32_t word(const uint8_t *data, size_t size, int k) {
  uint32_t w = 0;
  if (size >= (size_t)(k + 1) * 4) memcpy(&w, data + k * 4, 4);
  return w;
}

static void check_batch(TpTokenFile *f, int64_t pos, int64_t B, int64_t T, bool must_read, TpDiag *d) {
  int64_t inputs[64], targets[64];
  if (tp_tokens_batch(f, pos, B, T, inputs, targets, d) != TP_OK) {
    if (must_read) abort(); /* the file is whole: every batch reads */
    return;
  }
  for (int64_t i = 0; i < B * T; i++) {
    if (inputs[i] < 0 || inputs[i] >= f->limit || targets[i] < 0 || targets[i] >= f->limit) abort();
    if (i + 1 < B * T && targets[i] != inputs[i + 1]) abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int fd = -1;
  static char path[64];
  if (fd < 0) { /* one in-memory file, rewritten per input: no disk, no leftovers */
    fd = memfd_create("fuzz_tokens", 0);
    if (fd < 0) abort();
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  }
  if (ftruncate(fd, 0) != 0 || (size && pwrite(fd, data, size, 0) != (ssize_t)size)) abort();
  TpDiag d;
  tp_diag_init(&d, "fuzz_tokens", NULL, NULL); /* silent */
  uint32_t shape = word(data, size, 4);
  int64_t limit = 1 + (word(data, size, 3) & 0xffff), B = 1 + shape % 4, T = 1 + (shape >> 8) % 16;
  TpTokenFile f;
  if (tp_tokens_open(path, limit, NULL, B * T + 1, &f, &d) != TP_OK) {
    if (d.errors != 1) abort(); /* one diagnostic */
    return 0;
  }
  int64_t pos = word(data, size, 5) % f.count;
  check_batch(&f, 0, B, T, true, &d);
  check_batch(&f, f.count - 1, B, T, true, &d);
  check_batch(&f, pos, B, T, true, &d);
  /* cut short under the open reader */
  if (ftruncate(fd, (off_t)(word(data, size, 6) % (size + 1))) != 0) abort();
  check_batch(&f, pos, B, T, false, &d);
  check_batch(&f, 0, B, T, false, &d);
  tp_tokens_close(&f);
  return 0;
}
