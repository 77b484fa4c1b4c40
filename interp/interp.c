#include "interp.h"

#include "../bind/bind.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- working copies ----
 * Kernels read elements through typed pointers, but weights referenced in place sit at any
 * byte offset of the model file: such operands are copied to aligned memory. Ops whose
 * kernels compute in f32 get f32 copies of other float dtypes (converted back into the
 * results), and the flat kernels' ids are i64 (copies of i32 ones). */

/* Element i of p, which may be misaligned for t (memcpy reads it whatever the offset). */
static float load_float(const void *p, TpDType t, int64_t i) {
  const char *at = (const char *)p + (size_t)i * tp_dtype_size(t);
  float f;
  double f64;
  uint16_t h;
  switch (t) {
  case TP_F32: memcpy(&f, at, sizeof f); return f;
  case TP_F64: memcpy(&f64, at, sizeof f64); return (float)f64;
  case TP_F16: memcpy(&h, at, sizeof h); return tp_f16_to_f32(h);
  case TP_BF16: memcpy(&h, at, sizeof h); return tp_bf16_to_f32(h);
  default: return 0;
  }
}

static void store_float(void *p, TpDType t, int64_t i, float v) {
  switch (t) {
  case TP_F32: ((float *)p)[i] = v; break;
  case TP_F64: ((double *)p)[i] = v; break;
  case TP_F16: ((uint16_t *)p)[i] = tp_f32_to_f16(v); break;
  case TP_BF16: ((uint16_t *)p)[i] = tp_f32_to_bf16(v); break;
  default: break;
  }
}

/* A copy of t's elements as dtype `to` (f32 from a float, i64 from i32), converted when
 * `convert` (else uninitialised, for a result). */
static TpTensor working_copy(const TpTensor *t, TpDType to, bool convert) {
  TpTensor v = *t;
  int64_t n = tp_tensor_numel(t);
  v.dtype = to;
  v.data = malloc((size_t)(n ? n : 1) * tp_dtype_size(to));
  TP_ASSERT(v.data);
  if (!convert) return v;
  if (t->dtype == to) /* an aligned copy */
    memcpy(v.data, t->data, tp_tensor_bytes(t));
  else if (to == TP_I64)
    for (int64_t i = 0; i < n; i++) {
      int32_t id;
      memcpy(&id, (const char *)t->data + i * (int64_t)sizeof id, sizeof id); /* may be misaligned */
      ((int64_t *)v.data)[i] = id;
    }
  else
    for (int64_t i = 0; i < n; i++) ((float *)v.data)[i] = load_float(t->data, t->dtype, i);
  return v;
}

static const char *dtype_name(TpDType t) {
  const char *s = tp_dtype_name(t);
  return s ? s : "?";
}

/* Does the op's dtype rule want an f32 copy of a t? */
static bool wants_f32(TpBindDtypes rule, TpDType t) {
  if (rule == TP_BIND_F32_COPY) return tp_dtype_is_float(t) && t != TP_F32;
  if (rule == TP_BIND_HALF_COPY) return t == TP_F16 || t == TP_BF16;
  return false;
}

/* in2/out2: the views the kernel gets (working copies where the op's row asks for them). */
static int prepare(const TpModule *m, int op, const TpTensor *in, const TpTensor *out, TpTensor *in2, TpTensor *out2,
                   TpDiag *d) {
  const TpOp *o = &m->ops[op];
  const TpOpBinding *r = tp_op_binding(o->kind);
  if (r->dtypes == TP_BIND_F32_COPY && o->ninputs && !tp_dtype_is_float(in[0].dtype))
    return tp_error_op(d, m, op, "element type %s is not supported by the CPU kernel", dtype_name(in[0].dtype));
  for (int i = 0; i < o->ninputs; i++) {
    if (o->inputs[i] < 0 || (r->not_float >> i & 1)) continue;
    if (r->dtypes == TP_BIND_F32 && in[i].dtype != TP_F32)
      return tp_error_op(d, m, op, "operand %d is %s: the CPU training kernels are f32 only", i,
                         dtype_name(in[i].dtype));
  }
  for (int i = 0; i < o->noutputs; i++)
    if (o->outputs[i] >= 0 && r->dtypes == TP_BIND_F32 && out[i].dtype != TP_F32)
      return tp_error_op(d, m, op, "result %d is %s: the CPU training kernels are f32 only", i,
                         dtype_name(out[i].dtype));
  if (r->ids && in[r->ids - 1].dtype != TP_I32 && in[r->ids - 1].dtype != TP_I64)
    return tp_error_op(d, m, op, "indices are %s, expected i32 or i64", dtype_name(in[r->ids - 1].dtype));

  for (int i = 0; i < o->ninputs; i++) {
    in2[i] = in[i];
    if (!in[i].data) continue;
    size_t size = tp_dtype_size(in[i].dtype);
    if (i == r->ids - 1 && in[i].dtype == TP_I32) in2[i] = working_copy(&in[i], TP_I64, true);
    else if (!(r->not_float >> i & 1) && wants_f32(r->dtypes, in[i].dtype))
      in2[i] = working_copy(&in[i], TP_F32, true);
    else if (size && (uintptr_t)in[i].data % size) in2[i] = working_copy(&in[i], in[i].dtype, true);
  }
  for (int i = 0; i < o->noutputs; i++) {
    out2[i] = out[i];
    if (out[i].data && wants_f32(r->dtypes, out[i].dtype)) out2[i] = working_copy(&out[i], TP_F32, false);
  }
  return TP_OK;
}

