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
#include "tokpipec_config.h" /* the C compiler, where the runtime is, what a plan links */

extern char **environ;

static const char usage[] =
    "usage: tokpipec MODEL.onnx|FILE.tir [options]\n"
    "Imports MODEL.onnx (or textual IR; '-' reads stdin), runs the training pipeline (raise\n"
    "the transformer, add the loss, differentiate) and writes the result.\n"
    "  --emit=ir|dot|memory|c  textual IR (the default), a Graphviz graph, the memory plan, or\n"
    "                       the C training program (the default when -o ends in .c)\n"
    "  -o OUT               write OUT (atomically) instead of stdout\n"
    "  --exe TRAINER        also compile the C program into the executable TRAINER\n"
    "  -v, --verbose        print the C compiler's command line\n"
    "  --batch B, --seq T   the token input's two dims (symbolic or not)\n"
    "  --dim NAME=VALUE     fix a symbolic input dimension (repeatable)\n"
    "  --logits NAME        the graph output the loss reads (default: the float [B, T, V] one)\n"
    "  --freeze REGEX       parameters whose ONNX names match (POSIX ERE) are not trained\n"
    "  --no-retie           keep duplicated weights separate (no re-tying)\n"
    "  --forward-only       stop before the loss: the raised forward module, to inspect\n"
    "                       with --emit=ir|dot|memory\n" CLI_PASS_OPTIONS_HELP
    "  --help, --version\n"
    "Exit codes: 0 ok, 1 bad input, 2 bad usage, 3 internal error.\n";

static void write_ir(const void *m, FILE *out) { tp_print_module(m, out); }
static void write_dot(const void *m, FILE *out) { tp_print_dot(m, out); }
static void write_text(const void *text, FILE *out) { fputs(text, out); }

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* The memory plan's report, or the C program, into a malloc'ed string. */
static int render(const TpModule *m, const char *emit, const char *model, char **text, TpDiag *d) {
  size_t len = 0;
  FILE *f = open_memstream(text, &len);
  TP_ASSERT(f);
  int rc = TP_OK;
  if (strcmp(emit, "memory") == 0) {
    TpMemoryPlan plan;
    rc = tp_plan_memory(m, &plan, d);
    if (rc == TP_OK) {
      tp_print_memory(m, &plan, f);
      tp_memory_plan_free(&plan);
    }
  } else {
    TpEmitOptions o = {.model = model, .version = TOKPIPE_VERSION};
    rc = tp_emit_c(m, &o, f, d);
  }
  fclose(f);
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

static int compile_trainer(const char *plan_c, const char *exe, bool verbose, TpDiag *d) {
  Args a = {0};
  push(&a, TOKPIPE_CC);
  push(&a, "-O2");
  runtime_flags(&a); /* -I and -L */
  push(&a, plan_c);
  push(&a, "-o");
  push(&a, exe);
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
    else rc = tp_internal(d, "the C compiler failed (%s %d): %s", WIFEXITED(status) ? "exit" : "signal",
                          WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), cmd);
    free(cmd);
  }
  for (int i = 0; i < a.n; i++) free(a.argv[i]);
  free(a.argv);
  return rc;
}

/* Writes the program to `output` (or a temporary next to the executable) and compiles it. */
static int build_trainer(const char *code, const char *output, const char *exe, bool verbose,
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
  if (rc == TP_OK) rc = compile_trainer(plan_c, exe, verbose, d);
  if (tmp) unlink(tmp);
  free(tmp);
  return rc;
}

int main(int argc, char **argv) {
  cli_tool = "tokpipec";
  const char *input = NULL, *emit = NULL, *output = NULL, *exe = NULL, *logits = NULL,
             *freeze = NULL, *v;
  bool retie = true, verbose = false, forward_only = false;
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
      if (strcmp(emit, "ir") && strcmp(emit, "dot") && strcmp(emit, "memory") && strcmp(emit, "c"))
        cli_usage_error("--emit expects ir, dot, memory or c, got '%s'", emit);
    } else if (cli_value(argc, argv, &i, "-o", &output)) {
    } else if (cli_value(argc, argv, &i, "--exe", &exe)) {
    } else if (cli_value(argc, argv, &i, "--batch", &v)) {
      dims.token_dims[0] = cli_int("--batch", v, 1, INT32_MAX);
    } else if (cli_value(argc, argv, &i, "--seq", &v)) {
      dims.token_dims[1] = cli_int("--seq", v, 1, INT32_MAX);
    } else if (cli_value(argc, argv, &i, "--dim", &v)) {
      cli_add_dim(&dims, v);
    } else if (cli_value(argc, argv, &i, "--logits", &logits)) {
    } else if (cli_value(argc, argv, &i, "--freeze", &freeze)) {
      regex_t re;
      int err = regcomp(&re, freeze, REG_EXTENDED | REG_NOSUB);
      if (err) {
        char why[256];
        regerror(err, &re, why, sizeof why);
        cli_usage_error("--freeze: bad regular expression '%s': %s", freeze, why);
      }
      regfree(&re);
    } else if (cli_is(a, "-v") || cli_is(a, "--verbose")) {
      verbose = true;
    } else if (cli_is(a, "--forward-only")) {
      forward_only = true;
    } else if (cli_is(a, "--no-retie")) {
      retie = false;
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
  if (!emit) emit = exe || (output && ends_with(output, ".c")) ? "c" : "ir";
  if (exe && strcmp(emit, "c") != 0) cli_usage_error("--exe builds the C program; it cannot go with --emit=%s", emit);
  if (forward_only && strcmp(emit, "c") == 0)
    cli_usage_error("--forward-only has no loss to train: use it with --emit=ir, dot or memory");

  /* The default pipeline, less retie-params under --no-retie, less the loss and the
   * gradients under --forward-only. */
  const char *names[64];
  int n = 0;
  for (int i = 0; tp_default_pipeline[i]; i++) {
    const char *p = tp_default_pipeline[i];
    TP_ASSERT(n < 64);
    if (!retie && strcmp(p, "retie-params") == 0) continue;
    if (forward_only && (strcmp(p, "add-loss") == 0 || strcmp(p, "autodiff") == 0)) continue;
    names[n++] = p;
  }

  TpDiag d;
  tp_diag_init(&d, cli_tool, strcmp(input, "-") == 0 ? "<stdin>" : input, stderr);
  TpModule *m = NULL;
  char *text = NULL;
  int rc = cli_load_module(input, &dims, &m, &d);
  if (rc == TP_OK) {
    m->logits_name = logits;
    m->freeze = freeze;
    rc = cli_run_pipeline(m, names, n, &po, &d);
  }
  if (rc == TP_OK) {
    if (strcmp(emit, "ir") == 0) rc = cli_write_output(output, write_ir, m, &d);
    else if (strcmp(emit, "dot") == 0) rc = cli_write_output(output, write_dot, m, &d);
    else rc = render(m, emit, input, &text, &d);
  }
  if (rc == TP_OK && text) {
    if (exe) rc = build_trainer(text, output, exe, verbose, &d);
    else rc = cli_write_output(output, write_text, text, &d);
  }
  free(text);
  tp_module_free(m);
  cli_free_dims(&dims);
  return cli_exit_code(rc);
}
