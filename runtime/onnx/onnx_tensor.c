/* Decoding ONNX TensorProtos (raw, typed and external data) into tensors.
 * Requires: a decoded TensorProto. Provides: its checked type and its bytes, referenced where
 * they lie (raw_data, mapped external files) or converted from the typed fields. */
#include "onnx_tensor.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "ONNX raw data is little-endian");

static int fail(char *err, size_t err_size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t err_size, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, err_size, fmt, ap);
  va_end(ap);
  return TP_ERR_INPUT;
}

TpDType tp_onnx_dtype(int64_t onnx_type) {
  if (onnx_type <= 0 || onnx_type >= TP_DTYPE_END) return TP_UNDEF;
  return tp_dtype_size((TpDType)onnx_type) ? (TpDType)onnx_type : TP_UNDEF;
}

int tp_onnx_tensor_type(const Onnx__TensorProto *t, const char *what, TpTensor *out, char *err, size_t err_size) {
  memset(out, 0, sizeof *out);
  out->dtype = tp_onnx_dtype(t->data_type);
  if (out->dtype == TP_UNDEF)
    return fail(err, err_size, "%s has unsupported element type %d", what, (int)t->data_type);
  if (t->n_dims > TP_MAX_RANK)
    return fail(err, err_size, "%s has rank %zu; tokpipec supports rank <= %d", what, t->n_dims, TP_MAX_RANK);
  out->rank = (int)t->n_dims;
  for (int i = 0; i < out->rank; i++) {
    int64_t n = t->dims[i];
    if (n < 0) return fail(err, err_size, "%s has negative dim %d (%lld)", what, i, (long long)n);
    out->dims[i] = n;
  }
  if (!tp_dims_size_ok(out->rank, out->dims)) return fail(err, err_size, "%s is too large", what);
  if (t->segment) return fail(err, err_size, "%s is segmented; tokpipec does not support that", what);
  return TP_OK;
}

/* Typed fields (float_data, int32_data, ...) -> malloc'ed little-endian data of x's type. */
static int typed_data(const Onnx__TensorProto *t, const char *what, const TpTensor *x, void **out, char *err,
                      size_t err_size) {
  int64_t numel = tp_tensor_numel(x);
  size_t have;
  switch (x->dtype) {
  case TP_F32: have = t->n_float_data; break;
  case TP_I64: have = t->n_int64_data; break;
  case TP_F64: have = t->n_double_data; break;
  case TP_U32:
  case TP_U64: have = t->n_uint64_data; break;
  default: have = t->n_int32_data; break; /* bool, 8/16-bit ints, f16/bf16 bits, i32 */
  }
  if ((int64_t)have != numel)
    return fail(err, err_size, "%s has %zu data elements, its shape needs %lld", what, have, (long long)numel);
  size_t esize = tp_dtype_size(x->dtype);
  uint8_t *p = malloc(numel ? (size_t)numel * esize : 1);
  TP_ASSERT(p);
  for (int64_t i = 0; i < numel; i++) {
    uint8_t *e = p + i * (int64_t)esize;
    switch (x->dtype) {
    case TP_F32: memcpy(e, &t->float_data[i], 4); break;
    case TP_I64: memcpy(e, &t->int64_data[i], 8); break;
    case TP_F64: memcpy(e, &t->double_data[i], 8); break;
    case TP_U32: {
      uint32_t v = (uint32_t)t->uint64_data[i];
      memcpy(e, &v, 4);
      break;
    }
    case TP_U64: memcpy(e, &t->uint64_data[i], 8); break;
    case TP_I32: memcpy(e, &t->int32_data[i], 4); break;
    case TP_BOOL: *e = t->int32_data[i] != 0; break;
    case TP_I8:
    case TP_U8: *e = (uint8_t)t->int32_data[i]; break;
    default: {
      uint16_t v = (uint16_t)t->int32_data[i];
      memcpy(e, &v, 2);
      break;
    }
    }
  }
  *out = p;
  return TP_OK;
}

