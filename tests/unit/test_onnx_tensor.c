/* The runtime's TensorProto decoder (runtime/onnx/onnx_tensor.c) on its own: raw data
 * referenced in place, typed fields converted per dtype, external data found through the
 * caller's map (file id, offset, range), and the errors of each, word for word. */
#include <string.h>

#include "runtime/onnx/onnx_tensor.h"
#include "../check.h"

#define CHECK(cond, ...) ((cond) ? (void)0 : fail(__VA_ARGS__))

/* A TensorProto of dtype and dims (fields set by the caller). */
static Onnx__TensorProto proto(int dtype, int rank, int64_t *dims) {
  Onnx__TensorProto t;
  onnx__tensor_proto__init(&t);
  t.has_data_type = 1;
  t.data_type = dtype;
  t.n_dims = (size_t)rank;
  t.dims = dims;
  return t;
}

/* Decodes t as "tensor 'x'", expecting failure with `want`. */
static void expect_error(const Onnx__TensorProto *t, const TpOnnxData *data, const char *want) {
  TpOnnxTensor dec;
  char err[TP_ONNX_ERR_SIZE] = "";
  int rc = tp_onnx_tensor_decode(t, "tensor 'x'", data, &dec, err, sizeof err);
  CHECK(rc == TP_ERR_INPUT && strcmp(err, want) == 0, "rc %d, error '%s', expected '%s'", rc, err, want);
}

static void test_raw(void) {
  int64_t dims[2] = {2, 3};
  float w[6] = {1, 2, 3, 4, 5, 6};
  Onnx__TensorProto t = proto(1, 2, dims);
  t.has_raw_data = 1;
  t.raw_data = (ProtobufCBinaryData){sizeof w, (uint8_t *)w};
  TpOnnxTensor dec;
  char err[TP_ONNX_ERR_SIZE];
  CHECK(tp_onnx_tensor_decode(&t, "tensor 'x'", NULL, &dec, err, sizeof err) == TP_OK, "%s", err);
  CHECK(dec.raw && dec.t.data == (void *)w && !dec.owned && dec.file == -1, "raw data is not referenced in place");
  CHECK(dec.t.dtype == TP_F32 && dec.t.rank == 2 && dec.t.dims[0] == 2 && dec.t.dims[1] == 3, "wrong type");
  float *copy = tp_onnx_tensor_take(&dec);
  CHECK(copy != w && memcmp(copy, w, sizeof w) == 0, "take does not copy the raw bytes");
  free(copy);
  t.raw_data.len = 20;
  expect_error(&t, NULL, "tensor 'x' has 20 bytes of raw data, its shape needs 24");
}

static void test_typed(void) {
  int64_t dims[1] = {3};
  int32_t i32[3] = {0x3c00, 0xc000, 0x7bff}; /* f16 1, -2, 65504 */
  Onnx__TensorProto t = proto(10, 1, dims);
  t.n_int32_data = 3;
  t.int32_data = i32;
  TpOnnxTensor dec;
  char err[TP_ONNX_ERR_SIZE];
  CHECK(tp_onnx_tensor_decode(&t, "tensor 'x'", NULL, &dec, err, sizeof err) == TP_OK, "%s", err);
  const uint16_t *h = dec.t.data;
  CHECK(dec.owned == dec.t.data && !dec.raw && tp_f16_to_f32(h[0]) == 1 && tp_f16_to_f32(h[1]) == -2 &&
            tp_f16_to_f32(h[2]) == 65504,
        "f16 from int32_data");
  free(dec.owned);
  int32_t b[3] = {0, 7, -1};
  t = proto(9, 1, dims); /* bool: any non-zero is 1 */
  t.n_int32_data = 3;
  t.int32_data = b;
  CHECK(tp_onnx_tensor_decode(&t, "tensor 'x'", NULL, &dec, err, sizeof err) == TP_OK, "%s", err);
  const uint8_t *bb = dec.t.data;
  CHECK(bb[0] == 0 && bb[1] == 1 && bb[2] == 1, "bool from int32_data: %d %d %d", bb[0], bb[1], bb[2]);
  free(dec.owned);
  uint64_t u[3] = {1, 0xffffffffu, 5};
  t = proto(12, 1, dims); /* u32 from uint64_data */
  t.n_uint64_data = 3;
  t.uint64_data = u;
  CHECK(tp_onnx_tensor_decode(&t, "tensor 'x'", NULL, &dec, err, sizeof err) == TP_OK, "%s", err);
  const uint32_t *u32 = dec.t.data;
  CHECK(u32[0] == 1 && u32[1] == 0xffffffffu && u32[2] == 5, "u32 from uint64_data");
  free(dec.owned);
  t.n_uint64_data = 2;
  expect_error(&t, NULL, "tensor 'x' has 2 data elements, its shape needs 3");
}

