/* The targets' kernel tables (target.h). cpu: the kernels of runtime/cpu, called on host
 * pointers with the generated function's TpTensor views. What is per kernel (its function,
 * header and arguments) is in bind/kernels.def; what is per target is here. */
#include "target.h"

#include <stdio.h>
#include <string.h>

enum { H_ELEMENTWISE, H_LAYOUT, H_REDUCE, H_MATMUL, H_NN, H_LOSS, H_TRANSFORMER, H_NN_BACKWARD, H_LAYOUT_BACKWARD };
static const char *const cpu_headers[] = {
    [H_ELEMENTWISE] = "cpu/elementwise.h", [H_LAYOUT] = "cpu/layout.h",
    [H_REDUCE] = "cpu/reduce.h",           [H_MATMUL] = "cpu/matmul.h",
    [H_NN] = "cpu/nn.h",                   [H_LOSS] = "cpu/loss.h",
    [H_TRANSFORMER] = "cpu/transformer.h", [H_NN_BACKWARD] = "cpu/nn_backward.h",
    [H_LAYOUT_BACKWARD] = "cpu/layout_backward.h",
};

/* The cpu table, built once from bind/kernels.def's rows: each row's function and header,
 * and its argument macros as TpArgSpellings of the fields of the row's struct (Args, a
 * typedef per row) in TpBound. A field whose type is not the argument kind's is a compile
 * error, so the interpreter's call (bind/call.c) and the printed one agree by construction.
 *
 * A cuda table (issue 13) is built from the same rows: its function names derived from the
 * rows' (tp_cuda_ for tp_, say), the headers its own, and after each row's arguments one
 * more kind, the unit's stream; the argument kinds print as they do here (DATA: the view's
 * device pointer), so a kernel still has one argument list for every target. */
#define FIELD(f, ...) (offsetof(TpBound, a) + offsetof(Args, f) + 0 * _Generic(((Args *)0)->f, __VA_ARGS__: 0))
#define VIEW_FIELD(f) FIELD(f, const TpTensor *: 0, TpTensor *)
#define ARG(kind, f, ...) {TP_ARG_##kind, FIELD(f, __VA_ARGS__), 0}
#define ARG2(kind, f, T, g, U) {TP_ARG_##kind, FIELD(f, T), FIELD(g, U)}
#define VIEW(f) {TP_ARG_VIEW, VIEW_FIELD(f), 0}
#define DATA(f) {TP_ARG_DATA, VIEW_FIELD(f), 0}
#define SCALAR(f) {TP_ARG_SCALAR, VIEW_FIELD(f), 0}
#define SCRATCH(f, like) {TP_ARG_SCRATCH, VIEW_FIELD(f), VIEW_FIELD(like)}
#define RANK(f) {TP_ARG_RANK, VIEW_FIELD(f), 0}
#define DIMS(f) {TP_ARG_DIMS, VIEW_FIELD(f), 0}
#define I64(f) ARG(I64, f, int64_t)
#define INT(f) ARG(INT, f, int)
#define BOOL(f) ARG(BOOL, f, bool)
#define F32(f) ARG(F32, f, float)
#define F64(f) ARG(F64, f, double)
#define I64S(f, n) ARG2(I64S, f, const int64_t *, n, int)
#define VIEWS_IN(f, n) ARG2(VIEWS_IN, f, const TpTensor *, n, int)
#define VIEWS_OUT(f, n) ARG2(VIEWS_OUT, f, TpTensor *, n, int)
#define UNARY_OP(f) ARG(UNARY_OP, f, TpUnaryOp)
#define BINARY_OP(f) ARG(BINARY_OP, f, TpBinaryOp)
#define ATTENTION(p, mask) {TP_ARG_ATTENTION, FIELD(p, TpAttention), VIEW_FIELD(mask)}
#define LOSS(o, weight) {TP_ARG_LOSS, FIELD(o, TpLossOptions), VIEW_FIELD(weight)}
#define BAD(f) ARG(BAD, f, int64_t *)

static TpKernelSpelling cpu_kernels[TP_K_COUNT];

static void build_cpu_kernels(void) {
#define K(id, member, Args_, fn, header_, ...)                                                 \
  {                                                                                           \
    typedef Args_ Args;                                                                       \
    const TpArgSpelling args[] = {__VA_ARGS__};                                               \
    _Static_assert(sizeof args / sizeof *args <= TP_MAX_KERNEL_ARGS, #fn ": too many arguments"); \
    TpKernelSpelling *k = &cpu_kernels[TP_K_##id];                                            \
    *k = (TpKernelSpelling){.name = #fn, .header = H_##header_, .nargs = sizeof args / sizeof *args}; \
    memcpy(k->args, args, sizeof args);                                                       \
  }
#include "../bind/kernels.def"
#undef K
}

static const TpTarget targets[] = {
    {"cpu", cpu_headers, (int)(sizeof cpu_headers / sizeof *cpu_headers), cpu_kernels},
};

const TpTarget *tp_target_find(const char *name) {
  if (!cpu_kernels[0].name) build_cpu_kernels();
  for (size_t i = 0; i < sizeof targets / sizeof *targets; i++)
    if (strcmp(targets[i].name, name) == 0) return &targets[i];
  return NULL;
}

const char *tp_target_names(void) {
  static char names[256];
  if (!names[0])
    for (size_t i = 0; i < sizeof targets / sizeof *targets; i++)
      snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", targets[i].name);
  return names;
}
