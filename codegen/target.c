/* The targets' kernel tables (target.h). cpu: the kernels of runtime/cpu, called on host
 * pointers with the generated function's TpTensor views; cuda: runtime/cuda/ops.h's, the
 * same calls on device pointers, queued on the unit's stream. What is per kernel (its
 * function, header and arguments) is in runtime/kernels/kernels.def; what is per target is here. */
#include "target.h"

#include <stdio.h>
#include <string.h>

#include "../base/diag.h" /* TP_ASSERT */

enum { H_ELEMENTWISE, H_LAYOUT, H_REDUCE, H_MATMUL, H_NN, H_LOSS, H_TRANSFORMER, H_NN_BACKWARD, H_LAYOUT_BACKWARD };
static const char *const cpu_headers[] = {
    [H_ELEMENTWISE] = "cpu/elementwise.h",
    [H_LAYOUT] = "cpu/layout.h",
    [H_REDUCE] = "cpu/reduce.h",
    [H_MATMUL] = "cpu/matmul.h",
    [H_NN] = "cpu/nn.h",
    [H_LOSS] = "cpu/loss.h",
    [H_TRANSFORMER] = "cpu/transformer.h",
    [H_NN_BACKWARD] = "cpu/nn_backward.h",
    [H_LAYOUT_BACKWARD] = "cpu/layout_backward.h",
};

/* The rows, built once from runtime/kernels/kernels.def: each row's function and header,
 * and its argument macros as TpArgSpellings of the fields of the row's struct (Args, a
 * typedef per row) in TpBound. A field whose type is not the argument kind's is a compile
 * error, so the interpreter's call (bind/call.c) and the printed one agree by construction.
 * The cpu table is the rows; the cuda tables are derived from them (device_kernels), so a
 * kernel has one argument list for every target. */
