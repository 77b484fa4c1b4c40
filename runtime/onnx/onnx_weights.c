/* Reading and rewriting a model's initializers for the trainer (--init, --export-onnx).
 * Requires: an ONNX file. Provides: initializers decoded by onnx_tensor.c (raw, typed and
 * external data, external files confined to the model's folder, as the importer reads them),
 * and the model re-serialized with trained weights. */
#include "onnx_weights.h"

#include <stdlib.h>
#include <string.h>

#include "../../base/file.h"
#include "onnx_tensor.h"

/* An external-data file, mapped once however many tensors it holds. */
typedef struct {
  char *location; /* as the model names it, relative to its folder */
  TpFileMap map;
} ExternalFile;

struct TpOnnxWeights {
  Onnx__ModelProto *model;
  char *path;
  char *dir; /* the model's folder, where its external data lies */
  ExternalFile *files;
  int nfiles;
  void **owned; /* tensors converted from typed fields, freed at close */
  int nowned;
};

static bool is_identity(const Onnx__NodeProto *n) {
  return n->op_type && strcmp(n->op_type, "Identity") == 0 &&
         (!n->domain || !*n->domain || strcmp(n->domain, "ai.onnx") == 0) && n->n_input == 1 && n->n_output == 1;
}

static int find_initializer(const Onnx__GraphProto *g, const char *name) {
  for (size_t i = 0; i < g->n_initializer; i++)
    if (g->initializer[i]->name && strcmp(g->initializer[i]->name, name) == 0) return (int)i;
  return -1;
}

/* The Identity node whose output is `name` and whose input is an initializer, or -1. */
static int find_alias(const Onnx__GraphProto *g, const char *name) {
  for (size_t i = 0; i < g->n_node; i++) {
    const Onnx__NodeProto *n = g->node[i];
    if (is_identity(n) && strcmp(n->output[0], name) == 0 && find_initializer(g, n->input[0]) >= 0) return (int)i;
  }
  return -1;
}

int tp_onnx_weights_open(const char *path, TpOnnxWeights **out, TpDiag *d) {
  *out = NULL;
  const char *file = d->file;
  d->file = path;
  TpFileMap f;
  char why[256];
  int rc = TP_OK;
  Onnx__ModelProto *model = NULL;
  if (tp_map_input(path, &f, why, sizeof why) < 0) {
    rc = tp_error(d, "cannot open '%s': %s", path, why);
  } else {
    model = onnx__model_proto__unpack(NULL, f.size, f.base); /* copies what it keeps */
    tp_unmap_input(&f);
    if (!model || !model->graph)
      rc = tp_error(d, "cannot decode the file as an ONNX model (truncated, or not protobuf)");
  }
  d->file = file;
  if (rc) {
    if (model) onnx__model_proto__free_unpacked(model, NULL);
    return rc;
  }
  TpOnnxWeights *w = calloc(1, sizeof *w);
  TP_ASSERT(w);
  w->model = model;
  w->path = strdup(path);
  TP_ASSERT(w->path);
  w->dir = tp_folder_of(path);
  *out = w;
  return TP_OK;
}

void tp_onnx_weights_close(TpOnnxWeights *w) {
  if (!w) return;
  onnx__model_proto__free_unpacked(w->model, NULL);
  for (int i = 0; i < w->nfiles; i++) {
    free(w->files[i].location);
    tp_unmap_input(&w->files[i].map);
  }
  for (int i = 0; i < w->nowned; i++) free(w->owned[i]);
  free(w->files);
  free(w->owned);
  free(w->path);
  free(w->dir);
  free(w);
}

bool tp_onnx_weights_has(const TpOnnxWeights *w, const char *name) {
  return find_initializer(w->model->graph, name) >= 0;
}

/* TpOnnxData.map: file `location` of the model's folder. */
static int map_external(void *ctx, const char *location, const uint8_t **bytes, size_t *size, char *why,
                        size_t why_size) {
  TpOnnxWeights *w = ctx;
  TpFileMap f;
  if (tp_map_in_folder(w->dir, location, "the model's folder", &f, why, why_size) < 0) return -1;
  int i = 0;
  while (i < w->nfiles && strcmp(w->files[i].location, location) != 0) i++;
  if (i < w->nfiles) { /* the same file named again */
    tp_unmap_input(&f);
  } else {
    ExternalFile *grown = realloc(w->files, (size_t)(w->nfiles + 1) * sizeof *grown);
    TP_ASSERT(grown);
    w->files = grown;
    w->files[w->nfiles++] = (ExternalFile){strdup(location), f};
    TP_ASSERT(w->files[i].location);
  }
  *bytes = w->files[i].map.base;
  *size = w->files[i].map.size;
  return i;
}

int tp_onnx_weights_get(TpOnnxWeights *w, const char *name, TpTensor *out, TpDiag *d) {
  const char *file = d->file;
  d->file = w->path;
  int rc, i = find_initializer(w->model->graph, name);
  TpOnnxTensor dec;
  char what[300], err[TP_ONNX_ERR_SIZE];
  snprintf(what, sizeof what, "initializer '%s'", name);
  const TpOnnxData external = {.map = map_external, .ctx = w};
  if (i < 0) rc = tp_error(d, "the model has no initializer '%s'", name);
  else if ((rc = tp_onnx_tensor_decode(w->model->graph->initializer[i], what, &external, &dec, err, sizeof err)))
    tp_error(d, "%s", err);
  if (!rc && dec.owned) {
    void **grown = realloc(w->owned, (size_t)(w->nowned + 1) * sizeof *grown);
    TP_ASSERT(grown);
    w->owned = grown;
    w->owned[w->nowned++] = dec.owned;
  }
  if (!rc) *out = dec.t;
  d->file = file;
  return rc;
}

