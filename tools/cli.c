#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "base/atomic.h"

const char *cli_tool = "tokpipec";

_Noreturn void cli_usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  tp_vusage_error(stderr, cli_tool, fmt, ap);
  va_end(ap);
  exit(TP_ERR_USAGE);
}

bool cli_is(const char *arg, const char *flag) { return strcmp(arg, flag) == 0; }

bool cli_value(int argc, char **argv, int *i, const char *flag, const char **value) {
  const char *arg = argv[*i];
  size_t n = strlen(flag);
  if (strncmp(arg, flag, n) != 0) return false;
  if (arg[n] == '=') {
    *value = arg + n + 1;
    return true;
  }
  if (arg[n] != 0) return false;
  if (*i + 1 >= argc) cli_usage_error("%s needs a value", flag);
  /* the next word is an option, not this one's value ('--precision -o p.c'): a long
   * option or the tools' short ones; other words are values, '-' (stdin), negative
   * numbers and names like '-dash' among them (FLAG=VALUE also takes any value) */
  const char *next = argv[*i + 1];
  if ((next[0] == '-' && next[1] == '-' && next[2]) || cli_is(next, "-o") || cli_is(next, "-v") ||
      cli_is(next, "-h"))
    cli_usage_error("%s needs a value, but the next argument is the option '%s' (write %s=VALUE for a value "
                    "that starts with '-')",
                    flag, next, flag);
  *value = argv[++*i];
  return true;
}

int64_t cli_int(const char *flag, const char *text, int64_t lo, int64_t hi) {
  char *end;
  errno = 0;
  long long v = strtoll(text, &end, 10);
  if (end == text || *end || errno == ERANGE) cli_usage_error("%s expects an integer, got '%s'", flag, text);
  if (v < lo || v > hi)
    cli_usage_error("%s must be in [%lld, %lld], got %lld", flag, (long long)lo, (long long)hi, v);
  return v;
}

double cli_double(const char *flag, const char *text) {
  char *end;
  errno = 0;
  double v = strtod(text, &end);
  if (end == text || *end || errno == ERANGE || isnan(v))
    cli_usage_error("%s expects a number, got '%s'", flag, text);
  return v;
}

void cli_add_dim(CliDims *dims, const char *text) {
  const char *eq = strchr(text, '=');
  if (!eq || eq == text || !eq[1]) cli_usage_error("--dim expects NAME=VALUE, got '%s'", text);
  int64_t value = cli_int("--dim", eq + 1, 1, INT64_MAX);
  for (int i = 0; i < dims->n; i++)
    if (strlen(dims->dims[i].name) == (size_t)(eq - text) && strncmp(dims->dims[i].name, text, eq - text) == 0)
      cli_usage_error("--dim %.*s given twice", (int)(eq - text), text);
  dims->dims = realloc(dims->dims, (size_t)(dims->n + 1) * sizeof *dims->dims);
  char *name = strndup(text, (size_t)(eq - text));
  if (!dims->dims || !name) {
    fprintf(stderr, "%s: internal error: out of memory\n", cli_tool);
    exit(TP_ERR_INTERNAL);
  }
  dims->dims[dims->n++] = (TpDimBinding){name, value};
}

void cli_free_dims(CliDims *dims) {
  for (int i = 0; i < dims->n; i++) free((char *)dims->dims[i].name);
  free(dims->dims);
  for (int i = 0; i < dims->npadding; i++) free((char *)dims->padding[i].table);
  free(dims->padding);
  *dims = (CliDims){0};
}

