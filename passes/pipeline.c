/* The pass manager, the one list of passes, and the pipeline built from the options. */
#include "../ir/ir.h"

#include <string.h>

static int pass_verify(TpModule *m, TpPassOptions *opt, TpDiag *d) {
  (void)opt;
  return tp_verify(m, d);
}

const TpPassInfo tp_pass_registry[] = {
    {"fold-constants", pass_fold_constants, "evaluate ops whose operands are all constants"},
    {"dce", pass_dce, "remove ops, parameters and constants nothing uses"},
    {"add-loss", pass_add_loss, "append the training loss: mean cross-entropy of the logits, or the model's own"},
    {"autodiff", pass_autodiff, "append the backward ops and record the gradient of every trainable parameter"},
    {"verify", pass_verify, "check the IR's invariants"},
    {"rebatch", pass_rebatch,
     "give the token input --batch rows: follow the batch axis, cut or repeat constants along it"},
    {"retie-params", pass_retie_params, "re-tie parameters that are exact copies or transposes of another"},
    {"raise-transformer", pass_raise_transformer,
     "raise primitive chains to Embedding, Linear, LayerNorm, Gelu, Attention, RMSNorm, Rotary, gated MLPs"},
    {"raise-transformer-unfused", pass_raise_transformer_unfused,
     "raise-transformer leaving the RMSNorm, rotary and gated-MLP chains primitive"},
    {"insert-token-dim", pass_insert_token_dim, "mark the token axis of every value; refuse ops that mix tokens"},
    {"split-sequence", pass_split_sequence, "cut the forward into per-slice units along the token axis (--slices)"},
    {"assign-stages", pass_assign_stages,
     "cut the layers into pipeline stages (--stages, --stage-cuts); boundary copies"},
    {"shard-tensor", pass_shard_tensor,
     "split each stage's products over --tensor ranks (Megatron); collectives between"},
    {"finish-stages", pass_finish_stages,
     "put the gradients of boundary copies on the receiving stage; check stage crossings"},
    {"recompute", pass_recompute,
     "make the backward recompute the activations it reads, but the checkpoints (--recompute)"},
    {"store-bf16", pass_store_bf16, "store parameters, activations and gradients in bf16, computing in f32"},
    {"store-fp16", pass_store_fp16, "store parameters, activations and gradients in fp16, computing in f32"},
    {"split-backward", pass_split_backward,
     "mark the backward ops that only make parameter gradients @weight (zero-bubble schedules)"},
    {NULL, NULL, NULL},
};

/* The order tokpipec runs them in: clean up the import, undo the exporter's untying of
 * weights (tokpipec --no-retie skips it; rebatch first gives a fixed-batch export the rows
 * --batch asks for), raise the transformer, then make it train. The
 * token passes mark the sequence axis on the raised forward and cut the forward (with its
 * per-slice loss terms) into slices before autodiff, which then emits the slices' backward
 * in reverse; tokpipec runs them only when --slices asks for more than one slice.
 * shard-tensor (tokpipec --tensor N > 1) splits the raised forward over the tensor ranks
 * before the loss is added, so autodiff differentiates its collectives too; with
 * TpPassOptions.vocab_multiple (--target cuda) it also runs at one rank, to pad the head.
 * assign-stages then cuts the layers into pipeline stages (nothing to do for one stage)
 * and finish-stages places the gradients that cross stages once autodiff made them.
 * recompute (tokpipec --recompute selective|full) then has the backward recompute the
 * activations it reads from the finished forward and backward. --precision bf16 or fp16
 * appends store-bf16 or store-fp16 (TpPassOptions.storage), and a schedule that splits each
 * backward (--schedule zb) split-backward, last. */
const char *const tp_default_pipeline[] = {"fold-constants",
                                           "dce",
                                           "rebatch",
                                           "retie-params",
                                           "raise-transformer",
                                           "insert-token-dim",
                                           "shard-tensor",
                                           "add-loss",
                                           "split-sequence",
                                           "assign-stages",
                                           "autodiff",
                                           "finish-stages",
                                           "recompute",
                                           "dce",
                                           NULL};

