/* The TpPlan tables of plan.c (see emit.h; the ABI is runtime/train/plan.h): what the trainer
 * runtime reads of a plan besides its functions. The parameters with their ONNX and source
 * names and the stages holding them, re-tied initializers, the slice lengths, arena and
 * transient region sizes, per stage its unit functions, boundary buffers (arena offset,
 * bytes), tensor-group collective counts and instruction list, the profiling probes, and
 * main. */
#include "emit.h"

#include <string.h>

#include "lower.h"

/* "text" with C escapes. */
static void put_string(FILE *out, const char *s) {
  fputc('"', out);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(out, "\\%c", c);
    else if (c < 32 || c >= 127) fprintf(out, "\\%03o", c);
    else fputc(c, out);
  }
  fputc('"', out);
}

/* The name of stage s's function of (phase, slice): stageS_forward in unsliced plans,
 * else stageS_forward_sliceI; a probe's with its prefix (probeP_stageS_...). */
void tp_unit_name(const char *prefix, int nslices, int s, const char *phase, int slice, char *buf, size_t n) {
  if (nslices == 1) snprintf(buf, n, "%.16sstage%d_%s", prefix, s, phase);
  else snprintf(buf, n, "%.16sstage%d_%s_slice%d", prefix, s, phase, slice);
}

const char *tp_unit_phase(bool backward, bool weight, bool split) {
  return !backward ? "forward" : !split ? "backward" : weight ? "backward_weight" : "backward_input";
}

/* The vocabulary: the classes of the loss (the whole vocabulary's where it is split over
 * the tensor ranks), else of the first output [B, T, V]. */
static int64_t vocab_size(const TpModule *m) {
  for (int op = 0; op < m->nops; op++) {
    TpOpKind k = m->ops[op].kind;
    if (k == TP_OP_CrossEntropy || k == TP_OP_SoftmaxCrossEntropyLoss || k == TP_OP_NegativeLogLikelihoodLoss)
      return tp_loss_classes(m, op);
  }
  if (m->noutputs && m->values[m->outputs[0]].type.rank == 3) return m->values[m->outputs[0]].type.dims[2];
  return 0;
}

static const char *const insn_enum[TP_INSN_COUNT] = {"TP_PLAN_FORWARD",        "TP_PLAN_BACKWARD",
                                                     "TP_PLAN_SEND_ACT",       "TP_PLAN_RECV_ACT",
                                                     "TP_PLAN_SEND_GRAD",      "TP_PLAN_RECV_GRAD",
                                                     "TP_PLAN_ALLREDUCE_TIED", "TP_PLAN_ALLREDUCE",
                                                     "TP_PLAN_OPTIMIZER_STEP", "TP_PLAN_BACKWARD_INPUT",
                                                     "TP_PLAN_BACKWARD_WEIGHT"};
static const char *const plan_schedule[] = {"TP_PLAN_GPIPE", "TP_PLAN_1F1B", "TP_PLAN_ZB", "TP_PLAN_INTERLEAVED"};
static const char *const message_names[TP_MSG_COUNT] = {"recv_act", "send_act", "recv_grad", "send_grad"};

/* Does stage s have the neighbour that message kind k goes to or comes from? */
static bool has_peer(const TpMemoryPlan *p, int s, int k) {
  return k == TP_MSG_RECV_ACT || k == TP_MSG_SEND_GRAD ? s > 0 : s + 1 < p->nstages;
}

/* The io->tensor_allreduce calls of stage s's unit (phase, slice): its AllReduce ops. */
static int unit_reduces(const TpModule *m, const TpMemoryPlan *p, int s, bool backward, int slice) {
  int n = 0;
  for (int weight = 0; weight < 1 + (backward && p->split); weight++) { /* (split-backward keeps them in B) */
    int unit = tp_unit_index(p, backward, weight, slice);
    for (int i = p->unit_begin[s][unit]; i < p->unit_end[s][unit]; i++)
      n += m->ops[p->order[s][i]].kind == TP_OP_AllReduce;
  }
  return n;
}