bool cli_load_option(int argc, char **argv, int *i, CliDims *dims) {
  const char *v;
  if (cli_value(argc, argv, i, "--blob-dir", &v)) {
    if (!*v) cli_usage_error("--blob-dir expects a folder, got ''");
    dims->blob_dir = v;
    return true;
  }
  if (!cli_value(argc, argv, i, "--padding-idx", &v)) return false;
  const char *eq = strrchr(v, '='); /* initializer names may hold '=', rows never */
  if (!eq || eq == v || !eq[1]) cli_usage_error("--padding-idx expects TABLE=ROW, got '%s'", v);
  CliPadding p = {strndup(v, (size_t)(eq - v)), cli_int("--padding-idx", eq + 1, INT64_MIN + 1, INT64_MAX)};
  TP_ASSERT(p.table);
  for (int k = 0; k < dims->npadding; k++)
    if (strcmp(dims->padding[k].table, p.table) == 0) cli_usage_error("--padding-idx %s given twice", p.table);
  dims->padding = realloc(dims->padding, (size_t)(dims->npadding + 1) * sizeof *dims->padding);
  TP_ASSERT(dims->padding);
  dims->padding[dims->npadding++] = p;
  return true;
}

/* Is op an embedding lookup: Gather on axis 0 or Embedding (whose table is operand 0)? */
static bool embedding_lookup(const TpModule *m, int op) {
  const TpOp *o = &m->ops[op];
  return !o->dead && ((o->kind == TP_OP_Gather && tp_attr_int(m, op, "axis", 0) == 0) || o->kind == TP_OP_Embedding);
}

void cli_apply_padding(TpModule *m, const CliDims *dims) {
  if (dims->npadding && m->grads)
    cli_usage_error("--padding-idx applies before autodiff: this IR is already differentiated");
  for (int k = 0; k < dims->npadding; k++) {
    const CliPadding *p = &dims->padding[k];
    int table = tp_find_value(m, p->table), lookups = 0;
    if (table >= 0 && m->values[table].kind != TP_VAL_PARAM) table = -1;
    for (int op = 0; table >= 0 && op < m->nops; op++) {
      if (!embedding_lookup(m, op) || m->ops[op].inputs[0] != table) continue;
      int64_t rows = m->values[table].type.dims[0];
      if (p->row < -rows || p->row >= rows)
        cli_usage_error("--padding-idx %s=%lld: the table has %lld rows", p->table, (long long)p->row,
                        (long long)rows);
      tp_set_attr_int(m, op, "padding_idx", p->row < 0 ? p->row + rows : p->row);
      lookups++;
    }
    if (!lookups)
      cli_usage_error("--padding-idx %s: %s", p->table,
                      table < 0 ? "the model has no initializer of that name"
                                : "no embedding lookup (Gather on axis 0) reads that initializer");
  }
}

bool cli_pass_option(int argc, char **argv, int *i, TpPassOptions *o) {
  if (cli_value(argc, argv, i, "--print-before", &o->print_before)) return true;
  if (cli_value(argc, argv, i, "--print-after", &o->print_after)) return true;
  if (cli_is(argv[*i], "--print-after-all")) return o->print_after_all = true;
  if (cli_is(argv[*i], "--verify-each")) return o->verify_each = true;
  return false;
}

TpRecompute cli_recompute(const char *text) {
  TpRecompute r;
  if (!tp_recompute_parse(text, &r)) cli_usage_error("--recompute expects none, selective or full, got '%s'", text);
  return r;
}

char **cli_split_list(const char *flag, const char *text, int *n) {
  int count = 1;
  for (const char *p = text; *p; p++) count += *p == ',';
  char **names = calloc((size_t)count + 1, sizeof *names);
  TP_ASSERT(names);
  *n = 0;
  for (const char *p = text;;) {
    size_t len = strcspn(p, ",");
    if (len == 0) cli_usage_error("%s has an empty name in '%s'", flag, text);
    names[(*n)++] = strndup(p, len);
    TP_ASSERT(names[*n - 1]);
    if (!p[len]) break;
    p += len + 1;
  }
  return names;
}

void cli_free_list(char **names) {
  for (char **p = names; p && *p; p++) free(*p);
  free(names);
}

