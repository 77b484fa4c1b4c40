/* tokpipec: the user-facing compiler. Imports an ONNX model (or reads textual IR), runs the
 * training pipeline (tp_default_pipeline) and writes the IR, a Graphviz graph, the memory
 * plan, or the C training program (plan.c), which --exe also compiles and links against
 * the runtime tokpipec was built with (or installed with). */
#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <regex.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "codegen/codegen.h"
#include "codegen/lower.h" /* tp_lower_memory_options */
#include "codegen/target.h"
#include "passes/planner/plan.h"
#include "base/atomic.h"
#include "tokpipec_config.h" /* the C compiler, where the runtime is, what a plan links */

extern char **environ;

static const char usage[] =
    "usage: tokpipec MODEL.onnx|FILE.tir [options]\n"
    "Imports MODEL.onnx (or textual IR; '-' reads stdin), runs the training pipeline (raise\n"
    "the transformer, add the loss, differentiate) and writes the result.\n"
    "  --emit=ir|dot|memory|schedule|c|params  textual IR (the default), a Graphviz graph,\n"
    "                       the memory plan (per rank), the ranks' instruction lists, the C\n"
    "                       training program (the default when -o ends in .c), or one line\n"
    "                       per initializer: name, type, whether it trains, and why\n"
    "  -o OUT               write OUT (atomically) instead of stdout\n"
    "  --target cpu|cuda    the kernels the C program calls (default cpu); cuda: a trainer\n"
    "                       for NVIDIA GPUs (runtime/cuda), built on the CPU trainer\n"
    "  --precision fp32|bf16|fp16  store parameters, activations and gradients in fp32\n"
    "                       (default) or 16 bits, computing in fp32 with fp32 master\n"
    "                       weights and AdamW state (fp16 with dynamic loss scaling); cuda\n"
    "                       bf16 also gives the matrix products bf16 operands\n"
    "  --exe TRAINER        also compile the C program into the executable TRAINER\n"
    "  -v, --verbose        print the C compiler's command line\n"
    "  --batch B, --seq T   the global batch of a step (B / (dp * microbatches) rows per\n"
    "                       microbatch: the token input's first dim, to which a model exported\n"
    "                       with a fixed batch is re-batched) and the sequence length\n"
    "  --dim NAME=VALUE     fix a symbolic input dimension (repeatable)\n" CLI_LOAD_OPTIONS_HELP
    "  --logits NAME        the graph output the loss reads (default: the float [B, T, V] one)\n"
    "  --freeze REGEX       parameters whose ONNX names match (POSIX ERE) are not trained\n"
    "  --retie auto|off     re-tie weights the exporter duplicated (a tied LM head saved\n"
    "                       as a transposed copy of the embedding): auto (the default)\n"
    "                       compares same-shaped weights, first by their first and last\n"
    "                       elements, then whole; off keeps them apart\n"
    "  --no-retie           --retie off\n"
    "  --no-fuse            leave RMSNorm, rotary embeddings and gated MLPs as primitive chains\n"
    "                       (raise-transformer-unfused), and a CUDA plan's Gelu apart from its\n"
    "                       products (no cuBLASLt Gelu epilogue); to compare against the fused ops\n"
    "  --forward-only       stop before the loss: the raised forward module, to inspect\n"
    "                       with --emit=ir|dot|memory\n"
    "  --slices N|L1,L2,..|auto  cut each sequence into N near-equal token slices, slices of\n"
    "                       the lengths given (summing to the sequence), or the planner's\n"
    "                       optimal slicing; the model must be causal (default: 1, whole)\n"
    "  --stages S           cut the layers into S pipeline stages (default 1), balancing FLOPs\n"
    "  --stage-cuts A,B,..  ... or by hand: stage 1 starts at layer A, stage 2 at B, ..\n"
    "                       (layers from 0; S-1 cuts for S stages)\n"
    "  --microbatches M     microbatches per replica and step (default 1)\n"
    "  --dp D               data-parallel replicas of the pipeline (default 1)\n"
    "  --zero 0|1           1: each of the D replicas keeps 1/D of the AdamW state (ZeRO\n"
    "                       stage 1: gradients reduce-scattered, parameters all-gathered),\n"
    "                       with the same results as 0, where each keeps all of it (default)\n"
    "  --schedule gpipe|1f1b|zb|interleaved  the order of each rank's units (default gpipe);\n"
    "                       zb splits each backward into its input and weight parts (zero\n"
    "                       bubble); interleaved: each of the S ranks runs V chunks of layers\n"
    "  --chunks V           with --schedule interleaved: the chunks (virtual stages) per rank,\n"
    "                       V >= 2; the layers are cut into S x V virtual stages, rank k\n"
    "                       running k, k + S, ..; --stage-cuts then gives S x V - 1 cuts\n"
    "  --tensor N           split each stage's products over N tensor-parallel ranks\n"
    "                       (Megatron: attention heads and MLP columns, then rows, with an\n"
    "                       all-reduce after each row-parallel product); N must divide the\n"
    "                       query heads and the MLP width. Ranks: stages x N x dp (default 1)\n"
    "  --recompute none|selective|full  what the backward recomputes instead of keeping from\n"
    "                       the forward: nothing (the default); all but each layer's input and\n"
    "                       the products (selective); all but each layer's input (full). The\n"
    "                       gradients stay bit for bit the same\n"
    "  --max-memory BYTES   refuse a plan whose per-rank peak (weights, gradients, AdamW\n"
    "                       state, microbatch arenas and transient region; with --tensor,\n"
    "                       one tensor rank's"
    "                       parts) exceeds BYTES\n"
    "  --profile-grid auto|L1,L2,..:C1,C2,..  build profiling units into the trainer for its\n"
    "                       --profile: one stage unit per slice length l and context c (l + c\n"
    "                       <= seq); auto: l in seq/8, seq/4, seq/2, seq and c in 0, seq/4,\n"
    "                       seq/2, 3seq/4. Multiplies the code; the model must be causal\n" CLI_PASS_OPTIONS_HELP
    "  --help, --version\n"
    "Exit codes: 0 ok, 1 bad input, 2 bad usage, 3 internal error.\n";