static const char *external_key(const Onnx__TensorProto *t, const char *key) {
  const char *v = NULL;
  for (size_t i = 0; i < t->n_external_data; i++)
    if (t->external_data[i]->key && strcmp(t->external_data[i]->key, key) == 0) v = t->external_data[i]->value;
  return v;
}

/* A decimal offset or length into *out; NULL, or what is wrong with it. */
static const char *parse_u63(const char *s, int64_t *out) {
  int64_t v = 0;
  if (*s == '-' && s[1] >= '0' && s[1] <= '9' && !s[1 + strspn(s + 1, "0123456789")]) return "is negative";
  if (!*s || s[strspn(s, "0123456789")]) return "is not a number";
  for (; *s; s++) {
    if (v > (INT64_MAX - (*s - '0')) / 10) return "is out of range";
    v = v * 10 + (*s - '0');
  }
  *out = v;
  return NULL;
}

/* External data: the file (mapped lazily: the weights themselves are not read here), and
 * where in it. */
static int external_data(const Onnx__TensorProto *t, const char *what, const TpOnnxData *data, TpOnnxTensor *out,
                         char *err, size_t err_size) {
  const char *loc = external_key(t, "location"), *problem;
  if (!data || !data->map)
    return fail(err, err_size, "%s: external data %s", what,
                data && data->refused ? data->refused : "is not supported");
  if (!loc || !*loc) return fail(err, err_size, "%s: external data has no location", what);
  const uint8_t *bytes;
  size_t size;
  char why[300];
  out->file = data->map(data->ctx, loc, &bytes, &size, why, sizeof why);
  if (out->file < 0) return fail(err, err_size, "%s: external data location '%s' %s", what, loc, why);
  int64_t off = 0, need = (int64_t)tp_tensor_bytes(&out->t), len = need;
  const char *s_off = external_key(t, "offset"), *s_len = external_key(t, "length");
  if (s_off && (problem = parse_u63(s_off, &off)))
    return fail(err, err_size, "%s: external data offset '%s' %s", what, s_off, problem);
  if (s_len && (problem = parse_u63(s_len, &len)))
    return fail(err, err_size, "%s: external data length '%s' %s", what, s_len, problem);
  if (len != need)
    return fail(err, err_size, "%s: external data length %lld does not match its shape (%lld bytes)", what,
                (long long)len, (long long)need);
  int64_t fsize = (int64_t)size;
  if (off > fsize || len > fsize - off)
    return fail(err, err_size, "%s: external data [%lld, +%lld) lies beyond the end of '%s' (%lld bytes)", what,
                (long long)off, (long long)len, loc, (long long)fsize);
  out->offset = off;
  out->t.data = (void *)(bytes + off);
  return TP_OK;
}

int tp_onnx_tensor_decode(const Onnx__TensorProto *t, const char *what, const TpOnnxData *data, TpOnnxTensor *out,
                          char *err, size_t err_size) {
  memset(out, 0, sizeof *out);
  out->file = -1;
  int rc = tp_onnx_tensor_type(t, what, &out->t, err, err_size);
  if (rc) return rc;
  size_t bytes = tp_tensor_bytes(&out->t);
  if (t->has_data_location && t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL)
    return external_data(t, what, data, out, err, err_size);
  if (t->has_raw_data) {
    if (t->raw_data.len != bytes)
      return fail(err, err_size, "%s has %zu bytes of raw data, its shape needs %zu", what, t->raw_data.len, bytes);
    out->raw = true;
    out->t.data = t->raw_data.data;
    return TP_OK;
  }
  if ((rc = typed_data(t, what, &out->t, &out->owned, err, err_size))) return rc;
  out->t.data = out->owned;
  return TP_OK;
}

void *tp_onnx_tensor_take(TpOnnxTensor *dec) {
  void *p = dec->owned;
  dec->owned = NULL;
  if (p) return p;
  size_t bytes = tp_tensor_bytes(&dec->t);
  p = malloc(bytes ? bytes : 1);
  TP_ASSERT(p);
  if (bytes) memcpy(p, dec->t.data, bytes);
  return p;
}
