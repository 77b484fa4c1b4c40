/* libFuzzer target for the textual IR parser: any text must give a module or one
 * diagnostic, never a crash, a hang, a leak or a sanitizer report; then the verifier must
 * accept or refuse the module the same way (one diagnostic, no crash). */
#include <stdint.h>
#include <stdlib.h>

#include "ir/ir.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  TpDiag d;
  tp_diag_init(&d, "fuzz_tir", NULL, NULL); /* silent */
  TpModule *m = NULL;
  /* no path: blob lines are refused, so no file is touched */
  if (tp_parse_module((const char *)data, size, NULL, &m, &d) == TP_OK) {
    tp_verify(m, &d);
    tp_module_free(m);
  }
  return 0;
}