static void write_ir(const void *m, FILE *out) { tp_print_module(m, out); }

/* --emit=params: each initializer the model still reads after re-tying, as
 * "name type trains|frozen|tied|constant why". */
typedef struct {
  const TpModule *m;
  const char *freeze;
} ParamsReport;

static void write_params(const void *arg, FILE *out) {
  const ParamsReport *r = arg;
  const TpModule *m = r->m;
  regex_t freeze;
  bool frozen_any = r->freeze && regcomp(&freeze, r->freeze, REG_EXTENDED | REG_NOSUB) == 0;
  fprintf(out, "# initializer, type, trains|frozen|tied|constant, why\n");
  for (int v = 0; v < m->nvalues; v++) {
    const TpValue *val = &m->values[v];
    if (!val->why || val->dead) continue;
    char type[128];
    tp_type_str(&val->type, type, sizeof type);
    const char *state = "constant", *because = "";
    char tied[512];
    if (val->kind == TP_VAL_RESULT && val->def >= 0 && m->ops[val->def].role == TP_ROLE_RETIE) {
      const TpOp *o = &m->ops[val->def];
      state = "tied";
      snprintf(tied, sizeof tied, "%s of %s (retie-params); ",
               o->kind == TP_OP_Transpose ? "the transpose" : "a copy", m->values[o->inputs[0]].name);
      because = tied;
    } else if (val->kind == TP_VAL_PARAM) {
      bool frozen = frozen_any && regexec(&freeze, val->name, 0, NULL, 0) == 0;
      state = frozen ? "frozen" : "trains";
      if (frozen) because = "matches --freeze; ";
    }
    fprintf(out, "%s %s %s %s%s\n", val->name, type, state, because, val->why);
  }
  if (frozen_any) regfree(&freeze);
}
static void write_dot(const void *m, FILE *out) { tp_print_dot(m, out); }
static void write_text(const void *text, FILE *out) { fputs(text, out); }

/* The memory plan's report, the schedule or the C program into a malloc'ed string (NULL
 * for the IR and the graph), after checking --max-memory (max_memory > 0). A C program
 * whose ranks would not fit this machine's memory is refused too unless --max-memory sets
 * the limit (a trainer for a bigger machine): its trainer could not allocate its buffers. */
static int render(const TpModule *m, const char *emit, const char *model, const char *note,
                  const TpPipelineOptions *po, int64_t max_memory, const TpEmitOptions *probes, char **text,
                  TpDiag *d) {
  bool report = strcmp(emit, "memory") == 0 || strcmp(emit, "schedule") == 0;
  if (!report && strcmp(emit, "c") != 0 && max_memory <= 0) return TP_OK;
  TpMemoryPlan plan;
  TpPipeline pl;
  const TpTarget *target = tp_target_find(probes->target ? probes->target : "cpu", probes->precision);
  TpMemoryOptions mo; /* the plan's, as tp_emit_c plans it */
  bool *bf16_results = tp_lower_memory_options(m, target, &mo);
  int rc = tp_plan_memory(m, &mo, &plan, d);
  free(bf16_results);
  if (rc != TP_OK) return rc;
  rc = tp_pipeline_build(m, &plan, po, &pl, d);
  bool built = rc == TP_OK;
  if (rc == TP_OK && max_memory > 0) rc = tp_pipeline_check_memory(&pl, max_memory, "--max-memory", NULL, d);
  int64_t machine = tp_physical_memory();
  if (rc == TP_OK && max_memory <= 0 && strcmp(emit, "c") == 0 && machine > 0)
    rc = tp_pipeline_check_memory(&pl, machine, "this machine's memory of",
                                  " (lower --batch or --seq, add --stages "
                                  "or --microbatches, or give --max-memory for a bigger machine)",
                                  d);
  if (rc == TP_OK && (report || strcmp(emit, "c") == 0)) {
    size_t len = 0;
    FILE *f = open_memstream(text, &len);
    TP_ASSERT(f);
    TpEmitOptions o = {.model = model,
                       .version = TOKPIPE_VERSION,
                       .slicing = note,
                       .pipeline = po,
                       .nprobes = probes->nprobes,
                       .probes = probes->probes,
                       .stage_cuts = probes->stage_cuts,
                       .target = probes->target,
                       .precision = probes->precision,
                       .no_epilogues = probes->no_epilogues};
    if (strcmp(emit, "memory") == 0) tp_print_memory(m, &plan, &pl, f);
    else if (strcmp(emit, "schedule") == 0) tp_schedule_print(&pl.schedule, f);
    else rc = tp_emit_c(m, &o, f, d);
    fclose(f);
  }
  if (built) tp_pipeline_free(&pl);
  tp_memory_plan_free(&plan);
  return rc;
}

/* ---- --exe: compile plan.c against the runtime ---- */

typedef struct {
  char **argv;
  int n, cap;
} Args;

static void push(Args *a, const char *s) {
  if (a->n + 2 > a->cap) {
    a->cap = a->cap ? 2 * a->cap : 32;
    a->argv = realloc(a->argv, (size_t)a->cap * sizeof *a->argv);
    TP_ASSERT(a->argv);
  }
  a->argv[a->n] = strdup(s);
  TP_ASSERT(a->argv[a->n]);
  a->argv[++a->n] = NULL;
}

