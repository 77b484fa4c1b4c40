/* The ONNX importer: decodes a ModelProto (protobuf-c, confined to frontend/) and lowers it
 * into the canonical IR of ir/ops.def, folding shape arithmetic to constants on the way.
 * Weights are not copied: raw_data initializers point into the mapped model file and
 * external data into mapped data files. */
#ifndef TOKPIPE_FRONTEND_H
#define TOKPIPE_FRONTEND_H

#include <stddef.h>
#include <stdint.h>

#include "../ir/ir.h"

typedef struct {
  const char *name; /* a dim_param of the model, e.g. "batch" */
  int64_t value;    /* --dim batch=4 */
} TpDimBinding;

typedef struct {
  const char *name; /* a graph input */
  TpTensor value;   /* its known data (dtype and shape must match the input's type) */
} TpInputBinding;

typedef struct {
  const TpDimBinding *dims;
  int ndims;
  /* Graph inputs whose values are known (tokpipe-run's test data). A bound input used as
   * a shape-determining operand (Reshape shape, Slice starts, Reduce axes, ...) becomes a
   * CONST value and leaves the module's inputs; one used only as an ordinary operand stays
   * an input. An unbound input in such a position is an error naming node and operand. */
  const TpInputBinding *bound_inputs;
  int nbound;
  /* {batch, seq}: where > 0, the dims of the token input (the first integer graph input of
   * rank 2), whatever they are named (tokpipec --batch/--seq): a symbolic one takes it, and
   * one fixed otherwise must equal it. */
  int64_t token_dims[2];
  /* tokpipec: a token input whose batch (dim 0) is a fixed number other than token_dims[0]
   * keeps it; the rebatch pass then changes the batch (TpPassOptions.batch). */
  bool rebatch;
} TpImportOptions;

/* Imports an ONNX model file. o may be NULL. On success *out owns a new module. */
int tp_import_onnx_file(const char *path, const TpImportOptions *o, TpModule **out, TpDiag *d);

/* The same from bytes in memory (the fuzzer). `path` names the model in diagnostics and
 * its folder anchors external data; NULL refuses external data. The bytes are copied. */
int tp_import_onnx_buffer(const void *data, size_t size, const char *path, const TpImportOptions *o, TpModule **out,
                          TpDiag *d);

/* Reads a serialized TensorProto file (backend-test input_N.pb / output_N.pb) into a tensor
 * whose data is malloc'ed (the caller frees out->data); *name (if name is not NULL) gets a
 * malloc'ed copy of the tensor's name. */
int tp_read_tensor_pb(const char *path, TpTensor *out, char **name, TpDiag *d);

#endif
