/* What a torch.export-based ("dynamo") export records about its initializers, and the
 * parameter rule built on it.
 *
 * The exporter lifts parameters, buffers and constants into initializers and then folds
 * constants into more initializers (the float causal mask, rotary tables, scales, Pow
 * exponents, transposed Linear weights). Only PyTorch's parameters may train. ONNX IR 10
 * carries what tells them apart in metadata_props, which the IR-8 onnx.proto we compile does
 * not know; protobuf-c keeps such fields as unknown fields, read here (or as the field it
 * is, with a newer onnx.proto):
 *   value_info: pkg.torch.export.graph_signature.InputSpec.kind  PARAMETER|BUFFER|CONSTANT_TENSOR
 *               pkg.onnxscript.optimizer.folded_from              "['m.lm_head.weight']"
 *               pkg.torch.onnx.original_node_name                  "p_m_lm_head_weight"
 *   node:       pkg.torch.onnx.fx_node  the FX call, "... = call_function[...](args = (%a, %p_w), ...)"
 *               pkg.torch.onnx.name_scopes  "['', 'm', 'm.model', ...]"
 * torch.export names a lifted tensor's placeholder p_ (parameter), b_ (buffer) or c_
 * (constant) followed by its dotted name with '.' replaced by '_'.
 *
 * The rule, where the export records kinds: an initializer of kind PARAMETER trains; one
 * folded from exactly one tensor that is a parameter (a transposed Linear weight, Gemma's
 * 1 + w) trains as that parameter's stand-in; everything else (buffers, constants, folds of
 * buffers and arithmetic) is a CONST. Without the metadata every float initializer trains,
 * as before (--freeze). The exporter also merges initializers with equal bytes (a fresh
 * model's all-ones norm weights or all-zero biases become one tensor); where the nodes'
 * FX calls show several parameters behind one trainable initializer, each gets its own
 * PARAM over the same bytes (an alias, as for an Identity-merged TorchScript export). */
#include "import.h"

#include <stdlib.h>
#include <string.h>

#define KIND_KEY "pkg.torch.export.graph_signature.InputSpec.kind"
#define FOLDED_KEY "pkg.onnxscript.optimizer.folded_from"
#define ORIGINAL_KEY "pkg.torch.onnx.original_node_name"
#define FX_KEY "pkg.torch.onnx.fx_node"
#define SCOPES_KEY "pkg.torch.onnx.name_scopes"

/* metadata_props field numbers (ONNX IR 10) */
enum { VALUE_INFO_METADATA = 4, NODE_METADATA = 9 };

static const char *module_strndup(TpModule *m, const uint8_t *s, size_t n) {
  char *copy = tp_alloc(m, n + 1);
  memcpy(copy, s, n);
  return copy;
}

const char *onnx_metadata(Importer *I, const ProtobufCMessage *msg, bool node, const char *key) {
  /* an onnx.proto from ONNX 1.16 on (-DTOKPIPE_ONNX_PROTO) knows the field */
  const ProtobufCFieldDescriptor *known = protobuf_c_message_descriptor_get_field_by_name(msg->descriptor,
                                                                                          "metadata_props");
  if (known && known->label == PROTOBUF_C_LABEL_REPEATED && known->type == PROTOBUF_C_TYPE_MESSAGE) {
    size_t n = *(const size_t *)((const char *)msg + known->quantifier_offset);
    Onnx__StringStringEntryProto *const *entries = *(
        Onnx__StringStringEntryProto *const *const *)((const char *)msg + known->offset);
    for (size_t i = 0; i < n; i++)
      if (entries[i]->key && strcmp(entries[i]->key, key) == 0)
        return tp_strdup(I->m, entries[i]->value ? entries[i]->value : "");
    return NULL;
  }
  unsigned field = node ? NODE_METADATA : VALUE_INFO_METADATA;
  size_t want = strlen(key);
  for (unsigned i = 0; i < msg->n_unknown_fields; i++) {
    const ProtobufCMessageUnknownField *f = &msg->unknown_fields[i];
    if (f->tag != field || f->wire_type != PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED) continue;
    /* protobuf-c keeps a length-delimited unknown field with its length prefix */
    const uint8_t *p = f->data, *end = f->data + f->len, *payload, *k = NULL, *v = NULL;
    uint64_t number, len, klen = 0, vlen = 0;
    if (!wire_varint(&p, end, &len) || len != (uint64_t)(end - p)) continue;
    while (p < end && wire_field(&p, end, &number, &payload, &len)) {
      if (number == 1 && payload) k = payload, klen = len;
      if (number == 2 && payload) v = payload, vlen = len;
    }
    if (p == end && k && klen == want && memcmp(k, key, want) == 0) return v ? module_strndup(I->m, v, vlen) : "";
  }
  return NULL;
}

