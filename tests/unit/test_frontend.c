/* The ONNX importer on models written here byte by byte (a tiny protobuf writer, so the
 * test needs neither Python nor protobuf-c): weights referenced in place, external data
 * never read while importing (mincore on a 4 GiB sparse file) and refused where it cannot
 * be read (each reader's reason), canonical lowering of
 * Slice/Squeeze/Unsqueeze/Reshape/Split, bound inputs turned into constants. */
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "frontend/frontend.h"

static int failures;
#define CHECK(cond, ...)                                                                                            \
  do {                                                                                                              \
    if (!(cond)) {                                                                                                  \
      fprintf(stderr, "%s:%d: FAIL %s: ", __FILE__, __LINE__, #cond);                                               \
      fprintf(stderr, __VA_ARGS__);                                                                                 \
      fprintf(stderr, "\n");                                                                                        \
      failures++;                                                                                                   \
    }                                                                                                               \
  } while (0)

/* ---- protobuf wire format ---- */
typedef struct {
  uint8_t *p;
  size_t n, cap;
} Buf;

static void put(Buf *b, const void *data, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 64;
    b->p = realloc(b->p, b->cap);
    TP_ASSERT(b->p);
  }
  memcpy(b->p + b->n, data, n);
  b->n += n;
}
static void varint(Buf *b, uint64_t v) {
  do {
    uint8_t byte = (v & 0x7f) | (v > 0x7f ? 0x80 : 0);
    put(b, &byte, 1);
    v >>= 7;
  } while (v);
}
static void field_int(Buf *b, int field, int64_t v) { varint(b, (uint64_t)field << 3), varint(b, (uint64_t)v); }
static void field_bytes(Buf *b, int field, const void *data, size_t n) {
  varint(b, (uint64_t)field << 3 | 2);
  varint(b, n);
  put(b, data, n);
}
static void field_str(Buf *b, int field, const char *s) { field_bytes(b, field, s, strlen(s)); }
static void field_msg(Buf *b, int field, Buf *sub) { /* consumes sub */
  field_bytes(b, field, sub->p, sub->n);
  free(sub->p);
  *sub = (Buf){0};
}

/* ValueInfoProto: name, tensor type with dims (a negative dim is a dim_param "batch"). */
static void value_info(Buf *graph, int field, const char *name, int dtype, int rank, const int64_t *dims) {
  Buf vi = {0}, type = {0}, tensor = {0}, shape = {0}, dim = {0};
  for (int i = 0; i < rank; i++) {
    if (dims[i] < 0) field_str(&dim, 2, "batch");
    else field_int(&dim, 1, dims[i]);
    field_msg(&shape, 1, &dim);
  }
  field_int(&tensor, 1, dtype);
  field_msg(&tensor, 2, &shape);
  field_msg(&type, 1, &tensor);
  field_str(&vi, 1, name);
  field_msg(&vi, 2, &type);
  field_msg(graph, field, &vi);
}

/* NodeProto with inputs and outputs given as NULL-terminated lists; attrs already encoded. */
static void node(Buf *graph, const char *op, const char *name, const char *const *in, const char *const *out,
                 Buf *attrs) {
  Buf n = {0};
  for (; *in; in++) field_str(&n, 1, *in);
  for (; *out; out++) field_str(&n, 2, *out);
  field_str(&n, 3, name);
  field_str(&n, 4, op);
  if (attrs && attrs->n) put(&n, attrs->p, attrs->n);
  if (attrs) free(attrs->p);
  field_msg(graph, 1, &n);
}

/* TensorProto with raw data (data == NULL: external, at `location`). */
static Buf tensor(const char *name, int dtype, int rank, const int64_t *dims, const void *data, size_t bytes,
                  const char *location) {
  Buf t = {0};
  for (int i = 0; i < rank; i++) field_int(&t, 1, dims[i]);
  field_int(&t, 2, dtype);
  field_str(&t, 8, name);
  if (data) {
    field_bytes(&t, 9, data, bytes);
  } else {
    char len[32];
    snprintf(len, sizeof len, "%zu", bytes);
    const char *kv[3][2] = {{"location", location}, {"offset", "0"}, {"length", len}};
    for (int i = 0; i < 3; i++) {
      Buf e = {0};
      field_str(&e, 1, kv[i][0]);
      field_str(&e, 2, kv[i][1]);
      field_msg(&t, 13, &e);
    }
    field_int(&t, 14, 1);
  }
  return t;
}