int tp_onnx_weights_check_replace(const TpOnnxWeights *w, const char *name, TpDiag *d) {
  const Onnx__GraphProto *g = w->model->graph;
  if (find_initializer(g, name) >= 0 || find_alias(g, name) >= 0) return TP_OK;
  const char *file = d->file;
  d->file = w->path;
  int rc = tp_error(d,
                    "the model has no initializer '%s' (nor an Identity of one) to hold "
                    "the trained value",
                    name);
  d->file = file;
  return rc;
}

/* ---- rewriting ---- */

/* Replaces t's contents by `bytes` of raw data with the given dtype and shape. */
static void set_raw(Onnx__TensorProto *t, TpDType dtype, int rank, const int64_t *dims, const void *data,
                    size_t bytes) {
  free(t->float_data), t->float_data = NULL, t->n_float_data = 0;
  free(t->int32_data), t->int32_data = NULL, t->n_int32_data = 0;
  free(t->int64_data), t->int64_data = NULL, t->n_int64_data = 0;
  free(t->double_data), t->double_data = NULL, t->n_double_data = 0;
  free(t->uint64_data), t->uint64_data = NULL, t->n_uint64_data = 0;
  for (size_t i = 0; i < t->n_external_data; i++)
    onnx__string_string_entry_proto__free_unpacked(t->external_data[i], NULL);
  free(t->external_data), t->external_data = NULL, t->n_external_data = 0;
  t->has_data_location = 0;
  t->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__DEFAULT;
  t->has_data_type = 1;
  t->data_type = (int32_t)dtype;
  int64_t *d = realloc(t->dims, (size_t)(rank ? rank : 1) * sizeof *d);
  TP_ASSERT(d);
  if (rank) memcpy(d, dims, (size_t)rank * sizeof *d);
  t->dims = d;
  t->n_dims = (size_t)rank;
  free(t->raw_data.data);
  t->raw_data.data = malloc(bytes ? bytes : 1);
  TP_ASSERT(t->raw_data.data);
  if (bytes) memcpy(t->raw_data.data, data, bytes);
  t->raw_data.len = bytes;
  t->has_raw_data = 1;
}

static Onnx__TensorProto *add_initializer(Onnx__GraphProto *g, const char *name) {
  Onnx__TensorProto **grown = realloc(g->initializer, (g->n_initializer + 1) * sizeof *grown);
  Onnx__TensorProto *t = malloc(sizeof *t);
  TP_ASSERT(grown && t);
  onnx__tensor_proto__init(t);
  t->name = strdup(name);
  TP_ASSERT(t->name);
  g->initializer = grown;
  g->initializer[g->n_initializer++] = t;
  return t;
}

static void remove_node(Onnx__GraphProto *g, int i) {
  onnx__node_proto__free_unpacked(g->node[i], NULL);
  memmove(&g->node[i], &g->node[i + 1], (g->n_node - (size_t)i - 1) * sizeof *g->node);
  g->n_node--;
}

int tp_onnx_weights_pack(TpOnnxWeights *w, const char *const *names, const TpTensor *values, int n, void **bytes,
                         size_t *size, TpDiag *d) {
  Onnx__GraphProto *g = w->model->graph;
  int rc;
  *bytes = NULL;
  *size = 0;
  for (int k = 0; k < n; k++)
    if ((rc = tp_onnx_weights_check_replace(w, names[k], d))) return rc;
  /* inline external data first: the tensors are read from the files still named */
  for (size_t i = 0; i < g->n_initializer; i++) {
    Onnx__TensorProto *t = g->initializer[i];
    if (!t->has_data_location || t->data_location != ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL) continue;
    TpTensor v;
    if ((rc = tp_onnx_weights_get(w, t->name, &v, d))) return rc;
    set_raw(t, v.dtype, v.rank, v.dims, v.data, tp_tensor_bytes(&v));
  }
  for (int k = 0; k < n; k++) {
    TP_ASSERT(values[k].dtype == TP_F32);
    int i = find_initializer(g, names[k]);
    Onnx__TensorProto *t = i >= 0 ? g->initializer[i] : NULL;
    if (!t) {
      remove_node(g, find_alias(g, names[k]));
      t = add_initializer(g, names[k]);
    }
    set_raw(t, TP_F32, values[k].rank, values[k].dims, values[k].data, tp_tensor_bytes(&values[k]));
  }
  size_t len = onnx__model_proto__get_packed_size(w->model);
  if (len > INT32_MAX) {
    const char *file = d->file;
    d->file = w->path;
    rc = tp_error(d, "the model with its trained weights is %zu bytes; protobuf holds at most 2 GiB", len);
    d->file = file;
    return rc;
  }
  *bytes = malloc(len ? len : 1);
  TP_ASSERT(*bytes);
  *size = onnx__model_proto__pack(w->model, *bytes);
  TP_ASSERT(*size == len);
  return TP_OK;
}
