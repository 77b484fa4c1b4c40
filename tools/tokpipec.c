/* tokpipec: the user-facing compiler. Imports an ONNX model (or reads textual IR), runs
 * the default pass pipeline and emits the IR or a Graphviz graph of it. */
#include "cli.h"

#include <string.h>

static const char usage[] =
    "usage: tokpipec MODEL.onnx|FILE.tir [options]\n"
    "Imports MODEL.onnx (or textual IR; '-' reads stdin), runs the default pipeline and\n"
    "writes the result.\n"
    "  --emit=ir|dot        textual IR (default) or a Graphviz graph\n"
    "  -o OUT               write OUT (atomically) instead of stdout\n"
    "  --dim NAME=VALUE     fix a symbolic input dimension (repeatable)\n" CLI_PASS_OPTIONS_HELP
    "  --help, --version\n"
    "Exit codes: 0 ok, 1 bad input, 2 bad usage, 3 internal error.\n";

static void write_ir(const void *m, FILE *out) { tp_print_module(m, out); }
static void write_dot(const void *m, FILE *out) { tp_print_dot(m, out); }

int main(int argc, char **argv) {
  cli_tool = "tokpipec";
  const char *input = NULL, *emit = "ir", *output = NULL, *v;
  CliDims dims = {0};
  TpPassOptions po = {0};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (cli_is(a, "--help") || cli_is(a, "-h")) {
      fputs(usage, stdout);
      return 0;
    } else if (cli_is(a, "--version")) {
      printf("tokpipec %s\n", TOKPIPE_VERSION);
      return 0;
    } else if (cli_value(argc, argv, &i, "--emit", &emit)) {
      if (strcmp(emit, "ir") != 0 && strcmp(emit, "dot") != 0)
        cli_usage_error("--emit expects ir or dot, got '%s'", emit);
    } else if (cli_value(argc, argv, &i, "-o", &output)) {
    } else if (cli_value(argc, argv, &i, "--dim", &v)) {
      cli_add_dim(&dims, v);
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

  TpDiag d;
  tp_diag_init(&d, cli_tool, strcmp(input, "-") == 0 ? "<stdin>" : input, stderr);
  TpModule *m = NULL;
  int n = 0;
  while (tp_default_pipeline[n]) n++;
  int rc = cli_load_module(input, &dims, &m, &d);
  if (rc == TP_OK) rc = cli_run_pipeline(m, tp_default_pipeline, n, &po, &d);
  if (rc == TP_OK) rc = cli_write_output(output, strcmp(emit, "dot") == 0 ? write_dot : write_ir, m, &d);
  tp_module_free(m);
  cli_free_dims(&dims);
  return cli_exit_code(rc);
}
