/* ONNX weights for the trainer runtime: read a model's initializers (raw, typed or external
 * data, decoded by onnx_tensor.c as the importer decodes them) and serialize a copy of the
 * model with some initializers replaced, for --init and --export-onnx. No IR module is
 * built; protobuf-c types stay inside runtime/onnx/. */
#ifndef TOKPIPE_RUNTIME_ONNX_WEIGHTS_H
#define TOKPIPE_RUNTIME_ONNX_WEIGHTS_H

#include <stdbool.h>
#include <stddef.h>

#include "../../base/diag.h"
#include "../../base/tensor.h"

typedef struct TpOnnxWeights TpOnnxWeights;

/* Reads and decodes the model file; diagnostics name the file. */
int tp_onnx_weights_open(const char *path, TpOnnxWeights **out, TpDiag *d);
void tp_onnx_weights_close(TpOnnxWeights *w);

/* True if the model has an initializer `name`. */
bool tp_onnx_weights_has(const TpOnnxWeights *w, const char *name);

/* Initializer `name` as stored (dtype, shape); out->data stays valid until close (or a
 * pack that replaces it). */
int tp_onnx_weights_get(TpOnnxWeights *w, const char *name, TpTensor *out, TpDiag *d);

/* Checks that `name` can be replaced: it is an initializer, or the output of an Identity
 * node reading one (an exporter's alias of a de-duplicated initializer). */
int tp_onnx_weights_check_replace(const TpOnnxWeights *w, const char *name, TpDiag *d);

/* Serializes the model with initializer names[i] set to values[i] (f32, any shape). An
 * Identity alias named names[i] becomes an initializer of its own and the node goes.
 * Other initializers held in external data are inlined, so the bytes stand alone next to
 * any folder. Changes the opened model; *bytes is malloc'ed. */
int tp_onnx_weights_pack(TpOnnxWeights *w, const char *const *names, const TpTensor *values, int n, void **bytes,
                         size_t *size, TpDiag *d);

#endif