static void initializer(Buf *graph, const char *name, int dtype, int rank, const int64_t *dims, const void *data,
                        size_t bytes, const char *location) {
  Buf t = tensor(name, dtype, rank, dims, data, bytes, location);
  field_msg(graph, 5, &t);
}

static Buf model(Buf *graph, int opset) {
  Buf m = {0}, os = {0};
  field_int(&m, 1, 8);
  field_int(&os, 2, opset);
  field_msg(&m, 8, &os);
  field_msg(&m, 7, graph);
  return m;
}

static void write_file(const char *path, const Buf *b) {
  FILE *f = fopen(path, "wb");
  TP_ASSERT(f && fwrite(b->p, 1, b->n, f) == b->n && fclose(f) == 0);
}

/* quiet: the error is expected (it is still in d->last). */
static TpModule *import(const Buf *b, const char *path, const TpImportOptions *o, TpDiag *d, bool quiet) {
  TpModule *m = NULL;
  tp_diag_init(d, "test_frontend", path, quiet ? NULL : stderr);
  if (tp_import_onnx_buffer(b->p, b->n, path, o, &m, d) != TP_OK) return NULL;
  return m;
}

static const TpOp *only_op(const TpModule *m, TpOpKind kind) {
  CHECK(m->nops == 1 && m->ops[0].kind == kind, "expected one %s op, have %d ops", tp_op_info[kind].name, m->nops);
  return m->nops == 1 ? &m->ops[0] : NULL;
}

/* ---- tests ---- */

/* raw_data initializers point into the model file; nothing is copied. */
static void test_weights_referenced(void) {
  float w[6] = {1, 2, 3, 4, 5, 6};
  int64_t xd[2] = {2, 3}, wd[2] = {3, 2}, yd[2] = {2, 2};
  Buf g = {0};
  node(&g, "MatMul", "mm", (const char *[]){"x", "w", NULL}, (const char *[]){"y", NULL}, NULL);
  initializer(&g, "w", 1, 2, wd, w, sizeof w, NULL);
  value_info(&g, 11, "x", 1, 2, xd);
  value_info(&g, 12, "y", 1, 2, yd);
  Buf b = model(&g, 17);
  const char *path = "test_frontend_weights.onnx";
  write_file(path, &b);
  TpModule *m = NULL;
  TpDiag d;
  tp_diag_init(&d, "test_frontend", path, stderr);
  CHECK(tp_import_onnx_file(path, NULL, &m, &d) == TP_OK, "import failed");
  if (m) {
    int v = tp_find_value(m, "w");
    CHECK(v >= 0 && m->values[v].kind == TP_VAL_PARAM, "w is not a PARAM");
    const TpBlob *blob = v >= 0 ? &m->blobs[m->values[v].blob] : NULL;
    CHECK(blob && blob->file.map_base && blob->path && strcmp(blob->path, path) == 0,
          "w is not in the mapped model file");
    CHECK(blob && memcmp(blob->base + m->values[v].offset, w, sizeof w) == 0, "w's offset is wrong");
    tp_module_free(m);
  }
  unlink(path);
  free(b.p);
}

/* Resident pages of a mapped blob (mincore). */
static size_t resident_pages(const TpBlob *blob) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE), npages = (blob->file.map_size + page - 1) / page, resident = 0;
  unsigned char *vec = malloc(npages);
  TP_ASSERT(vec && mincore(blob->file.map_base, blob->file.map_size, vec) == 0);
  for (size_t i = 0; i < npages; i++) resident += vec[i] & 1;
  free(vec);
  return resident;
}

/* A sparse file's holes, from the file system: 4 KiB written at 1 MiB of 3 MiB. */
static void test_file_holes(void) {
  char path[] = "test_frontend_holes_XXXXXX";
  int fd = mkstemp(path);
  char page[4096];
  memset(page, 7, sizeof page);
  const uint64_t MiB = 1 << 20;
  TP_ASSERT(fd >= 0 && ftruncate(fd, (off_t)(3 * MiB)) == 0 && pwrite(fd, page, sizeof page, (off_t)MiB) == 4096 &&
            close(fd) == 0);
  TpFileMap f;
  char why[200];
  TP_ASSERT(tp_map_input(path, &f, why, sizeof why) == 0);
  CHECK(f.holes, "the file system reported no hole in %s", path);
  CHECK(tp_file_map_unwritten(&f, 0, MiB), "the first MiB is not a hole");
  CHECK(tp_file_map_unwritten(&f, 2 * MiB, MiB), "the last MiB is not a hole");
  CHECK(!tp_file_map_unwritten(&f, MiB, 4096), "the written page is a hole");
  CHECK(!tp_file_map_unwritten(&f, MiB - 8, 16), "a range into the written page is a hole");
  CHECK(!tp_file_map_unwritten(&f, 3 * MiB - 8, 16), "a range past the end is a hole");
  CHECK(f.base[MiB + 100] == 7 && f.base[100] == 0, "the mapped bytes are wrong");
  tp_unmap_input(&f);
  unlink(path);
}

