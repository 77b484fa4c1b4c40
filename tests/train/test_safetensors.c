/* The safetensors writer and reader (runtime/train/safetensors.h): a round trip of several
 * dtypes, escaped names and metadata; the header's layout; and each malformed file the
 * reader must refuse, with its message.
 *   test_safetensors WORK_DIR */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/train/safetensors.h"

static int failures;
static char path[4096];

static void expect(bool ok, const char *what) {
  printf("%s %s\n", ok ? "ok" : "FAIL", what);
  failures += !ok;
}

/* Writes a file of header text `json` (its length as the prefix) and `data_bytes` zeros. */
static void write_raw(const char *json, size_t data_bytes) {
  FILE *f = fopen(path, "wb");
  uint64_t n = strlen(json);
  fwrite(&n, 8, 1, f);
  fputs(json, f);
  for (size_t i = 0; i < data_bytes; i++) fputc(0, f);
  fclose(f);
}

static void expect_refused(const char *json, size_t data_bytes, const char *message) {
  TpDiag d;
  tp_diag_init(&d, "test", NULL, NULL);
  TpSafetensors st;
  write_raw(json, data_bytes);
  int rc = tp_safetensors_load(path, &st, &d);
  char what[1400];
  snprintf(what, sizeof what, "refused with '%s' (got: %s)", message, rc ? d.last : "accepted");
  expect(rc == TP_ERR_INPUT && strstr(d.last, message), what);
}

