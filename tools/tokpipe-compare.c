/* tokpipe-compare: judges a training run against reference data, as the parity tests do:
 * two safetensors files tensor by tensor, or the losses of two JSON-lines logs step by
 * step. Prints the worst error and where it is; exit 0 match, 1 mismatch or unreadable
 * input, 2 bad usage. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/train/safetensors.h"

#ifndef TOKPIPE_VERSION
#define TOKPIPE_VERSION "unknown"
#endif

static const char *tool = "tokpipe-compare";
static const double FLOOR_SHARE = 1e-2; /* see compare_tensors */

static const char *usage =
    "Usage: tokpipe-compare GOT.safetensors WANT.safetensors [--tol R] [-v]\n"
    "       tokpipe-compare --losses GOT.jsonl WANT.jsonl [--steps N] [--tol R]\n"
    "Tensors: the key sets and shapes must match, and each tensor's max |got - want|\n"
    "divided by its max |want| (at least 1% of the largest in WANT) must be <= R\n"
    "(default 1e-4).\n"
    "Losses: the \"loss\" of each \"step\" 1..N (default: every step of WANT) must be within\n"
    "R relative (default 1e-5); the logs are one JSON object per line, as --log writes.\n"
    "  -v                 one line per tensor\n"
    "  --help, --version\n";

/* "[2,17]": the position of flat index i in a row-major tensor. */
static void format_index(const TpTensor *t, int64_t i, char *buf, size_t size) {
  int64_t idx[TP_MAX_RANK];
  for (int k = t->rank - 1; k >= 0; k--) {
    idx[k] = t->dims[k] ? i % t->dims[k] : 0;
    i = t->dims[k] ? i / t->dims[k] : 0;
  }
  size_t n = (size_t)snprintf(buf, size, "[");
  for (int k = 0; k < t->rank && n < size; k++)
    n += (size_t)snprintf(buf + n, size - n, "%s%lld", k ? "," : "", (long long)idx[k]);
  if (n < size) snprintf(buf + n, size - n, "]");
}

static void format_shape(const TpTensor *t, char *buf, size_t size) {
  size_t n = (size_t)snprintf(buf, size, "[");
  for (int k = 0; k < t->rank && n < size; k++)
    n += (size_t)snprintf(buf + n, size - n, "%s%lld", k ? "," : "", (long long)t->dims[k]);
  if (n < size) snprintf(buf + n, size - n, "]");
}

typedef struct {
  double err; /* max |got - want| / scale (absolute when scale is 0); NaN-safe */
  int64_t at; /* where the largest |got - want| is */
  double got, want, scale;
} TensorError;

/* A tensor's largest |element|. */
static double max_abs(const TpTensor *t) {
  double m = 0;
  for (int64_t i = 0, n = tp_tensor_numel(t); i < n; i++) m = fmax(m, fabs(tp_tensor_get_f64(t, i)));
  return m;
}

/* The error of got against want, relative to want's largest element or to `floor` when that
 * is larger. */
static TensorError tensor_error(const TpTensor *got, const TpTensor *want, double floor) {
  TensorError e = {0, 0, 0, 0, fmax(max_abs(want), floor)};
  double worst = 0;
  for (int64_t i = 0, n = tp_tensor_numel(want); i < n; i++) {
    double g = tp_tensor_get_f64(got, i), w = tp_tensor_get_f64(want, i), diff = fabs(g - w);
    if (diff != diff) diff = INFINITY; /* a NaN is the worst mismatch there is */
    if (diff > worst || (i == 0 && diff == worst)) worst = diff, e.at = i, e.got = g, e.want = w;
  }
  e.err = e.scale > 0 ? worst / e.scale : worst;
  return e;
}

static int same_shape(const TpTensor *a, const TpTensor *b) {
  if (a->rank != b->rank) return 0;
  for (int k = 0; k < a->rank; k++)
    if (a->dims[k] != b->dims[k]) return 0;
  return 1;
}

