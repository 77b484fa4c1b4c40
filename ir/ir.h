/* The tokpipec IR: the one header that defines modules, values, ops, attributes,
 * diagnostics and the cross-file prototypes of ir/ and passes/ (grouped by file).
 *
 * A module owns arrays of values and ops; everything refers to values and ops by index, so
 * cloning a region is an array copy plus an index remap. Ops are stored in topological
 * order. Every value and op keeps the ONNX node it came from (TpOrigin). Constant data is
 * never copied into the IR: PARAM and CONST values point into blobs (the mapped model
 * file, mapped external-data files, or small buffers the module owns, e.g. folded
 * constants). */
#ifndef TOKPIPE_IR_H
#define TOKPIPE_IR_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "../base/atomic.h"
#include "../base/diag.h"
#include "../base/file.h"
#include "../base/tensor.h"

/* ---- the op table ---- */
enum {
  TP_TRAIT_ELEMENTWISE = 1 << 0, /* result[i] depends on broadcast operands at i only */
  TP_TRAIT_BOOL_RESULT = 1 << 1, /* result dtype is bool */
  /* How an op treats the token (sequence) axis, beyond the axis bookkeeping of
   * passes/insert_token_dim.c: a loss that sums over every position (token-reducing), and
   * an attention whose queries read the keys and values of earlier tokens (causal-prefix
   * when causal, else token-global). */
  TP_TRAIT_TOKEN_REDUCING = 1 << 2,
  TP_TRAIT_TOKEN_PREFIX = 1 << 3,
  /* Every row of the result (all but its last axis) comes from the same row of the first
   * operand, the other operands alike for every row (Linear, the gated MLPs). */
  TP_TRAIT_ROWWISE = 1 << 4,
};

typedef enum {
#define TP_OP(name, min_in, max_in, min_out, max_out, traits) TP_OP_##name,
#include "ops.def"
  TP_OP_COUNT
} TpOpKind;

typedef struct {
  const char *name;
  int min_inputs, max_inputs, min_outputs, max_outputs;
  unsigned traits;
} TpOpInfo;

extern const TpOpInfo tp_op_info[TP_OP_COUNT];
typedef enum { TP_ATTR_INT, TP_ATTR_FLOAT, TP_ATTR_INTS, TP_ATTR_STRING } TpAttrKind;
typedef enum { TP_PHASE_FORWARD, TP_PHASE_BACKWARD } TpPhase;

/* The attribute schema (TP_ATTR rows of ops.def); NULL-terminated (name == NULL). */
typedef struct {
  TpOpKind op;
  const char *name;
  TpAttrKind kind;
  const char *choices; /* allowed values, "0|1", or NULL for any */
} TpAttrRule;
extern const TpAttrRule tp_attr_rules[];

/* TP_OP_COUNT when the name is not an IR op. */
TpOpKind tp_op_from_name(const char *name);

/* ---- types, values, ops ---- */
typedef struct {
  TpDType dtype;
  int rank;
  int64_t dims[TP_MAX_RANK];
  /* symbolic name of each dimension ("batch", "seq") or NULL; module-owned strings */
  const char *dimnames[TP_MAX_RANK];
} TpType;

/* Where something came from in the ONNX model: node name and op type (NULL if none). */
typedef struct {
  const char *node;
  const char *op_type;
} TpOrigin;

typedef enum {
  TP_VAL_INPUT,  /* graph input, supplied at run time */
  TP_VAL_PARAM,  /* floating-point initializer: a (later trainable) weight */
  TP_VAL_CONST,  /* constant: non-float initializer, Constant node, folded value */
  TP_VAL_RESULT, /* result of an op */
} TpValueKind;