int main(int argc, char **argv) {
  if (argc != 2) return 2;
  mkdir(argv[1], 0777);
  snprintf(path, sizeof path, "%s/t.safetensors", argv[1]);
  TpDiag d;
  tp_diag_init(&d, "test", NULL, stderr);

  float a[6] = {1, -2, 3.5f, 1e-30f, -0.0f, 7};
  int64_t b[4] = {-1, 0, INT64_MAX, 42};
  uint16_t h = 0x3c00;
  uint8_t u[3] = {1, 2, 3};
  TpNamedTensor ts[] = {
      {"zeta \"quoted\" \\ \x01", {TP_F32, 2, {2, 3}, a}},
      {"alpha.ünï", {TP_I64, 1, {4}, b}},
      {"scalar", {TP_F16, 0, {0}, &h}},
      {"bytes", {TP_U8, 1, {3}, u}},
  };
  const char *meta[] = {"step", "7", "note", "tab\there", NULL};
  expect(tp_safetensors_save(path, ts, 4, meta, &d) == TP_OK, "saved");
  TpSafetensors st;
  expect(tp_safetensors_load(path, &st, &d) == TP_OK && st.n == 4, "loaded 4 tensors");
  bool same = true;
  for (int i = 0; i < 4; i++) {
    const TpTensor *t = tp_safetensors_find(&st, ts[i].name);
    same &= t && t->dtype == ts[i].t.dtype && t->rank == ts[i].t.rank &&
            memcmp(t->dims, ts[i].t.dims, (size_t)t->rank * 8) == 0 &&
            memcmp(t->data, ts[i].t.data, tp_tensor_bytes(t)) == 0;
  }
  expect(same, "every tensor reads back with its name, dtype, shape and bytes");
  expect(strcmp(st.tensors[0].name, "alpha.ünï") == 0 && strcmp(st.tensors[3].name, ts[0].name) == 0,
         "tensors come sorted by name");
  expect(st.nmeta == 3 && strcmp(tp_safetensors_meta(&st, "note"), "tab\there") == 0 &&
             strcmp(tp_safetensors_meta(&st, "step"), "7") == 0 && !tp_safetensors_meta(&st, "x"),
         "metadata reads back");
  expect(!tp_safetensors_find(&st, "nope"), "an absent name is NULL");
  const char *crcs = tp_safetensors_meta(&st, TP_SAFETENSORS_CRC_KEY);
  char want[64];
  uint32_t meta_crc = tp_crc32c(0,
                                "note\0"
                                "tab\there\0"
                                "step\0"
                                "7",
                                21); /* by key; the last NUL too */
  snprintf(want, sizeof want, "%08x,%08x,%08x,%08x,%08x", meta_crc, tp_crc32c(0, b, 32), tp_crc32c(0, u, 3),
           tp_crc32c(0, &h, 2), tp_crc32c(0, a, 24));
  expect(crcs && strcmp(crcs, want) == 0, "the metadata holds its own CRC-32C, then each tensor's in name order");
  tp_safetensors_free(&st);
  expect(tp_crc32c(0, "123456789", 9) == 0xe3069283u &&
             tp_crc32c(tp_crc32c(0, "1234", 4), "56789", 5) == 0xe3069283u,
         "CRC-32C of '123456789' is e3069283 (RFC 3720), also in pieces");
  {
    /* the word-at-a-time paths (the crc32 instruction or the table) against the bit-at-a-time
     * definition, over lengths and split points around the 8-byte words */
    unsigned char bytes[1027];
    for (size_t i = 0; i < sizeof bytes; i++) bytes[i] = (unsigned char)(i * 131 + 7);
    bool same = true;
    for (size_t n = 0; n <= sizeof bytes; n += n < 40 ? 1 : 97) {
      uint32_t bitwise = ~0u;
      for (size_t i = 0; i < n; i++) {
        bitwise ^= bytes[i];
        for (int k = 0; k < 8; k++) bitwise = bitwise & 1 ? bitwise >> 1 ^ 0x82f63b78u : bitwise >> 1;
      }
      size_t cut = n / 3;
      same = same && tp_crc32c(0, bytes, n) == ~bitwise &&
             tp_crc32c(tp_crc32c(0, bytes, cut), bytes + cut, n - cut) == ~bitwise;
    }
    expect(same, "CRC-32C equals its bit-by-bit definition at every length, whole and in pieces");
  }

  /* a flipped bit in any tensor's bytes is found, and named */
  {
    FILE *g = fopen(path, "rb");
    char bytes[1024];
    size_t size = fread(bytes, 1, sizeof bytes, g);
    fclose(g);
    char flipped[4200];
    snprintf(flipped, sizeof flipped, "%s/flipped.safetensors", argv[1]);
    bytes[size - 1] ^= 0x10; /* the last byte: zeta's (sorted last) */
    g = fopen(flipped, "wb");
    fwrite(bytes, 1, size, g);
    fclose(g);
    TpDiag q;
    tp_diag_init(&q, "test", NULL, NULL);
    char what[1400];
    int rc = tp_safetensors_load(flipped, &st, &q);
    snprintf(what, sizeof what, "a flipped bit is refused, naming the file and tensor (got: %s)",
             rc ? q.last : "accepted");
    expect(rc == TP_ERR_INPUT &&
               strstr(q.last, "flipped.safetensors: tensor 'zeta \"quoted\" \\ \\x01' fails its "
                              "CRC-32C check") &&
               strstr(q.last, "the file is corrupt"),
           what);
  }
  {
    TpDiag q;
    tp_diag_init(&q, "test", NULL, NULL);
    char fifo[4200], what[1400];
    snprintf(fifo, sizeof fifo, "%s/fifo.safetensors", argv[1]);
    unlink(fifo);
    mkfifo(fifo, 0666);
    int rc = tp_safetensors_load(fifo, &st, &q); /* would block without tp_open_input */
    snprintf(what, sizeof what, "a FIFO is refused at once (got: %s)", rc ? q.last : "accepted");
    expect(rc == TP_ERR_INPUT && strstr(q.last, "fifo.safetensors: cannot read: not a regular file: it is a FIFO"),
           what);
  }

  FILE *f = fopen(path, "rb");
  uint64_t hlen;
  char head[64] = {0};
  fread(&hlen, 8, 1, f);
  fread(head, 1, 40, f);
  fclose(f);
  expect(hlen % 8 == 0, "the data starts 8-byte aligned");
  expect(strncmp(head, "{\"__metadata__\":{\"step\":\"7\"", 27) == 0, "the header starts with the metadata");

  /* an escaped \u name and a surrogate pair */
  write_raw("{\"\\u00e9\\ud83d\\ude00\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
  expect(tp_safetensors_load(path, &st, &d) == TP_OK && st.n == 1 &&
             strcmp(st.tensors[0].name, "\xc3\xa9\xf0\x9f\x98\x80") == 0,
         "\\u escapes decode to UTF-8");
  tp_safetensors_free(&st);
  write_raw("{\"x\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4],\"extra\":[1,{\"a\":null}]}}", 4);
  expect(tp_safetensors_load(path, &st, &d) == TP_OK && st.n == 1, "unknown fields are skipped");
  tp_safetensors_free(&st);

  f = fopen(path, "wb");
  fwrite("abc", 1, 3, f);
  fclose(f);
  {
    TpDiag q;
    tp_diag_init(&q, "test", NULL, NULL);
    expect(tp_safetensors_load(path, &st, &q) && strstr(q.last, "shorter than its 8-byte header length"),
           "a 3-byte file is refused");
  }
  expect_refused("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 8, "expected '}'");
  expect_refused("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4,
                 "tensor 'x' has data_offsets [0, 8] outside the 4 data bytes");
  expect_refused("{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
                 "tensor 'x' has 8 data bytes, its shape needs 12");
  expect_refused("{\"x\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
                 "tensor 'x' has unsupported dtype 'Q4'");
  expect_refused("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                 8, "tensors 'x' and 'y' overlap");
  expect_refused("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                 "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                 8, "tensor 'x' is listed twice");
  expect_refused("{\"x\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
                 "expected a non-negative integer");
  expect_refused("{\"x\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4,
                 "tensor 'x' lacks dtype, shape or data_offsets");
  expect_refused("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}} x", 4,
                 "text after the header object");
  expect_refused("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 0, "outside the 0 data bytes");
  expect_refused("{\"__metadata__\":{\"a\":\"1\",\"a\":\"2\"}}", 0, "metadata key 'a' is listed twice");
  expect_refused("{\"__metadata__\":{\"tokpipe.crc32c\":\"00000000,00000000\"},"
                 "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                 4, "tensor 'x' fails its CRC-32C check (stored 00000000, computed 48674bc7)");
  expect_refused("{\"__metadata__\":{\"a\":\"b\",\"tokpipe.crc32c\":\"00000000,48674bc7\"},"
                 "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                 4, "the metadata fails its CRC-32C check (stored 00000000, computed ");
  expect_refused("{\"__metadata__\":{\"tokpipe.crc32c\":\"00000000,48674bc7,\"},"
                 "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                 4, "metadata 'tokpipe.crc32c' is not 2 checksums (8 lowercase hex digits each");
  expect_refused("{\"__metadata__\":{\"tokpipe.crc32c\":\"00000000,48674BC7\"},"
                 "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                 4, "is not 2 checksums");
  expect_refused("{\"__metadata__\":{\"tokpipe.crc32c\":\"00000000;48674bc7\"},"
                 "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                 4, "is not 2 checksums");
  expect_refused("{\"__metadata__\":{\"tokpipe.crc32c\":\"\"}}", 0, "is not 1 checksums");
  write_raw("{\"__metadata__\":{\"b\":\"2\",\"a\":\"1\",\"tokpipe.crc32c\":\"dc33662c\"}}", 0);
  expect(tp_safetensors_load(path, &st, &d) == TP_OK, "the metadata's checksum does not depend on the keys' order");
  tp_safetensors_free(&st);
  write_raw("{\"__metadata__\":{\"tokpipe.crc32c\":\"00000000,48674bc7\"},"
            "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
            4);
  expect(tp_safetensors_load(path, &st, &d) == TP_OK && st.n == 1, "a right checksum is accepted");
  tp_safetensors_free(&st);
  {
    TpDiag q;
    tp_diag_init(&q, "test", NULL, NULL);
    f = fopen(path, "wb");
    uint64_t huge = 1000;
    fwrite(&huge, 8, 1, f);
    fputs("{}", f);
    fclose(f);
    expect(tp_safetensors_load(path, &st, &q) && strstr(q.last, "header length 1000 exceeds the file"),
           "a header length beyond the file is refused");
  }
  return failures ? 1 : 0;
}
