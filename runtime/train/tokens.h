/* Token files in llm.c's format: a header of 256 int32 (magic 20240520, version 1, the
 * token count, the rest 0), then the tokens as uint16. Batch k of B x T reads the B*T + 1
 * tokens starting at k*B*T, wrapping around at the end of the file.
 *
 * The file is read (pread), never mapped: a file truncated or rewritten while a run reads
 * it gives an error naming it, not a SIGBUS. Each batch is read afresh and its ids checked
 * again. */
#ifndef TOKPIPE_TRAIN_TOKENS_H
#define TOKPIPE_TRAIN_TOKENS_H

#include <stdint.h>

#include "../../base/diag.h"
#include "../../base/file.h"

enum { TP_TOKENS_MAGIC = 20240520, TP_TOKENS_VERSION = 1, TP_TOKENS_HEADER_INTS = 256 };

typedef struct {
  const char *path; /* for errors */
  int fd;           /* open while path is set */
  int64_t count;
  int64_t limit;        /* every id is below it */
  const char *limit_of; /* what bounds the ids, for errors ("the 100 rows of table 'wte'");
                           NULL: the model's vocabulary */
  uint32_t crc32c;      /* of the tokens' bytes as validated at open (checkpoints name the data) */
  uint16_t *window;     /* the tokens of the last batch read */
  int64_t window_cap;
} TpTokenFile;

/* Opens and validates the file: a regular file (a FIFO is refused, never waited on),
 * magic, version, size agreeing with the count, at least min_tokens tokens, every id <
 * limit. limit_of names what sets the limit (NULL: "the model's vocabulary of LIMIT").
 * Errors name the file; f stays closed then. */
int tp_tokens_open(const char *path, int64_t limit, const char *limit_of, int64_t min_tokens, TpTokenFile *f,
                   TpDiag *d);
void tp_tokens_close(TpTokenFile *f);

/* The batch at token position pos (0 <= pos < count): inputs [B*T] = tokens pos..,
 * targets the same shifted by one (positions modulo the count). An error naming the file
 * if it no longer holds them (truncated) or they are out of range (rewritten). */
int tp_tokens_batch(TpTokenFile *f, int64_t pos, int64_t B, int64_t T, int64_t *inputs, int64_t *targets, TpDiag *d);

/* Writes count tokens (count < 2^31) as a token file, atomically. */
int tp_tokens_write(const char *path, const uint16_t *tokens, int64_t count, TpDiag *d);

#endif