static int compare_tensors(const char *got_path, const char *want_path, double tol, int verbose, TpDiag *d) {
  TpSafetensors got, want;
  if (tp_safetensors_load(got_path, &got, d)) return 1;
  if (tp_safetensors_load(want_path, &want, d)) {
    tp_safetensors_free(&got);
    return 1;
  }
  /* A gradient that is zero in exact arithmetic (a key projection's bias: softmax ignores a
   * shift shared by a row's scores) is float32 noise of the size of the products that cancel,
   * which follows the whole model's gradients, not its own: each tensor's scale is at least
   * FLOOR_SHARE of the largest in WANT. */
  double floor = 0;
  for (int i = 0; i < want.n; i++) { /* a tensor holding inf or NaN sets no floor: it fails on its own */
    double largest = tp_dtype_is_float(want.tensors[i].t.dtype) ? max_abs(&want.tensors[i].t) : 0;
    if (isfinite(largest)) floor = fmax(floor, FLOOR_SHARE * largest);
  }
  int bad = 0, compared = 0;
  const char *worst_name = NULL;
  TensorError worst = {-1, 0, 0, 0, 0};
  char where[160], s1[160], s2[160];
  for (int i = 0; i < want.n; i++) {
    const char *name = want.tensors[i].name;
    const TpTensor *w = &want.tensors[i].t, *g = tp_safetensors_find(&got, name);
    if (!g) {
      tp_print_line(stderr, "%s: %s: missing from %s", tool, name, got_path);
      bad = 1;
      continue;
    }
    if (!same_shape(g, w)) {
      format_shape(g, s1, sizeof s1), format_shape(w, s2, sizeof s2);
      tp_print_line(stderr, "%s: %s: shape %s, want %s", tool, name, s1, s2);
      bad = 1;
      continue;
    }
    if (!tp_dtype_is_float(g->dtype) || !tp_dtype_is_float(w->dtype)) {
      tp_print_line(stderr, "%s: %s: not a float tensor (%s, %s)", tool, name, tp_dtype_name(g->dtype),
                    tp_dtype_name(w->dtype));
      bad = 1;
      continue;
    }
    TensorError e = tensor_error(g, w, floor);
    format_index(w, e.at, where, sizeof where);
    int ok = e.err <= tol;
    if (!ok || verbose)
      tp_print_line(ok ? stdout : stderr, "%s: %s %s: max_rel_err=%.2e at %s (got %.9g, want %.9g, max|want| %.3g)",
                    tool, ok ? "ok  " : "FAIL", name, e.err, where, e.got, e.want, e.scale);
    bad |= !ok;
    compared++;
    if (!(e.err <= worst.err)) worst = e, worst_name = name;
  }
  for (int i = 0; i < got.n; i++)
    if (!tp_safetensors_find(&want, got.tensors[i].name)) {
      tp_print_line(stderr, "%s: %s: in %s but not in %s", tool, got.tensors[i].name, got_path, want_path);
      bad = 1;
    }
  if (worst_name) {
    const TpTensor *w = tp_safetensors_find(&want, worst_name);
    format_index(w, worst.at, where, sizeof where);
    tp_print_line(stdout, "%s: %d of %d tensors compared, worst %s max_rel_err=%.2e at %s (tol %.0e): %s", tool,
                  compared, want.n, worst_name, worst.err, where, tol, bad ? "FAIL" : "ok");
  } else {
    printf("%s: no tensor compared: FAIL\n", tool);
    bad = 1;
  }
  tp_safetensors_free(&got);
  tp_safetensors_free(&want);
  return bad;
}

/* The number after "key": in a JSON line; 0 if the key is absent. */
static int json_number(const char *line, const char *key, double *out) {
  char quoted[64];
  snprintf(quoted, sizeof quoted, "\"%s\"", key);
  const char *p = strstr(line, quoted);
  if (!p) return 0;
  p += strlen(quoted);
  while (*p == ' ' || *p == '\t') p++;
  if (*p++ != ':') return 0;
  char *end;
  *out = strtod(p, &end);
  return end != p;
}

/* A log's losses: one entry per step, sorted by step (a later line for the same step wins,
 * as after a resume). Sized by the lines read, never by the step numbers. */
typedef struct {
  int64_t step;
  double loss;
  int64_t line;
} Loss;

#define MAX_STEP 1000000000 /* step numbers in a log and --steps */

static int by_step_then_line(const void *a, const void *b) {
  const Loss *x = a, *y = b;
  if (x->step != y->step) return x->step < y->step ? -1 : 1;
  return x->line < y->line ? -1 : x->line > y->line;
}

static int read_losses(const char *path, Loss **losses, int64_t *n, TpDiag *d) {
  char why[256];
  FILE *f = tp_fopen_input(path, why, sizeof why);
  if (!f) return tp_error(d, "cannot read '%s': %s", path, why);
  char *line = NULL;
  size_t cap = 0;
  int64_t lineno = 0, size = 0;
  *losses = NULL, *n = 0;
  while (getline(&line, &cap, f) > 0) {
    lineno++;
    double step, loss;
    if (!json_number(line, "step", &step) || !json_number(line, "loss", &loss)) continue;
    if (!(step >= 1 && step <= MAX_STEP) || step != (int64_t)step) {
      free(line), fclose(f), free(*losses);
      return tp_error(d, "%s:%lld: bad step number %g (1..%d)", path, (long long)lineno, step, MAX_STEP);
    }
    if (*n == size) {
      size = size ? 2 * size : 256;
      *losses = realloc(*losses, (size_t)size * sizeof **losses);
      TP_ASSERT(*losses);
    }
    (*losses)[(*n)++] = (Loss){(int64_t)step, loss, lineno};
  }
  free(line);
  fclose(f);
  if (*n == 0) return tp_error(d, "%s: no line with a \"step\" and a \"loss\"", path);
  qsort(*losses, (size_t)*n, sizeof **losses, by_step_then_line);
  int64_t kept = 0; /* the last line of each step */
  for (int64_t i = 0; i < *n; i++) {
    if (kept && (*losses)[kept - 1].step == (*losses)[i].step) kept--;
    (*losses)[kept++] = (*losses)[i];
  }
  *n = kept;
  return TP_OK;
}