int64_t *cli_parse_slices(const char *spec, int64_t T, int *n) {
  int64_t *len;
  if (!strchr(spec, ',')) {
    *n = (int)cli_int("--slices", spec, 1, INT32_MAX);
    if (*n > T) cli_usage_error("--slices: %d slices are more than the %lld tokens of a sequence", *n, (long long)T);
    len = malloc((size_t)*n * sizeof *len);
    TP_ASSERT(len);
    for (int i = 0; i < *n; i++) len[i] = T / *n + (i < T % *n);
  } else {
    char **parts = cli_split_list("--slices", spec, n);
    len = malloc((size_t)*n * sizeof *len);
    TP_ASSERT(len);
    int64_t sum = 0;
    for (int i = 0; i < *n; i++) sum += len[i] = cli_int("--slices", parts[i], 1, INT32_MAX);
    cli_free_list(parts);
    if (sum != T)
      cli_usage_error("--slices: the lengths %s sum to %lld, not the sequence length %lld", spec, (long long)sum,
                      (long long)T);
  }
  return len;
}

void cli_set_slices(TpModule *m, const char *spec, TpPassOptions *o) {
  int tokens = tp_token_input(m);
  if (tokens < 0) cli_usage_error("--slices: the model has no integer [batch, seq] token input to slice");
  int64_t T = m->values[tokens].type.dims[1];
  if (T < 1) cli_usage_error("--slices needs a known sequence length: pass --seq T");
  int n;
  int64_t *len = cli_parse_slices(spec, T, &n), *own = tp_alloc(m, (size_t)n * sizeof *own);
  memcpy(own, len, (size_t)n * sizeof *own);
  free(len);
  o->nslices = n;
  o->slice_len = own;
}

int cli_run_pipeline(TpModule *m, const char *const *names, int n, TpPassOptions *o, TpDiag *d) {
  int rc = tp_verify(m, d);
  if (rc == TP_OK && o) rc = tp_verify_split(m, o->tensor, o->nslices, d); /* IR read back, split otherwise */
  if (rc != TP_OK) return rc;
  rc = tp_run_passes(m, names, n, o, d);
  if (rc != TP_OK) return rc;
  if (tp_verify(m, d) != TP_OK) return tp_internal(d, "the passes produced invalid IR");
  return TP_OK;
}

bool cli_ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && strcmp(s + n - k, suffix) == 0;
}

int cli_load_module(const char *path, const CliDims *dims, TpModule **out, TpDiag *d) {
  if (cli_ends_with(path, ".onnx")) {
    if (dims->blob_dir) cli_usage_error("--blob-dir applies to textual IR, not ONNX models ('%s')", path);
    TpImportOptions o = {.dims = dims->dims,
                         .ndims = dims->n,
                         .token_dims = {dims->token_dims[0], dims->token_dims[1]},
                         .rebatch = dims->rebatch};
    int rc = tp_import_onnx_file(path, &o, out, d);
    if (rc == TP_OK) cli_apply_padding(*out, dims);
    return rc;
  }
  if (dims->n) cli_usage_error("--dim applies to ONNX models, not textual IR ('%s')", path);
  if ((dims->token_dims[0] && !dims->rebatch) || dims->token_dims[1])
    cli_usage_error("--batch and --seq apply to ONNX models, not textual IR ('%s')", path);
  int rc = tp_parse_file(path, dims->blob_dir, out, d);
  if (rc == TP_OK) cli_apply_padding(*out, dims);
  return rc;
}

int cli_write_output(const char *path, CliWriter write, const void *ctx, TpDiag *d) {
  if (!path || strcmp(path, "-") == 0) {
    write(ctx, stdout);
    if (fflush(stdout) != 0 || ferror(stdout)) return tp_error(d, "cannot write to stdout: %s", strerror(errno));
    return TP_OK;
  }
  TpAtomicFile a;
  int rc = tp_atomic_open(&a, path, d);
  if (rc) return rc;
  write(ctx, a.f);
  return tp_atomic_commit(&a, d);
}

int cli_exit_code(int rc) { return rc == TP_OK || rc == TP_ERR_INPUT || rc == TP_ERR_USAGE ? rc : TP_ERR_INTERNAL; }