/* Stage s's stageS_forward_reduces and stageS_backward_reduces: per slice, the calls of
 * its units, which the runtime checks (runtime/train/plan.h). */
static void emit_reduce_tables(const TpPlanTables *E, FILE *out, int s) {
  for (int b = 0; b < 2; b++) {
    fprintf(out, "static const int stage%d_%s_reduces[] = {", s, b ? "backward" : "forward");
    for (int i = 0; i < E->mem->nslices; i++)
      fprintf(out, "%s%d", i ? ", " : "", unit_reduces(E->m, E->mem, s, b, i));
    fputs("};\n", out);
  }
}

/* The schedule's tables: per stage its unit functions, boundary messages and instruction
 * list, then the stages. */
static void emit_pipeline(const TpPlanTables *E, FILE *out, int64_t seq) {
  const TpModule *m = E->m;
  const TpMemoryPlan *p = E->mem;
  const TpPipeline *pl = E->pipe;
  int N = p->nslices, S = p->nstages;
  char name[64];
  fputs("\n/* The token slices, first to last. */\nstatic const int64_t slice_len[] = {", out);
  for (int i = 0; i < N; i++) fprintf(out, "%s%lld", i ? ", " : "", (long long)tp_slice_length(m, p, i, seq));
  fputs("};\n", out);
  fputs("\n/* Per stage: one microbatch's arena (what it keeps from unit to unit: activations saved for\n"
        " * the backward, K/V contexts, boundary buffers; all its buffers where the rank keeps one\n"
        " * microbatch at a time), and the transient region the rank's units share. */\n",
        out);
  fputs("static const size_t arena_bytes[] = {", out);
  for (int s = 0; s < S; s++) fprintf(out, "%s%lld", s ? ", " : "", (long long)p->arena_bytes[s]);
  fputs("};\nstatic const size_t transient_bytes[] = {", out);
  for (int s = 0; s < S; s++) fprintf(out, "%s%lld", s ? ", " : "", (long long)p->transient_bytes[s]);
  fputs("};\n", out);
  if (N == 1 && !p->split) {
    fputs("static const TpStageFn forward[] = {", out);
    for (int s = 0; s < S; s++) fprintf(out, "%sstage%d_forward", s ? ", " : "", s);
    fputs("};\nstatic const TpStageFn backward[] = {", out);
    for (int s = 0; s < S; s++) fprintf(out, "%sstage%d_backward", s ? ", " : "", s);
    fputs("};\n", out);
  }
  for (int s = 0; s < S; s++) {
    fprintf(out, "\n/* Stage %d: ", s);
    if (N > 1) fputs("its functions per slice, ", out);
    if (S > 1) fputs("what it receives and sends per slice (arena offset, bytes), ", out);
    fputs("its instructions for one step. */\n", out);
    for (int b = 0; (N > 1 || p->split) && b < (p->split ? 3 : 2); b++) {
      const char *phase = tp_unit_phase(b > 0, b > 1, p->split);
      fprintf(out, "static const TpUnitFn stage%d_%s_units[] = {", s, phase);
      for (int i = 0; i < N; i++) {
        tp_unit_name("", N, s, phase, i, name, sizeof name);
        fprintf(out, "%s%s", i ? ", " : "", name);
      }
      fputs("};\n", out);
    }
    for (int k = 0; k < TP_MSG_COUNT; k++) {
      if (!has_peer(p, s, k)) continue;
      for (int i = 0; i < N; i++) {
        const TpMemMessage *msg = &p->messages[s][k * N + i];
        if (!msg->n) continue;
        fprintf(out, "static const TpPlanBuffer stage%d_%s_%d[] = {", s, message_names[k], i);
        for (int j = 0; j < msg->n; j++) {
          int v = msg->values[j], at = v;
          while (p->value[at].kind == TP_MEM_VIEW) at = p->value[at].index;
          const TpType *t = &m->values[v].type;
          fprintf(out, "%s{%lld, %lld}", j ? ", " : "", (long long)p->value[at].offset,
                  (long long)(tp_type_numel(t) * (int64_t)tp_dtype_size(t->dtype)));
        }
        fputs("};\n", out);
      }
      fprintf(out, "static const TpPlanMessage stage%d_%s[] = {", s, message_names[k]);
      for (int i = 0; i < N; i++) {
        const TpMemMessage *msg = &p->messages[s][k * N + i];
        if (msg->n) fprintf(out, "%s{%d, stage%d_%s_%d}", i ? ", " : "", msg->n, s, message_names[k], i);
        else fprintf(out, "%s{0, NULL}", i ? ", " : "");
      }
      fputs("};\n", out);
    }
    if (s < pl->schedule.stages) {
      fprintf(out, "static const TpPlanInsn stage%d_schedule[] = {\n", s);
      for (int i = 0; i < pl->schedule.count[s]; i++) {
        const TpInsn *x = &pl->schedule.insn[s][i];
        fprintf(out, "    {%s, %d, %d, %d, %d},\n", insn_enum[x->kind], x->mb, x->slice,
                tp_schedule_peer_stage(&pl->schedule, s, x), x->chunk);
      }
      fputs("};\n", out);
    }
    if (E->tensor > 1) emit_reduce_tables(E, out, s);
  }
  fputs("\nstatic const TpPlanStage stages[] = {\n", out);
  for (int s = 0; s < S; s++) {
    if (p->split)
      fprintf(out,
              "    {.forward = stage%d_forward_units,\n     .backward_input = stage%d_backward_input_units,\n"
              "     .backward_weight = stage%d_backward_weight_units,\n",
              s, s, s);
    else if (N == 1) fprintf(out, "    {.forward = forward + %d,\n     .backward = backward + %d,\n", s, s);
    else fprintf(out, "    {.forward = stage%d_forward_units,\n     .backward = stage%d_backward_units,\n", s, s);
    fprintf(out, "     .arena_bytes = %lld,\n     .arenas = %d,\n     .transient_bytes = %lld,\n",
            (long long)p->arena_bytes[s], pl->arenas[s], (long long)p->transient_bytes[s]);
    for (int k = 0; k < TP_MSG_COUNT; k++)
      if (has_peer(p, s, k)) fprintf(out, "     .%s = stage%d_%s,\n", message_names[k], s, message_names[k]);
    if (E->tensor > 1)
      fprintf(out,
              "     .forward_reduces = stage%d_forward_reduces,\n"
              "     .backward_reduces = stage%d_backward_reduces,\n",
              s, s);
    if (s < pl->schedule.stages) /* an interleaved plan's virtual stages >= S: in their rank's list */
      fprintf(out, "     .ninsns = %d,\n     .insns = stage%d_schedule,\n", pl->schedule.count[s], s);
    fprintf(out, "     .memory_bytes = %lld},\n", (long long)pl->memory[tp_pipeline_rank(pl, s)].peak);
  }
  fputs("};\n", out);
}

