/* tokpipe-tokens: any file -> token files for the trainer (llm.c's format), one token per
 * byte (a vocabulary of 256), optionally with the tail split off as validation data. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime/train/tokens.h"

#ifndef TOKPIPE_VERSION
#define TOKPIPE_VERSION "unknown"
#endif

static const char *tool = "tokpipe-tokens";

static const char *usage = "Usage: tokpipe-tokens IN -o OUT.bin [--val-fraction F --val-out VAL.bin]\n"
                           "Writes the bytes of IN ('-' for stdin) as tokens 0..255 in llm.c's token file format\n"
                           "(a 256 x int32 header: 20240520, 1, count; then uint16 tokens), for the --data and\n"
                           "--val-data of a tokpipec trainer compiled with vocabulary >= 256.\n"
                           "  -o OUT.bin            the training tokens\n"
                           "  --val-fraction F      put the last fraction F (0 < F < 1) of the bytes in --val-out\n"
                           "  --val-out VAL.bin     the validation tokens\n"
                           "  --help, --version\n";

/* The value of an option given as `--flag VALUE` or `--flag=VALUE`, or NULL. */
static const char *option(int argc, char **argv, int *i, const char *flag, int *bad) {
  size_t n = strlen(flag);
  if (strncmp(argv[*i], flag, n) != 0) return NULL;
  if (argv[*i][n] == '=') return argv[*i] + n + 1;
  if (argv[*i][n] != 0) return NULL;
  if (*i + 1 >= argc) {
    *bad = 1;
    return NULL;
  }
  return argv[++*i];
}

/* The file a path names: the one it leads to (through symlinks) if it exists, else the
 * folder entry it would create. Two paths naming the same file alias each other. */
typedef struct {
  bool exists;
  dev_t dev;
  ino_t ino;
  char *entry; /* malloc'ed: the canonical folder + "/" + the last component */
} FileId;

static FileId file_id(const char *path) {
  FileId id = {0};
  struct stat st;
  if (stat(path, &st) == 0) id.exists = true, id.dev = st.st_dev, id.ino = st.st_ino;
  const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
  char *dir = tp_folder_of(path), *real = realpath(dir, NULL);
  size_t n = real ? strlen(real) + strlen(base) + 2 : 0;
  if (real && (id.entry = malloc(n))) snprintf(id.entry, n, "%s/%s", real, base);
  free(dir), free(real);
  return id;
}

static bool same_file(const FileId *a, const FileId *b) {
  if (a->exists && b->exists) return a->dev == b->dev && a->ino == b->ino;
  return a->entry && b->entry && strcmp(a->entry, b->entry) == 0;
}

/* No output may replace the input or the other output. */
static int check_aliases(const char *in, const char *out, const char *val_out) {
  const char *flags[3] = {"the input", "-o", "--val-out"}, *paths[3] = {in, out, val_out};
  FileId ids[3] = {{0}};
  int rc = 0;
  for (int i = 0; i < 3; i++)
    if (paths[i] && strcmp(paths[i], "-") != 0) ids[i] = file_id(paths[i]);
  for (int j = 1; j < 3 && !rc; j++)
    for (int i = 0; i < j && !rc; i++)
      if (paths[i] && paths[j] && (strcmp(paths[i], paths[j]) == 0 || same_file(&ids[i], &ids[j]))) {
        tp_print_line(stderr,
                      "%s: error: %s '%s' and %s '%s' are the same file: writing one would replace the other", tool,
                      flags[i], paths[i], flags[j], paths[j]);
        rc = 2;
      }
  for (int i = 0; i < 3; i++) free(ids[i].entry);
  return rc;
}

static int read_all(const char *path, uint8_t **out, size_t *size, TpDiag *d) {
  char why[256];
  FILE *f = strcmp(path, "-") == 0 ? stdin : tp_fopen_input(path, why, sizeof why);
  if (!f) return tp_error(d, "cannot read '%s': %s", path, why);
  size_t cap = 1 << 16, len = 0, got;
  uint8_t *buf = malloc(cap);
  TP_ASSERT(buf);
  while ((got = fread(buf + len, 1, cap - len, f)) > 0)
    if ((len += got) == cap) {
      buf = realloc(buf, cap *= 2);
      TP_ASSERT(buf);
    }
  int rc = ferror(f) ? tp_error(d, "cannot read '%s': %s", path, strerror(errno)) : TP_OK;
  if (f != stdin) fclose(f);
  if (rc) free(buf);
  else *out = buf, *size = len;
  return rc;
}

static int write_tokens(const char *path, const uint8_t *bytes, size_t n, TpDiag *d) {
  uint16_t *tokens = malloc((n ? n : 1) * sizeof *tokens);
  TP_ASSERT(tokens);
  for (size_t i = 0; i < n; i++) tokens[i] = bytes[i];
  int rc = tp_tokens_write(path, tokens, (int64_t)n, d);
  free(tokens);
  if (!rc) tp_print_line(stderr, "%s: %zu tokens -> %s", tool, n, path);
  return rc;
}

int main(int argc, char **argv) {
  const char *in = NULL, *out = NULL, *val_out = NULL, *frac_text = NULL, *v;
  double frac = 0;
  for (int i = 1; i < argc; i++) {
    int bad = 0;
    if (strcmp(argv[i], "--help") == 0) {
      fputs(usage, stdout);
      return 0;
    } else if (strcmp(argv[i], "--version") == 0) {
      printf("tokpipe-tokens %s\n", TOKPIPE_VERSION);
      return 0;
    } else if ((v = option(argc, argv, &i, "-o", &bad))) {
      out = v;
    } else if ((v = option(argc, argv, &i, "--val-out", &bad))) {
      val_out = v;
    } else if ((v = option(argc, argv, &i, "--val-fraction", &bad))) {
      char *end;
      frac_text = v;
      frac = strtod(v, &end);
      if (!*v || *end || !(frac > 0 && frac < 1))
        return tp_usage_error(stderr, tool, "--val-fraction needs a number between 0 and 1, not '%s'", v);
    } else if (bad) {
      return tp_usage_error(stderr, tool, "%s needs a value", argv[i]);
    } else if (argv[i][0] == '-' && argv[i][1]) {
      return tp_usage_error(stderr, tool, "unknown option '%s'", argv[i]);
    } else if (in) {
      return tp_usage_error(stderr, tool, "unexpected argument '%s' (one input file)", argv[i]);
    } else {
      in = argv[i];
    }
  }
  if (!in) return tp_usage_error(stderr, tool, "no input file");
  if (!out) return tp_usage_error(stderr, tool, "-o OUT.bin is required");
  if (!frac_text != !val_out) return tp_usage_error(stderr, tool, "--val-fraction and --val-out go together");
  int rc = check_aliases(in, out, val_out);
  if (rc) return rc;
  TpDiag d;
  tp_diag_init(&d, tool, NULL, stderr);
  uint8_t *bytes = NULL;
  size_t n = 0;
  rc = read_all(in, &bytes, &n, &d);
  if (rc) return rc;
  size_t nval = val_out ? (size_t)((double)n * frac) : 0;
  if (n - nval > INT32_MAX || nval > INT32_MAX) {
    free(bytes);
    return tp_error(&d, "'%s' has %zu bytes; a token file holds at most 2^31 - 1", in, n);
  }
  rc = write_tokens(out, bytes, n - nval, &d);
  if (!rc && val_out) rc = write_tokens(val_out, bytes + (n - nval), nval, &d);
  free(bytes);
  return rc;
}
