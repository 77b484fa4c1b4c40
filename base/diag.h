/* Status codes, internal assertions and user-facing diagnostics: the bottom layer every
 * part of tokpipec (compiler, tools, trainer runtime) reports through. */
#ifndef TOKPIPE_BASE_DIAG_H
#define TOKPIPE_BASE_DIAG_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

/* ---- status codes (also the tools' exit codes) ---- */
enum { TP_OK = 0, TP_ERR_INPUT = 1, TP_ERR_USAGE = 2, TP_ERR_INTERNAL = 3 };

/* C's _Noreturn, or C++'s attribute where runtime/cuda's C++ (backend.cu) includes this */
#ifdef __cplusplus
#define TP_NORETURN [[noreturn]]
#else
#define TP_NORETURN _Noreturn
#endif

/* Internal invariant: aborts with file and line. Never used for bad user input. */
#define TP_ASSERT(cond) ((cond) ? (void)0 : tp_internal_error(__FILE__, __LINE__, #cond))
TP_NORETURN void tp_internal_error(const char *file, int line, const char *what);

/* ---- diagnostics (base/diag.c) ----
 * User-facing errors read like a compiler's:
 *   tokpipec: error: model.onnx: node '/blocks.0/attn/Where' (Where, opset 17): ...
 * Library code reports through a TpDiag and returns TP_ERR_*; it never exits. */
typedef struct {
  const char *tool; /* "tokpipec" */
  const char *file; /* the input being processed, or NULL */
  FILE *stream;     /* where lines go; NULL = silent (fuzzing) */
  int errors;
  char last[1024]; /* the last message, without the "tool: error: " prefix */
} TpDiag;

void tp_diag_init(TpDiag *d, const char *tool, const char *file, FILE *stream);
/* "tool: error: file: msg"; returns TP_ERR_INPUT. */
int tp_error(TpDiag *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* An internal error (a compiler bug) reported without aborting; returns TP_ERR_INTERNAL. */
int tp_internal(TpDiag *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int tp_verror(TpDiag *d, int code, const char *prefix, const char *fmt, va_list ap);
/* Control bytes (names from a model, paths) are written as \xNN in every diagnostic, so a
 * crafted name cannot drive the user's terminal. Escapes src into dst (always terminated). */
void tp_escape_text(char *dst, size_t dst_size, const char *src);
/* The length of the well-formed UTF-8 sequence at s (RFC 3629: no overlong forms, no
 * surrogates, at most U+10FFFF; 1 for ASCII) within its `avail` bytes, or 0. */
size_t tp_utf8_length(const char *s, size_t avail);
/* s as a JSON string: quotes, backslashes and control bytes escaped, UTF-8 as it is, and a
 * byte that is not UTF-8 as U+0080..U+00FF (Latin-1), so names in any encoding stay valid
 * JSON. */
void tp_json_write_string(FILE *f, const char *s);
/* For lines that do not go through a TpDiag (reports, usage errors): the formatted text
 * escaped as above, as one line on stream. */
void tp_print_line(FILE *stream, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "tool: error: MSG" (escaped) and "Try 'tool --help'." on stream; returns TP_ERR_USAGE. */
int tp_usage_error(FILE *stream, const char *tool, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int tp_vusage_error(FILE *stream, const char *tool, const char *fmt, va_list ap);

#endif