static void push_list(Args *a, const char *list) { /* "a;b;c" */
  for (const char *p = list; *p;) {
    size_t len = strcspn(p, ";");
    if (len) {
      char *item = strndup(p, len);
      TP_ASSERT(item);
      push(a, item);
      free(item);
    }
    p += len + (p[len] == ';');
  }
}

static void push_joined(Args *a, const char *flag, const char *dir, const char *sub) {
  size_t n = strlen(flag) + strlen(dir) + strlen(sub) + 2;
  char *s = malloc(n);
  TP_ASSERT(s);
  snprintf(s, n, "%s%s%s%s", flag, dir, *sub ? "/" : "", sub);
  push(a, s);
  free(s);
}

/* A file path as the compiler's operand: "./-x.c", not the option "-x.c". */
static void push_path(Args *a, const char *path) { push_joined(a, path[0] == '-' ? "./" : "", path, ""); }

static bool is_file(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* An installed tokpipec finds the headers and libraries next to it (PREFIX/bin/tokpipec,
 * PREFIX/include/tokpipe, PREFIX/lib); a build-tree one uses the build's. */
static void runtime_flags(Args *a) {
  char exe[PATH_MAX], prefix[PATH_MAX + 8], probe[2 * PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    snprintf(prefix, sizeof prefix, "%s/..", exe);
    snprintf(probe, sizeof probe, "%s/%s/train/plan.h", prefix, TOKPIPE_INSTALL_INCLUDEDIR);
    if (is_file(probe)) {
      push_joined(a, "-I", prefix, TOKPIPE_INSTALL_INCLUDEDIR);
      push_joined(a, "-L", prefix, TOKPIPE_INSTALL_LIBDIR);
      return;
    }
  }
  push_joined(a, "-I", TOKPIPE_BUILD_INCLUDEDIR, "");
  push_joined(a, "-L", TOKPIPE_BUILD_LIBDIR, "");
}

/* "cc -O2 ... -o trainer" for the internal error that reports a failed compile. */
static char *command_line(const Args *a) {
  size_t len = 1;
  for (int i = 0; i < a->n; i++) len += strlen(a->argv[i]) + 1;
  char *s = malloc(len);
  TP_ASSERT(s);
  s[0] = 0;
  for (int i = 0; i < a->n; i++) {
    if (i) strcat(s, " ");
    strcat(s, a->argv[i]);
  }
  return s;
}

/* A device plan (--target cuda) links the device runtime and its libraries before the CPU
 * trainer's (TOKPIPE_CUDA_PLAN_*: empty when tokpipec was built without them). */
static int compile_trainer(const char *plan_c, const char *exe, bool device, bool verbose, TpDiag *d) {
  Args a = {0};
  push(&a, TOKPIPE_CC);
  push(&a, "-O2");
  runtime_flags(&a); /* -I and -L */
  if (device) push_list(&a, TOKPIPE_CUDA_PLAN_CFLAGS);
  push_path(&a, plan_c);
  push(&a, "-o");
  push_path(&a, exe);
  if (device) push_list(&a, TOKPIPE_CUDA_PLAN_LIBS);
  push_list(&a, TOKPIPE_PLAN_LIBS);
  if (verbose) {
    char *cmd = command_line(&a);
    fprintf(stderr, "%s\n", cmd);
    free(cmd);
  }
  pid_t pid;
  int status = 0, rc = TP_OK;
  int err = posix_spawnp(&pid, a.argv[0], NULL, NULL, a.argv, environ);
  if (err == 0 && waitpid(pid, &status, 0) < 0) err = errno;
  if (err || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    char *cmd = command_line(&a);
    if (err) rc = tp_internal(d, "cannot run the C compiler (%s): %s", strerror(err), cmd);
    else
      rc = tp_internal(d, "the C compiler failed (%s %d): %s", WIFEXITED(status) ? "exit" : "signal",
                       WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), cmd);
    free(cmd);
  }
  for (int i = 0; i < a.n; i++) free(a.argv[i]);
  free(a.argv);
  return rc;
}

/* Writes the program to `output` (or a temporary next to the executable) and compiles it. */
static int build_trainer(const char *code, const char *output, const char *exe, bool device, bool verbose,
                         TpDiag *d) {
  char *tmp = NULL;
  const char *plan_c = output;
  if (!output) {
    size_t n = strlen(exe) + 32;
    tmp = malloc(n);
    TP_ASSERT(tmp);
    snprintf(tmp, n, "%s.plan.XXXXXX.c", exe);
    int fd = mkstemps(tmp, 2);
    if (fd < 0) {
      int rc = tp_error(d, "cannot create '%s': %s", tmp, strerror(errno));
      free(tmp);
      return rc;
    }
    close(fd);
    plan_c = tmp;
  }
  int rc = cli_write_output(plan_c, write_text, code, d);
  if (rc == TP_OK) rc = compile_trainer(plan_c, exe, device, verbose, d);
  if (tmp) unlink(tmp);
  free(tmp);
  return rc;
}

/* ---- --slices auto ---- */

/* TeraPipe's optimal slicing (passes/planner/slicing.h, Eqs. 5-8) of the plan's
 * `microbatches` microbatches (of the token input's rows each, all sliced alike, as the
 * trainer runs them) on its stages (--stage-cuts, else near-equal cuts) and o->tensor
 * tensor ranks, priced by the planner's cost model on the CPU profile; writes o->nslices
 * and o->slice_len (module-owned), and a note for the program's header. `whole` describes
 * the model as it was before shard-tensor cut its widths (NULL: read off m). */
