/* libFuzzer target for the safetensors reader and the checkpoint's metadata checks (what
 * --resume, --init FILE.safetensors and tokpipe-compare read): any bytes must give a file
 * or one diagnostic, never a crash, a leak or a sanitizer report. A file it accepts must
 * hold what the reader promises: tensors sorted by unique name, each of its shape's size. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/train/train.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  TpDiag d;
  tp_diag_init(&d, "fuzz_safetensors", "input.safetensors", NULL); /* silent */
  TpSafetensors st;
  if (tp_safetensors_parse(data, size, &st, &d) != TP_OK) return 0;
  for (int i = 0; i < st.n; i++) {
    const TpNamedTensor *t = &st.tensors[i];
    if (i && strcmp(st.tensors[i - 1].name, t->name) >= 0) abort(); /* unsorted or twice */
    if (tp_safetensors_find(&st, t->name) != &t->t) abort();
    if (tp_tensor_bytes(&t->t) && !t->t.data) abort();
    /* touch every byte: the reader's copy must be as large as the shape says */
    volatile uint8_t sum = 0;
    for (size_t k = 0; k < tp_tensor_bytes(&t->t); k++) sum += ((const uint8_t *)t->t.data)[k];
  }
  tp_safetensors_verify(&st, &d); /* either way: mutated headers rarely keep their checksum, */
  TrainCheckpointMeta m;          /* and the metadata checks below should still see them */
  if (train_checkpoint_meta(&st, &m, &d) == TP_OK &&
      (m.step < 0 || m.step > TRAIN_MAX_STEPS || m.data_position < 0 || m.data_position >= m.data_tokens ||
       m.batch < 1 || m.seq < 1 || m.vocab < 1))
    abort(); /* accepted metadata out of its ranges */
  tp_safetensors_free(&st);
  return 0;
}
