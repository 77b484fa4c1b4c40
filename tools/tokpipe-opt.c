/* tokpipe-opt: runs a list of passes on an ONNX model or textual IR and prints the IR (like
 * mlir-opt), so every pass can be tested alone. The result is always verified. --emit=c and
 * --emit=memory hand the result to the code generator instead, so codegen is testable on a
 * hand-written module too. */
#include "cli.h"

#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"

static const char usage[] =
    "usage: tokpipe-opt FILE.onnx|FILE.tir [options]\n"
    "Reads an ONNX model or textual IR ('-' reads stdin), runs the passes and prints the IR.\n"
    "  --passes=a,b,c       the passes to run, in order (default: none)\n"
    "  --list-passes        print the registered passes\n"
    "  --emit=ir|dot|c|memory  print the IR (default), a Graphviz graph, the C plan or the\n"
    "                       memory plan\n"
    "  -o OUT               write OUT (atomically) instead of stdout\n"
    "  --dim NAME=VALUE     fix a symbolic input dimension of an ONNX model (repeatable)\n" CLI_LOAD_OPTIONS_HELP
    "  --logits NAME        add-loss: the graph output holding the logits\n"
    "  --freeze REGEX       autodiff: params whose name matches (POSIX ERE) stay frozen\n"
    "  --batch B            rebatch: the rows the token input gets\n"
    "  --slices N|L1,L2,..  split-sequence: N near-equal token slices, or their lengths\n"
    "  --stages S           assign-stages: cut the layers into S pipeline stages\n"
    "  --stage-cuts A,B,..  assign-stages: stage k starts at layer cut k (default: balance FLOPs)\n"
    "  --tensor N           shard-tensor: split the products over N tensor-parallel ranks\n"
    "  --vocab-multiple M   shard-tensor: pad the LM head's vocabulary so each rank holds a\n"
    "                       multiple of M classes (tokpipec --target cuda: 64)\n"
    "  --recompute MODE     recompute: none (the default), selective or full\n" CLI_PASS_OPTIONS_HELP
    "  --help, --version\n"
    "Exit codes: 0 ok, 1 bad input, 2 bad usage, 3 internal error.\n";

static void write_ir(const void *m, FILE *out) { tp_print_module(m, out); }
static void write_dot(const void *m, FILE *out) { tp_print_dot(m, out); }
static void write_text(const void *text, FILE *out) { fputs(text, out); }

/* The C plan or the memory plan of m into a malloc'ed string. */
static int generate(const TpModule *m, bool c, char **text, TpDiag *d) {
  size_t len = 0;
  FILE *f = open_memstream(text, &len);
  TP_ASSERT(f);
  TpMemoryPlan plan;
  TpEmitOptions o = {.version = TOKPIPE_VERSION};
  int rc = c ? tp_emit_c(m, &o, f, d) : tp_plan_memory(m, NULL, &plan, d);
  if (rc == TP_OK && !c) {
    tp_print_memory(m, &plan, NULL, f);
    tp_memory_plan_free(&plan);
  }
  fclose(f);
  return rc;
}

int main(int argc, char **argv) {
  cli_tool = "tokpipe-opt";
  const char *input = NULL, *passes = "", *output = NULL, *emit = "ir", *slices = NULL, *v;
  CliDims dims = {0};
  TpPassOptions po = {0};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (cli_is(a, "--help") || cli_is(a, "-h")) {
      fputs(usage, stdout);
      return 0;
    } else if (cli_is(a, "--version")) {
      printf("tokpipe-opt %s\n", TOKPIPE_VERSION);
      return 0;
    } else if (cli_is(a, "--list-passes")) {
      for (const TpPassInfo *p = tp_pass_registry; p->name; p++) printf("%-16s %s\n", p->name, p->summary);
      return 0;
    } else if (cli_value(argc, argv, &i, "--passes", &passes)) {
    } else if (cli_value(argc, argv, &i, "--emit", &emit)) {
      if (strcmp(emit, "ir") && strcmp(emit, "dot") && strcmp(emit, "c") && strcmp(emit, "memory"))
        cli_usage_error("--emit expects ir, dot, c or memory, got '%s'", emit);
    } else if (cli_value(argc, argv, &i, "-o", &output)) {
    } else if (cli_value(argc, argv, &i, "--logits", &po.logits)) {
    } else if (cli_value(argc, argv, &i, "--freeze", &po.freeze)) {
    } else if (cli_value(argc, argv, &i, "--slices", &slices)) {
    } else if (cli_value(argc, argv, &i, "--batch", &v)) {
      po.batch = cli_int("--batch", v, 1, INT32_MAX);
    } else if (cli_value(argc, argv, &i, "--stages", &v)) {
      po.nstages = (int)cli_int("--stages", v, 1, 1024);
    } else if (cli_value(argc, argv, &i, "--tensor", &v)) {
      po.tensor = (int)cli_int("--tensor", v, 1, 1024);
    } else if (cli_value(argc, argv, &i, "--vocab-multiple", &v)) {
      po.vocab_multiple = (int)cli_int("--vocab-multiple", v, 1, 1 << 20);
    } else if (cli_value(argc, argv, &i, "--recompute", &v)) {
      po.recompute = cli_recompute(v);
    } else if (cli_value(argc, argv, &i, "--stage-cuts", &po.stage_cuts)) {
    } else if (cli_value(argc, argv, &i, "--dim", &v)) {
      cli_add_dim(&dims, v);
    } else if (cli_load_option(argc, argv, &i, &dims)) {
    } else if (cli_pass_option(argc, argv, &i, &po)) {
    } else if (a[0] == '-' && a[1]) {
      cli_usage_error("unknown option '%s'", a);
    } else if (input) {
      cli_usage_error("more than one input ('%s' and '%s')", input, a);
    } else {
      input = a;
    }
  }
  if (!input) cli_usage_error("no input (a .onnx or .tir file, or - for stdin)");
  int n = 0;
  char **names = *passes ? cli_split_list("--passes", passes, &n) : NULL;

  TpDiag d;
  tp_diag_init(&d, cli_tool, strcmp(input, "-") == 0 ? "<stdin>" : input, stderr);
  TpModule *m = NULL;
  int rc = cli_load_module(input, &dims, &m, &d);
  if (rc == TP_OK && slices) cli_set_slices(m, slices, &po);
  if (rc == TP_OK) rc = cli_run_pipeline(m, (const char *const *)names, n, &po, &d);
  char *text = NULL;
  if (rc == TP_OK && strcmp(emit, "ir") == 0) rc = cli_write_output(output, write_ir, m, &d);
  else if (rc == TP_OK && strcmp(emit, "dot") == 0) rc = cli_write_output(output, write_dot, m, &d);
  else if (rc == TP_OK) rc = generate(m, strcmp(emit, "c") == 0, &text, &d);
  if (rc == TP_OK && text) rc = cli_write_output(output, write_text, text, &d);
  free(text);
  tp_module_free(m);
  cli_free_list(names);
  cli_free_dims(&dims);
  return cli_exit_code(rc);
}
