/* The kernel binders (bind/bind.h) and the targets' kernel tables (codegen/target.h): every
 * kernel has a CPU entry and a spelling on every target, every op kind the interpreter runs
 * has a binder, and a binder turns attributes and dims into the kernel's arguments (RMSNorm:
 * rows, n and epsilon; its shape check), and the interpreter's working copies (an operand at
 * an odd address, as weights referenced in place in a model file are, is copied whole). */
#include <stdio.h>
#include <string.h>

#include "bind/bind.h"
#include "codegen/target.h"
#include "interp/interp.h"

static int failures;
#define fail(...) (failures++, fprintf(stderr, "FAIL " __VA_ARGS__), fputc('\n', stderr))

/* The multiplied operands of the products, their first arguments: the --precision bf16
 * entry points take them as views (f32 or bf16); attention's rounds its f32 operands. */
static int bf16_operands(int k) {
  switch (k) {
  case TP_K_GEMM:
  case TP_K_MATMUL:
  case TP_K_LINEAR:
  case TP_K_LINEAR_GELU: return 2;
  case TP_K_LINEAR_BACKWARD:
  case TP_K_MATMUL_BACKWARD: return 3;
  case TP_K_LINEAR_BACKWARD_DGELU: return 4;
  default: return 0;
  }
}

/* Every kernel has a cpu spelling; cuda's (fp32, bf16) are the same rows renamed, their
 * scalar passed as a device pointer and the unit's stream last; under bf16 the products
 * (attention too) are tp_cuda_bf16_X, their multiplied operands views, and a few kernels
 * have an entry writing their result in bf16. */
static void test_tables(void) {
  const TpTarget *cpu = tp_target_find("cpu", NULL), *cuda = tp_target_find("cuda", NULL),
                 *bf16 = tp_target_find("cuda", "bf16");
  if (!cpu || !cuda || !bf16) {
    fail("targets: cpu %p, cuda %p, cuda bf16 %p", (const void *)cpu, (const void *)cuda, (const void *)bf16);
    return;
  }
  if (tp_target_find("cpu", "bf16") || tp_target_find("cuda", "fp8")) fail("a precision the targets lack");
  if (strcmp(cuda->precision, "fp32") != 0) fail("cuda's default precision is %s", cuda->precision);
  if (strcmp(tp_target_names(), "cpu, cuda") != 0) fail("target names '%s'", tp_target_names());
  if (strcmp(tp_target_precisions("cuda"), "fp32, bf16, fp16") != 0 || strcmp(tp_target_precisions("cpu"), "") != 0)
    fail("precisions '%s', '%s'", tp_target_precisions("cuda"), tp_target_precisions("cpu"));
  if (cpu->device || !cuda->device || strcmp(cuda->device, "tp_plan_device_cuda") != 0) fail("the targets' devices");
  for (int k = 0; k < TP_K_COUNT; k++) {
    const TpKernelSpelling *s = &cpu->kernels[k];
    if (!s->name[0] || s->nargs <= 0 || s->nargs >= TP_MAX_KERNEL_ARGS || s->header < 0 ||
        s->header >= cpu->nheaders)
      fail("cpu kernel %d: no spelling (name %s, %d args, header %d)", k, s->name, s->nargs, s->header);
    const TpTarget *device[] = {cuda, bf16};
    for (int j = 0; j < 2; j++) {
      const TpTarget *t = device[j];
      const TpKernelSpelling *c = &t->kernels[k];
      bool product = bf16_operands(k) > 0 || k == TP_K_ATTENTION || k == TP_K_ATTENTION_BACKWARD;
      char want[64];
      snprintf(want, sizeof want, "tp_cuda_%s%s", t == bf16 && product ? "bf16_" : "", s->name + 3);
      if (strcmp(c->name, want) != 0 || c->header != 0 || c->nargs != s->nargs + 1 ||
          c->args[s->nargs].kind != TP_ARG_STREAM)
        fail("cuda %s kernel %d: %s with %d args, expected %s with %d", t->precision, k, c->name, c->nargs, want,
             s->nargs + 1);
      for (int i = 0; i < s->nargs; i++) {
        bool operand = t == bf16 && i < bf16_operands(k);
        TpArgKind kind = operand ? TP_ARG_VIEW : s->args[i].kind == TP_ARG_SCALAR ? TP_ARG_DATA : s->args[i].kind;
        if (c->args[i].offset != s->args[i].offset || c->args[i].kind != kind || c->args[i].operand != operand)
          fail("cuda %s: %s argument %d", t->precision, c->name, i);
      }
    }
  }
  /* the bf16-result entries (kernels.def's BF16_RESULT_SIG): the bf16 table's only */
  for (int k = 0; k < TP_K_COUNT; k++) {
    const char *want = k == TP_K_CROSS_ENTROPY_BACKWARD       ? "tp_cuda_cross_entropy_backward_bf16"
                       : k == TP_K_CROSS_ENTROPY_BACKWARD_PAD ? "tp_cuda_cross_entropy_backward_pad_bf16"
                       : k == TP_K_GELU_BACKWARD              ? "tp_cuda_gelu_backward_bf16"
                       : k == TP_K_SWIGLU_BACKWARD            ? "tp_cuda_swiglu_backward_bf16"
                                                              : "";
    if (strcmp(bf16->kernels[k].bf16_result, want) != 0 || cpu->kernels[k].bf16_result[0] ||
        cuda->kernels[k].bf16_result[0])
      fail("kernel %d: bf16-result entry '%s' (expected '%s'), on the cpu '%s', on fp32 cuda '%s'", k,
           bf16->kernels[k].bf16_result, want, cpu->kernels[k].bf16_result, cuda->kernels[k].bf16_result);
  }
  int bound = 0;
  for (int k = 0; k < TP_OP_COUNT; k++) bound += tp_op_binding(k)->bind != NULL;
  if (bound < 60) fail("only %d op kinds have a binder", bound);
}

