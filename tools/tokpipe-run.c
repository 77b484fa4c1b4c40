/* tokpipe-run: imports a model, runs it with the reference interpreter on ONNX backend-test
 * data (input_N.pb / output_N.pb, in DIR or in DIR/test_data_set_*) and compares every
 * output with the expected one: 0 when all are within tolerance, 1 when not. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "interp/interp.h"

static const char usage[] =
    "usage: tokpipe-run MODEL.onnx|FILE.tir --test-dir DIR [--dim NAME=VALUE]... [--atol A] [--rtol R]\n"
    "                   [--passes=a,b,c] [--slices S]\n"
    "\n"
    "Runs MODEL (an ONNX model or textual IR) with the reference CPU interpreter on ONNX\n"
    "backend-test data and compares its outputs: DIR holds input_N.pb and output_N.pb\n"
    "(serialized TensorProto, one per graph input and output, in order), or\n"
    "test_data_set_*/ folders of them.\n"
    "An element passes when |got - want| <= atol + rtol * |want| (NaN matches NaN); integer\n"
    "and bool outputs must match exactly; dtype and shape must match.\n"
    "\n"
    "options:\n"
    "  --test-dir DIR       the test data (required)\n"
    "  --dim NAME=VALUE     fix a symbolic input dimension (repeatable)\n" CLI_LOAD_OPTIONS_HELP
    "  --atol A             absolute tolerance (default 1e-5)\n"
    "  --rtol R             relative tolerance (default 1e-4)\n"
    "  --passes=a,b,c       the passes to run before executing (default fold-constants,dce;\n"
    "                       tokpipe-opt --list-passes lists them)\n"
    "  --slices N|L1,L2,..  split-sequence: N near-equal token slices, or their lengths\n" CLI_PASS_OPTIONS_HELP
    "  --help               print this help\n"
    "  --version            print the version\n"
    "\n"
    "exit status: 0 all outputs within tolerance, 1 a mismatch or bad input, 2 bad usage,\n"
    "3 internal error.\n";

typedef struct {
  double atol, rtol;
  const CliDims *dims;
  char **passes; /* names, NULL-terminated */
  int npasses;
  const char *slices; /* --slices, for split-sequence */
  TpPassOptions pass_options;
} RunOptions;

static char *path_join(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = malloc(n);
  TP_ASSERT(p);
  snprintf(p, n, "%s/%s", dir, name);
  return p;
}

/* How many of prefix_0.pb, prefix_1.pb, ... exist in dir, counting up to the first gap
 * (whatever they are: reading one that is not a regular file reports it). */
static int count_pb(const char *dir, const char *prefix) {
  for (int n = 0;; n++) {
    char name[64];
    snprintf(name, sizeof name, "%s_%d.pb", prefix, n);
    char *p = path_join(dir, name);
    struct stat st;
    bool found = lstat(p, &st) == 0;
    free(p);
    if (!found) return n;
  }
}

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The data sets: dir itself when it holds .pb files, else its test_data_set_* folders in
 * name order. *sets is a malloc'ed array of malloc'ed paths. */
static int find_data_sets(const char *dir, char ***sets, int *n, TpDiag *d) {
  *sets = NULL;
  *n = 0;
  DIR *dp = opendir(dir);
  if (!dp) return tp_error(d, "cannot open the test directory: %s", strerror(errno));
  if (count_pb(dir, "input") || count_pb(dir, "output")) {
    closedir(dp);
    *sets = malloc(sizeof **sets);
    TP_ASSERT(*sets);
    (*sets)[(*n)++] = strdup(dir);
    return TP_OK;
  }
  struct dirent *e;
  while ((e = readdir(dp))) {
    if (strncmp(e->d_name, "test_data_set_", 14) != 0) continue;
    *sets = realloc(*sets, (size_t)(*n + 1) * sizeof **sets);
    TP_ASSERT(*sets);
    (*sets)[(*n)++] = path_join(dir, e->d_name);
  }
  closedir(dp);
  if (*n == 0) return tp_error(d, "no input_N.pb / output_N.pb files and no test_data_set_* folders");
  qsort(*sets, (size_t)*n, sizeof **sets, cmp_names);
  return TP_OK;
}

