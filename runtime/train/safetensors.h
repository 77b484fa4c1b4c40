/* safetensors files (https://github.com/huggingface/safetensors): an 8-byte little-endian
 * header length, a JSON header {"__metadata__": {str: str}, NAME: {"dtype": "F32", "shape":
 * [..], "data_offsets": [begin, end]}, ...} padded with spaces to a multiple of 8, then the
 * tensor bytes (little-endian, row-major). Used for gradient and weight dumps, checkpoints
 * and the parity fixtures. */
#ifndef TOKPIPE_TRAIN_SAFETENSORS_H
#define TOKPIPE_TRAIN_SAFETENSORS_H

#include "../../base/diag.h"
#include "../../base/file.h"
#include "../../base/tensor.h"
#include "../../base/atomic.h"

typedef struct {
  const char *name;
  TpTensor t;
} TpNamedTensor;

/* A loaded file: tensors sorted by name; names, data and metadata owned by it. */
typedef struct {
  int n;
  TpNamedTensor *tensors;
  int nmeta;
  char **meta; /* nmeta (key, value) pairs: meta[2*i], meta[2*i + 1] */
} TpSafetensors;

/* The files we write carry CRC-32C checksums in this metadata key, so that a flipped bit is
 * found on load: 8 lowercase hex digits each, comma-separated, first the one of the other
 * metadata (each key and value with its terminating NUL, in key order), then one per
 * tensor (its bytes) in name order. Other readers see one more metadata string. */
#define TP_SAFETENSORS_CRC_KEY "tokpipe.crc32c"

/* Reads (a regular file only: tp_open_input) and validates the whole file: header syntax,
 * unique metadata keys, known dtypes, shapes matching the byte ranges, ranges inside the
 * file and not overlapping, unique names (tp_safetensors_parse), and the checksums where
 * the file has them (tp_safetensors_verify; files of other writers have none). Errors
 * name the file (and the tensor). */
int tp_safetensors_load(const char *path, TpSafetensors *st, TpDiag *d);
/* The structure's checks of a file's bytes in memory (errors name d->file). */
int tp_safetensors_parse(const void *bytes, size_t size, TpSafetensors *st, TpDiag *d);
/* The checksums of a parsed file, if it has TP_SAFETENSORS_CRC_KEY. */
int tp_safetensors_verify(const TpSafetensors *st, TpDiag *d);
/* NULL when absent. */
const TpTensor *tp_safetensors_find(const TpSafetensors *st, const char *name);
const char *tp_safetensors_meta(const TpSafetensors *st, const char *key);
void tp_safetensors_free(TpSafetensors *st);

/* Writes tensors (any order; written sorted by name; names must be unique), metadata
 * (NULL, or key/value strings ending with a NULL key) and the tensors' checksums
 * (TP_SAFETENSORS_CRC_KEY) atomically (see atomic.h). */
int tp_safetensors_save(const char *path, const TpNamedTensor *tensors, int n, const char *const *meta, TpDiag *d);
/* The same into an open atomic file, which the caller commits. */
void tp_safetensors_write(TpAtomicFile *a, const TpNamedTensor *tensors, int n, const char *const *meta);

/* The CRC-32C (Castagnoli) of size bytes, continuing from crc (0 to start). */
uint32_t tp_crc32c(uint32_t crc, const void *data, size_t size);
/* A CRC-32C as written in the files: exactly 8 lowercase hex digits at text (what follows
 * them is the caller's to check). False if malformed. */
bool tp_crc32c_parse(const char *text, uint32_t *out);

/* "F32", ... for a dtype; NULL if safetensors has no name for it. */
const char *tp_safetensors_dtype_name(TpDType t);

#endif