int tp_pipeline_passes(const TpPassOptions *o, const char **names) {
  int n = 0;
  for (int i = 0; tp_default_pipeline[i]; i++) {
    const char *p = tp_default_pipeline[i];
    TP_ASSERT(n + 3 <= TP_MAX_PIPELINE);
    bool raise = strcmp(p, "raise-transformer") == 0;
    if (raise && o->params_only) break; /* what trains is decided by re-tying */
    if (strcmp(p, "retie-params") == 0 && o->no_retie) continue;
    if (raise && o->no_fuse) p = "raise-transformer-unfused";
    if (o->forward_only && (strcmp(p, "add-loss") == 0 || strcmp(p, "autodiff") == 0)) continue;
    if (!o->sliced && (strcmp(p, "insert-token-dim") == 0 || strcmp(p, "split-sequence") == 0)) continue;
    if (o->tensor <= 1 && (o->vocab_multiple <= 1 || o->forward_only) && strcmp(p, "shard-tensor") == 0) continue;
    if ((o->forward_only || o->recompute == TP_RECOMPUTE_NONE) && strcmp(p, "recompute") == 0) continue;
    /* raise-transformer leaves the products it replaced unread until dce, and shard-tensor
     * refuses to split a weight that two products read */
    if (strcmp(p, "shard-tensor") == 0) names[n++] = "dce";
    names[n++] = p;
  }
  /* mixed precision: last, on the module the memory plan sees */
  if (o->storage != TP_UNDEF && !o->forward_only && !o->params_only)
    names[n++] = o->storage == TP_F16 ? "store-fp16" : "store-bf16";
  /* the input and weight halves of every backward unit, on the module the memory plan sees */
  if (o->split_backward && !o->forward_only && !o->params_only) names[n++] = "split-backward";
  names[n] = NULL;
  return n;
}

const TpPassInfo *tp_find_pass(const char *name) {
  for (const TpPassInfo *p = tp_pass_registry; p->name; p++)
    if (strcmp(p->name, name) == 0) return p;
  return NULL;
}

/* Is `name` one of the comma-separated names in `list` ("all" matches every pass)? */
static bool in_list(const char *list, const char *name) {
  size_t n = strlen(name);
  for (const char *p = list; p && *p;) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    if ((len == n && strncmp(p, name, n) == 0) || (len == 3 && strncmp(p, "all", 3) == 0)) return true;
    p = end ? end + 1 : NULL;
  }
  return false;
}

static int unknown_pass(TpDiag *d, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = tp_verror(d, TP_ERR_USAGE, NULL, fmt, ap);
  va_end(ap);
  return rc;
}

static void dump(const TpModule *m, FILE *out, const char *when, const char *pass) {
  fprintf(out, "*** IR Dump %s %s ***\n", when, pass);
  tp_print_module(m, out);
  fflush(out);
}

int tp_run_passes(TpModule *m, const char *const *names, int n, TpPassOptions *o, TpDiag *d) {
  TpPassOptions none = {0};
  if (!o) o = &none;
  FILE *out = o->dump ? o->dump : stderr;
  for (int i = 0; i < n; i++)
    if (!tp_find_pass(names[i])) return unknown_pass(d, "unknown pass '%s'", names[i]);
  for (int i = 0; i < n; i++) {
    const TpPassInfo *p = tp_find_pass(names[i]);
    if (in_list(o->print_before, p->name)) dump(m, out, "Before", p->name);
    int rc = p->run(m, o, d);
    if (rc != TP_OK) return rc;
    if (o->print_after_all || in_list(o->print_after, p->name)) dump(m, out, "After", p->name);
    if (o->verify_each && tp_verify(m, d) != TP_OK) return tp_internal(d, "pass '%s' produced invalid IR", p->name);
  }
  return TP_OK;
}