/* Stores the results computed in copies and frees every copy. */
static void finish(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpTensor *in2, TpTensor *out2) {
  const TpOp *o = &m->ops[op];
  for (int i = 0; i < o->ninputs; i++)
    if (in2[i].data != in[i].data) free(in2[i].data);
  for (int i = 0; i < o->noutputs; i++) {
    if (out2[i].data == out[i].data) continue;
    for (int64_t k = 0, n = tp_tensor_numel(&out[i]); k < n; k++)
      store_float(out[i].data, out[i].dtype, k, ((float *)out2[i].data)[k]);
    free(out2[i].data);
  }
}

/* Binds the op and runs its kernel. */
int tp_exec_op(const TpModule *m, int op, const TpTensor *in, TpTensor *out, TpDiag *d) {
  const TpOp *o = &m->ops[op];
  if (!tp_op_binding(o->kind)->bind)
    return tp_internal(d, "no CPU implementation of op %s", tp_op_info[o->kind].name);
  TpTensor in2[64], out2[64];
  TP_ASSERT(o->ninputs <= 64 && o->noutputs <= 64);
  int rc = prepare(m, op, in, out, in2, out2, d);
  if (rc) return rc;
  TpBound b;
  rc = tp_bind_op(m, op, in2, out2, &b, d);
  if (rc == TP_OK) {
    TpKernelStatus s = tp_bound_run(&b);
    if (s != TP_KERNEL_OK) rc = tp_bound_failed(m, op, &b, in2, out2, s, d);
  }
  finish(m, op, in, out, in2, out2);
  return rc;
}

/* A buffer per value, allocated when its op runs and freed after its last use. */
int tp_interp_run(const TpModule *m, const TpTensor *inputs, TpTensor *outputs, TpDiag *d) {
  /* a module split over tensor ranks runs as one process per rank (a trainer under mpirun) */
  for (int o = 0; o < m->nops; o++) {
    TpOpKind k = m->ops[o].kind;
    if (k == TP_OP_AllReduce || k == TP_OP_TensorCopy || k == TP_OP_TensorRank)
      return tp_error_op(d, m, o,
                         "the module is split over tensor ranks (shard-tensor made this %s): the reference "
                         "interpreter runs one process; give it the IR printed without --tensor",
                         tp_op_info[k].name);
  }
  int rc = TP_OK;
  TpTensor *vals = calloc((size_t)m->nvalues, sizeof *vals);
  bool *owned = calloc((size_t)m->nvalues, sizeof *owned);
  int *last_use = malloc((size_t)m->nvalues * sizeof *last_use);
  TP_ASSERT(vals && owned && last_use);
  for (int v = 0; v < m->nvalues; v++) {
    vals[v] = tp_value_tensor(m, v);
    last_use[v] = -1;
  }
  for (int o = 0; o < m->nops; o++)
    for (int i = 0; i < m->ops[o].ninputs; i++)
      if (m->ops[o].inputs[i] >= 0) last_use[m->ops[o].inputs[i]] = o;
  for (int i = 0; i < m->noutputs; i++) last_use[m->outputs[i]] = m->nops; /* kept to the end */

  for (int i = 0; i < m->ninputs; i++) {
    const TpValue *v = &m->values[m->inputs[i]];
    const TpTensor *t = &inputs[i];
    bool same = t->dtype == v->type.dtype && t->rank == v->type.rank &&
                memcmp(t->dims, v->type.dims, (size_t)t->rank * sizeof t->dims[0]) == 0;
    if (!same) {
      char want[256];
      rc = tp_error(d, "input '%s': expected %s", v->name, tp_type_str(&v->type, want, sizeof want));
      goto done;
    }
    vals[m->inputs[i]].data = t->data;
  }

  for (int o = 0; o < m->nops && rc == TP_OK; o++) {
    const TpOp *op = &m->ops[o];
    TpTensor in[64], out[64];
    TP_ASSERT(op->ninputs <= 64 && op->noutputs <= 64);
    for (int i = 0; i < op->ninputs; i++) in[i] = op->inputs[i] >= 0 ? vals[op->inputs[i]] : (TpTensor){0};
    for (int i = 0; i < op->noutputs; i++) {
      int r = op->outputs[i];
      if (r < 0) {
        out[i] = (TpTensor){0};
        continue;
      }
      size_t bytes = tp_tensor_bytes(&vals[r]);
      vals[r].data = malloc(bytes ? bytes : 1);
      TP_ASSERT(vals[r].data);
      owned[r] = true;
      out[i] = vals[r];
    }
    rc = tp_exec_op(m, o, in, out, d);
    for (int i = 0; i < op->ninputs; i++) {
      int v = op->inputs[i];
      if (v >= 0 && owned[v] && last_use[v] == o) {
        free(vals[v].data);
        owned[v] = false;
      }
    }
  }
  if (rc != TP_OK) goto done;

  for (int i = 0; i < m->noutputs; i++) {
    int v = m->outputs[i];
    outputs[i] = vals[v];
    size_t bytes = tp_tensor_bytes(&vals[v]);
    outputs[i].data = malloc(bytes ? bytes : 1);
    TP_ASSERT(outputs[i].data);
    if (bytes) memcpy(outputs[i].data, vals[v].data, bytes);
  }
done:
  for (int v = 0; v < m->nvalues; v++)
    if (owned[v]) free(vals[v].data);
  free(vals);
  free(owned);
  free(last_use);
  return rc;
}