static void test_rmsnorm(void) {
  TpModule *m = tp_module_new("bind.tir");
  TpDiag d;
  FILE *sink = tmpfile();
  tp_diag_init(&d, "test", "bind.tir", sink);
  TpType t = {.dtype = TP_F32};
  int in[2] = {tp_add_value(m, "x", TP_VAL_INPUT, t, (TpOrigin){0}),
               tp_add_value(m, "s", TP_VAL_INPUT, t, (TpOrigin){0})};
  const char *names[1] = {"y"};
  int op = tp_add_op(m, TP_OP_RMSNorm, in, 2, names, 1, (TpOrigin){"rms", "RMSNorm"});
  tp_set_attr_int(m, op, "axis", 1);
  tp_set_attr_float(m, op, "epsilon", 0.25);
  TpTensor views[3] = {{TP_F32, 3, {2, 3, 4}, NULL}, {TP_F32, 2, {3, 4}, NULL}, {TP_F32, 3, {2, 3, 4}, NULL}};
  TpBound b;
  if (tp_bind_op(m, op, views, views + 2, &b, &d) != TP_OK) fail("bind RMSNorm: %s", d.last);
  const TpRMSNormArgs *a = &b.a.rmsnorm;
  if (b.kernel != TP_K_RMSNORM || a->rows != 2 || a->n != 12 || a->eps != 0.25f || a->x != &views[0] ||
      a->scale != &views[1] || a->y != &views[2] || a->dy || a->dscale)
    fail("bind RMSNorm: kernel %d, rows %lld, n %lld, eps %g", (int)b.kernel, (long long)a->rows, (long long)a->n,
         (double)a->eps);
  views[1].dims[1] = 5; /* a scale that is not the normalised shape */
  if (tp_bind_op(m, op, views, views + 2, &b, &d) != TP_ERR_INPUT || !strstr(d.last, "shapes do not fit"))
    fail("bind RMSNorm accepted a scale of 15 for rows of 12");
  fclose(sink);
  tp_module_free(m);
}

/* Neg of an i64 operand one byte off its alignment: the aligned copy keeps its dtype. */
static void test_misaligned(void) {
  TpModule *m = tp_module_new("bind.tir");
  TpDiag d;
  FILE *sink = tmpfile();
  tp_diag_init(&d, "test", "bind.tir", sink);
  TpType t = {.dtype = TP_I64, .rank = 1, .dims = {3}};
  int x = tp_add_value(m, "x", TP_VAL_INPUT, t, (TpOrigin){0});
  const char *names[1] = {"y"};
  int op = tp_add_op(m, TP_OP_Neg, &x, 1, names, 1, (TpOrigin){"neg", "Neg"});
  int64_t want[3] = {5000000000LL, -7, 3}, y[3] = {0};
  _Alignas(8) unsigned char bytes[32];
  for (int i = 0; i < 3; i++) {
    int64_t v = -want[i];
    memcpy(bytes + 1 + 8 * i, &v, 8);
  }
  TpTensor in = {TP_I64, 1, {3}, bytes + 1}, out = {TP_I64, 1, {3}, y};
  if (tp_exec_op(m, op, &in, &out, &d) != TP_OK) fail("exec Neg i64: %s", d.last);
  else if (memcmp(y, want, sizeof y))
    fail("exec Neg of a misaligned i64: %lld %lld %lld", (long long)y[0], (long long)y[1], (long long)y[2]);
  fclose(sink);
  tp_module_free(m);
}

int main(void) {
  test_tables();
  test_rmsnorm();
  test_misaligned();
  if (failures) return 1;
  printf("bind: ok\n");
  return 0;
}