/* ---- names ---- */

/* "p_" + dotted name with '.' as '_': torch.export's placeholder for a parameter. */
static const char *placeholder(Importer *I, char prefix, const char *dotted) {
  char *s = (char *)tp_strfmt(I->m, "%c_%s", prefix, dotted);
  for (char *c = s; *c; c++)
    if (*c == '.') *c = '_';
  return s;
}

static bool is_ident_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* The quoted entries of a Python list repr "['a', 'b']" into out[], at most max; count. */
static int list_entries(Importer *I, const char *list, const char **out, int max) {
  int n = 0;
  for (const char *p = list; p && (p = strchr(p, '\'')) && n < max;) {
    const char *end = strchr(p + 1, '\'');
    if (!end) break;
    out[n++] = module_strndup(I->m, (const uint8_t *)p + 1, (size_t)(end - p - 1));
    p = end + 1;
  }
  return n;
}

/* A module path (a parameter's or a buffer's dotted name), not an FX node or exporter name. */
static bool is_dotted(const char *s) { return strchr(s, '.') != NULL; }

/* ---- the per-initializer rule ---- */

/* The value_info (or graph input) of a name, through the map record_names made. */
static const Onnx__ValueInfoProto *find_info(Importer *I, const Onnx__GraphProto *g, const char *name) {
  int i = map_get(&I->infos, name);
  return i < 0 ? NULL : i < (int)g->n_value_info ? g->value_info[i] : g->input[i - (int)g->n_value_info];
}

static const char *info_metadata(Importer *I, const Onnx__GraphProto *g, const char *name, const char *key) {
  const Onnx__ValueInfoProto *vi = find_info(I, g, name);
  return vi ? onnx_metadata(I, &vi->base, false, key) : NULL;
}

/* Is the dotted name a parameter of the exported module? Its value_info's kind where it has
 * one, else a placeholder an FX call names (p_ a parameter, b_/c_ not), else undecided. */
static int parameter_by_name(Importer *I, const Onnx__GraphProto *g, const char *dotted) {
  const char *kind = info_metadata(I, g, dotted, KIND_KEY);
  if (kind) return strcmp(kind, "PARAMETER") == 0;
  if (map_get(&I->placeholders, placeholder(I, 'p', dotted)) >= 0) return 1;
  if (map_get(&I->placeholders, placeholder(I, 'b', dotted)) >= 0 ||
      map_get(&I->placeholders, placeholder(I, 'c', dotted)) >= 0)
    return 0;
  return -1;
}

/* I->infos: value_info and graph input names; I->fx_calls: each node's FX call (or NULL);
 * I->placeholders: every %name an FX call names (a lifted tensor may be named by any
 * node). Made once: a large export has tens of thousands of each. */
static void record_names(Importer *I, const Onnx__GraphProto *g) {
  for (size_t i = 0; i < g->n_value_info; i++)
    if (g->value_info[i]->name) map_put(&I->infos, g->value_info[i]->name, (int)i);
  for (size_t i = 0; i < g->n_input; i++)
    if (g->input[i]->name) map_put(&I->infos, g->input[i]->name, (int)(g->n_value_info + i));
  for (size_t i = 0; i < g->n_node; i++) {
    const char *call = I->fx_calls[i] = onnx_metadata(I, &g->node[i]->base, true, FX_KEY);
    for (const char *p = call; p && (p = strchr(p, '%'));) {
      const char *start = ++p;
      while (is_ident_char(*p)) p++;
      if (p > start) map_put(&I->placeholders, module_strndup(I->m, (const uint8_t *)start, (size_t)(p - start)), 1);
    }
  }
}