/* Reads prefix_0.pb .. prefix_{n-1}.pb from dir into t[] and names[]. */
static int load_pbs(const char *dir, const char *prefix, int n, TpTensor *t, char **names, TpDiag *d) {
  for (int i = 0; i < n; i++) {
    char name[64];
    snprintf(name, sizeof name, "%s_%d.pb", prefix, i);
    char *p = path_join(dir, name);
    int rc = tp_read_tensor_pb(p, &t[i], &names[i], d);
    free(p);
    if (rc) return rc;
  }
  return TP_OK;
}

static void free_tensors(TpTensor *t, char **names, int n) {
  for (int i = 0; i < n; i++) {
    free(t[i].data);
    if (names) free(names[i]);
  }
}

/* ---- comparison ---- */

static char *shape_str(const TpTensor *t, char *buf, size_t n) {
  TpType type = tp_type_make(t->dtype, t->rank, t->dims);
  return tp_type_str(&type, buf, n);
}

/* "[i,j,k]" of flat index i in t's shape. */
static char *index_str(const TpTensor *t, int64_t flat, char *buf, size_t n) {
  int64_t idx[TP_MAX_RANK];
  for (int k = t->rank - 1; k >= 0; k--) {
    idx[k] = t->dims[k] ? flat % t->dims[k] : 0;
    flat = t->dims[k] ? flat / t->dims[k] : 0;
  }
  size_t len = (size_t)snprintf(buf, n, "[");
  for (int k = 0; k < t->rank && len < n; k++)
    len += (size_t)snprintf(buf + len, n - len, "%s%lld", k ? "," : "", (long long)idx[k]);
  if (len < n) snprintf(buf + len, n - len, "]");
  return buf;
}

/* Prints one output's verdict line; true when it is within tolerance. */
static bool compare_output(const char *label, int i, const char *name, const TpTensor *got, const TpTensor *want,
                           const RunOptions *o) {
  char gs[256], ws[256], at[160], shown_label[512], shown_name[512];
  tp_escape_text(shown_label, sizeof shown_label, label); /* names from the files: no control bytes */
  tp_escape_text(shown_name, sizeof shown_name, name);
  printf("%soutput %d '%s': ", shown_label, i, shown_name);
  if (got->dtype != want->dtype || got->rank != want->rank ||
      memcmp(got->dims, want->dims, (size_t)got->rank * sizeof got->dims[0]) != 0) {
    printf("got %s, expected %s FAIL\n", shape_str(got, gs, sizeof gs), shape_str(want, ws, sizeof ws));
    return false;
  }
  bool exact = !tp_dtype_is_float(want->dtype);
  double max_abs = 0, max_rel = 0, worst_excess = -1;
  int64_t at_abs = 0, worst = -1, nbad = 0, n = tp_tensor_numel(want);
  size_t es = tp_dtype_size(want->dtype);
  for (int64_t k = 0; k < n; k++) {
    double g = tp_tensor_get_f64(got, k), w = tp_tensor_get_f64(want, k), err;
    bool ok;
    if (exact) {
      ok = memcmp((const char *)got->data + k * es, (const char *)want->data + k * es, es) == 0;
      err = ok ? 0 : fabs(g - w);
    } else if (isnan(g) || isnan(w)) {
      ok = isnan(g) && isnan(w);
      err = ok ? 0 : INFINITY;
    } else if (g == w) { /* also equal infinities */
      ok = true;
      err = 0;
    } else {
      err = fabs(g - w);
      ok = err <= o->atol + o->rtol * fabs(w);
    }
    double rel = err == 0 ? 0 : w != 0 ? err / fabs(w) : INFINITY;
    if (err > max_abs) {
      max_abs = err;
      at_abs = k;
    }
    if (rel > max_rel) max_rel = rel;
    if (!ok) {
      nbad++;
      double excess = isinf(err) ? INFINITY : err - (o->atol + o->rtol * fabs(w));
      if (excess > worst_excess) worst_excess = excess, worst = k;
    }
  }
  printf("max_abs_err=%.3g max_rel_err=%.3g", max_abs, max_rel);
  if (n) printf(" (at %s)", index_str(want, at_abs, at, sizeof at));
  if (nbad) {
    printf(" FAIL: %lld of %lld elements out of tolerance; worst at %s: got %.9g, want %.9g\n", (long long)nbad,
           (long long)n, index_str(want, worst, at, sizeof at), tp_tensor_get_f64(got, worst),
           tp_tensor_get_f64(want, worst));
    return false;
  }
  printf(" ok\n");
  return true;
}

