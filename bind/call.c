/* The interpreter's kernel calls (tp_bound_run, bind.h): each row of kernels.def expanded
 * into a call of its kernel on the bound struct, so the call is written once, in the row,
 * for the interpreter and codegen (codegen/target.c) alike. */
#include <stdlib.h>

#include "bind.h"

/* DATA(f): the data of an optional view (NULL when absent). */
static void *data_of(const TpTensor *t) { return t ? t->data : NULL; }

/* ATTENTION(p, mask): a copy of p pointing at the mask's data. */
static const TpAttention *with_mask(TpAttention *copy, const TpAttention *p, const TpTensor *mask) {
  *copy = *p;
  copy->mask = data_of(mask);
  return copy;
}

/* LOSS(o, weight): a copy of o pointing at the weight's data. */
static const TpLossOptions *with_weight(TpLossOptions *copy, const TpLossOptions *o, const TpTensor *weight) {
  *copy = *o;
  copy->weight = data_of(weight);
  return copy;
}

/* SCRATCH(f, like): f's data, or a buffer of like's numel floats (tp_bound_run frees it). */
static float *scratch(const TpTensor *f, const TpTensor *like, void **buffer) {
  if (f) return f->data;
  *buffer = malloc(((size_t)tp_tensor_numel(like) + 1) * sizeof(float));
  if (!*buffer) abort(); /* out of memory */
  return *buffer;
}

/* One call per row of kernels.def: its argument macros as expressions over the row's struct a. */
#define VIEW(f) a->f
#define DATA(f) data_of(a->f)
#define OPERAND(kind, f) kind(f)
#define SCALAR(f) (*(const float *)a->f->data)
#define SCRATCH(f, like) scratch(a->f, a->like, buffer)
#define RANK(f) a->f->rank
#define DIMS(f) a->f->dims
#define I64(f) a->f
#define INT(f) a->f
#define BOOL(f) a->f
#define F32(f) a->f
#define F64(f) a->f
#define I64S(f, n) a->f
#define VIEWS_IN(f, n) a->f
#define VIEWS_OUT(f, n) a->f
#define UNARY_OP(f) a->f
#define BINARY_OP(f) a->f
#define ATTENTION(p, mask) with_mask(&(TpAttention){0}, &a->p, a->mask)
#define LOSS(o, weight) with_weight(&(TpLossOptions){0}, &a->o, a->weight)
#define BAD(f) a->f
#define K(id, name, Args, fn, header, ...)                                                                          \
  static TpKernelStatus run_##name(const TpBound *b, void **buffer) {                                               \
    const Args *a = &b->a.name;                                                                                     \
    (void)buffer;                                                                                                   \
    return fn(__VA_ARGS__);                                                                                         \
  }
#include "../runtime/kernels/kernels.def"
#undef K

TpKernelStatus tp_bound_run(const TpBound *b) {
  static TpKernelStatus (*const run[TP_K_COUNT])(const TpBound *, void **) = {
#define K(id, name, ...) [TP_K_##id] = run_##name,
#include "../runtime/kernels/kernels.def"
#undef K
  };
  void *buffer = NULL;
  TpKernelStatus s = run[b->kernel](b, &buffer);
  free(buffer);
  return s;
}
