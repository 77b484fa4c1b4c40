/* Unit tests of the interpreter's Gather, Slice and Transpose (interp/interp.c, bound by
 * bind/bind.c): they read the canonical attributes of ir/ops.def and report data-dependent
 * errors at the op's ONNX origin. */
#include "interp/interp.h"

#include <stdlib.h>
#include <string.h>

static int failures;
#define CHECK(cond)                                                                                                 \
  do {                                                                                                              \
    if (!(cond)) {                                                                                                  \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);                                      \
      failures++;                                                                                                   \
    }                                                                                                               \
  } while (0)

/* y = Gather(x, indices, axis=1) with x an input f32[2, 3] and constant indices i64[2]. */
static TpModule *gather_module(const int64_t *indices) {
  TpModule *m = tp_module_new("g.onnx");
  int x = tp_add_value(m, "x", TP_VAL_INPUT, tp_type_make(TP_F32, 2, (int64_t[]){2, 3}), (TpOrigin){0});
  tp_add_input(m, x);
  int ix = tp_add_const(m, "ix", tp_type_make(TP_I64, 1, (int64_t[]){2}), indices, (TpOrigin){0});
  int g = tp_add_op(m, TP_OP_Gather, (int[]){x, ix}, 2, (const char *[]){"y"}, 1, (TpOrigin){"/g", "Gather"});
  tp_set_attr_int(m, g, "axis", 1);
  TpDiag d;
  tp_diag_init(&d, "unit", "g.onnx", stderr);
  CHECK(tp_infer_op(m, g, &d) == TP_OK);
  tp_add_output(m, m->ops[g].outputs[0]);
  return m;
}

static void test_gather(void) {
  float xv[6] = {0, 1, 2, 10, 11, 12};
  TpTensor x = {TP_F32, 2, {2, 3}, xv}, y;
  TpDiag d;
  tp_diag_init(&d, "unit", "g.onnx", NULL);

  TpModule *m = gather_module((int64_t[]){-1, 0});
  CHECK(tp_interp_run(m, &x, &y, &d) == TP_OK);
  const float *yv = y.data;
  CHECK(y.rank == 2 && y.dims[0] == 2 && y.dims[1] == 2);
  CHECK(yv[0] == 2 && yv[1] == 0 && yv[2] == 12 && yv[3] == 10);
  free(y.data);
  tp_module_free(m);

  m = gather_module((int64_t[]){1, 3});
  CHECK(tp_interp_run(m, &x, &y, &d) == TP_ERR_INPUT);
  CHECK(strstr(d.last, "node '/g' (Gather") && strstr(d.last, "index 3 is out of range for axis 1 of size 3"));
  tp_module_free(m);
}

/* Slice and Transpose take their normalised attributes. */
static void test_slice_transpose(void) {
  TpModule *m = tp_module_new("s.onnx");
  int x = tp_add_value(m, "x", TP_VAL_INPUT, tp_type_make(TP_F32, 2, (int64_t[]){2, 4}), (TpOrigin){0});
  tp_add_input(m, x);
  TpDiag d;
  tp_diag_init(&d, "unit", "s.onnx", stderr);
  int s = tp_add_op(m, TP_OP_Slice, &x, 1, (const char *[]){"s"}, 1, (TpOrigin){"/s", "Slice"});
  tp_set_attr_ints(m, s, "starts", (int64_t[]){1, 3}, 2);
  tp_set_attr_ints(m, s, "steps", (int64_t[]){1, -2}, 2);
  m->values[m->ops[s].outputs[0]].type = tp_type_make(TP_F32, 2, (int64_t[]){1, 2});
  CHECK(tp_infer_op(m, s, &d) == TP_OK);
  int t = tp_add_op(m, TP_OP_Transpose, (int[]){m->ops[s].outputs[0]}, 1, (const char *[]){"t"}, 1,
                    (TpOrigin){"/t", "Transpose"});
  tp_set_attr_ints(m, t, "perm", (int64_t[]){1, 0}, 2);
  CHECK(tp_infer_op(m, t, &d) == TP_OK);
  tp_add_output(m, m->ops[t].outputs[0]);
  float xv[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  TpTensor in = {TP_F32, 2, {2, 4}, xv}, y;
  CHECK(tp_interp_run(m, &in, &y, &d) == TP_OK);
  const float *yv = y.data;
  CHECK(y.rank == 2 && y.dims[0] == 2 && y.dims[1] == 1 && yv[0] == 7 && yv[1] == 5);
  free(y.data);
  tp_module_free(m);
}

int main(void) {
  test_gather();
  test_slice_transpose();
  if (failures) fprintf(stderr, "test_interp_ops: %d check(s) failed\n", failures);
  return failures != 0;
}