/* ---- one data set ---- */

/* Imports the model with this set's inputs bound, runs it, compares. *nfail counts the
 * outputs out of tolerance; the return code is for bad input or errors. */
static int run_data_set(const char *model_path, const char *set, const char *label, const RunOptions *o, TpDiag *d,
                        int *noutputs, int *nfail) {
  int nin = count_pb(set, "input"), nout = count_pb(set, "output");
  TpTensor *ins = calloc((size_t)nin + 1, sizeof *ins), *wants = calloc((size_t)nout + 1, sizeof *wants);
  char **in_names = calloc((size_t)nin + 1, sizeof *in_names);
  char **out_names = calloc((size_t)nout + 1, sizeof *out_names);
  TpInputBinding *bound = calloc((size_t)nin + 1, sizeof *bound);
  TP_ASSERT(ins && wants && in_names && out_names && bound);
  TpModule *m = NULL;
  TpTensor *run_in = NULL, *got = NULL;
  int rc;
  if ((rc = load_pbs(set, "input", nin, ins, in_names, d))) goto done;
  if ((rc = load_pbs(set, "output", nout, wants, out_names, d))) goto done;

  /* Every input is offered to the importer; it keeps as constants those that fix shapes. */
  int nbound = 0;
  for (int i = 0; i < nin; i++)
    if (in_names[i] && *in_names[i]) bound[nbound++] = (TpInputBinding){in_names[i], ins[i]};
  TpImportOptions io = {.dims = o->dims->dims, .ndims = o->dims->n, .bound_inputs = bound, .nbound = nbound};
  if (!cli_ends_with(model_path, ".onnx")) { /* textual IR (e.g. tokpipec --batch B --forward-only): inputs stay */
    nbound = 0;
    rc = cli_load_module(model_path, o->dims, &m, d);
  } else {
    rc = tp_import_onnx_file(model_path, &io, &m, d);
    if (rc == TP_OK) cli_apply_padding(m, o->dims);
  }
  if (rc) goto done;
  TpPassOptions po = o->pass_options; /* this module's: its slice lengths */
  if (o->slices) cli_set_slices(m, o->slices, &po);
  if ((rc = cli_run_pipeline(m, (const char *const *)o->passes, o->npasses, &po, d))) goto done;

  /* The model's inputs: those still inputs plus the bound ones the importer made constants
   * (it rejects bound names that are not graph inputs). */
  int model_inputs = m->ninputs;
  for (int i = 0; i < nbound; i++) {
    bool still_input = false;
    for (int j = 0; j < m->ninputs && !still_input; j++)
      still_input = strcmp(m->values[m->inputs[j]].name, bound[i].name) == 0;
    if (!still_input) model_inputs++;
  }
  if (nin != model_inputs) {
    rc = tp_error(d, "the model has %d input%s but %s has %d input_N.pb file%s", model_inputs,
                  model_inputs == 1 ? "" : "s", set, nin, nin == 1 ? "" : "s");
    goto done;
  }
  if (nout != m->noutputs) {
    rc = tp_error(d, "the model has %d output%s but %s has %d output_N.pb file%s", m->noutputs,
                  m->noutputs == 1 ? "" : "s", set, nout, nout == 1 ? "" : "s");
    goto done;
  }
  run_in = calloc((size_t)m->ninputs + 1, sizeof *run_in);
  got = calloc((size_t)m->noutputs + 1, sizeof *got);
  TP_ASSERT(run_in && got);
  for (int i = 0; i < m->ninputs; i++) {
    const char *name = m->values[m->inputs[i]].name;
    int k = -1;
    for (int j = 0; j < nin && k < 0; j++)
      if (in_names[j] && strcmp(in_names[j], name) == 0) k = j;
    if (k < 0 && nbound == 0) k = i; /* unnamed tensors: by position */
    if (k < 0) {
      rc = tp_error(d, "model input '%s' has no input_N.pb file of that name in %s", name, set);
      goto done;
    }
    run_in[i] = ins[k];
  }
  if ((rc = tp_interp_run(m, run_in, got, d))) goto done;
  for (int i = 0; i < m->noutputs; i++) {
    if (!compare_output(label, i, m->values[m->outputs[i]].name, &got[i], &wants[i], o)) (*nfail)++;
    (*noutputs)++;
  }
  free_tensors(got, NULL, m->noutputs);

done:
  free_tensors(ins, in_names, nin);
  free_tensors(wants, out_names, nout);
  free(ins);
  free(wants);
  free(in_names);
  free(out_names);
  free(bound);
  free(run_in);
  free(got);
  if (m) tp_module_free(m);
  return rc;
}

