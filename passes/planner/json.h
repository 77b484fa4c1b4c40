/* A small JSON reader for the planner's data files (hardware profiles, cost tables,
 * profile samples). The whole document is parsed into one malloc'ed tree; numbers are
 * doubles. Writing JSON is plain fprintf at the call sites. */
#ifndef TOKPIPE_PLANNER_JSON_H
#define TOKPIPE_PLANNER_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "../../base/diag.h" /* tp_json_write_string */

typedef enum {
  TP_JSON_NULL,
  TP_JSON_BOOL,
  TP_JSON_NUMBER,
  TP_JSON_STRING,
  TP_JSON_ARRAY,
  TP_JSON_OBJECT
} TpJsonKind;

typedef struct TpJson TpJson;
struct TpJson {
  TpJsonKind kind;
  double number; /* NUMBER; BOOL as 0/1 */
  char *string;  /* STRING */
  char *key;     /* the member name when inside an object */
  TpJson *items; /* ARRAY elements / OBJECT members */
  int count;
};

/* Parses text[0, len) as strict JSON (RFC 8259): no duplicate member names, no trailing
 * text, nesting up to 64, numbers finite doubles, strings UTF-8. On failure returns NULL
 * and writes "line L: what" into err. */
TpJson *tp_json_parse(const char *text, size_t len, char *err, size_t errsize);
/* Reads and parses a file (a regular one, up to TP_JSON_MAX_BYTES: the planner's inputs are
 * small); err says why on failure (including I/O errors). */
#define TP_JSON_MAX_BYTES (32 << 20)
TpJson *tp_json_parse_file(const char *path, char *err, size_t errsize);
void tp_json_free(TpJson *j);

/* Member `key` of an object, or NULL (also when j is not an object). */
const TpJson *tp_json_get(const TpJson *j, const char *key);
/* The number at `key`, or `fallback` when absent; *ok = false when present but not a
 * number (ok may be NULL). */
double tp_json_number(const TpJson *j, const char *key, double fallback, bool *ok);

#endif
