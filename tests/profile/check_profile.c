/* check_profile FILE.json STAGES BATCH SEQ RANKS L:C,L:C,..: the trainer's --profile file
 * is valid JSON in the format of passes/planner/cost.h (above TpSample): format, version,
 * device, threads, ranks, model, stages, stage_cuts, batch, seq, one optimizer time per
 * stage, the drift (>= 0), and exactly one sample per (grid point, stage) with b = BATCH, positive forward
 * and backward and seconds = forward + backward. No timing is judged. Exit 0 or 1. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes/planner/json.h"

static int bad;

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "check_profile: ");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  bad = 1;
}

static double number(const TpJson *j, const char *key) {
  bool ok = true;
  double x = tp_json_number(j, key, NAN, &ok);
  if (!ok || isnan(x)) fail("\"%s\" is missing or not a number", key);
  return x;
}

static void expect(const TpJson *j, const char *key, double want) {
  double x = number(j, key);
  if (x != want) fail("\"%s\" is %g, expected %g", key, x, want);
}

int main(int argc, char **argv) {
  if (argc != 7) return fprintf(stderr, "usage: check_profile FILE.json STAGES BATCH SEQ RANKS L:C,L:C,..\n"), 2;
  int S = atoi(argv[2]), B = atoi(argv[3]), T = atoi(argv[4]), ranks = atoi(argv[5]);
  int np = 0, pl[4096], pc[4096];
  for (const char *p = argv[6]; *p && np < 4096; np++) {
    if (sscanf(p, "%d:%d", &pl[np], &pc[np]) != 2) return fprintf(stderr, "check_profile: bad grid '%s'\n", p), 2;
    p += strcspn(p, ",");
    p += *p == ',';
  }
  char err[256];
  TpJson *doc = tp_json_parse_file(argv[1], err, sizeof err);
  if (!doc) return fprintf(stderr, "check_profile: %s: %s\n", argv[1], err), 1;
  const TpJson *format = tp_json_get(doc, "format"), *device = tp_json_get(doc, "device"),
               *model = tp_json_get(doc, "model");
  if (!format || format->kind != TP_JSON_STRING || strcmp(format->string, "tokpipe-profile") != 0)
    fail("\"format\" is not \"tokpipe-profile\"");
  if (!device || device->kind != TP_JSON_STRING || !*device->string) fail("\"device\" is not a name");
  if (!model || model->kind != TP_JSON_STRING || !*model->string) fail("\"model\" is not a file name");
  expect(doc, "version", 1);
  expect(doc, "stages", S);
  expect(doc, "batch", B);
  expect(doc, "seq", T);
  expect(doc, "ranks", ranks);
  if (!(number(doc, "threads") >= 1)) fail("\"threads\" < 1");
  const TpJson *cuts = tp_json_get(doc, "stage_cuts"), *opt = tp_json_get(doc, "optimizer");
  if (!cuts || cuts->kind != TP_JSON_ARRAY || cuts->count != S) fail("\"stage_cuts\" is not %d layer numbers", S);
  for (int k = 0; cuts && cuts->kind == TP_JSON_ARRAY && k < cuts->count; k++)
    if (k ? cuts->items[k].number <= cuts->items[k - 1].number : cuts->items[0].number != 0)
      fail("\"stage_cuts\" does not start at 0 and increase (entry %d)", k);
  if (!opt || opt->kind != TP_JSON_ARRAY || opt->count != S) fail("\"optimizer\" is not %d times", S);
  for (int k = 0; opt && opt->kind == TP_JSON_ARRAY && k < opt->count; k++)
    if (!(opt->items[k].number > 0)) fail("\"optimizer\" of stage %d is not positive", k);
  if (!(number(doc, "drift") >= 0)) fail("\"drift\" is not >= 0");

  const TpJson *samples = tp_json_get(doc, "samples");
  if (!samples || samples->kind != TP_JSON_ARRAY) return fail("no \"samples\" array"), 1;
  if (samples->count != np * S) fail("\"samples\" has %d entries, expected %d", samples->count, np * S);
  int *seen = calloc((size_t)np * S + 1, sizeof *seen);
  for (int i = 0; i < samples->count; i++) {
    const TpJson *e = &samples->items[i];
    int k = (int)number(e, "stage"), l = (int)number(e, "l"), c = (int)number(e, "c");
    double f = number(e, "forward"), b = number(e, "backward"), sec = number(e, "seconds");
    int p = 0;
    while (p < np && !(pl[p] == l && pc[p] == c)) p++;
    if (p == np || k < 0 || k >= S) {
      fail("sample %d: (l %d, c %d, stage %d) is not a grid point and stage", i, l, c, k);
      continue;
    }
    if (seen[p * S + k]++) fail("sample %d: (l %d, c %d, stage %d) again", i, l, c, k);
    expect(e, "b", B);
    if (!(f > 0) || !(b > 0)) fail("sample %d: forward or backward not positive", i);
    if (!(fabs(sec - (f + b)) <= 1e-6 * sec)) fail("sample %d: seconds %g != forward + backward %g", i, sec, f + b);
  }
  if (!bad) printf("%d samples: %d grid points x %d stages, batch %d, seq %d\n", samples->count, np, S, B, T);
  free(seen);
  tp_json_free(doc);
  return bad;
}