int main(int argc, char **argv) {
  cli_tool = "tokpipe-run";
  const char *model = NULL, *test_dir = NULL, *passes = "fold-constants,dce", *v;
  CliDims dims = {0};
  RunOptions o = {.atol = 1e-5, .rtol = 1e-4, .dims = &dims};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (cli_is(a, "--help") || cli_is(a, "-h")) {
      fputs(usage, stdout);
      return 0;
    } else if (cli_is(a, "--version")) {
      printf("tokpipe-run %s\n", TOKPIPE_VERSION);
      return 0;
    } else if (cli_value(argc, argv, &i, "--test-dir", &v)) {
      test_dir = v;
    } else if (cli_value(argc, argv, &i, "--dim", &v)) {
      cli_add_dim(&dims, v);
    } else if (cli_load_option(argc, argv, &i, &dims)) {
    } else if (cli_value(argc, argv, &i, "--atol", &v)) {
      o.atol = cli_double("--atol", v);
      if (o.atol < 0) cli_usage_error("--atol must be >= 0");
    } else if (cli_value(argc, argv, &i, "--rtol", &v)) {
      o.rtol = cli_double("--rtol", v);
      if (o.rtol < 0) cli_usage_error("--rtol must be >= 0");
    } else if (cli_value(argc, argv, &i, "--passes", &passes)) {
    } else if (cli_value(argc, argv, &i, "--slices", &o.slices)) {
    } else if (cli_pass_option(argc, argv, &i, &o.pass_options)) {
    } else if (a[0] == '-' && a[1]) {
      cli_usage_error("unknown option '%s'", a);
    } else if (model) {
      cli_usage_error("more than one model given ('%s' and '%s')", model, a);
    } else {
      model = a;
    }
  }
  if (!model) cli_usage_error("no model given");
  if (!test_dir) cli_usage_error("--test-dir is required");
  if (dims.blob_dir && cli_ends_with(model, ".onnx"))
    cli_usage_error("--blob-dir applies to textual IR, not ONNX models ('%s')", model);
  o.passes = *passes ? cli_split_list("--passes", passes, &o.npasses) : NULL;
  for (int i = 0; i < o.npasses; i++)
    if (!tp_find_pass(o.passes[i]))
      cli_usage_error("unknown pass '%s' (tokpipe-opt --list-passes lists them)", o.passes[i]);

  TpDiag dd, md;
  tp_diag_init(&dd, cli_tool, test_dir, stderr);
  tp_diag_init(&md, cli_tool, model, stderr);
  char **sets;
  int nsets, rc = find_data_sets(test_dir, &sets, &nsets, &dd);
  int noutputs = 0, nfail = 0;
  for (int s = 0; s < nsets && rc == TP_OK; s++) {
    char label[256] = "";
    const char *base = strrchr(sets[s], '/');
    if (strcmp(sets[s], test_dir) != 0) snprintf(label, sizeof label, "%s: ", base ? base + 1 : sets[s]);
    rc = run_data_set(model, sets[s], label, &o, &md, &noutputs, &nfail);
  }
  for (int s = 0; s < nsets; s++) free(sets[s]);
  free(sets);
  cli_free_dims(&dims);
  cli_free_list(o.passes);
  if (rc != TP_OK) return cli_exit_code(rc);
  if (nfail) {
    printf("FAIL: %d of %d output%s out of tolerance (atol %g, rtol %g)\n", nfail, noutputs,
           noutputs == 1 ? "" : "s", o.atol, o.rtol);
    return 1;
  }
  printf("PASS: %d output%s within tolerance (atol %g, rtol %g)\n", noutputs, noutputs == 1 ? "" : "s", o.atol,
         o.rtol);
  return 0;
}
