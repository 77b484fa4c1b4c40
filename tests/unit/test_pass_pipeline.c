/* Unit tests of the pipeline built from the pass options (tp_pipeline_passes): which passes
 * of the default pipeline each option drops, replaces or adds, compared as one joined list
 * so a mismatch prints both. */
#include "../check.h"

#include <string.h>

#include "ir/ir.h"

/* The passes o asks for, joined by commas, against want. */
static void expect(const char *label, TpPassOptions o, const char *want) {
  const char *names[TP_MAX_PIPELINE];
  int n = tp_pipeline_passes(&o, names);
  char got[1024] = "";
  for (int i = 0; i < n; i++) snprintf(got + strlen(got), sizeof got - strlen(got), "%s%s", i ? "," : "", names[i]);
  if (strcmp(got, want) != 0) fail("%s: got  %s\n     want %s", label, got, want);
  if (names[n] != NULL) fail("%s: the list is not NULL-terminated", label);
}

int main(void) {
  expect("defaults", (TpPassOptions){0},
         "fold-constants,dce,rebatch,retie-params,raise-transformer,add-loss,assign-stages,autodiff,finish-stages,"
         "dce");
  expect("--slices", (TpPassOptions){.sliced = true},
         "fold-constants,dce,rebatch,retie-params,raise-transformer,insert-token-dim,add-loss,split-sequence,"
         "assign-stages,autodiff,finish-stages,dce");
  /* shard-tensor after a dce: raising leaves the products it replaced unread until dce */
  expect("--tensor 2", (TpPassOptions){.tensor = 2},
         "fold-constants,dce,rebatch,retie-params,raise-transformer,dce,shard-tensor,add-loss,assign-stages,"
         "autodiff,"
         "finish-stages,dce");
  expect("--tensor 1", (TpPassOptions){.tensor = 1},
         "fold-constants,dce,rebatch,retie-params,raise-transformer,add-loss,assign-stages,autodiff,finish-stages,"
         "dce");
  expect("--no-retie --no-fuse", (TpPassOptions){.no_retie = true, .no_fuse = true},
         "fold-constants,dce,rebatch,raise-transformer-unfused,add-loss,assign-stages,autodiff,finish-stages,dce");
  expect("--forward-only", (TpPassOptions){.forward_only = true},
         "fold-constants,dce,rebatch,retie-params,raise-transformer,assign-stages,finish-stages,dce");
  expect("--emit=params", (TpPassOptions){.params_only = true, .sliced = true, .tensor = 2},
         "fold-constants,dce,rebatch,retie-params");
  expect("--emit=params --no-retie --no-fuse",
         (TpPassOptions){.params_only = true, .no_retie = true, .no_fuse = true}, "fold-constants,dce,rebatch");
  expect("all of them", (TpPassOptions){.sliced = true, .tensor = 4, .forward_only = true, .no_fuse = true},
         "fold-constants,dce,rebatch,retie-params,raise-transformer-unfused,insert-token-dim,dce,shard-tensor,"
         "split-sequence,assign-stages,finish-stages,dce");
  /* every name the builder gives is a registered pass */
  const char *names[TP_MAX_PIPELINE];
  int n = tp_pipeline_passes(&(TpPassOptions){.sliced = true, .tensor = 2, .no_fuse = true}, names);
  for (int i = 0; i < n; i++)
    if (!tp_find_pass(names[i])) fail("'%s' is not a registered pass", names[i]);
  if (failures) fprintf(stderr, "%d failure(s)\n", failures);
  return failures != 0;
}