/* The profiling probes' tables: per probe and stage its setup units, probed units and
 * arena, then the probes; the stage cuts. */
static void emit_probe_tables(const TpPlanTables *E, FILE *out) {
  const TpEmitOptions *o = E->o;
  int S = E->mem->nstages;
  char name[64], prefix[32];
  fputs("\n/* Profiling probes (--profile-grid): the same model for one microbatch sliced as [c, l, rest],\n"
        " * per stage the forwards of the context slices (setup), the forward and backward of the\n"
        " * probed slice, and their arena and transient region. */\n",
        out);
  for (int k = 0; k < o->nprobes; k++) {
    const TpProbeInfo *info = &E->probe[k];
    snprintf(prefix, sizeof prefix, "probe%d_", k);
    for (int s = 0; s < S && info->probed; s++) {
      fprintf(out, "static const TpUnitFn probe%d_stage%d_setup[] = {", k, s);
      for (int i = 0; i < info->probed; i++) {
        tp_unit_name(prefix, info->nslices, s, "forward", i, name, sizeof name);
        fprintf(out, "%s%s", i ? ", " : "", name);
      }
      fputs("};\n", out);
    }
    fprintf(out, "static const TpPlanProbeStage probe%d_stages[] = {\n", k);
    for (int s = 0; s < S; s++) {
      fprintf(out, "    {.arena_bytes = %lld, .transient_bytes = %lld,", (long long)info->arena_bytes[s],
              (long long)info->transient_bytes[s]);
      if (info->probed) fprintf(out, " .nsetup = %d, .setup = probe%d_stage%d_setup,", info->probed, k, s);
      tp_unit_name(prefix, info->nslices, s, "forward", info->probed, name, sizeof name);
      fprintf(out, "\n     .forward = %s, ", name);
      tp_unit_name(prefix, info->nslices, s, "backward", info->probed, name, sizeof name);
      fprintf(out, ".backward = %s},\n", name);
    }
    fputs("};\n", out);
  }
  fputs("static const TpPlanProbe probes[] = {\n", out);
  for (int k = 0; k < o->nprobes; k++)
    fprintf(out, "    {%lld, %lld, %lld, probe%d_stages},\n", (long long)E->probe[k].b, (long long)o->probes[k].l,
            (long long)o->probes[k].c, k);
  fputs("};\n", out);
  if (o->stage_cuts) {
    fputs("\n/* The first layer of each stage. */\nstatic const int stage_cuts[] = {", out);
    for (int s = 0; s < S; s++) fprintf(out, "%s%d", s ? ", " : "", o->stage_cuts[s]);
    fputs("};\n", out);
  }
}

