/* Rewrites a safetensors file with edits, for the checkpoint tests (the file written anew,
 * so its checksums are right: what is tested is what the edit says):
 *   edit_safetensors IN OUT EDIT...
 * EDIT: KEY=VALUE sets a metadata string (adds it if missing), -KEY removes one,
 * tensor:NAME=X fills the F32 tensor NAME with X (inf and nan too), -tensor:NAME drops it,
 * copy:NAME=NEW adds a copy of tensor NAME named NEW, rows:NAME=K keeps the first K rows
 * (dim 0) of tensor NAME (what one tensor rank holds of a row-split parameter). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/train/safetensors.h"

int main(int argc, char **argv) {
  TpDiag d;
  tp_diag_init(&d, "edit_safetensors", NULL, stderr);
  TpSafetensors st;
  if (argc < 3 || tp_safetensors_load(argv[1], &st, &d)) return 2;
  const char **meta = calloc((size_t)(2 * st.nmeta + 2 * argc + 1), sizeof *meta);
  TpNamedTensor *ts = calloc((size_t)(st.n + argc), sizeof *ts);
  int nmeta = 0, n = 0;
  for (int i = 0; i < st.nmeta; i++)
    if (strcmp(st.meta[2 * i], TP_SAFETENSORS_CRC_KEY) != 0)
      meta[nmeta++] = st.meta[2 * i], meta[nmeta++] = st.meta[2 * i + 1];
  for (int i = 0; i < st.n; i++) ts[n++] = st.tensors[i];
  for (int a = 3; a < argc; a++) {
    char *edit = argv[a], *eq = strchr(edit, '=');
    if (strncmp(edit, "-tensor:", 8) == 0) {
      for (int i = 0; i < n; i++)
        if (strcmp(ts[i].name, edit + 8) == 0) ts[i--] = ts[--n];
    } else if (strncmp(edit, "copy:", 5) == 0 && eq) {
      *eq = 0;
      const TpTensor *t = tp_safetensors_find(&st, edit + 5);
      if (!t) return fprintf(stderr, "no tensor '%s'\n", edit + 5), 2;
      ts[n++] = (TpNamedTensor){eq + 1, *t};
    } else if (strncmp(edit, "rows:", 5) == 0 && eq) {
      *eq = 0;
      int i = 0;
      while (i < n && strcmp(ts[i].name, edit + 5) != 0) i++;
      long long rows = strtoll(eq + 1, NULL, 10);
      if (i == n || ts[i].t.rank < 1 || rows < 0 || rows > ts[i].t.dims[0])
        return fprintf(stderr, "no tensor '%s' of at least %lld rows\n", edit + 5, rows), 2;
      ts[i].t.dims[0] = rows;
    } else if (strncmp(edit, "tensor:", 7) == 0 && eq) {
      *eq = 0;
      const TpTensor *t = tp_safetensors_find(&st, edit + 7);
      if (!t || t->dtype != TP_F32) return fprintf(stderr, "no F32 tensor '%s'\n", edit + 7), 2;
      for (size_t k = 0; k < tp_tensor_bytes(t) / 4; k++) ((float *)t->data)[k] = strtof(eq + 1, NULL);
    } else {
      const char *key = edit[0] == '-' ? edit + 1 : edit;
      if (eq) *eq = 0;
      int i = 0;
      while (i < nmeta && strcmp(meta[i], key) != 0) i += 2;
      if (edit[0] == '-') {
        if (i < nmeta) memmove(&meta[i], &meta[i + 2], (size_t)(nmeta - i - 2) * sizeof *meta), nmeta -= 2;
      } else if (eq) {
        meta[i] = key, meta[i + 1] = eq + 1;
        if (i == nmeta) nmeta += 2;
      } else {
        return fprintf(stderr, "bad edit '%s'\n", edit), 2;
      }
    }
  }
  meta[nmeta] = NULL;
  int rc = tp_safetensors_save(argv[2], ts, n, meta, &d);
  free(meta);
  free(ts);
  tp_safetensors_free(&st);
  return rc ? 1 : 0;
}