#define FIELD(f, ...) (offsetof(TpBound, a) + offsetof(Args, f) + 0 * _Generic(((Args *)0)->f, __VA_ARGS__ : 0))
#define VIEW_FIELD(f) FIELD(f, const TpTensor * : 0, TpTensor *)
#define ARG(kind, f, ...)                                                                                           \
  { TP_ARG_##kind, FIELD(f, __VA_ARGS__), 0, false }
#define ARG2(kind, f, T, g, U)                                                                                      \
  { TP_ARG_##kind, FIELD(f, T), FIELD(g, U), false }
#define VIEW(f)                                                                                                     \
  { TP_ARG_VIEW, VIEW_FIELD(f), 0, false }
#define DATA(f)                                                                                                     \
  { TP_ARG_DATA, VIEW_FIELD(f), 0, false }
#define OPERAND(kind, f)                                                                                            \
  { TP_ARG_##kind, VIEW_FIELD(f), 0, true }
#define SCALAR(f)                                                                                                   \
  { TP_ARG_SCALAR, VIEW_FIELD(f), 0, false }
#define SCRATCH(f, like)                                                                                            \
  { TP_ARG_SCRATCH, VIEW_FIELD(f), VIEW_FIELD(like), false }
#define RANK(f)                                                                                                     \
  { TP_ARG_RANK, VIEW_FIELD(f), 0, false }
#define DIMS(f)                                                                                                     \
  { TP_ARG_DIMS, VIEW_FIELD(f), 0, false }
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
#define ATTENTION(p, mask)                                                                                          \
  { TP_ARG_ATTENTION, FIELD(p, TpAttention), VIEW_FIELD(mask), false }
#define LOSS(o, weight)                                                                                             \
  { TP_ARG_LOSS, FIELD(o, TpLossOptions), VIEW_FIELD(weight), false }
#define BAD(f) ARG(BAD, f, int64_t *)

/* The rows as written (OPERAND arguments marked), and the cpu table, which passes them as
 * written (its products take f32 operands); has_bf16_entry: the rows followed by a BF16_SIG
 * (the products, whose --precision bf16 CUDA entry points are tp_cuda_bf16_X). */
static TpKernelSpelling rows[TP_K_COUNT], cpu_kernels[TP_K_COUNT];
static bool has_bf16_entry[TP_K_COUNT];

static void build_rows(void) {
  int row = -1; /* the last K row: the one a BF16_SIG follows */
#define K(id, member, Args_, fn, header_, ...)                                                                      \
  {                                                                                                                 \
    typedef Args_ Args;                                                                                             \
    row = TP_K_##id;                                                                                                \
    const TpArgSpelling args[] = {__VA_ARGS__};                                                                     \
    /* one more for a device target's stream */                                                                     \
    _Static_assert(sizeof args / sizeof *args < TP_MAX_KERNEL_ARGS, #fn ": too many arguments");                    \
    TpKernelSpelling *k = &rows[TP_K_##id];                                                                         \
    *k = (TpKernelSpelling){.name = #fn, .header = H_##header_, .nargs = sizeof args / sizeof *args};               \
    memcpy(k->args, args, sizeof args);                                                                             \
  }
#define BF16_SIG(...) has_bf16_entry[row] = true;
#include "../runtime/kernels/kernels.def"
#undef K
#undef BF16_SIG
  for (int id = 0; id < TP_K_COUNT; id++) {
    cpu_kernels[id] = rows[id];
    for (int i = 0; i < rows[id].nargs; i++) cpu_kernels[id].args[i].operand = false;
  }
}

/* A device table from the rows: row function tp_X becomes <prefix>X (the products, the rows
 * with a BF16_SIG, <product_prefix>X), declared in the target's one header
 * (index 0); a SCALAR argument is passed as its device pointer (DATA), since the host cannot
 * read it; a product's OPERAND is its view where the products take bf16 operands
 * (bf16_operands: kernels.def's BF16_SIG), else as on the cpu; and the unit's stream
 * follows the row's arguments. */
static void device_kernels(TpKernelSpelling *table, const char *prefix, const char *product_prefix,
                           bool bf16_operands) {
  for (int id = 0; id < TP_K_COUNT; id++) {
    const TpKernelSpelling *row = &rows[id];
    TpKernelSpelling *k = &table[id];
    *k = *row;
    TP_ASSERT(strncmp(row->name, "tp_", 3) == 0);
    int n = snprintf(k->name, sizeof k->name, "%s%s", has_bf16_entry[id] ? product_prefix : prefix, row->name + 3);
    TP_ASSERT(n > 0 && (size_t)n < sizeof k->name);
    k->header = 0;
    for (int i = 0; i < k->nargs; i++) {
      if (k->args[i].kind == TP_ARG_SCALAR) k->args[i].kind = TP_ARG_DATA;
      k->args[i].operand = bf16_operands && k->args[i].operand;
      if (k->args[i].operand) k->args[i].kind = TP_ARG_VIEW;
    }
    k->args[k->nargs++] = (TpArgSpelling){TP_ARG_STREAM, 0, 0, false};
  }
}

static const char *const cuda_headers[] = {"cuda/ops.h"};
static TpKernelSpelling cuda_kernels[TP_K_COUNT], cuda_bf16_kernels[TP_K_COUNT];

#define CPU_BUILD "cc plan.c $(pkg-config --cflags --libs tokpipe) -o trainer"
#define CUDA_BUILD "cc plan.c $(pkg-config --cflags --libs tokpipe-cuda) -o trainer"
#define CUDA_DEVICE                                                                                                 \
  .device = "tp_plan_device_cuda", .device_header = 0, .constant = "tp_cuda_constant",                              \
  .copy_to_host = "tp_cuda_copy_to_host", .fill_i64 = "tp_cuda_fill_i64", .gelu_epilogues = true
static const TpTarget targets[] = {
    {.name = "cpu",
     .headers = cpu_headers,
     .nheaders = (int)(sizeof cpu_headers / sizeof *cpu_headers),
     .kernels = cpu_kernels,
     .build = CPU_BUILD},
    {.name = "cuda",
     .precision = "fp32",
     .headers = cuda_headers,
     .nheaders = 1,
     .kernels = cuda_kernels,
     .build = CUDA_BUILD,
     CUDA_DEVICE},
    {.name = "cuda",
     .precision = "bf16",
     .headers = cuda_headers,
     .nheaders = 1,
     .kernels = cuda_bf16_kernels,
     .build = CUDA_BUILD,
     CUDA_DEVICE},
    /* fp16 storage; the products' operands stay f32 (no fp16 products) */
    {.name = "cuda",
     .precision = "fp16",
     .headers = cuda_headers,
     .nheaders = 1,
     .kernels = cuda_kernels,
     .build = CUDA_BUILD,
     CUDA_DEVICE},
};
enum { NTARGETS = sizeof targets / sizeof *targets };

const TpTarget *tp_target_find(const char *name, const char *precision) {
  if (!cpu_kernels[0].name[0]) {
    build_rows();
    device_kernels(cuda_kernels, "tp_cuda_", "tp_cuda_", false);
    device_kernels(cuda_bf16_kernels, "tp_cuda_", "tp_cuda_bf16_", true);
  }
  for (int i = 0; i < NTARGETS; i++)
    if (strcmp(targets[i].name, name) == 0 &&
        (!precision || (targets[i].precision && strcmp(targets[i].precision, precision) == 0)))
      return &targets[i];
  return NULL;
}

bool tp_target_reads_bf16(const TpTarget *t) {
  for (int id = 0; id < TP_K_COUNT; id++)
    for (int i = 0; i < t->kernels[id].nargs; i++)
      if (t->kernels[id].args[i].operand) return true;
  return false;
}

/* Into buf, ", "-separated: the targets' names (name NULL), or target `name`'s precisions. */
static const char *list(char *buf, size_t size, const char *name) {
  buf[0] = 0;
  for (int i = 0; i < NTARGETS; i++) {
    const char *item = name ? targets[i].precision : targets[i].name;
    if (!item || (name && strcmp(targets[i].name, name) != 0) || (!name && i && !strcmp(targets[i - 1].name, item)))
      continue;
    size_t len = strlen(buf);
    snprintf(buf + len, size - len, "%s%s", len ? ", " : "", item);
  }
  return buf;
}

const char *tp_target_names(void) {
  static char names[256];
  return list(names, sizeof names, NULL);
}

const char *tp_target_precisions(const char *name) {
  static char precisions[256];
  return list(precisions, sizeof precisions, name);
}