void tp_emit_plan_tables(const TpPlanTables *E, FILE *out) {
  const TpModule *m = E->m;
  const TpMemoryPlan *p = E->mem;
  int64_t batch = 0, seq = 0;
  for (int v = 0; v < m->nvalues; v++)
    if (p->value[v].kind == TP_MEM_TOKENS) batch = m->values[v].type.dims[0], seq = m->values[v].type.dims[1];

  fputs("\n/* The parameters: ONNX name, the initializer --init reads, shape, trainable, the stage\n"
        " * holding it, the last stage if it holds a tied copy too. */\n",
        out);
  fprintf(out, "static const TpPlanParam params[%d] = {\n", p->nparams ? p->nparams : 1);
  for (int i = 0; i < p->nparams; i++) {
    const TpValue *val = &m->values[p->params[i]];
    bool alias = val->origin.op_type && strcmp(val->origin.op_type, "Identity") == 0 && val->origin.node;
    fputs("    {", out);
    put_string(out, val->name);
    fputs(", ", out);
    put_string(out, alias ? val->origin.node : val->name);
    fprintf(out, ", %d, {", val->type.rank);
    for (int k = 0; k < val->type.rank; k++) fprintf(out, "%s%lld", k ? ", " : "", (long long)val->type.dims[k]);
    fprintf(out, "%s}, %d, %d, %d, {%d, %d, %d}},\n", val->type.rank ? "" : "0",
            m->grads && tp_grad_of(m, p->params[i]) >= 0, p->param_stage[i], p->param_tied_stage[i], val->shard.axis,
            val->shard.parts, val->shard.chunks);
  }
  fputs("};\n", out);
  /* a padded vocabulary's padding (TpPlan.param_pad): only plans that have one print it */
  bool padded = false;
  for (int i = 0; i < p->nparams; i++) padded |= m->values[p->params[i]].shard.pad > 0;
  if (padded) {
    fprintf(out, "/* the padding of each parameter's padded vocabulary */\nstatic const int param_pad[%d] = {",
            p->nparams);
    for (int i = 0; i < p->nparams; i++) fprintf(out, "%s%d", i ? ", " : "", m->values[p->params[i]].shard.pad);
    fputs("};\n", out);
  }

  /* Re-tied initializers: the forward re-tie views (a Transpose or Reshape of a parameter,
   * the initializer named by their origin). */
  int nderived = 0;
  for (int op = 0; op < m->nops; op++) {
    const TpOp *o = &m->ops[op];
    if (o->role != TP_ROLE_RETIE || o->phase != TP_PHASE_FORWARD) continue;
    int src = o->inputs[0];
    if (!nderived++)
      fputs("\n/* Initializers re-tied to a parameter: name, parameter, transposed. */\n"
            "static const TpPlanDerived derived[] = {\n",
            out);
    fputs("    {", out);
    put_string(out, o->origin.node);
    fprintf(out, ", %d, %d},\n", p->value[src].index, o->kind == TP_OP_Transpose);
  }
  if (nderived) fputs("};\n", out);

  emit_pipeline(E, out, seq);
  if (E->o->nprobes) emit_probe_tables(E, out);
  fputs("\nconst TpPlan tp_plan = {\n    .abi = TP_PLAN_ABI,\n    .model = ", out);
  put_string(out, E->o->model ? E->o->model : m->source ? m->source : "");
  fputs(",\n    .tokpipec_version = ", out);
  put_string(out, E->o->version ? E->o->version : "");
  fprintf(out, ",\n    .batch = %lld,\n    .seq = %lld,\n    .vocab = %lld,\n", (long long)batch, (long long)seq,
          (long long)vocab_size(m));
  char limit_of[512];
  int64_t limit = tp_token_limit(m, p, limit_of, sizeof limit_of);
  if (limit) {
    fprintf(out, "    .token_limit = %lld,\n    .token_limit_of = ", (long long)limit);
    put_string(out, limit_of);
    fputs(",\n", out);
  }
  fprintf(out, "    .nparams = %d,\n    .params = params,\n", p->nparams);
  if (padded) fputs("    .param_pad = param_pad,\n", out);
  if (nderived) fprintf(out, "    .nderived = %d,\n    .derived = derived,\n", nderived);
  fprintf(out, "    .nstages = %d,\n    .arena_bytes = arena_bytes,\n    .transient_bytes = transient_bytes,\n",
          p->nstages);
  if (p->nslices == 1 && !p->split) fputs("    .forward = forward,\n    .backward = backward,\n", out);
  const TpPipeline *pl = E->pipe;
  fprintf(out,
          "    .global_batch = %lld,\n    .microbatches = %d,\n    .dp = %d,\n    .nslices = %d,\n"
          "    .slice_len = slice_len,\n    .schedule = %s,\n    .stages = stages,\n",
          (long long)(batch * pl->o.microbatches * pl->o.dp), pl->o.microbatches, pl->o.dp, p->nslices,
          plan_schedule[pl->o.kind]);
  if (pl->chunks > 1) fprintf(out, "    .chunks = %d,\n", pl->chunks);
  if (E->o->nprobes)
    fprintf(out, "    .stage_cuts = %s,\n    .nprobes = %d,\n    .probes = probes,\n",
            E->o->stage_cuts ? "stage_cuts" : "NULL", E->o->nprobes);
  if (E->target->device) fprintf(out, "    .device = &%s,\n", E->target->device);
  if (E->tensor > 1) fprintf(out, "    .tensor = %d,\n", E->tensor);
  if (pl->o.zero && pl->o.dp > 1) fputs("    .zero = 1,\n", out);
  TpDType stored = p->nparams ? m->values[p->params[0]].type.dtype : TP_F32; /* store-bf16, store-fp16 */
  if (stored != TP_F32) fprintf(out, "    .precision = %s,\n", stored == TP_BF16 ? "TP_PLAN_BF16" : "TP_PLAN_FP16");
  fputs("};\n", out);
  fputs("\nint main(int argc, char **argv) { return tp_trainer_main(&tp_plan, argc, argv); }\n", out);
}
