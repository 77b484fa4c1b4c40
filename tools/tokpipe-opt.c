/* tokpipe-opt: runs a list of passes on an ONNX model or textual IR and prints the IR (like
 * mlir-opt), so every pass can be tested alone. The result is always verified. */
#include "cli.h"

#include <string.h>

static const char usage[] =
    "usage: tokpipe-opt FILE.onnx|FILE.tir [options]\n"
    "Reads an ONNX model or textual IR ('-' reads stdin), runs the passes and prints the IR.\n"
    "  --passes=a,b,c       the passes to run, in order (default: none)\n"
    "  --list-passes        print the registered passes\n"
    "  -o OUT               write OUT (atomically) instead of stdout\n"
    "  --dim NAME=VALUE     fix a symbolic input dimension of an ONNX model (repeatable)\n"
    CLI_PASS_OPTIONS_HELP
    "  --help, --version\n"
    "Exit codes: 0 ok, 1 bad input, 2 bad usage, 3 internal error.\n";

static void write_ir(const void *m, FILE *out) { tp_print_module(m, out); }

int main(int argc, char **argv) {
  cli_tool = "tokpipe-opt";
  const char *input = NULL, *passes = "", *output = NULL, *v;
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
  if (!input) cli_usage_error("no input (a .onnx or .tir file, or - for stdin)");
  int n = 0;
  char **names = *passes ? cli_split_list("--passes", passes, &n) : NULL;

  TpDiag d;
  tp_diag_init(&d, cli_tool, strcmp(input, "-") == 0 ? "<stdin>" : input, stderr);
  TpModule *m = NULL;
  int rc = cli_load_module(input, &dims, &m, &d);
  if (rc == TP_OK) rc = cli_run_pipeline(m, (const char *const *)names, n, &po, &d);
  if (rc == TP_OK) rc = cli_write_output(output, write_ir, m, &d);
  tp_module_free(m);
  cli_free_list(names);
  cli_free_dims(&dims);
  return cli_exit_code(rc);
}