static int auto_slices(TpModule *m, TpPassOptions *o, const TpModelDesc *whole, int microbatches, char *note,
                       size_t size, TpDiag *d) {
  int tokens = tp_token_input(m);
  if (tokens < 0) return tp_error(d, "--slices auto: the model has no integer [batch, seq] token input");
  int64_t rows = m->values[tokens].type.dims[0], T = m->values[tokens].type.dims[1];
  TpModelDesc desc;
  if (whole) desc = *whole;
  else if (!tp_model_describe(m, T, &desc))
    return tp_error(d, "--slices auto: cannot read the layer count, width and vocabulary off the model; give the "
                       "slices");
  int stages = o->nstages > 1 ? o->nstages : 1, *cuts = NULL;
  int rc = o->stage_cuts ? tp_stage_cuts_parse(o->stage_cuts, desc.layers, &stages, &cuts, d) : TP_OK;
  TpHardware hw;
  TpCostModel cm;
  char dirs[4096];
  tp_profile_dirs(TOKPIPE_PROFILE_DIRS, dirs, sizeof dirs);
  if (rc == TP_OK) rc = tp_hardware_find("cpu", dirs, &hw, d);
  /* described from the split module (whole == NULL), its sizes are one tensor rank's already */
  int tensor = whole && o->tensor > 1 ? o->tensor : 1;
  if (rc == TP_OK) rc = tp_cost_model_init(&cm, &hw, &desc, 1, tensor, 1, d);
  if (rc == TP_OK && stages > 1 && stages <= desc.layers && stages <= TP_MAX_STAGES) {
    if (!cuts) { /* assign-stages balances the layers' compute: near-equal cuts */
      cuts = malloc(sizeof(int) * (size_t)stages);
      TP_ASSERT(cuts);
      for (int k = 0; k < stages; k++) cuts[k] = (int)((int64_t)k * desc.layers / stages);
    }
    cm.pipeline = cm.nstages = stages;
    tp_cost_model_set_cuts(&cm, cuts);
  }
  free(cuts);
  if (rc) return rc;
  cm.microbatch_rows = (int)rows; /* the trainer runs microbatches of the token input's rows */
  int g = 1;                      /* slice lengths in units of g tokens: at most 256 units */
  while (T / g > 256 || T % g) g++;
  int batch = (int)rows * microbatches;
  TpSliceCost table;
  double rms, worst;
  tp_model_slice_cost(&cm, batch, g, &table, &rms, &worst);
  TpSlicing plan = {0};
  rc = tp_slice_cost_finish(&table, d);
  if (rc == TP_OK) rc = tp_solve_slicing(&table, batch, cm.nstages, &plan, d);
  if (rc == TP_OK) {
    TP_ASSERT(plan.n == microbatches); /* equal sizes get equal (the one optimal) slicings */
    int64_t *len = tp_alloc(m, (size_t)plan.mb[0].nslices * sizeof *len);
    for (int i = 0; i < plan.mb[0].nslices; i++) len[i] = plan.mb[0].len[i];
    o->nslices = plan.mb[0].nslices;
    o->slice_len = len;
    int n = snprintf(note, size, "--slices auto chose");
    for (int i = 0; i < o->nslices && n < (int)size; i++)
      n += snprintf(note + n, size - (size_t)n, "%s %lld", i ? "," : "", (long long)len[i]);
    if (n < (int)size)
      snprintf(note + n, size - (size_t)n,
               ": the planner's optimal slicing for %d stage%s%s x %d microbatch%s on the "
               "%s profile, %.3g s a step",
               cm.nstages, cm.nstages > 1 ? "s" : "",
               cm.tensor > 1 ? tp_strfmt(m, " x %d tensor ranks", cm.tensor) : "", microbatches,
               microbatches > 1 ? "es" : "", hw.name, plan.time);
  }
  tp_slicing_free(&plan);
  tp_slice_cost_free(&table);
  return rc;
}

/* ---- --profile-grid ---- */

/* Sorted, without repeats. */
static int unique_sorted(int64_t *x, int n) {
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && x[j - 1] > x[j]; j--) {
      int64_t t = x[j];
      x[j] = x[j - 1], x[j - 1] = t;
    }
  int k = 0;
  for (int i = 0; i < n; i++)
    if (!k || x[i] != x[k - 1]) x[k++] = x[i];
  return k;
}

/* "N,N,..": numbers in [lo, hi] into x (at most 64); usage errors name the grid. */
static int grid_list(const char *spec, const char *text, size_t len, int64_t lo, int64_t hi, const char *what,
                     int64_t *x) {
  int n = 0;
  for (const char *p = text, *end = text + len; p <= end;) {
    char *stop;
    errno = 0;
    long long v = strtoll(p, &stop, 10);
    if (stop == p || errno || (stop != end && *stop != ',') || n == 64 || *p == ' ' || *p == '+')
      cli_usage_error("--profile-grid expects auto or L1,L2,..:C1,C2,.. (slice lengths, then contexts), got '%s'",
                      spec);
    if (v < lo || v > hi)
      cli_usage_error("--profile-grid %s: %s %lld is not in [%lld, %lld] (the sequence has %lld tokens)", spec, what,
                      v, (long long)lo, (long long)hi, (long long)(what[0] == 'l' ? hi : hi + 1));
    x[n++] = v;
    p = stop + 1;
  }
  return unique_sorted(x, n);
}

