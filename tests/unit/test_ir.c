/* Unit tests of the IR core: construction, attributes, type inference and its errors,
 * constant folding through the interpreter, DCE and compaction. */
#include "ir/ir.h"

#include <math.h>
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

static TpType f32(int rank, const int64_t *dims) { return tp_type_make(TP_F32, rank, dims); }

static void test_names_and_attrs(void) {
  TpModule *m = tp_module_new("unit");
  int64_t d2[] = {2};
  float one[2] = {1, 1};
  int a = tp_add_const(m, "a", f32(1, d2), one, (TpOrigin){0});
  CHECK(tp_find_value(m, "a") == a);
  CHECK(strcmp(tp_unique_name(m, "a"), "a.1") == 0);
  CHECK(strcmp(tp_unique_name(m, "b"), "b") == 0);
  int op = tp_add_op(m, TP_OP_Softmax, &a, 1, (const char *[]){"a"}, 1, (TpOrigin){"n", "Softmax"});
  CHECK(strcmp(m->values[m->ops[op].outputs[0]].name, "a.1") == 0); /* made unique */
  tp_set_attr_int(m, op, "zeta", 1);
  tp_set_attr_int(m, op, "axis", 0);
  tp_set_attr_int(m, op, "axis", 0); /* replaces, does not duplicate */
  CHECK(m->ops[op].nattrs == 2 && strcmp(m->ops[op].attrs[0].name, "axis") == 0);
  CHECK(tp_attr_int(m, op, "missing", 7) == 7);
  for (int i = 0; i < 1000; i++) { /* the name table survives growth */
    char name[32];
    snprintf(name, sizeof name, "v%d", i);
    tp_add_value(m, name, TP_VAL_INPUT, f32(1, d2), (TpOrigin){0});
  }
  CHECK(tp_find_value(m, "v999") == m->nvalues - 1 && tp_find_value(m, "a") == a);
  tp_module_free(m);
}

static void test_infer_and_errors(void) {
  TpModule *m = tp_module_new("unit");
  int64_t d23[] = {2, 3}, d45[] = {4, 5}, d35[] = {3, 5};
  TpType x = f32(2, d23);
  x.dimnames[0] = "batch";
  int a = tp_add_value(m, "a", TP_VAL_INPUT, x, (TpOrigin){0});
  int b = tp_add_value(m, "b", TP_VAL_INPUT, f32(2, d45), (TpOrigin){0});
  int c = tp_add_value(m, "c", TP_VAL_INPUT, f32(2, d35), (TpOrigin){0});
  TpDiag d;
  tp_diag_init(&d, "unit", "m.onnx", NULL);
  int bad = tp_add_op(m, TP_OP_MatMul, (int[]){a, b}, 2, (const char *[]){"ab"}, 1, (TpOrigin){"/mm", "MatMul"});
  CHECK(tp_infer_op(m, bad, &d) == TP_ERR_INPUT);
  CHECK(strstr(d.last, "m.onnx: node '/mm' (MatMul, opset 0): inner dimensions differ") == d.last);
  int good = tp_add_op(m, TP_OP_MatMul, (int[]){a, c}, 2, (const char *[]){"ac"}, 1, (TpOrigin){"/mm2", "MatMul"});
  CHECK(tp_infer_op(m, good, &d) == TP_OK);
  const TpType *t = &m->values[m->ops[good].outputs[0]].type;
  CHECK(t->rank == 2 && t->dims[0] == 2 && t->dims[1] == 5);
  CHECK(t->dimnames[0] && strcmp(t->dimnames[0], "batch") == 0); /* names flow through */
  /* a recorded type that disagrees is reported, not overwritten */
  m->values[m->ops[good].outputs[0]].type.dims[1] = 6;
  CHECK(tp_infer_op(m, good, &d) == TP_ERR_INPUT &&
        strstr(d.last, "has type f32[batch=2, 6] but the op computes f32[batch=2, 5]"));
  tp_module_free(m);
}

