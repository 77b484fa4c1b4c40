/* ONNX TensorProto decoding: the one reader of tensor data in ONNX files, shared by the
 * importer (initializers, Constant values, test data files) and the trainer's weight reader
 * (onnx_weights.h). protobuf-c is used only here, in runtime/onnx/, and in frontend/. */
#ifndef TOKPIPE_RUNTIME_ONNX_TENSOR_H
#define TOKPIPE_RUNTIME_ONNX_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "onnx/onnx.pb-c.h"

#include "../../base/diag.h"
#include "../../base/tensor.h"

/* Room for a decoding error: a whole diagnostic line (TpDiag.last), so long initializer
 * names and locations never cut off the reason. */
#define TP_ONNX_ERR_SIZE 1024

/* Where external data comes from. `map` opens file `location` of the model's folder,
 * confined to it (tp_map_in_folder), and returns an id >= 0 with the file's bytes, or -1
 * with why[] completing "external data location 'X' ...". The mapping must outlive the
 * decoded tensor. map NULL: external data is refused ("WHAT: external data " + refused). */
typedef struct {
  int (*map)(void *ctx, const char *location, const uint8_t **bytes, size_t *size, char *why, size_t why_size);
  void *ctx;
  const char *refused; /* e.g. "is not supported in tensor files" */
} TpOnnxData;

/* A decoded TensorProto: t's dtype and shape, and t.data where its bytes lie. */
typedef struct {
  TpTensor t;
  bool raw;       /* in the TensorProto's raw_data */
  void *owned;    /* typed fields (float_data, ...) converted: malloc'ed, == t.data; free it */
  int file;       /* external data: the id TpOnnxData.map returned; else -1 */
  int64_t offset; /* external data: where t.data lies in that file */
} TpOnnxTensor;

/* dtype of an ONNX elem_type, or TP_UNDEF when tokpipec has no such dtype. */
TpDType tp_onnx_dtype(int64_t onnx_type);

/* t's dtype and shape (out->data NULL), checked: a known element type, rank, no negative
 * dim, a size far from overflow, not segmented. `what` names the tensor in the error
 * ("initializer 'W'"); on failure returns TP_ERR_INPUT with the message in err[]. */
int tp_onnx_tensor_type(const Onnx__TensorProto *t, const char *what, TpTensor *out, char *err, size_t err_size);

/* Decodes t: its type (as above) and its bytes, from raw_data (in place), the typed fields
 * (converted, little-endian) or external data (through `data`; NULL refuses it), each
 * checked against the shape. Errors as above; the caller reports err[] with its context. */
int tp_onnx_tensor_decode(const Onnx__TensorProto *t, const char *what, const TpOnnxData *data, TpOnnxTensor *out,
                          char *err, size_t err_size);

/* The decoded bytes as a malloc'ed copy the caller frees (the owned buffer itself when
 * there is one). */
void *tp_onnx_tensor_take(TpOnnxTensor *dec);

#endif