bool export_records_kinds(Importer *I, const Onnx__GraphProto *g) {
  for (size_t i = 0; i < g->n_value_info; i++)
    if (onnx_metadata(I, &g->value_info[i]->base, false, KIND_KEY)) return true;
  for (size_t i = 0; i < g->n_input; i++)
    if (onnx_metadata(I, &g->input[i]->base, false, KIND_KEY)) return true;
  return false;
}

int classify_initializers(Importer *I, const Onnx__GraphProto *g, InitClass *out) {
  bool recorded = export_records_kinds(I, g);
  if (recorded) {
    I->fx_calls = tp_alloc(I->m, (g->n_node + 1) * sizeof *I->fx_calls);
    record_names(I, g);
  }
  for (size_t i = 0; i < g->n_initializer; i++) {
    const Onnx__TensorProto *t = g->initializer[i];
    InitClass *c = &out[i];
    c->source = NULL;
    if (!tp_dtype_is_float(tp_onnx_dtype(t->data_type))) {
      *c = (InitClass){TP_VAL_CONST, "not floating-point", NULL, false};
      continue;
    }
    if (!recorded) {
      *c = (InitClass){TP_VAL_PARAM, "a float initializer (the export records no parameters: all train)", NULL,
                       false};
      continue;
    }
    const char *kind = info_metadata(I, g, t->name, KIND_KEY);
    const char *folded = info_metadata(I, g, t->name, FOLDED_KEY);
    if (kind) {
      bool param = strcmp(kind, "PARAMETER") == 0;
      *c = (InitClass){param ? TP_VAL_PARAM : TP_VAL_CONST,
                       tp_strfmt(I->m, "%s (export metadata)",
                                 param                         ? "a parameter"
                                 : strcmp(kind, "BUFFER") == 0 ? "a buffer"
                                                               : "a constant tensor"),
                       NULL, false};
      continue;
    }
    if (!folded) {
      *c = (InitClass){TP_VAL_CONST, "a constant the exporter made (export metadata)", NULL, false};
      continue;
    }
    const char *from[64], *params[64];
    int n = list_entries(I, folded, from, 64), nparams = 0, ntensors = 0;
    const char *tensor = NULL;
    for (int k = 0; k < n; k++) {
      if (!is_dotted(from[k])) continue;
      ntensors++, tensor = from[k];
      int p = parameter_by_name(I, g, from[k]);
      /* undecided (no node names its placeholder any more): a tensor folded with literals
       * only (val_N: a transpose, Gemma's 1 + w) is a parameter's stand-in, and so is one
       * named like a module's parameter (.weight, .bias: GPT-2's position rows for T,
       * folded from wpe and arange); rotary tables fold a buffer (inv_freq) */
      if (p < 0) {
        p = 1;
        for (int j = 0; j < n; j++)
          if (j != k && strncmp(from[j], "val_", 4) != 0) p = 0;
        const char *last = strrchr(from[k], '.') + 1;
        if (!p) p = strcmp(last, "weight") == 0 || strcmp(last, "bias") == 0;
      }
      if (p) params[nparams++] = from[k];
    }
    if (nparams > 1)
      return tp_error(I->d,
                      "initializer '%s' was folded by the exporter from several parameters ('%s' and "
                      "'%s'): it cannot train as one of them; export with torch.onnx.export(..., optimize=False)",
                      t->name, params[0], params[1]);
    if (nparams == 1)
      *c = (InitClass){TP_VAL_PARAM, tp_strfmt(I->m, "folded from the parameter %s (export metadata)", params[0]),
                       params[0], n == 1};
    else if (ntensors)
      *c = (InitClass){TP_VAL_CONST,
                       tp_strfmt(I->m,
                                 "folded by the exporter from %s and computation, no "
                                 "parameter (export metadata)",
                                 tensor),
                       NULL, false};
    else *c = (InitClass){TP_VAL_CONST, "folded by the exporter from constants (export metadata)", NULL, false};
  }
  return TP_OK;
}