static void report_gap(const char *path, int64_t first, int64_t last) {
  if (first == last) tp_print_line(stderr, "%s: step %lld: not in %s", tool, (long long)first, path);
  else tp_print_line(stderr, "%s: steps %lld..%lld: not in %s", tool, (long long)first, (long long)last, path);
}

static int compare_losses(const char *got_path, const char *want_path, int64_t steps, double tol, TpDiag *d) {
  Loss *got, *want;
  int64_t ngot, nwant;
  if (read_losses(got_path, &got, &ngot, d)) return 1;
  if (read_losses(want_path, &want, &nwant, d)) {
    free(got);
    return 1;
  }
  if (steps <= 0) steps = want[nwant - 1].step;
  int bad = 0;
  const Loss *worst_got = NULL, *worst_want = NULL;
  double worst = -1;
  int64_t next = 1, g = 0; /* the first step not yet seen in WANT; got[g] the next candidate */
  for (int64_t i = 0; i < nwant && want[i].step <= steps; i++) {
    const Loss *w = &want[i];
    if (w->step > next) report_gap(want_path, next, w->step - 1), bad = 1;
    next = w->step + 1;
    while (g < ngot && got[g].step < w->step) g++;
    if (g == ngot || got[g].step != w->step) {
      tp_print_line(stderr, "%s: step %lld: no loss in %s", tool, (long long)w->step, got_path);
      bad = 1;
      continue;
    }
    double err = fabs(got[g].loss - w->loss) / fmax(fabs(w->loss), 1e-30);
    if (!(err <= tol)) {
      if (!bad) /* the first divergence is the one worth reading */
        fprintf(stderr, "%s: step %lld: loss %.9g, want %.9g: rel_err=%.2e > tol %.0e\n", tool, (long long)w->step,
                got[g].loss, w->loss, err, tol);
      bad = 1;
    }
    if (err > worst) worst = err, worst_got = &got[g], worst_want = w;
  }
  if (next <= steps) report_gap(want_path, next, steps), bad = 1;
  if (worst_want)
    printf("%s: losses of steps 1..%lld, worst rel_err=%.2e at step %lld (got %.9g, want %.9g, "
           "tol %.0e): %s\n",
           tool, (long long)steps, worst, (long long)worst_want->step, worst_got->loss, worst_want->loss, tol,
           bad ? "FAIL" : "ok");
  free(got);
  free(want);
  return bad;
}

int main(int argc, char **argv) {
  const char *paths[2] = {NULL, NULL};
  int npaths = 0, losses = 0, verbose = 0;
  double tol = -1;
  int64_t steps = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    char *end;
    if (strcmp(a, "--help") == 0) {
      fputs(usage, stdout);
      return 0;
    } else if (strcmp(a, "--version") == 0) {
      printf("%s %s\n", tool, TOKPIPE_VERSION);
      return 0;
    } else if (strcmp(a, "--losses") == 0) {
      losses = 1;
    } else if (strcmp(a, "-v") == 0) {
      verbose = 1;
    } else if (strcmp(a, "--tol") == 0 || strcmp(a, "--steps") == 0) {
      if (i + 1 >= argc) return tp_usage_error(stderr, tool, "%s needs a value", a);
      const char *v = argv[++i];
      double x = strtod(v, &end);
      if (!*v || *end || !(x >= 0) || (a[2] == 's' && !(x >= 1 && x <= MAX_STEP && x == floor(x))))
        return tp_usage_error(stderr, tool,
                              a[2] == 's' ? "--steps needs a whole number in [1, 1000000000], not '%s'"
                                          : "--tol needs a number >= 0, not '%s'",
                              v);
      if (a[2] == 's') steps = (int64_t)x;
      else tol = x;
    } else if (a[0] == '-' && a[1]) {
      return tp_usage_error(stderr, tool, "unknown option '%s'", a);
    } else if (npaths == 2) {
      return tp_usage_error(stderr, tool, "unexpected argument '%s' (two files: GOT and WANT)", a);
    } else {
      paths[npaths++] = a;
    }
  }
  if (npaths != 2) return tp_usage_error(stderr, tool, "two files are needed: GOT and WANT");
  if (steps && !losses) return tp_usage_error(stderr, tool, "--steps goes with --losses");
  TpDiag d;
  tp_diag_init(&d, tool, NULL, stderr);
  if (losses) return compare_losses(paths[0], paths[1], steps, tol < 0 ? 1e-5 : tol, &d);
  return compare_tensors(paths[0], paths[1], tol < 0 ? 1e-4 : tol, verbose, &d);
}