/* The grid points (l, c), l + c <= T, of `spec` (auto or "L1,..:C1,.."), at most 4096 of
 * them, into l[] and c[]; usage errors for bad text and for grids the planner's fit cannot
 * use (it needs c = 0 at one length at least, and 4 points with c > 0 over 2 lengths and 2
 * contexts at least). */
static int profile_grid(const char *spec, int64_t T, int64_t *l, int64_t *c) {
  int64_t len[64], ctx[64];
  int nl, nc;
  if (strcmp(spec, "auto") == 0) {
    int64_t autol[4] = {(T + 4) / 8, (T + 2) / 4, (T + 1) / 2, T},
            autoc[4] = {0, (T + 2) / 4, (T + 1) / 2, (3 * T + 2) / 4};
    for (int i = 0; i < 4; i++) len[i] = autol[i] < 1 ? 1 : autol[i], ctx[i] = autoc[i];
    nl = unique_sorted(len, 4), nc = unique_sorted(ctx, 4);
  } else {
    const char *colon = strchr(spec, ':');
    if (!colon || strchr(colon + 1, ':'))
      cli_usage_error("--profile-grid expects auto or L1,L2,..:C1,C2,.. (slice lengths, then contexts), got '%s'",
                      spec);
    nl = grid_list(spec, spec, (size_t)(colon - spec), 1, T, "length", len);
    nc = grid_list(spec, colon + 1, strlen(colon + 1), 0, T - 1, "context", ctx);
  }
  int n = 0, ctx_points = 0, ctx_lengths = 0, zero = 0;
  bool used_c[64] = {false};
  for (int i = 0; i < nl; i++) {
    int here = 0;
    for (int j = 0; j < nc; j++) {
      if (len[i] + ctx[j] > T) continue;
      l[n] = len[i], c[n] = ctx[j], n++;
      if (ctx[j] == 0) zero++;
      else here++, used_c[j] = true;
    }
    ctx_points += here, ctx_lengths += here > 0;
  }
  int ctx_contexts = 0;
  for (int j = 0; j < nc; j++) ctx_contexts += used_c[j];
  if (!n) cli_usage_error("--profile-grid %s: no point has l + c <= %lld, the sequence length", spec, (long long)T);
  if (!zero || ctx_points < 4 || ctx_lengths < 2 || ctx_contexts < 2)
    cli_usage_error("--profile-grid %s: its %d point%s with l + c <= %lld give%s %d with c = 0 and %d with c > 0 "
                    "(over %d length%s and %d context%s); the fit needs 1 with c = 0 and 4 with c > 0 over 2 "
                    "lengths and 2 contexts",
                    spec, n, n == 1 ? "" : "s", (long long)T, n == 1 ? "s" : "", zero, ctx_points, ctx_lengths,
                    ctx_lengths == 1 ? "" : "s", ctx_contexts, ctx_contexts == 1 ? "" : "s");
  return n;
}

/* The main module's stages (*nstages) and the first layer of each (*cuts), as assign-stages
 * cut them (it reports its cuts in o->staged_cuts, already checked against the layers). */
static int stage_layout(const TpPassOptions *o, int *nstages, int **cuts, TpDiag *d) {
  *nstages = o->staged_nstages > 1 ? o->staged_nstages : 1;
  if (*nstages == 1) {
    *cuts = calloc(1, sizeof **cuts);
    TP_ASSERT(*cuts);
    return TP_OK;
  }
  if (!o->staged_cuts) return tp_internal(d, "assign-stages made %d stages but recorded no cuts", *nstages);
  return tp_stage_cuts_parse(o->staged_cuts, INT_MAX, nstages, cuts, d);
}

/* Compiles the model again for each grid point (one microbatch sliced [c, l, rest], the
 * stage cuts of the main module, the same passes and options): probes[i].m. */
static int build_probes(const char *input, const CliDims *dims, const TpModule *m, const TpPassOptions *o, int S,
                        const int64_t *l, const int64_t *c, int n, TpEmitProbe *probes, TpModule **mods, TpDiag *d) {
  int64_t T = m->values[tp_token_input(m)].type.dims[1];
  int rc = TP_OK;
  for (int i = 0; i < n && rc == TP_OK; i++) {
    probes[i] = (TpEmitProbe){.l = l[i], .c = c[i]};
    int64_t slices[3]; /* [c,] l[, rest] */
    int nslices = 0;
    if (c[i]) slices[nslices++] = c[i];
    slices[nslices++] = l[i];
    if (c[i] + l[i] < T) slices[nslices++] = T - c[i] - l[i];
    TpPassOptions po = {.no_retie = o->no_retie,
                        .no_fuse = o->no_fuse,
                        .sliced = nslices > 1,
                        .logits = o->logits,
                        .freeze = o->freeze,
                        .batch = dims->token_dims[0],
                        .nslices = nslices,
                        .slice_len = slices,
                        .nstages = S,
                        .stage_cuts = S > 1 ? o->staged_cuts : NULL,
                        .recompute = o->recompute,
                        .storage = o->storage}; /* the units share the plan's buffers */
    const char *names[TP_MAX_PIPELINE];
    int np = tp_pipeline_passes(&po, names);
    char where[PATH_MAX + 96];
    /* errors name the probe: "model.onnx (--profile-grid point l 4, c 2): ..." */
    snprintf(where, sizeof where, "%s (--profile-grid point l %lld, c %lld)", input, (long long)l[i],
             (long long)c[i]);
    const char *file = d->file;
    d->file = where;
    TpModule *pm = NULL;
    rc = cli_load_module(input, dims, &pm, d);
    if (rc == TP_OK) rc = cli_run_pipeline(pm, names, np, &po, d);
    d->file = file;
    probes[i].m = mods[i] = pm;
  }
  return rc;
}

