/* Internal to frontend/: the importer's state and the helpers the op lowerings share.
 * onnx_import.c decodes the model, tensors and graph; onnx_ops.c holds the op table. */
#ifndef TOKPIPE_FRONTEND_IMPORT_H
#define TOKPIPE_FRONTEND_IMPORT_H

#include "../runtime/onnx/onnx_tensor.h" /* protobuf-c's onnx.pb-c.h, and the tensor decoder */
#include "frontend.h"

/* Longest constant operand read as integers (Split sizes, Slice starts, shapes, axes). */
#define TP_MAX_CONST_INTS 64
/* Largest constant the importer materialises itself (ConstantOfShape, Range, masks). */
#define TP_MAX_CONST_BYTES ((int64_t)1 << 28)

/* ONNX value name -> IR value index; Identity and Dropout add aliases. */
typedef struct {
  const char **keys; /* strings of the decoded model: alive while importing */
  int *vals;
  int cap, count;
} NameMap;

/* A raw_data field located in the model bytes by the wire-format walk. */
typedef struct {
  int64_t offset, size;
} RawSpan;

/* A tensor sequence that SplitToSequence made: its elements, SequenceAt's results
 * (module-owned). */
typedef struct Sequence {
  const char *name;
  int n;
  int *values;
  struct Sequence *next;
} Sequence;

/* A node operand the importer reads from another value than its ONNX name's (a parameter
 * the exporter merged into another initializer: export_metadata.c). */
typedef struct {
  int node, operand, value;
} Override;

typedef struct {
  TpModule *m;
  TpDiag *d;
  const TpImportOptions *o;
  const char *path; /* the model as named by the user, or NULL */
  char *dir;        /* the model's folder as named by the user; NULL: external data refused */
  int opset;
  int model_blob; /* the model bytes, or -1 */
  RawSpan *raw;   /* per graph initializer */
  int nraw;
  NameMap names;
  Sequence *sequences;
  Override *overrides;
  int noverrides, cap_overrides;
  /* export_metadata.c: value_info and graph input names; FX placeholders named by nodes;
   * each node's FX call (module-owned; NULL without the export's record) */
  NameMap infos, placeholders;
  const char **fx_calls;
} Importer;

/* One ONNX node being lowered. */
typedef struct {
  const Onnx__NodeProto *n;
  TpOrigin at;   /* module-owned strings */
  int since;     /* since_version of the matched op-table row */
  TpOpKind kind; /* the IR op of the row (TP_OP_COUNT for none) */
  int nin, nout;
  int in[TP_MAX_CONST_INTS]; /* operand values, -1 when absent */
} Node;

typedef int (*ImportFn)(Importer *I, Node *N);

/* onnx_import.c: the name map, the protobuf wire format, operand overrides */
int map_get(const NameMap *t, const char *key);
void map_put(NameMap *t, const char *key, int val);
void map_free(NameMap *t);
bool wire_varint(const uint8_t **p, const uint8_t *end, uint64_t *v);
/* Next field of a message's bytes: number, wire type, and for length-delimited ones the payload. */
bool wire_field(const uint8_t **p, const uint8_t *end, uint64_t *field, const uint8_t **payload, uint64_t *len);
void add_override(Importer *I, int node, int operand, int value);
int override_of(const Importer *I, int node, int operand); /* -1: none */

/* export_metadata.c: what a torch.export-based export records (see its header) */
/* The value of metadata_props key `key` of a ValueInfoProto (node false) or NodeProto (node
 * true), module-owned, or NULL. */
const char *onnx_metadata(Importer *I, const ProtobufCMessage *msg, bool node, const char *key);
/* The top-level comma-separated arguments of an FX call's `args = (...)` (fx_node
 * metadata) into out[], module-owned; the count, or -1 without such a list or past max. */