static void test_fold_and_dce(void) {
  TpModule *m = tp_module_new("unit");
  int64_t d3[] = {3};
  float av[3] = {1, 2, 3}, bv[3] = {10, 20, 30};
  int a = tp_add_const(m, "a", f32(1, d3), av, (TpOrigin){0});
  int b = tp_add_const(m, "b", f32(1, d3), bv, (TpOrigin){0});
  int x = tp_add_value(m, "x", TP_VAL_INPUT, f32(1, d3), (TpOrigin){0});
  tp_add_input(m, x);
  TpDiag d;
  tp_diag_init(&d, "unit", NULL, stderr);
  int sum = tp_add_op(m, TP_OP_Add, (int[]){a, b}, 2, (const char *[]){"sum"}, 1, (TpOrigin){"s", "Add"});
  CHECK(tp_infer_op(m, sum, &d) == TP_OK);
  int use = tp_add_op(m, TP_OP_Mul, (int[]){m->ops[sum].outputs[0], x}, 2, (const char *[]){"y"}, 1,
                      (TpOrigin){"u", "Mul"});
  CHECK(tp_infer_op(m, use, &d) == TP_OK);
  int dead = tp_add_op(m, TP_OP_Neg, &x, 1, (const char *[]){"unused"}, 1, (TpOrigin){"n", "Neg"});
  CHECK(tp_infer_op(m, dead, &d) == TP_OK);
  tp_add_output(m, m->ops[use].outputs[0]);
  TpPassOptions opt = {0};
  CHECK(pass_fold_constants(m, &opt, &d) == TP_OK);
  CHECK(m->nops == 2); /* Add folded; Mul reads an input */
  int s = tp_find_value(m, "sum");
  CHECK(s >= 0 && m->values[s].kind == TP_VAL_CONST);
  const float *sv = tp_value_data(m, s);
  CHECK(sv && sv[0] == 11 && sv[1] == 22 && sv[2] == 33);
  CHECK(pass_dce(m, &opt, &d) == TP_OK);
  CHECK(m->nops == 1 && tp_find_value(m, "unused") < 0 && tp_find_value(m, "a") < 0);
  CHECK(m->ops[0].inputs[0] == tp_find_value(m, "sum") && m->ops[0].inputs[1] == tp_find_value(m, "x"));
  CHECK(m->values[m->outputs[0]].def == 0 && m->ninputs == 1 && m->inputs[0] == tp_find_value(m, "x"));
  CHECK(tp_verify(m, &d) == TP_OK);
  tp_module_free(m);
}

/* Diagnostics keep printable text (UTF-8 included) and write every other byte as \xNN. */
static void test_escape_text(void) {
  static const struct {
    const char *raw, *want;
  } cases[] = {
      {"plain 'name'", "plain 'name'"},
      {"esc\x1b[2J del\x7f nl\n", "esc\\x1b[2J del\\x7f nl\\x0a"},
      {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"}, /* 2, 3, 4 bytes */
      {"c1 \xc2\x9b", "c1 \\xc2\\x9b"},              /* CSI as a C1 control */
      {"latin1 \xe9!", "latin1 \\xe9!"},             /* not UTF-8 */
      {"lead \xf8\x80\x80", "lead \\xf8\\x80\\x80"}, /* no such lead byte */
      {"overlong \xc0\xaf \xe0\x80\xaf", "overlong \\xc0\\xaf \\xe0\\x80\\xaf"},
      {"surrogate \xed\xa0\x80", "surrogate \\xed\\xa0\\x80"},
      {"cut \xe2\x82", "cut \\xe2\\x82"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char out[128];
    tp_escape_text(out, sizeof out, cases[i].raw);
    if (strcmp(out, cases[i].want) != 0) {
      fprintf(stderr, "escape case %zu: got '%s', want '%s'\n", i, out, cases[i].want);
      failures++;
    }
  }
}

int main(void) {
  test_escape_text();
  test_names_and_attrs();
  test_infer_and_errors();
  test_fold_and_dce();
  if (failures) fprintf(stderr, "test_ir: %d check(s) failed\n", failures);
  else printf("test_ir: all checks passed\n");
  return failures != 0;
}