/* ---- initializers the exporter merged ---- */

int fx_call_args(Importer *I, const char *call, const char **out, int max) {
  const char *p = call ? strstr(call, "args = (") : NULL;
  if (!p) return -1;
  p += strlen("args = (");
  int n = 0, depth = 0;
  const char *start = p;
  for (; *p; p++) {
    if (*p == '(' || *p == '[' || *p == '{') depth++;
    else if ((*p == ')' || *p == ']' || *p == '}') && depth > 0) depth--;
    else if ((*p == ',' || *p == ')') && depth == 0) {
      while (*start == ' ') start++;
      if (p > start) {
        if (n == max) return -1;
        out[n++] = module_strndup(I->m, (const uint8_t *)start, (size_t)(p - start));
      }
      if (*p == ')') return n;
      start = p + 1;
    }
  }
  return -1;
}

/* The dotted parameter name behind placeholder p_<mangled> at a node, from its module
 * scopes (the longest scope whose mangled form starts it); the placeholder when none. */
static const char *parameter_name(Importer *I, const Onnx__NodeProto *n, const char *fx_name) {
  if (strncmp(fx_name, "p_", 2) != 0) return fx_name;
  const char *scopes[64], *best = NULL;
  int count = list_entries(I, onnx_metadata(I, &n->base, true, SCOPES_KEY), scopes, 64);
  for (int i = 0; i < count; i++) {
    const char *mangled = placeholder(I, 'p', scopes[i]);
    size_t len = strlen(mangled);
    if (*scopes[i] && strncmp(fx_name, mangled, len) == 0 && fx_name[len] == '_' &&
        (!best || strlen(scopes[i]) > strlen(best)))
      best = scopes[i];
  }
  if (!best) return fx_name;
  return tp_strfmt(I->m, "%s.%s", best, fx_name + strlen(placeholder(I, 'p', best)) + 1);
}

typedef struct {
  int init;       /* initializer index */
  const char *fx; /* the FX value the node's operand stands for */
  int node, operand;
} Use;

/* The placeholder of the parameter initializer i stands for, or NULL when unknown. */
static const char *own_placeholder(Importer *I, const Onnx__GraphProto *g, const InitClass *cls, int i) {
  const char *mine = info_metadata(I, g, g->initializer[i]->name, ORIGINAL_KEY);
  return mine ? mine : cls[i].source ? placeholder(I, 'p', cls[i].source) : NULL;
}

static size_t common_suffix(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b), n = 0;
  while (n < la && n < lb && a[la - 1 - n] == b[lb - 1 - n]) n++;
  return n;
}

/* Pairs node n's trainable initializer operands with the FX values its call names: with
 * the call's parameter placeholders (%p_...) in order where there are as many (a
 * LayerNormalization's scale and bias among its call's shape and epsilon); where there
 * are more (a Linear's MatMul and Add both carry linear(x, %p_w, %p_b)), each operand takes
 * its own placeholder, or the free one ending most like it (_bias, not _weight); else by
 * position where the call has one argument per operand. */