/* IR printed after store-bf16 or store-fp16 (16-bit parameters) is stored in that
 * precision: the memory plan counts it so (pipe->precision), and a --precision naming
 * another (`given`) is refused. */
static int stored_precision(const TpModule *m, const char *given, TpPipelineOptions *pipe, TpDiag *d) {
  TpPrecision stored = TP_PRECISION_FP32;
  for (int v = 0; v < m->nvalues && stored == TP_PRECISION_FP32; v++)
    if (m->values[v].kind == TP_VAL_PARAM && m->values[v].type.dtype == TP_BF16) stored = TP_PRECISION_BF16;
    else if (m->values[v].kind == TP_VAL_PARAM && m->values[v].type.dtype == TP_F16) stored = TP_PRECISION_FP16;
  if (stored == TP_PRECISION_FP32) return TP_OK;
  if (given && pipe->precision != stored)
    return tp_error(d,
                    "IR printed after store-%s (its parameters are %s): --precision %s contradicts it; drop "
                    "--precision, or give the ONNX model",
                    tp_precision_name(stored), stored == TP_PRECISION_BF16 ? "bf16" : "f16", given);
  pipe->precision = stored;
  return TP_OK;
}

int main(int argc, char **argv) {
  cli_tool = "tokpipec";
  const char *input = NULL, *emit = NULL, *output = NULL, *exe = NULL, *target = "cpu", *precision = NULL,
             *slices = NULL, *grid = NULL, *v;
  int64_t batch = 0, max_memory = 0;
  TpPipelineOptions pipe = {.microbatches = 1, .dp = 1, .kind = TP_SCHEDULE_GPIPE};
  bool verbose = false;
  CliDims dims = {0};
  TpPassOptions po = {.tensor = 1}; /* the passes' options, and the pipeline built from them */
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (cli_is(a, "--help") || cli_is(a, "-h")) {
      fputs(usage, stdout);
      return 0;
    } else if (cli_is(a, "--version")) {
      printf("tokpipec %s\n", TOKPIPE_VERSION);
      return 0;
    } else if (cli_value(argc, argv, &i, "--emit", &emit)) {
      if (strcmp(emit, "ir") && strcmp(emit, "dot") && strcmp(emit, "memory") && strcmp(emit, "schedule") &&
          strcmp(emit, "c") && strcmp(emit, "params"))
        cli_usage_error("--emit expects ir, dot, memory, schedule, c or params, got '%s'", emit);
    } else if (cli_value(argc, argv, &i, "--target", &target)) {
      if (!tp_target_find(target, NULL)) cli_usage_error("--target expects %s, got '%s'", tp_target_names(), target);
    } else if (cli_value(argc, argv, &i, "--precision", &precision)) {
    } else if (cli_value(argc, argv, &i, "-o", &output)) {
    } else if (cli_value(argc, argv, &i, "--exe", &exe)) {
    } else if (cli_value(argc, argv, &i, "--batch", &v)) {
      batch = cli_int("--batch", v, 1, INT32_MAX);
    } else if (cli_value(argc, argv, &i, "--stages", &v)) {
      po.nstages = (int)cli_int("--stages", v, 1, 1024);
    } else if (cli_value(argc, argv, &i, "--stage-cuts", &po.stage_cuts)) {
    } else if (cli_value(argc, argv, &i, "--profile-grid", &grid)) {
    } else if (cli_value(argc, argv, &i, "--microbatches", &v)) {
      pipe.microbatches = (int)cli_int("--microbatches", v, 1, 65536);
    } else if (cli_value(argc, argv, &i, "--dp", &v)) {
      pipe.dp = (int)cli_int("--dp", v, 1, 65536);
    } else if (cli_value(argc, argv, &i, "--zero", &v)) {
      pipe.zero = (int)cli_int("--zero", v, 0, 1);
    } else if (cli_value(argc, argv, &i, "--tensor", &v)) {
      po.tensor = (int)cli_int("--tensor", v, 1, 1024);
    } else if (cli_value(argc, argv, &i, "--schedule", &v)) {
      if (!tp_schedule_parse(v, &pipe.kind))
        cli_usage_error("--schedule expects gpipe, 1f1b, zb or interleaved, got '%s'", v);
    } else if (cli_value(argc, argv, &i, "--chunks", &v)) {
      pipe.chunks = (int)cli_int("--chunks", v, 1, TP_SCHEDULE_MAX_CHUNKS);
    } else if (cli_value(argc, argv, &i, "--recompute", &v)) {
      po.recompute = cli_recompute(v);
    } else if (cli_value(argc, argv, &i, "--max-memory", &v)) {
      max_memory = cli_int("--max-memory", v, 1, INT64_MAX);
    } else if (cli_value(argc, argv, &i, "--seq", &v)) {
      dims.token_dims[1] = cli_int("--seq", v, 1, INT32_MAX);
    } else if (cli_value(argc, argv, &i, "--dim", &v)) {
      cli_add_dim(&dims, v);
    } else if (cli_load_option(argc, argv, &i, &dims)) {
    } else if (cli_value(argc, argv, &i, "--logits", &po.logits)) {
    } else if (cli_value(argc, argv, &i, "--freeze", &po.freeze)) {
      regex_t re;
      int err = regcomp(&re, po.freeze, REG_EXTENDED | REG_NOSUB);
      if (err) {
        char why[256];
        regerror(err, &re, why, sizeof why);
        cli_usage_error("--freeze: bad regular expression '%s': %s", po.freeze, why);
      }
      regfree(&re);
    } else if (cli_is(a, "-v") || cli_is(a, "--verbose")) {
      verbose = true;
    } else if (cli_is(a, "--forward-only")) {
      po.forward_only = true;
    } else if (cli_is(a, "--no-retie")) {
      po.no_retie = true;
    } else if (cli_value(argc, argv, &i, "--retie", &v)) {
      if (strcmp(v, "auto") == 0) po.no_retie = false;
      else if (strcmp(v, "data") == 0) po.no_retie = false; /* what auto does since external data is compared */
      else if (strcmp(v, "off") == 0) po.no_retie = true;
      else cli_usage_error("--retie takes auto, data or off, not '%s'", v);
    } else if (cli_is(a, "--no-fuse")) {
      po.no_fuse = true;
    } else if (cli_value(argc, argv, &i, "--slices", &slices)) {
      /* a count is checked against the sequence once the model is read */
      po.sliced = strcmp(slices, "auto") == 0 || strchr(slices, ',') ||
                  cli_int("--slices", slices, 1, INT32_MAX) > 1;
    } else if (cli_pass_option(argc, argv, &i, &po)) {
    } else if (a[0] == '-' && a[1]) {
      cli_usage_error("unknown option '%s'", a);
    } else if (input) {
      cli_usage_error("more than one input ('%s' and '%s')", input, a);
    } else {
      input = a;
    }
  }
  if (!input) cli_usage_error("no input model");
  const TpTarget *code_target = tp_target_find(target, NULL);
  if (precision && code_target->precision && !tp_target_find(target, precision))
    cli_usage_error("--precision expects %s with --target %s, got '%s'", tp_target_precisions(target), target,
                    precision);
  /* Both targets store in 16 bits what --precision names (fp32 masters, f32 compute); the
   * cuda target's bf16 also rounds the matrix products' operands to bf16. */
  if (precision && !tp_precision_parse(precision, &pipe.precision))
    cli_usage_error("--precision expects fp32, bf16 or fp16, got '%s'", precision);
  po.storage = pipe.precision == TP_PRECISION_BF16   ? TP_BF16
               : pipe.precision == TP_PRECISION_FP16 ? TP_F16
                                                     : TP_UNDEF;
  po.split_backward = pipe.kind == TP_SCHEDULE_ZB; /* its units run as backward-input and -weight */
  /* A device plan pads the LM head's vocabulary so each rank's logits row is a multiple of
   * 64 classes: 128 bytes in bf16, 256 in f32, so every row starts 16-byte aligned and
   * cuBLASLt can take its vectorised tensor-core paths for the head, its backward and the
   * loss (GPT-2's 50257 classes are 100514 bytes a bf16 row otherwise). */
  if (code_target->device) po.vocab_multiple = 64;
  if (!emit) emit = exe || (output && cli_ends_with(output, ".c")) ? "c" : "ir";
  if (exe && strcmp(emit, "c") != 0)
    cli_usage_error("--exe builds the C program; it cannot go with --emit=%s", emit);
  if (po.forward_only && po.recompute != TP_RECOMPUTE_NONE)
    cli_usage_error("--recompute %s recomputes in the backward: --forward-only has none",
                    tp_recompute_name(po.recompute));
  if (po.forward_only && strcmp(emit, "c") == 0)
    cli_usage_error("--forward-only has no loss to train: use it with --emit=ir, dot or memory");
  if (grid && strcmp(emit, "c") != 0)
    cli_usage_error("--profile-grid builds profiling units into the C program: use it with --exe or --emit=c");
  if (grid && strcmp(input, "-") == 0)
    cli_usage_error("--profile-grid compiles the model once per grid point: read it from a file, not stdin");
  if (grid && po.tensor > 1)
    cli_usage_error("--profile-grid cannot go with --tensor yet: its probes are compiled whole, without the "
                    "tensor split");
  /* interleaved: the layers cut into S x V virtual stages, V per rank */
  bool interleaved = pipe.kind == TP_SCHEDULE_INTERLEAVED;
  if (pipe.chunks && !interleaved)
    cli_usage_error("--chunks %d cuts each rank's layers into chunks for --schedule interleaved; the %s schedule "
                    "runs one stage per rank",
                    pipe.chunks, tp_schedule_name(pipe.kind));
  if (interleaved && pipe.chunks < 2)
    cli_usage_error("--schedule interleaved needs --chunks V, V >= 2: the virtual stages each rank runs%s",
                    pipe.chunks ? " (--chunks 1 is --schedule 1f1b)" : "");
  if (interleaved && po.nstages < 2)
    cli_usage_error("--schedule interleaved needs --stages S, S >= 2: it interleaves the chunks of several "
                    "ranks");
  if (interleaved && (int64_t)po.nstages * pipe.chunks > 1024)
    cli_usage_error("--stages %d x --chunks %d = %lld virtual stages: at most 1024", po.nstages, pipe.chunks,
                    (long long)po.nstages * pipe.chunks);
  if (interleaved && grid)
    cli_usage_error("--profile-grid cannot go with --schedule interleaved yet: its probes time whole stages");
  if (interleaved) po.nstages *= pipe.chunks, po.chunks = pipe.chunks;
  /* --batch is the step's: every microbatch of every replica gets an equal share of rows */
  int64_t units = (int64_t)pipe.dp * pipe.microbatches;
  if (batch && batch % units)
    cli_usage_error("--batch %lld is not divisible by --dp %d x --microbatches %d = %lld: every microbatch "
                    "of every replica needs the same number of rows",
                    (long long)batch, pipe.dp, pipe.microbatches, (long long)units);
  /* A symbolic batch takes the microbatch's rows at import; the rebatch pass gives them to
   * a model exported with a fixed batch (or to textual IR). */
  if (batch) dims.token_dims[0] = batch / units;
  dims.rebatch = true;

  po.batch = dims.token_dims[0];
  po.params_only = strcmp(emit, "params") == 0;
  const char *names[TP_MAX_PIPELINE];
  int n = tp_pipeline_passes(&po, names);

  if (exe) {
    TpDiag exe_diag;
    tp_diag_init(&exe_diag, cli_tool, NULL, stderr);
    if (code_target->device && !*TOKPIPE_CUDA_PLAN_LIBS) {
      tp_error(&exe_diag, "--exe: this tokpipec was built without the CUDA runtime (TOKPIPE_CUDA=OFF); write the "
                          "plan with -o plan.c and build it where tokpipe-cuda is installed");
      return cli_exit_code(TP_ERR_INPUT);
    }
    if (tp_check_writable(exe, "--exe", &exe_diag)) /* else the linker fails, as if tokpipec had */
      return cli_exit_code(TP_ERR_INPUT);
  }
  TpDiag d;
  tp_diag_init(&d, cli_tool, strcmp(input, "-") == 0 ? "<stdin>" : input, stderr);
  TpModule *m = NULL;
  char *text = NULL;
  int rc = cli_load_module(input, &dims, &m, &d);
  char note[256] = "";
  if (rc == TP_OK && !cli_ends_with(input, ".onnx")) {
    bool wanted[CLI_RESUME_COUNT] = {[CLI_RESUME_SHARD] = po.tensor > 1,
                                     [CLI_RESUME_LOSS] = !po.forward_only,
                                     [CLI_RESUME_SLICE] = po.sliced,
                                     [CLI_RESUME_STAGES] = po.nstages > 1,
                                     [CLI_RESUME_AUTODIFF] = !po.forward_only};
    wanted[CLI_RESUME_RECOMPUTE] = po.recompute != TP_RECOMPUTE_NONE;
    rc = cli_resume_after(m, names, &n, wanted, batch != 0, &d);
    if (rc == TP_OK && !code_target->precision) rc = stored_precision(m, precision, &pipe, &d);
  }
  if (rc == TP_OK) {
    if (slices && strcmp(slices, "auto") != 0) cli_set_slices(m, slices, &po);
    /* --slices auto: the passes up to split-sequence, the slicing, the rest; the sizes it
     * prices are read off the model before shard-tensor makes them one rank's */
    int first = n, shard = n;
    for (int i = 0; i < n && slices && strcmp(slices, "auto") == 0; i++) {
      if (strcmp(names[i], "split-sequence") == 0) first = i;
      if (strcmp(names[i], "shard-tensor") == 0) shard = i;
    }
    TpModelDesc whole, *described = NULL;
    rc = cli_run_pipeline(m, names, shard < first ? shard : first, &po, &d);
    if (rc == TP_OK && shard < first) {
      int tokens = tp_token_input(m);
      if (tokens >= 0 && tp_model_describe(m, m->values[tokens].type.dims[1], &whole)) described = &whole;
      rc = cli_run_pipeline(m, names + shard, first - shard, &po, &d);
    }
    if (rc == TP_OK && first < n) rc = auto_slices(m, &po, described, pipe.microbatches, note, sizeof note, &d);
    if (rc == TP_OK && first < n) rc = cli_run_pipeline(m, names + first, n - first, &po, &d);
  }
  /* --profile-grid: the model again per grid point, with the stage cuts it got */
  TpEmitOptions probes = {0};
  TpEmitProbe *list = NULL;
  TpModule **mods = NULL;
  int *cuts = NULL;
  if (rc == TP_OK && grid) {
    int tokens = tp_token_input(m);
    if (tokens < 0) cli_usage_error("--profile-grid: the model has no integer [batch, seq] token input to slice");
    int64_t T = m->values[tokens].type.dims[1], *gl = calloc(4096, sizeof *gl), *gc = calloc(4096, sizeof *gc);
    list = calloc(4096, sizeof *list);
    mods = calloc(4096, sizeof *mods);
    TP_ASSERT(gl && gc && list && mods);
    int npoints = profile_grid(grid, T, gl, gc), S;
    rc = stage_layout(&po, &S, &cuts, &d);
    probes = (TpEmitOptions){.nprobes = npoints, .probes = list, .stage_cuts = cuts};
    if (rc == TP_OK) rc = build_probes(input, &dims, m, &po, S, gl, gc, npoints, list, mods, &d);
    free(gl), free(gc);
  }
  probes.target = target;
  probes.precision = code_target->precision ? precision : NULL;
  probes.no_epilogues = po.no_fuse;
  if (rc == TP_OK) rc = render(m, emit, input, note, &pipe, max_memory, &probes, &text, &d);
  ParamsReport params = {m, po.freeze};
  if (rc == TP_OK && strcmp(emit, "params") == 0) rc = cli_write_output(output, write_params, &params, &d);
  if (rc == TP_OK && strcmp(emit, "ir") == 0) rc = cli_write_output(output, write_ir, m, &d);
  else if (rc == TP_OK && strcmp(emit, "dot") == 0) rc = cli_write_output(output, write_dot, m, &d);
  if (rc == TP_OK && text) {
    if (exe) rc = build_trainer(text, output, exe, code_target->device != NULL, verbose, &d);
    else rc = cli_write_output(output, write_text, text, &d);
  }
  free(text);
  for (int i = 0; i < probes.nprobes; i++) tp_module_free(mods[i]);
  free(mods), free(list);
  free(cuts);
  tp_module_free(m);
  cli_free_dims(&dims);
  return cli_exit_code(rc);
}