/* A map over one in-memory "file" of 16 bytes, id 7; other names do not exist. */
static const uint8_t file_bytes[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
static int map_one(void *ctx, const char *location, const uint8_t **bytes, size_t *size, char *why,
                   size_t why_size) {
  (void)ctx;
  if (strcmp(location, "w.bin") != 0) {
    snprintf(why, why_size, "cannot be opened: No such file or directory");
    return -1;
  }
  *bytes = file_bytes;
  *size = sizeof file_bytes;
  return 7;
}

static void test_external(void) {
  int64_t dims[1] = {2};
  Onnx__StringStringEntryProto loc, off, len;
  onnx__string_string_entry_proto__init(&loc);
  onnx__string_string_entry_proto__init(&off);
  onnx__string_string_entry_proto__init(&len);
  loc.key = "location", loc.value = "w.bin";
  off.key = "offset", off.value = "8";
  len.key = "length", len.value = "8";
  Onnx__StringStringEntryProto *kv[3] = {&loc, &off, &len};
  Onnx__TensorProto t = proto(1, 1, dims);
  t.has_data_location = 1;
  t.data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
  t.n_external_data = 3;
  t.external_data = kv;
  const TpOnnxData data = {.map = map_one};
  TpOnnxTensor dec;
  char err[TP_ONNX_ERR_SIZE];
  CHECK(tp_onnx_tensor_decode(&t, "tensor 'x'", &data, &dec, err, sizeof err) == TP_OK, "%s", err);
  CHECK(dec.file == 7 && dec.offset == 8 && dec.t.data == (void *)(file_bytes + 8) && !dec.raw && !dec.owned,
        "external data: file %d offset %lld", dec.file, (long long)dec.offset);
  off.value = "12";
  expect_error(&t, &data, "tensor 'x': external data [12, +8) lies beyond the end of 'w.bin' (16 bytes)");
  off.value = "8";
  len.value = "4";
  expect_error(&t, &data, "tensor 'x': external data length 4 does not match its shape (8 bytes)");
  len.value = "8";
  loc.value = "v.bin";
  expect_error(&t, &data, "tensor 'x': external data location 'v.bin' cannot be opened: No such file or directory");
  /* a long location and name leave the reason whole (the message is one diagnostic line) */
  char longloc[201];
  memset(longloc, 'v', 200);
  longloc[200] = 0;
  loc.value = longloc;
  char longname[280], want[700];
  snprintf(longname, sizeof longname, "initializer '%0249d'", 0);
  snprintf(want, sizeof want, "%s: external data location '%s' cannot be opened: No such file or directory",
           longname, longloc);
  TpOnnxTensor dec2;
  CHECK(tp_onnx_tensor_decode(&t, longname, &data, &dec2, err, sizeof err) == TP_ERR_INPUT && strcmp(err, want) == 0,
        "a long name and location cut the error: '%s'", err);
  loc.value = "w.bin";
  const TpOnnxData refused = {.refused = "is not supported in tensor files"};
  expect_error(&t, &refused, "tensor 'x': external data is not supported in tensor files");
}

static void test_type_errors(void) {
  int64_t dims[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1}, neg[2] = {2, -3}, huge[2] = {INT64_C(1) << 40, INT64_C(1) << 20};
  Onnx__TensorProto t = proto(8, 1, dims); /* string */
  expect_error(&t, NULL, "tensor 'x' has unsupported element type 8");
  t = proto(1, 9, dims);
  expect_error(&t, NULL, "tensor 'x' has rank 9; tokpipec supports rank <= 8");
  t = proto(1, 2, neg);
  expect_error(&t, NULL, "tensor 'x' has negative dim 1 (-3)");
  t = proto(1, 2, huge);
  expect_error(&t, NULL, "tensor 'x' is too large");
  Onnx__TensorProto__Segment seg;
  onnx__tensor_proto__segment__init(&seg);
  t = proto(1, 1, dims);
  t.segment = &seg;
  expect_error(&t, NULL, "tensor 'x' is segmented; tokpipec does not support that");
}

int main(void) {
  test_raw();
  test_typed();
  test_external();
  test_type_errors();
  if (failures) {
    fprintf(stderr, "test_onnx_tensor: %d failure(s)\n", failures);
    return 1;
  }
  printf("test_onnx_tensor: ok\n");
  return 0;
}
