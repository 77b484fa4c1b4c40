/* Command-line helpers shared by the tools (tokpipec, tokpipe-opt, tokpipe-run): option
 * parsing in the `--flag=value` and `--flag value` forms, `--dim NAME=VALUE`, checked
 * numbers, usage errors (exit 2), loading a model from .onnx or textual IR, and writing an
 * output file atomically. Tools may exit; the library never does. */
#ifndef TOKPIPE_CLI_H
#define TOKPIPE_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "frontend/frontend.h"
#include "ir/ir.h"

#ifndef TOKPIPE_VERSION
#define TOKPIPE_VERSION "unknown"
#endif

/* The tool's name for messages ("tokpipec"); set first thing in main. */
extern const char *cli_tool;

/* "tool: error: MSG" and "Try 'tool --help'." on stderr, then exit 2. */
_Noreturn void cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* argv[*i] is exactly `flag` (a switch such as --verify-each). */
bool cli_is(const char *arg, const char *flag);
/* Does s end in suffix (a file name in ".onnx", ".c")? */
bool cli_ends_with(const char *s, const char *suffix);
/* argv[*i] is `flag=VALUE` or `flag` followed by VALUE (consumed: *i advances). A missing
 * value is a usage error. */
bool cli_value(int argc, char **argv, int *i, const char *flag, const char **value);

/* Checked numbers: the whole text must be a number in range, else a usage error naming
 * the flag. */
int64_t cli_int(const char *flag, const char *text, int64_t lo, int64_t hi);
double cli_double(const char *flag, const char *text);

/* What loading a model takes besides its file (cli_load_module): repeatable --dim
 * NAME=VALUE (VALUE >= 1), tokpipec's --batch/--seq (0: not given): the token input's two
 * dims, whatever they are named; and the loading options of cli_load_option. */
typedef struct {
  const char *table; /* --padding-idx TABLE=ROW: an initializer's name */
  int64_t row;
} CliPadding;
typedef struct {
  TpDimBinding *dims;
  int n;
  int64_t token_dims[2];
  /* tokpipec: token_dims[0] binds a symbolic batch only; a fixed one (and textual IR's) is
   * kept for the rebatch pass (TpPassOptions.batch, which the tool sets). */
  bool rebatch;
  /* --blob-dir DIR: textual IR reads its blob files from DIR, not its own folder */
  const char *blob_dir;
  CliPadding *padding;
  int npadding;
} CliDims;
void cli_add_dim(CliDims *dims, const char *text);
void cli_free_dims(CliDims *dims);

/* --blob-dir DIR and repeatable --padding-idx TABLE=ROW into dims. True if argv[*i] was one. */
bool cli_load_option(int argc, char **argv, int *i, CliDims *dims);
#define CLI_LOAD_OPTIONS_HELP                                                                                       \
  "  --padding-idx TABLE=ROW  the embedding lookups of initializer TABLE give row ROW no\n"                         \
  "                       gradient, as torch's padding_idx (negative: from the end); for\n"                         \
  "                       exports without the metadata that says so (repeatable)\n"                                 \
  "  --blob-dir DIR       textual IR: read its blob files from DIR (trusted: any file in it)\n"                     \
  "                       instead of the IR file's own folder\n"
/* Gives the embedding lookups of each --padding-idx table their padding row; a table no
 * lookup reads, a row outside it, or a module already differentiated is a usage error.
 * cli_load_module does it; tokpipe-run, which imports by itself, calls it. */
void cli_apply_padding(TpModule *m, const CliDims *dims);

/* The pass manager's switches: --print-before=P, --print-after=P, --print-after-all,
 * --verify-each. True if argv[*i] was one. */
bool cli_pass_option(int argc, char **argv, int *i, TpPassOptions *o);
#define CLI_PASS_OPTIONS_HELP                                                                                       \
  "  --print-before=P     dump the IR to stderr before passes P (comma list, or all)\n"                             \
  "  --print-after=P      dump the IR to stderr after passes P\n"                                                   \
  "  --print-after-all    dump the IR to stderr after every pass\n"                                                 \
  "  --verify-each        verify the IR after every pass\n"

/* --recompute's value: none, selective or full (else a usage error). */
TpRecompute cli_recompute(const char *text);

/* Splits "a,b,c" into a NULL-terminated malloc'ed array of malloc'ed names (*n of them);
 * an empty name is a usage error naming `flag`. */
char **cli_split_list(const char *flag, const char *text, int *n);
void cli_free_list(char **names);

/* --slices N|l1,l2,...: the *n slice lengths (malloc'ed) of a sequence of T tokens: N
 * near-equal slices (the longer ones first) or the lengths given. A count above T, a
 * zero, or lengths that do not sum to T are usage errors naming --slices. */
int64_t *cli_parse_slices(const char *spec, int64_t T, int *n);
/* ... of the token input's sequence of m into o->nslices and o->slice_len (module-owned). */
void cli_set_slices(TpModule *m, const char *spec, TpPassOptions *o);

/* Verifies the loaded module (exit 1 territory; split as o asks, when it is split), runs the
 * passes, verifies the result (a failure there is a compiler bug: TP_ERR_INTERNAL). */
int cli_run_pipeline(TpModule *m, const char *const *names, int n, TpPassOptions *o, TpDiag *d);

/* Reads FILE.onnx (imported with `dims`) or textual IR (any other name; "-" = stdin).
 * Diagnostics go to d. */
int cli_load_module(const char *path, const CliDims *dims, TpModule **out, TpDiag *d);

/* Writes through `write` to `path` ("-" or NULL = stdout). A file is written to a
 * temporary in the same folder, synced and renamed over `path`, so a failure never
 * leaves a half-written file. */
typedef void (*CliWriter)(const void *ctx, FILE *out);
int cli_write_output(const char *path, CliWriter write, const void *ctx, TpDiag *d);

/* A status code (TP_OK, TP_ERR_*) as the process exit code. */
int cli_exit_code(int rc);

/* Textual IR that tokpipec printed after its pipeline, or part of it, read back: which of
 * the passes that leave their mark it shows the work of (in pipeline order), and the
 * default pipeline's names[0..*n) cut to the passes after the last of them. */
enum {
  CLI_RESUME_SHARD,
  CLI_RESUME_LOSS,
  CLI_RESUME_SLICE,
  CLI_RESUME_STAGES,
  CLI_RESUME_AUTODIFF,
  CLI_RESUME_RECOMPUTE = 6, /* after finish-stages (5), which leaves no mark of its own */
  CLI_RESUME_COUNT
};
void cli_passes_done(const TpModule *m, bool done[CLI_RESUME_COUNT]);
/* Drops from names[0..*n) the passes up to the last one whose work m shows; an error
 * naming it if a pass before it, which this run asks for (`wanted`: --tensor, --slices,
 * --stages, training, --recompute; `batch`: --batch), has not been done, or if an option asks for a pass
 * done already. */
int cli_resume_after(const TpModule *m, const char **names, int *n, const bool wanted[CLI_RESUME_COUNT], bool batch,
                     TpDiag *d);

#endif
