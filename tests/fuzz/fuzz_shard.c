/* libFuzzer target for shard-tensor on textual IR: a module that parses and verifies is
 * split over 2 to 4 tensor ranks (by the input's size); the pass must succeed or give one
 * diagnostic, never crash, hang, leak or draw a sanitizer report, and the module it leaves
 * must verify, and again after add-loss and autodiff where those succeed (any other outcome
 * aborts: a finding). */
#include <stdint.h>
#include <stdlib.h>

#include "ir/ir.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  TpDiag d;
  tp_diag_init(&d, "fuzz_shard", NULL, NULL); /* silent */
  TpModule *m = NULL;
  /* no path: blob lines are refused, so no file is touched */
  if (tp_parse_module((const char *)data, size, NULL, &m, &d) != TP_OK) return 0;
  const char *const shard[] = {"shard-tensor"}, *const train[] = {"add-loss", "autodiff"};
  TpPassOptions opt = {.tensor = 2 + (int)(size % 3)};
  if (tp_verify(m, &d) == TP_OK && tp_verify_split(m, opt.tensor, 0, &d) == TP_OK &&
      tp_run_passes(m, shard, 1, &opt, &d) == TP_OK) {
    if (tp_verify(m, &d) != TP_OK) abort();
    if (tp_run_passes(m, train, 2, &opt, &d) == TP_OK && tp_verify(m, &d) != TP_OK) abort();
  }
  tp_module_free(m);
  return 0;
}
