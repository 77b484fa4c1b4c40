/* libFuzzer target for the ONNX importer: any bytes must give a module or one diagnostic,
 * never a crash, a leak or a sanitizer report; a module it returns must verify. */
#include <stdint.h>
#include <stdlib.h>

#include "frontend/frontend.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const TpDimBinding dims[] = {{"batch", 2}, {"seq", 3}, {"sequence", 3}, {"N", 2}};
  TpImportOptions o = {.dims = dims, .ndims = (int)(sizeof dims / sizeof *dims)};
  TpDiag d;
  tp_diag_init(&d, "fuzz_import", NULL, NULL); /* silent */
  TpModule *m = NULL;
  /* no path: external data is refused, so no file outside the input is touched */
  if (tp_import_onnx_buffer(data, size, NULL, &o, &m, &d) == TP_OK) {
    if (tp_verify(m, &d) != TP_OK) abort(); /* the importer built invalid IR */
    tp_module_free(m);
  }
  return 0;
}