/* Two 4 GiB external weights of one shape (sparse files, never written) are mapped, never
 * read, while importing, nor by retie-params, which sees them in the files' holes (all
 * zeros: not tied) without reading a page. */
static void test_external_not_read(void) {
  char dir[] = "test_frontend_ext_XXXXXX", model_path[64], data_path[2][64];
  TP_ASSERT(mkdtemp(dir));
  snprintf(model_path, sizeof model_path, "%s/model.onnx", dir);
  const char *weights[2] = {"w", "u"}, *files[2] = {"w.bin", "u.bin"};
  int64_t wd[2] = {1 << 20, 1024}, id[1] = {2}, yd[2] = {2, 1024};
  size_t bytes = (size_t)wd[0] * (size_t)wd[1] * 4;
  Buf g = {0};
  node(&g, "Gather", "embed_w", (const char *[]){"w", "idx", NULL}, (const char *[]){"yw", NULL}, NULL);
  node(&g, "Gather", "embed_u", (const char *[]){"u", "idx", NULL}, (const char *[]){"yu", NULL}, NULL);
  node(&g, "Add", "sum", (const char *[]){"yw", "yu", NULL}, (const char *[]){"y", NULL}, NULL);
  for (int i = 0; i < 2; i++) {
    snprintf(data_path[i], sizeof data_path[i], "%s/%s", dir, files[i]);
    int fd = open(data_path[i], O_CREAT | O_WRONLY | O_TRUNC, 0644);
    TP_ASSERT(fd >= 0 && ftruncate(fd, (off_t)bytes) == 0 && close(fd) == 0);
    initializer(&g, weights[i], 1, 2, wd, NULL, bytes, files[i]);
  }
  value_info(&g, 11, "idx", 7, 1, id);
  value_info(&g, 12, "y", 1, 2, yd);
  Buf b = model(&g, 17);
  write_file(model_path, &b);
  TpModule *m = NULL;
  TpDiag d;
  tp_diag_init(&d, "test_frontend", model_path, stderr);
  CHECK(tp_import_onnx_file(model_path, NULL, &m, &d) == TP_OK, "import failed");
  const char *retie[] = {"retie-params"};
  TpPassOptions po = {.verify_each = true};
  for (int pass = 0; m && pass < 2; pass++) { /* 0: after the import, 1: after retie-params */
    if (pass == 1) CHECK(tp_run_passes(m, retie, 1, &po, &d) == TP_OK, "retie-params failed");
    for (int i = 0; i < 2; i++) {
      int v = tp_find_value(m, weights[i]);
      const TpBlob *blob = v >= 0 && m->values[v].blob >= 0 ? &m->blobs[m->values[v].blob] : NULL;
      CHECK(blob && blob->size == bytes && blob->file.map_base, "%s is not the mapped %s", weights[i], files[i]);
      if (!blob || !blob->file.map_base) continue;
      size_t resident = resident_pages(blob);
      CHECK(resident == 0, "%zu pages of %s were read %s", resident, files[i],
            pass ? "by retie-params" : "while importing");
    }
  }
  if (m) CHECK(m->values[tp_find_value(m, "u")].kind == TP_VAL_PARAM, "two zero tensors were tied");
  tp_module_free(m);
  unlink(model_path);
  for (int i = 0; i < 2; i++) unlink(data_path[i]);
  rmdir(dir);
  free(b.p);
}

