/* check_trace TRACE.json RANKS: the file is valid JSON in the Chrome trace format, names
 * every rank 0..RANKS-1 (a process_name record each), and each rank has complete ("X")
 * events of forward and backward compute with non-negative times. Exit 0 or 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes/planner/json.h"

static const char *str(const TpJson *j, const char *key) {
  const TpJson *v = tp_json_get(j, key);
  return v && v->kind == TP_JSON_STRING ? v->string : "";
}

int main(int argc, char **argv) {
  if (argc != 3) return fprintf(stderr, "usage: check_trace TRACE.json RANKS\n"), 2;
  char err[256];
  TpJson *doc = tp_json_parse_file(argv[1], err, sizeof err);
  if (!doc) return fprintf(stderr, "check_trace: %s: %s\n", argv[1], err), 1;
  int ranks = atoi(argv[2]), bad = 0;
  int *named = calloc((size_t)ranks, sizeof *named), *fwd = calloc((size_t)ranks, sizeof *fwd),
      *bwd = calloc((size_t)ranks, sizeof *bwd);
  const TpJson *ev = tp_json_get(doc, "traceEvents");
  if (!ev || ev->kind != TP_JSON_ARRAY) return fprintf(stderr, "check_trace: no traceEvents array\n"), 1;
  for (int i = 0; i < ev->count; i++) {
    const TpJson *e = &ev->items[i];
    int pid = (int)tp_json_number(e, "pid", -1, NULL);
    if (pid < 0 || pid >= ranks) {
      fprintf(stderr, "check_trace: event %d has pid %d\n", i, pid);
      bad = 1;
      continue;
    }
    const char *ph = str(e, "ph"), *name = str(e, "name");
    if (!strcmp(ph, "M") && !strcmp(name, "process_name")) named[pid] = 1;
    if (strcmp(ph, "X") != 0) continue;
    if (tp_json_number(e, "ts", -1, NULL) < 0 || tp_json_number(e, "dur", -1, NULL) < 0) {
      fprintf(stderr, "check_trace: event %d (%s) has negative times\n", i, name);
      bad = 1;
    }
    if (!strncmp(name, "forward ", 8)) fwd[pid]++;
    if (!strncmp(name, "backward ", 9)) bwd[pid]++;
  }
  for (int r = 0; r < ranks; r++)
    if (!named[r] || !fwd[r] || !bwd[r]) {
      fprintf(stderr, "check_trace: rank %d: named %d, %d forward and %d backward events\n", r, named[r], fwd[r],
              bwd[r]);
      bad = 1;
    }
  if (!bad) printf("check_trace: %d events, %d ranks\n", ev->count, ranks);
  tp_json_free(doc);
  free(named), free(fwd), free(bwd);
  return bad;
}