/* How a PARAM is split over the N ranks of the tensor group (passes/shard_tensor.c),
 * printed `@shard(axis=A, parts=P, ranks=N)` (`, chunks=C` when C > 1). Every rank runs
 * the same module, so the param's type is one rank's part; the whole tensor has dim A
 * times P. Along A the whole is C equal chunks (a fused Q|K|V weight: 3); each chunk is
 * cut into P equal pieces and rank r in [0, N) holds piece r*P/N of every chunk, in chunk
 * order: P == N gives each rank its own piece; P < N (grouped K/V heads fewer than the
 * ranks) gives N/P ranks the same piece, whose gradient those ranks must sum. A file
 * blob's data at the param's offset is the whole tensor, which the runtime scatters (and
 * gathers back for checkpoints). parts == 0: not split (whole on every rank).
 * pad > 0 (printed `, pad=K`): the whole tensor's last K slices along A are padding that
 * makes a vocabulary the ranks do not divide split (Megatron's padded vocabulary; one
 * chunk, parts == ranks), or makes each rank's range a multiple of
 * TpPassOptions.vocab_multiple classes (parts == ranks == 1 under --tensor 1: padded, not
 * split): files hold dim A times P minus K, the runtime scatters zeros into the padding
 * and gathers it back to nothing, and the padded classes are masked out of the loss
 * (CrossEntropyStats' and CrossEntropy's vocab_pad), so their rows never get a gradient. */
typedef struct {
  int axis, parts, ranks, chunks, pad;
} TpShard;

typedef struct {
  const char *name; /* unique in the module; from ONNX names where there is one */
  TpType type;
  TpValueKind kind;
  int def;  /* TP_VAL_RESULT: index of the defining op; else -1 */
  int blob; /* TP_VAL_PARAM/CONST: data at blobs[blob].base + offset; else -1 */
  int64_t offset;
  /* TP_VAL_PARAM: the dtype of its data where that is not type.dtype (store-bf16 and
   * store-fp16 make a parameter 16-bit and keep its f32 initial values, which the trainer
   * reads into its f32 masters); TP_UNDEF: type.dtype. Printed before the data (`= f32
   * blob ...`). Read it through tp_data_dtype. */
  TpDType data_dtype;
  /* The ONNX node that made it. A PARAM an exporter's Identity named (a de-duplicated
   * initializer) has (source initializer name, "Identity") and shares the source's blob
   * and offset; a weight that retie-params re-tied keeps its initializer's name as node. */
  TpOrigin origin;
  /* TP_VAL_PARAM: the parameter this one is a tied copy of (same type and data; the last
   * pipeline stage's own copy of a parameter the first stage reads too, so that each has
   * its partial gradient: passes/assign_stages.c), else -1. Printed `@tied(%param)`. */
  int tied;
  TpShard shard; /* TP_VAL_PARAM split over the tensor group; see TpShard */
  /* An initializer: why the importer made it a PARAM (trained) or a CONST, e.g. "a parameter
   * (export metadata)"; module-owned, not printed in the IR (tokpipec --emit=params). */
  const char *why;
  /* An initializer the exporter folded from one parameter alone, with no constants or
   * other ops it records (export metadata): that parameter's name, or NULL; retie-params
   * re-ties it as a transpose without reading data when the parameter is in the module
   * too and the shapes say so (a tied head). Not printed. */
  const char *folded_from;
  bool dead; /* marked for removal by tp_module_compact */
} TpValue;

typedef struct {
  const char *name;
  TpAttrKind kind;
  int64_t i;
  double f;
  const int64_t *ints;
  int nints;
  const char *s;
} TpAttr;

/* The part an op plays in placing the model on pipeline stages (printed `@boundary`,
 * `@retie`; none for compute). */
typedef enum {
  TP_ROLE_COMPUTE, /* an ordinary op */
  /* A stage-boundary copy (passes/assign_stages.c): a same-shape Reshape whose operand is
   * a result of the neighbouring stage, sent from there: the stage before for a forward
   * copy, the stage after for a backward one (a gradient going back). A compiled plan
   * runs no code for it: the runtime receives its value. */
  TP_ROLE_BOUNDARY,
  /* A re-tie view (passes/retie_params.c): a forward Transpose {perm = [1, 0]} or
   * same-shape Reshape of a PARAM standing for an initializer that duplicated it (the
   * op's origin node names that initializer, which codegen derives from the parameter).
   * Backward ops play the role of the forward op they differentiate (autodiff). */
  TP_ROLE_RETIE,
  /* A recomputed activation (passes/recompute.c): a backward-phase copy of a forward op
   * (same kind, attributes and placement) that the backward reads instead of the forward
   * op's results, so that those need not be kept from the forward to the backward. */
  TP_ROLE_RECOMPUTE,
  TP_ROLE_COUNT
} TpOpRole;
/* "compute", "boundary", "retie", "recompute" */
extern const char *const tp_op_role_names[TP_ROLE_COUNT];