/* External data where none can be read: each reader's reason, through the one decoder. */
static void test_external_refused(void) {
  int64_t one[1] = {1}, shape[1] = {2};
  Buf g = {0}, b;
  TpDiag d;
  /* a model from memory has no folder to hold its external data */
  node(&g, "Identity", "id", (const char *[]){"w", NULL}, (const char *[]){"y", NULL}, NULL);
  initializer(&g, "w", 1, 1, one, NULL, 4, "weights.bin");
  value_info(&g, 12, "y", 1, 1, one);
  b = model(&g, 17);
  CHECK(!import(&b, NULL, NULL, &d, true) &&
            strcmp(d.last, "initializer 'w': external data needs the model's folder") == 0,
        "diagnostic: %s", d.last);
  free(b.p);
  /* ConstantOfShape's value is read whole, never from a file */
  Buf attr = {0}, value = tensor("v", 1, 1, one, NULL, 4, "weights.bin");
  field_str(&attr, 1, "value");
  field_msg(&attr, 5, &value);
  field_int(&attr, 20, 4); /* TENSOR */
  Buf attrs = {0};
  field_msg(&attrs, 5, &attr);
  node(&g, "ConstantOfShape", "c", (const char *[]){"s", NULL}, (const char *[]){"y", NULL}, &attrs);
  initializer(&g, "s", 7, 1, one, shape, sizeof shape, NULL);
  value_info(&g, 12, "y", 1, 1, shape);
  b = model(&g, 17);
  CHECK(!import(&b, "cos.onnx", NULL, &d, true) &&
            strcmp(d.last, "cos.onnx: node 'c' (ConstantOfShape, opset 17): attribute 'value': external data is not "
                           "supported here") == 0,
        "diagnostic: %s", d.last);
  free(b.p);
  /* a test-data tensor file stands alone */
  const char *path = "test_frontend_ext_input.pb";
  b = tensor("x", 1, 1, one, NULL, 4, "weights.bin");
  write_file(path, &b);
  TpTensor t;
  tp_diag_init(&d, "test_frontend", NULL, NULL);
  CHECK(tp_read_tensor_pb(path, &t, NULL, &d) == TP_ERR_INPUT &&
            strcmp(d.last, "test_frontend_ext_input.pb: x: external data is not supported in tensor files") == 0,
        "diagnostic: %s", d.last);
  unlink(path);
  free(b.p);
}

/* Slice with negative steps, clamped and INT64_MAX ends, default axes -> full-rank attrs. */
static void test_slice_canonical(void) {
  int64_t xd[3] = {4, 5, 6}, yd[3] = {4, 2, 3};
  int64_t starts[2] = {-1, 0}, ends[2] = {-100, INT64_MAX}, axes[2] = {1, -1}, steps[2] = {-3, 2};
  int64_t n = 2;
  Buf g = {0};
  node(&g, "Slice", "s", (const char *[]){"x", "st", "en", "ax", "sp", NULL}, (const char *[]){"y", NULL}, NULL);
  initializer(&g, "st", 7, 1, &n, starts, sizeof starts, NULL);
  initializer(&g, "en", 7, 1, &n, ends, sizeof ends, NULL);
  initializer(&g, "ax", 7, 1, &n, axes, sizeof axes, NULL);
  initializer(&g, "sp", 7, 1, &n, steps, sizeof steps, NULL);
  value_info(&g, 11, "x", 1, 3, xd);
  value_info(&g, 12, "y", 1, 3, yd);
  Buf b = model(&g, 13);
  TpDiag d;
  TpModule *m = import(&b, "slice.onnx", NULL, &d, false);
  CHECK(m, "import failed: %s", d.last);
  const TpOp *op = m ? only_op(m, TP_OP_Slice) : NULL;
  if (op) {
    int ns, nt;
    const int64_t *s = tp_attr_ints(m, 0, "starts", &ns), *t = tp_attr_ints(m, 0, "steps", &nt);
    CHECK(ns == 3 && s[0] == 0 && s[1] == 4 && s[2] == 0, "starts");
    CHECK(nt == 3 && t[0] == 1 && t[1] == -3 && t[2] == 2, "steps");
    const TpType *y = &m->values[op->outputs[0]].type;
    CHECK(y->rank == 3 && y->dims[0] == 4 && y->dims[1] == 2 && y->dims[2] == 3, "result shape");
  }
  tp_module_free(m);
  free(b.p);
}