int fx_call_args(Importer *I, const char *call, const char **out, int max);
/* Does the export record the kinds of its lifted inputs (PARAMETER, BUFFER, ...)? */
bool export_records_kinds(Importer *I, const Onnx__GraphProto *g);
typedef struct {
  TpValueKind kind;   /* TP_VAL_PARAM: trains; TP_VAL_CONST */
  const char *why;    /* TpValue.why */
  const char *source; /* the parameter a folded initializer stands for, or NULL */
  bool alone;         /* folded from that parameter alone (a transpose or a view of it) */
} InitClass;
/* out[i] for each initializer i of g; an error for an initializer folded from several parameters. */
int classify_initializers(Importer *I, const Onnx__GraphProto *g, InitClass *out);
/* Gives each parameter the exporter merged into another trainable initializer (equal bytes)
 * a PARAM of its own, read by its nodes' operands (overrides); values[i]: initializer i's value. */
int split_merged_params(Importer *I, const Onnx__GraphProto *g, const InitClass *cls, const int *values);

/* onnx_ops.c */
/* The op-table row for (op_type, opset): highest since_version <= opset. NULL if none;
 * *first_since gets the op's oldest supported version (0 if the op is unknown). */
typedef struct {
  const char *op_type;
  int since;
  ImportFn fn;
  TpOpKind kind;               /* passed to fn; TP_OP_COUNT when fn makes no single IR op */
  int min_in, max_in, max_out; /* the ONNX node's arity */
} OpRow;
const OpRow *tp_onnx_find_op(const char *op_type, int opset, int *first_since);

/* onnx_import.c: the model's file name in its folder (tp_folder_of): blobs are named
 * relative to that folder (ONNX external data, and so the textual IR) */
const char *model_file_name(const char *path);

/* onnx_import.c: helpers for the lowerings */
int node_error(Importer *I, const Node *N, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
const Onnx__AttributeProto *node_attr(const Node *N, const char *name);
int attr_int(Importer *I, const Node *N, const char *name, int64_t dflt, int64_t *out);
int attr_float(Importer *I, const Node *N, const char *name, double dflt, double *out);
int attr_string(Importer *I, const Node *N, const char *name, const char *dflt, const char **out);
/* *n = -1 when absent. */
int attr_ints(Importer *I, const Node *N, const char *name, int64_t *out, int *n);
/* Normalises axis into [0, rank); error naming `what` when out of range. */
int norm_axis(Importer *I, const Node *N, const char *what, int64_t axis, int rank, int64_t *out);

/* Operand k must be a compile-time constant (bound inputs become one); *t views it. */
int const_operand(Importer *I, const Node *N, int k, const char *what, TpTensor *t);
/* ...of an integer dtype with at most TP_MAX_CONST_INTS elements, as int64; *n its count. */
int const_ints(Importer *I, const Node *N, int k, const char *what, int64_t *out, int *n);
const TpType *value_type(Importer *I, int v);

/* Binds ONNX output k of the node to value v. */
void bind_output(Importer *I, const Node *N, int k, int v);
/* New IR op with the node's outputs as results (names from the node). */
int new_op(Importer *I, const Node *N, TpOpKind kind, const int *inputs, int ninputs, int noutputs);
/* Infers and folds op (result types already set where the op needs it) and binds its
 * results to the node's outputs in order. */
int finish_op(Importer *I, const Node *N, int op);
/* A new CONST value for ONNX output k of the node, holding a copy of data. */
int add_output_const(Importer *I, const Node *N, int k, TpType type, const void *data);
/* A small TensorProto (ConstantOfShape's value) as malloc'ed data (no external data). */
int read_small_tensor(Importer *I, const Node *N, const Onnx__TensorProto *t, const char *what, TpType *type,
                      void **data);
/* Converts a TensorProto into a PARAM/CONST value named name; raw_index: its position among
   the graph's initializers (raw_data is then referenced in place), or -1 (copied). */
int import_tensor_value(Importer *I, const Onnx__TensorProto *t, const char *name, TpValueKind kind, TpOrigin at,
                        int raw_index, int *value);

#endif