typedef struct {
  TpOpKind kind;
  int ninputs, noutputs;
  int *inputs;  /* value indices; -1 for an absent optional operand */
  int *outputs; /* value indices; -1 for an absent optional result */
  int nattrs;
  TpAttr *attrs; /* kept sorted by name, so printing is deterministic */
  TpOrigin origin;
  /* Placement, set by the training passes: the pipeline stage that runs the op, the token
   * slice it computes (-1: not sliced) and whether it is part of the backward pass. */
  int stage;
  int slice;
  TpPhase phase;
  /* A backward op of the weight half of a split backward (passes/split_backward.c): it
   * computes parameter gradients only, in the unit's backward-weight part (printed
   * `@weight`); false: the backward-input part, or an unsplit backward. */
  bool weight;
  TpOpRole role;
  bool dead; /* marked for removal by tp_module_compact */
} TpOp;

typedef struct {
  const char *path; /* file the bytes come from, relative to the module's folder; NULL if owned */
  const uint8_t *base;
  size_t size;
  TpFileMap file; /* a mapped file's (what to unmap, where its holes are), or zeros */
  bool owned;     /* base was malloc'ed by the module */
} TpBlob;

typedef struct TpArena TpArena;

typedef struct TpModule {
  TpArena *arena;     /* strings, attribute arrays, operand lists */
  const char *source; /* the file the module was read from, for diagnostics */
  int opset;          /* the ONNX default-domain opset the model was imported at */
  TpValue *values;
  int nvalues, cap_values;
  TpOp *ops;
  int nops, cap_ops;
  TpBlob *blobs;
  int nblobs, cap_blobs;
  int *inputs; /* graph inputs in order */
  int ninputs, cap_inputs;
  int *outputs; /* graph outputs in order */
  int noutputs, cap_outputs;
  /* Training (passes/autodiff.c): the scalar loss value (-1 before add-loss), and for each
   * trainable PARAM value v, grads[v] = the value holding d loss / d v (-1 otherwise;
   * NULL before autodiff; nvalues entries). */
  int loss;
  int *grads;
  int ngrads;
  /* What split-sequence cut (not printed; 0 and NULL before it, and in IR read back): the
   * lengths of the nslices slices each sequence is cut into, first to last, summing to the
   * token axis's length. */
  int nslices;
  const int64_t *slice_len;
  /* The ranks of the tensor group shard-tensor split the module over (not printed; 0 before
   * it, and in IR read back, whose split params record their ranks: TpShard). */
  int tensor;
  /* name -> value index hash table (open addressing), maintained by tp_module_* */
  int *name_table;
  int name_table_cap;
} TpModule;