static int pair_operands(Importer *I, const Onnx__GraphProto *g, size_t node, const NameMap *index,
                         const InitClass *cls, Use *out) {
  const char *args[TP_MAX_CONST_INTS], *placeholders[TP_MAX_CONST_INTS], *own[TP_MAX_CONST_INTS];
  const Onnx__NodeProto *n = g->node[node];
  int nargs = fx_call_args(I, I->fx_calls ? I->fx_calls[node] : NULL, args, TP_MAX_CONST_INTS);
  int operands[TP_MAX_CONST_INTS], nops = 0, nplace = 0;
  bool taken[TP_MAX_CONST_INTS] = {false};
  for (size_t k = 0; k < n->n_input && k < TP_MAX_CONST_INTS; k++) {
    int init = *n->input[k] ? map_get(index, n->input[k]) : -1;
    if (init >= 0 && cls[init].kind == TP_VAL_PARAM) operands[nops++] = (int)k;
  }
  for (int a = 0; a < nargs; a++)
    if (strncmp(args[a], "%p_", 3) == 0) placeholders[nplace++] = args[a] + 1;
  /* placeholders that are some operand's own are taken by it */
  for (int j = 0; j < nops; j++) {
    own[j] = own_placeholder(I, g, cls, map_get(index, n->input[operands[j]]));
    for (int a = 0; a < nplace; a++)
      if (own[j] && strcmp(placeholders[a], own[j]) == 0) taken[a] = true;
  }
  int used = 0;
  for (int j = 0; j < nops; j++) {
    int k = operands[j], best = -1;
    const char *fx = NULL;
    if (nplace == nops) {
      fx = placeholders[j];
    } else if (nplace > nops) {
      for (int a = 0; a < nplace && !fx; a++)
        if (own[j] && strcmp(placeholders[a], own[j]) == 0) fx = placeholders[a];
      for (int a = 0; a < nplace && !fx && own[j]; a++)
        if (!taken[a] &&
            (best < 0 || common_suffix(placeholders[a], own[j]) > common_suffix(placeholders[best], own[j])))
          best = a;
      if (!fx && best >= 0) fx = placeholders[best], taken[best] = true;
    } else if (nargs == (int)n->n_input && args[k][0] == '%') {
      fx = args[k] + 1;
    }
    if (fx) out[used++] = (Use){map_get(index, n->input[k]), fx, -1, k};
  }
  return used;
}

int split_merged_params(Importer *I, const Onnx__GraphProto *g, const InitClass *cls, const int *values) {
  Use *uses = malloc((g->n_node * TP_MAX_CONST_INTS + 1) * sizeof *uses);
  const char **own = calloc(g->n_initializer + 1, sizeof *own);
  TP_ASSERT(uses && own);
  int nuses = 0;
  NameMap index = {0}; /* initializer name -> index */
  for (size_t i = 0; i < g->n_initializer; i++) map_put(&index, g->initializer[i]->name, (int)i);
  for (size_t i = 0; i < g->n_node; i++) {
    int n = pair_operands(I, g, i, &index, cls, uses + nuses);
    for (int u = nuses; u < nuses + n; u++) uses[u].node = (int)i;
    nuses += n;
  }
  map_free(&index);
  /* the FX value an initializer stands for keeps it: its own placeholder, or that of the
   * parameter it was folded from, where a node names it; else its first use's */
  for (int u = 0; u < nuses; u++) {
    const char *mine = own_placeholder(I, g, cls, uses[u].init);
    if (mine && strcmp(uses[u].fx, mine) == 0) own[uses[u].init] = uses[u].fx;
  }
  for (int u = 0; u < nuses; u++)
    if (!own[uses[u].init]) own[uses[u].init] = uses[u].fx;
  for (int u = 0; u < nuses; u++) {
    const Use *use = &uses[u];
    if (strcmp(use->fx, own[use->init]) == 0) continue;
    int v = -1; /* an earlier use of the same FX value made its parameter already */
    for (int w = 0; w < u && v < 0; w++)
      if (uses[w].init == use->init && strcmp(uses[w].fx, use->fx) == 0)
        v = override_of(I, uses[w].node, uses[w].operand);
    if (v < 0) {
      const TpValue src = I->m->values[values[use->init]];
      const char *name = tp_unique_name(I->m, parameter_name(I, g->node[use->node], use->fx));
      v = tp_add_data_value(I->m, name, TP_VAL_PARAM, src.type, src.blob, src.offset,
                            (TpOrigin){src.name, "Identity"});
      I->m->values[v].why = tp_strfmt(I->m,
                                      "a parameter the exporter merged into '%s' (equal bytes), trained "
                                      "apart (export metadata)",
                                      src.name);
    }
    add_override(I, use->node, use->operand, v);
  }
  free(own);
  free(uses);
  return TP_OK;
}