/* Squeeze/Unsqueeze become Reshape; a symbolic dim fixed by --dim keeps its name. */
static void test_squeeze_unsqueeze(void) {
  int64_t xd[3] = {-1, 1, 3}, yd[3] = {2, 3, 1}, one = 1, ax1[1] = {1}, ax2[1] = {-1};
  Buf g = {0};
  node(&g, "Squeeze", "sq", (const char *[]){"x", "a1", NULL}, (const char *[]){"t", NULL}, NULL);
  node(&g, "Unsqueeze", "un", (const char *[]){"t", "a2", NULL}, (const char *[]){"y", NULL}, NULL);
  initializer(&g, "a1", 7, 1, &one, ax1, 8, NULL);
  initializer(&g, "a2", 7, 1, &one, ax2, 8, NULL);
  value_info(&g, 11, "x", 1, 3, xd);
  value_info(&g, 12, "y", 1, 3, yd);
  Buf b = model(&g, 13);
  TpDimBinding dim = {"batch", 2};
  TpImportOptions o = {.dims = &dim, .ndims = 1};
  TpDiag d;
  TpModule *m = import(&b, "squeeze.onnx", &o, &d, false);
  CHECK(m, "import failed: %s", d.last);
  if (m) {
    CHECK(m->nops == 2 && m->ops[0].kind == TP_OP_Reshape && m->ops[1].kind == TP_OP_Reshape, "not two Reshapes");
    const TpType *x = &m->values[m->inputs[0]].type;
    CHECK(x->dims[0] == 2 && x->dimnames[0] && strcmp(x->dimnames[0], "batch") == 0, "input dim 'batch'");
    tp_module_free(m);
  }
  free(b.p);
}

/* A bound input that gives a Reshape its shape becomes a constant and leaves the inputs;
 * Split with num_outputs (opset 18) makes a smaller last part. */
static void test_bound_shape_and_split(void) {
  int64_t xd[2] = {2, 5}, sd[1] = {2}, yd[2] = {5, 2}, shape[2] = {5, -1};
  int64_t p0[2] = {2, 2}, p2[2] = {2, 1};
  Buf g = {0}, attrs = {0}, a = {0};
  field_str(&a, 1, "num_outputs");
  field_int(&a, 3, 3);
  field_int(&a, 20, 2);
  field_msg(&attrs, 5, &a);
  field_str(&a, 1, "axis");
  field_int(&a, 3, -1);
  field_int(&a, 20, 2);
  field_msg(&attrs, 5, &a);
  node(&g, "Reshape", "r", (const char *[]){"x", "shape", NULL}, (const char *[]){"y", NULL}, NULL);
  node(&g, "Split", "sp", (const char *[]){"x", NULL}, (const char *[]){"p0", "p1", "p2", NULL}, &attrs);
  value_info(&g, 11, "x", 1, 2, xd);
  value_info(&g, 11, "shape", 7, 1, sd);
  value_info(&g, 12, "y", 1, 2, yd);
  value_info(&g, 12, "p0", 1, 2, p0);
  value_info(&g, 12, "p1", 1, 2, p0);
  value_info(&g, 12, "p2", 1, 2, p2);
  Buf b = model(&g, 18);
  TpInputBinding bound = {"shape", {.dtype = TP_I64, .rank = 1, .dims = {2}, .data = shape}};
  TpImportOptions o = {.bound_inputs = &bound, .nbound = 1};
  TpDiag d;
  TpModule *m = import(&b, "bound.onnx", &o, &d, false);
  CHECK(m, "import failed: %s", d.last);
  if (m) {
    CHECK(m->ninputs == 1 && strcmp(m->values[m->inputs[0]].name, "x") == 0, "inputs: only x");
    CHECK(m->nops == 2 && m->ops[0].kind == TP_OP_Reshape && m->ops[1].kind == TP_OP_Split, "ops");
    tp_module_free(m);
  }
  /* unbound, the shape operand is an error naming the node and operand */
  m = import(&b, "bound.onnx", NULL, &d, true);
  CHECK(!m && strstr(d.last, "node 'r' (Reshape, opset 18): operand 'shape' is graph input 'shape'"),
        "diagnostic: %s", d.last);
  free(b.p);
}

int main(void) {
  test_weights_referenced();
  test_file_holes();
  test_external_not_read();
  test_external_refused();
  test_slice_canonical();
  test_squeeze_unsqueeze();
  test_bound_shape_and_split();
  if (failures) {
    fprintf(stderr, "test_frontend: %d failure(s)\n", failures);
    return 1;
  }
  printf("test_frontend: ok\n");
  return 0;
}