/* ---- diagnostics at a node (ir/diag.c; the rest is base/diag.c) ---- */
/* "tool: error: file: node 'N' (OpType, opset K): msg"; returns TP_ERR_INPUT. */
int tp_error_at(TpDiag *d, TpOrigin at, int opset, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* The same for an op of m (its origin; m->opset). */
int tp_error_op(TpDiag *d, const TpModule *m, int op, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* ---- module construction and queries (ir/module.c) ---- */
TpModule *tp_module_new(const char *source);
void tp_module_free(TpModule *m);
void *tp_alloc(TpModule *m, size_t bytes); /* zeroed, freed with the module */
const char *tp_strdup(TpModule *m, const char *s);
/* A printf-formatted string owned by the module. */
const char *tp_strfmt(TpModule *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* -1 if no value has the name. */
int tp_find_value(const TpModule *m, const char *name);
/* A name not yet used in m: `base` itself if free, else base.1, base.2, ... */
const char *tp_unique_name(TpModule *m, const char *base);

int tp_add_blob(TpModule *m, TpBlob blob);
/* Maps a whole file read-only (tp_map_input); `name` (NULL: path) is how the textual IR
 * names it, relative to the module's folder; a blob of the same name is reused. Returns the
 * blob index, or -1 after reporting why the file cannot be mapped. */
int tp_add_file_blob(TpModule *m, const char *path, const char *name, TpDiag *d);
/* The same for file `name` of folder `dir`, confined to it (tp_map_in_folder: -1 with why[]
 * completing "the file 'name' ..."). */
int tp_add_folder_blob(TpModule *m, const char *dir, const char *name, const char *folder, char *why,
                       size_t why_size);
/* Copies `data` (numel*size bytes) into a new module-owned blob. */
int tp_add_owned_blob(TpModule *m, const void *data, size_t bytes);
/* New value; name must be unused (checked). Returns its index. */
int tp_add_value(TpModule *m, const char *name, TpValueKind kind, TpType type, TpOrigin origin);
/* New PARAM/CONST value with data in blob at offset. */
/* The dtype of PARAM/CONST v's data (TpValue.data_dtype). */
TpDType tp_data_dtype(const TpModule *m, int v);
int tp_add_data_value(TpModule *m, const char *name, TpValueKind kind, TpType type, int blob, int64_t offset,
                      TpOrigin origin);
/* New CONST value holding a copy of `data`. */
int tp_add_const(TpModule *m, const char *name, TpType type, const void *data, TpOrigin origin);
void tp_add_input(TpModule *m, int value);
/* The gradient of PARAM value `param` (-1 if none); set it. */
int tp_grad_of(const TpModule *m, int param);
void tp_set_grad(TpModule *m, int param, int grad);
void tp_add_output(TpModule *m, int value);

/* New op appended at the end (topological order is the caller's duty). Results are new
 * TP_VAL_RESULT values named out_names[i] (made unique), type TP_UNDEF until inference;
 * a NULL name makes an absent optional result (-1). Inputs may be -1 (absent optional). */
int tp_add_op(TpModule *m, TpOpKind kind, const int *inputs, int ninputs, const char *const *out_names, int noutputs,
              TpOrigin origin);

/* Attributes (copied into the module; replace an existing one of the same name). */
void tp_set_attr_int(TpModule *m, int op, const char *name, int64_t v);
void tp_set_attr_float(TpModule *m, int op, const char *name, double v);
void tp_set_attr_ints(TpModule *m, int op, const char *name, const int64_t *v, int n);
void tp_set_attr_string(TpModule *m, int op, const char *name, const char *v);
const TpAttr *tp_get_attr(const TpModule *m, int op, const char *name); /* NULL if absent */
int64_t tp_attr_int(const TpModule *m, int op, const char *name, int64_t dflt);
double tp_attr_float(const TpModule *m, int op, const char *name, double dflt);
const char *tp_attr_string(const TpModule *m, int op, const char *name, const char *dflt);
/* Copies every attribute of op `from` to op `to` (a copy of the op). */
void tp_copy_attrs(TpModule *m, int from, int to);
/* NULL (and *n = 0) if absent. */
const int64_t *tp_attr_ints(const TpModule *m, int op, const char *name, int *n);

/* Data of a PARAM/CONST value (NULL for others); a tensor view of any value's type. */
const void *tp_value_data(const TpModule *m, int value);
TpTensor tp_value_tensor(const TpModule *m, int value);

/* Every use of `from` (op operands, graph outputs) now reads `to`. */
void tp_replace_uses(TpModule *m, int from, int to);
/* Number of op operands and graph outputs that read the value. */
int tp_use_count(const TpModule *m, int value);
/* Whether the value is one of the graph's outputs. */
bool tp_is_output(const TpModule *m, int value);
/* Removes ops and values marked dead, renumbering everything; a dead value must be unused. */
void tp_module_compact(TpModule *m);
/* Restores the topological order of m->ops after a pass appended ops that earlier ops now
 * read; ops already in order keep their relative order. */
void tp_sort_ops(TpModule *m);

/* Placement queries (the fields they read: TpOp.role, TpValue.tied). Is op a stage-boundary
 * copy (its operand is sent from the neighbouring stage)? */
bool tp_is_boundary_op(const TpModule *m, int op);
/* For a tied copy of a parameter: the parameter; else -1. */
int tp_tied_param(const TpModule *m, int v);
/* The axis of value v named TP_TOKEN_DIM (passes/insert_token_dim.c marks it), or -1. */
int tp_token_axis(const TpModule *m, int v);

/* Types. */
TpType tp_type_make(TpDType dtype, int rank, const int64_t *dims);
bool tp_type_equal(const TpType *a, const TpType *b); /* dtype and dims; names ignored */
int64_t tp_type_numel(const TpType *t);
/* tp_dims_size_ok of its dims. */
bool tp_type_size_ok(const TpType *t);
/* "f32[batch=4, seq=8, 64]" into buf; returns buf. */
char *tp_type_str(const TpType *t, char *buf, size_t n);

/* ---- type inference (ir/infer.c) ----
 * Computes the result types of an op from its operands and attributes. A result whose type
 * is already set (dtype != TP_UNDEF) is checked against the inferred one instead; Reshape,
 * Expand, Cast and Split results must be set before (their target shape or dtype is the
 * result type). Reports bad operands as user errors at the op's origin. */
int tp_infer_op(TpModule *m, int op, TpDiag *d);
/* numpy broadcast of two shapes; false if incompatible. */
bool tp_broadcast_shape(const TpType *a, const TpType *b, TpType *out);

/* ---- verifier (ir/verify.c) ----
 * Arity, dtypes and shapes (re-inferred), single definition, defined-before-use (acyclic),
 * attribute sanity, data present for PARAM/CONST. Returns TP_OK or TP_ERR_INPUT. */
int tp_verify(const TpModule *m, TpDiag *d);
/* What the module is split into, which tp_verify checks against what split-sequence and
 * shard-tensor recorded (m->nslices, m->tensor) and a tool against its options: one tensor
 * group (every split param over the same ranks, `tensor` of them when > 1), and token slices
 * numbered 0..N-1 without gaps (below `nslices` when > 1). */
int tp_verify_split(const TpModule *m, int tensor, int nslices, TpDiag *d);

/* ---- textual IR (ir/print.c, ir/parse.c) and Graphviz (ir/dot.c) ---- */
void tp_print_module(const TpModule *m, FILE *out);
/* Parses textual IR; `path` is used in diagnostics and to resolve blob file names. */
int tp_parse_module(const char *text, size_t len, const char *path, TpModule **out, TpDiag *d);
/* The file at path ("-": stdin); its blob files are read from blob_dir, a folder the user
 * trusts (tools' --blob-dir), or when NULL from the file's own folder. */
int tp_parse_file(const char *path, const char *blob_dir, TpModule **out, TpDiag *d);
void tp_print_dot(const TpModule *m, FILE *out);

/* ---- passes (passes/) ----
 * One pass per file; each is `int pass_<name>(TpModule *m, TpPassOptions *opt, TpDiag *d)`:
 * opt says what the tool asks of the passes (most read none of it) and takes back what a pass
 * reports (assign-stages' cuts); see the pass manager below. */
typedef struct TpPassOptions TpPassOptions;
int pass_fold_constants(TpModule *m, TpPassOptions *opt, TpDiag *d);
int pass_dce(TpModule *m, TpPassOptions *opt, TpDiag *d);
int pass_add_loss(TpModule *m, TpPassOptions *opt, TpDiag *d);
int pass_autodiff(TpModule *m, TpPassOptions *opt, TpDiag *d);

/* passes/fold.c: evaluates op `op` if every operand is CONST and its results are small,
 * turning the results into CONST values and marking the op dead (compact afterwards).
 * *folded says whether it did. Used by the importer while it builds the module. */
int tp_fold_op(TpModule *m, int op, bool *folded, TpDiag *d);

/* passes/retie_params.c and passes/raise_transformer.c (the raise helper's passes). */
int pass_retie_params(TpModule *m, TpPassOptions *opt, TpDiag *d);
int pass_raise_transformer(TpModule *m, TpPassOptions *opt, TpDiag *d);
/* raise-transformer with the RMSNorm, Rotary and gated-MLP chains left primitive */
int pass_raise_transformer_unfused(TpModule *m, TpPassOptions *opt, TpDiag *d);

/* Why the primitive attention whose scores MatMul `product` computes is not proven causal
 * (a module-owned string naming the op or the mask values that failed), or NULL when no
 * reason is known. (passes/causal_mask.c) */
const char *tp_attention_unproven(TpModule *m, int product);

/* passes/insert_token_dim.c: the token (sequence) axis, for slicing the sequence.
 * insert-token-dim names the token axis of every value TP_TOKEN_DIM (a reserved dimension
 * name: the IR prints it, e.g. f32[2, tokens=16, 32], and reads it back; any other use of
 * the name is cleared), starting from the token input's second dim and following every
 * op's positional axes, and refuses a module with a token-global op. */
#define TP_TOKEN_DIM "tokens"
typedef enum {
  TP_TOKEN_FREE,          /* no operand or result has a token axis: computed once */
  TP_TOKEN_POSITIONWISE,  /* result row t reads operand rows t only */
  TP_TOKEN_CAUSAL_PREFIX, /* causal attention: row t reads the keys and values of rows <= t */
  TP_TOKEN_REDUCING,      /* a loss: the sum over every row */
  TP_TOKEN_GLOBAL,        /* mixes rows otherwise: the sequence cannot be sliced */
} TpTokenClass;
int pass_insert_token_dim(TpModule *m, TpPassOptions *opt, TpDiag *d);
/* The token ids: the graph input of integer [batch, seq] type read by an Embedding or
 * Gather (else the first such input) that no loss reads as labels; -1 if none. */
int tp_token_input(const TpModule *m);
/* How op `op` of a marked module treats the token axis; for TP_TOKEN_GLOBAL, *why says
 * why (a module-owned string, "attention at node 'X' is not causal"). */
TpTokenClass tp_token_class(TpModule *m, int op, const char **why);

/* The positional axis relations of a forward op (its token-axes rule, ops/axes.h): pairs of axes
 * of its operands and results that index the same positions whatever the data (elementwise
 * ops align their broadcast axes, Transpose permutes, Reshape keeps an axis whose extent and
 * preceding elements are unchanged, ...), the axes along which it combines elements, each
 * with why ("normalises over"), and whether it is an op those rules do not describe. */
enum { TP_MAX_AXIS_LINKS = 1024, TP_MAX_AXIS_MIXES = 600 };
typedef struct {
  int v, a; /* value, axis */
} TpAxis;
typedef struct {
  TpAxis link[TP_MAX_AXIS_LINKS][2];
  int nlinks;
  TpAxis mix[TP_MAX_AXIS_MIXES];
  const char *mix_why[TP_MAX_AXIS_MIXES];
  int nmixes;
  bool unknown;
} TpOpAxes;
void tp_op_axes(const TpModule *m, int op, TpOpAxes *x);
/* The class of axis key i (value * TP_MAX_RANK + axis) in a union-find forest over axes
 * (parent[i] == i at a root), compressing the path on the way: how insert-token-dim and
 * rebatch group the axes tp_op_axes links. */
static inline int tp_axis_class(int *parent, int i) {
  while (parent[i] != i) i = parent[i] = parent[parent[i]];
  return i;
}

/* passes/rebatch.c: rebatch gives the forward module (before add-loss) opt->batch rows: the
 * batch axis of every value, followed from the token input's first dim, takes the new size,
 * and constants along it are cut to one row or repeated; see the file. */
int pass_rebatch(TpModule *m, TpPassOptions *opt, TpDiag *d);

/* passes/split_sequence.c: split-sequence cuts the marked forward module (after add-loss,
 * before autodiff) into opt->nslices per-slice units, recorded in m->nslices and m->slice_len;
 * see the file. */
int pass_split_sequence(TpModule *m, TpPassOptions *opt, TpDiag *d);

/* passes/assign_stages.c: assign-stages (after add-loss and split-sequence, before
 * autodiff) cuts the forward module's layers into opt->nstages pipeline stages, places every
 * op, and makes each value that crosses stages an explicit boundary copy (TP_ROLE_BOUNDARY)
 * on the receiving stage. A parameter that the first and the last stage both read gets a
 * tied copy (TpValue.tied) on the last stage, sharing its data, so that each stage has its
 * own partial gradient. autodiff sends the gradient of a boundary copy back as a boundary
 * copy on the sending stage; finish-stages (after autodiff) checks that boundary copies are
 * the only ops reading another stage's results. The cuts it made go back in
 * opt->staged_nstages and opt->staged_cuts. */
int pass_assign_stages(TpModule *m, TpPassOptions *opt, TpDiag *d);
/* --stage-cuts text "a,b,..", the first layers of stages 1, 2, .. of a model of nlayers
 * layers -> *nstages and a malloc'd *first[0..*nstages-1] (first[0] = 0); an error if the
 * cuts are not increasing layer numbers in [1, nlayers-1] or, with *nstages > 1 on entry,
 * do not make that many stages. */
int tp_stage_cuts_parse(const char *text, int nlayers, int *nstages, int **first, TpDiag *d);
int pass_finish_stages(TpModule *m, TpPassOptions *opt, TpDiag *d);
/* The values that start a layer of the residual stream, as assign-stages finds the layers:
 * each chain's first skip operand, and the skip operand of every residual Add whose branch
 * holds an Attention (of every residual Add when the model has none). Reads the forward
 * ops only, so it works after assign-stages (each stage's chain starts at what the stage
 * receives) and after autodiff. Sets input[v] (nvalues entries); returns how many. */
int tp_layer_inputs(TpModule *m, bool *input);

/* passes/recompute.c: recompute (after autodiff and finish-stages, before the memory plan)
 * makes the backward read recomputed copies of the forward activations it needs, instead of
 * the forward's own, all but the checkpoints opt->recompute keeps; see the file. */
typedef enum {
  TP_RECOMPUTE_NONE,      /* keep every activation the backward reads */
  TP_RECOMPUTE_SELECTIVE, /* keep the layer inputs and the products; recompute the rest */
  TP_RECOMPUTE_FULL,      /* keep the layer inputs; recompute each layer in its backward */
} TpRecompute;
int pass_recompute(TpModule *m, TpPassOptions *opt, TpDiag *d);
/* "none", "selective", "full"; and back (false for another name). */
const char *tp_recompute_name(TpRecompute r);
bool tp_recompute_parse(const char *name, TpRecompute *r);
/* passes/store_half.c: store-bf16 and store-fp16 store a trained module's parameters,
 * activations and gradients in 16 bits, every op still computing in f32 (casts around it). */
int pass_store_bf16(TpModule *m, TpPassOptions *opt, TpDiag *d);
int pass_store_fp16(TpModule *m, TpPassOptions *opt, TpDiag *d);
/* A Cast of value x into dtype `to`, named "<x>.<suffix>" (made unique), with op at's
 * origin, stage, slice and phase; appended: the caller orders it. Returns the op. */
int tp_add_cast(TpModule *m, int x, TpDType to, int at, const char *suffix);
/* passes/split_backward.c: split-backward (last, for schedules that split each backward unit
 * into its input and weight parts) marks the backward ops that only make parameter gradients
 * `@weight`, splitting an op that makes both (LinearBackward's dX from its dW, dB); see the
 * file. */
int pass_split_backward(TpModule *m, TpPassOptions *opt, TpDiag *d);

/* passes/shard_tensor.c: shard-tensor splits the raised forward module (before add-loss)
 * over opt->tensor ranks the Megatron way (column-parallel, then row-parallel products,
 * collectives between), recorded in m->tensor; see the file. */
int pass_shard_tensor(TpModule *m, TpPassOptions *opt, TpDiag *d);
/* How many vocabulary ranges the logits value v holds one of: shard-tensor's vocabulary-
 * parallel LM head gives each rank [..., V / N] logits; 1 for any other value. */
int tp_vocab_parts(const TpModule *m, int v);
/* The padding of that split (TpShard.pad: classes past the true vocabulary on the last
 * rank, masked out of the loss); 0 for any other value. */
int tp_vocab_pad(const TpModule *m, int v);
/* passes/add_loss.c: the graph output add-loss would train as the logits (the one named
 * `name`, its --logits, when not NULL); -1 when it would not (a loss already, the model's
 * own loss, no or several candidates). */
int tp_loss_logits(TpModule *m, const char *name);

/* passes/pipeline.c: the pass manager. */
typedef int (*TpPassFn)(TpModule *m, TpPassOptions *opt, TpDiag *d);
typedef struct {
  const char *name;
  TpPassFn run;
  const char *summary;
} TpPassInfo;
/* Every registered pass; NULL-terminated (name == NULL). */
extern const TpPassInfo tp_pass_registry[];
/* The default pipeline tokpipec runs, in order; NULL-terminated. */
extern const char *const tp_default_pipeline[];
const TpPassInfo *tp_find_pass(const char *name);

/* What the tool asks of the passes (its flags), how the pass manager runs them, and what the
 * passes report back. Zeroed: the whole default pipeline, training, one slice, one stage,
 * no tensor split, no dumps. */
struct TpPassOptions {
  /* Which passes tp_pipeline_passes takes from the default pipeline. */
  bool forward_only; /* stop before the loss: no add-loss, no autodiff (tokpipec --forward-only) */
  bool no_retie;     /* keep an exporter's copies of a tied weight apart: no retie-params */
  bool no_fuse;      /* raise-transformer-unfused in place of raise-transformer (--no-fuse) */
  bool sliced;       /* the token passes: --slices asks for more than one slice (or auto) */
  bool params_only;  /* only the passes that decide what trains, up to re-tying (--emit=params) */
  /* add-loss: the graph output it takes as the logits (NULL: the one float [B, T, V] output). */
  const char *logits;
  /* autodiff: a POSIX extended regex of PARAM names left frozen, matched anywhere in the name
   * (NULL: every float PARAM is trainable). */
  const char *freeze;
  /* rebatch: the rows the token input should have, when the module was made for another
   * batch (a fixed-shape export); 0: keep the module's batch. */
  int64_t batch;
  /* split-sequence: the lengths of the nslices slices each sequence is cut into, first to
   * last, summing to the token axis's length (nslices <= 1: the sequence stays whole). */
  int nslices;
  const int64_t *slice_len;
  /* assign-stages: how many stages to cut the layers into (<= 1: one), and the first layer
   * of stages 1.. as "a,b,..." (NULL: balance the estimated compute). */
  int nstages;
  const char *stage_cuts;
  /* assign-stages, for its messages: the virtual stages per pipeline rank of an interleaved
   * schedule (nstages is then ranks x chunks); <= 1: not interleaved. */
  int chunks;
  /* shard-tensor: the ranks of the tensor group that split each stage's ops (<= 1: none). */
  int tensor;
  /* shard-tensor: pad the LM head's vocabulary so that each rank's range is a multiple of
   * this many classes (0, 1: only what --tensor needs; any --tensor, 1 included). */
  int vocab_multiple;
  /* recompute: what the backward recomputes (tokpipec --recompute; NONE: no recompute pass). */
  TpRecompute recompute;
  /* store-bf16 or store-fp16 (TP_BF16, TP_F16) ends the pipeline of a trained module
   * (tokpipec --precision); TP_UNDEF: values stay f32. */
  TpDType storage;
  /* split-backward ends the pipeline (after store-bf16/fp16): the schedule runs each backward
   * unit as backward-input and backward-weight (tokpipec --schedule zb). */
  bool split_backward;
  /* The pass manager: IR dumps and verification. */
  const char *print_before; /* comma-separated pass names, or NULL */
  const char *print_after;  /* comma-separated pass names, or NULL */
  bool print_after_all;
  bool verify_each; /* run tp_verify after every pass (tests do) */
  FILE *dump;       /* where IR dumps go (stderr by default) */
  /* Reported back by assign-stages: the stages it cut (0 when it cut none) and the first
   * layer of stages 1.. as "a,b,..", module-owned. */
  int staged_nstages;
  const char *staged_cuts;
};

/* The passes of the default pipeline that o asks for, in order, into names[TP_MAX_PIPELINE]
 * (NULL-terminated); returns how many. */
enum { TP_MAX_PIPELINE = 32 };
int tp_pipeline_passes(const TpPassOptions *o, const char **names);

/* Runs the named passes in order (o NULL: zeroed options). Unknown names are a usage error
 * (TP_ERR_USAGE). */
int tp_run_passes(TpModule *m, const char *const *names, int n, TpPassOptions *o, TpDiag *d);

#endif
