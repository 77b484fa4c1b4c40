/* Token files in llm.c's format: a header of 256 int32 (magic 20240520, version 1, the
 * token count, the rest 0), then the tokens as uint16. Batch k of B x T reads the B*T + 1
 * tokens starting at k*B*T, wrapping around at the end of the file. */
#ifndef TOKPIPE_TRAIN_TOKENS_H
#define TOKPIPE_TRAIN_TOKENS_H

#include <stdint.h>

#include "../../ir/ir.h"

enum { TP_TOKENS_MAGIC = 20240520, TP_TOKENS_VERSION = 1, TP_TOKENS_HEADER_INTS = 256 };

typedef struct {
  const uint16_t *tokens; /* mapped read-only */
  int64_t count;
  void *map;
  size_t map_size;
} TpTokenFile;

/* Maps and validates the file: magic, version, size agreeing with the count, at least
 * min_tokens tokens, every id < vocab. Errors name the file. */
int tp_tokens_open(const char *path, int64_t vocab, int64_t min_tokens, TpTokenFile *f, TpDiag *d);
void tp_tokens_close(TpTokenFile *f);

/* The batch at token position pos: inputs [B*T] = tokens pos.., targets the same shifted
 * by one (positions modulo the count). */
void tp_tokens_batch(const TpTokenFile *f, int64_t pos, int64_t B, int64_t T, int64_t *inputs,
                     int64_t *targets);

/* Writes count tokens (count < 2^31) as a token file, atomically. */
int tp_tokens_write(const char *path, const uint16_t *tokens, int64_t count, TpDiag *d);

#endif