/* ---- textual IR that tokpipec printed, read back (cli.h) ----
 * A module read from text may be what tokpipec printed after its pipeline, or part of it
 * (--forward-only): the passes whose work it shows are not run again (raise-transformer
 * on a differentiated module, assign-stages on a staged one, do not expect their own
 * output). The work shows as: */
typedef struct {
  const char *pass, *option; /* the pass, and what asks tokpipec to run it */
} ResumePass;
static const ResumePass resume_passes[CLI_RESUME_COUNT] = {
    /* in pipeline order */
    {"shard-tensor", "--tensor"},  {"add-loss", "training (no --forward-only)"}, {"split-sequence", "--slices"},
    {"assign-stages", "--stages"}, {"autodiff", "training (no --forward-only)"}, {"finish-stages", NULL},
    {"recompute", "--recompute"},
};

void cli_passes_done(const TpModule *m, bool done[CLI_RESUME_COUNT]) {
  memset(done, 0, CLI_RESUME_COUNT * sizeof *done);
  done[CLI_RESUME_LOSS] = m->loss >= 0;
  for (int v = 0; v < m->nvalues; v++)
    done[CLI_RESUME_SHARD] |= m->values[v].kind == TP_VAL_PARAM && m->values[v].shard.parts;
  for (int o = 0; o < m->nops; o++) {
    const TpOp *op = &m->ops[o];
    done[CLI_RESUME_SHARD] |= op->kind == TP_OP_AllReduce || op->kind == TP_OP_TensorCopy ||
                              op->kind == TP_OP_TensorRank;
    done[CLI_RESUME_SLICE] |= op->slice >= 0;
    done[CLI_RESUME_STAGES] |= op->stage > 0 || op->role == TP_ROLE_BOUNDARY;
    done[CLI_RESUME_AUTODIFF] |= op->phase == TP_PHASE_BACKWARD;
    done[CLI_RESUME_RECOMPUTE] |= op->role == TP_ROLE_RECOMPUTE;
  }
}

static int resume_index(const char *pass) {
  for (int i = 0; i < CLI_RESUME_COUNT; i++)
    if (strcmp(resume_passes[i].pass, pass) == 0) return i;
  return -1;
}

int cli_resume_after(const TpModule *m, const char **names, int *n, const bool wanted[CLI_RESUME_COUNT], bool batch,
                     TpDiag *d) {
  bool done[CLI_RESUME_COUNT];
  cli_passes_done(m, done);
  int last = -1;
  for (int i = 0; i < CLI_RESUME_COUNT; i++)
    if (done[i]) last = i;
  if (last < 0) return TP_OK;
  for (int i = 0; i <= last; i++) {
    /* an option's pass done already */
    bool again = wanted[i] && done[i] && i != CLI_RESUME_LOSS && i != CLI_RESUME_AUTODIFF;
    if (i < last && wanted[i] && !done[i])
      return tp_error(d,
                      "IR printed after %s: %s cannot resume after %s for %s, whose pass %s comes "
                      "before it; give it the ONNX model, or IR printed before %s",
                      resume_passes[last].pass, cli_tool, resume_passes[last].pass, resume_passes[i].option,
                      resume_passes[i].pass, resume_passes[last].pass);
    if (again)
      return tp_error(d, "IR printed after %s, which %s asks for again; give it the ONNX model, or drop %s",
                      resume_passes[i].pass, resume_passes[i].option, resume_passes[i].option);
  }
  if (batch)
    return tp_error(d,
                    "IR printed after %s: %s cannot resume after %s for --batch, whose pass rebatch "
                    "comes before it; give it the ONNX model, or IR printed before %s",
                    resume_passes[last].pass, cli_tool, resume_passes[last].pass, resume_passes[last].pass);
  int cut = 0; /* the first pass after `last` */
  while (cut < *n && (resume_index(names[cut]) < 0 || resume_index(names[cut]) <= last)) cut++;
  memmove(names, names + cut, (size_t)(*n - cut) * sizeof *names);
  *n -= cut;
  return TP_OK;
}
