/* Graphviz output: one box per op (op name and result types), an ellipse per graph input,
 * a note per parameter, a plain node per constant, a double circle per graph output, and
 * an edge from each operand's producer labelled with the value name. Node ids are value
 * and op indices, so the output is deterministic. */
#include "ir.h"

/* A DOT string literal body: '"' and '\\' escaped, control bytes dropped. */
static void dot_text(FILE *out, const char *s) {
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') fputc('\\', out);
    if ((unsigned char)*s >= 0x20) fputc(*s, out);
  }
}

static void dot_type(FILE *out, const TpType *t) {
  char buf[512];
  dot_text(out, tp_type_str(t, buf, sizeof buf));
}

/* The node an operand comes from: its op, or the value itself if it is not a result. */
static void dot_source(FILE *out, const TpModule *m, int v) {
  if (m->values[v].kind == TP_VAL_RESULT) fprintf(out, "op%d", m->values[v].def);
  else fprintf(out, "v%d", v);
}

void tp_print_dot(const TpModule *m, FILE *out) {
  fputs("digraph tokpipe {\n  rankdir=TB;\n  node [fontname=\"monospace\", fontsize=10];\n", out);
  for (int v = 0; v < m->nvalues; v++) {
    const TpValue *val = &m->values[v];
    const char *shape;
    switch (val->kind) {
    case TP_VAL_INPUT: shape = "ellipse, style=filled, fillcolor=lightblue"; break;
    case TP_VAL_PARAM: shape = "note, style=filled, fillcolor=lightyellow"; break;
    case TP_VAL_CONST: shape = "plaintext"; break;
    default: continue;
    }
    fprintf(out, "  v%d [shape=%s, label=\"", v, shape);
    dot_text(out, val->name);
    fputs("\\n", out);
    dot_type(out, &val->type);
    fputs("\"];\n", out);
  }
  for (int o = 0; o < m->nops; o++) {
    const TpOp *op = &m->ops[o];
    fprintf(out, "  op%d [shape=box, label=\"%s", o, tp_op_info[op->kind].name);
    for (int i = 0; i < op->noutputs; i++) {
      fputs("\\n", out);
      if (op->outputs[i] < 0) fputs("none", out);
      else dot_type(out, &m->values[op->outputs[i]].type);
    }
    fputs("\"];\n", out);
    for (int i = 0; i < op->ninputs; i++) {
      int v = op->inputs[i];
      if (v < 0) continue;
      fputs("  ", out);
      dot_source(out, m, v);
      fprintf(out, " -> op%d [label=\"", o);
      dot_text(out, m->values[v].name);
      fputs("\"];\n", out);
    }
  }
  for (int i = 0; i < m->noutputs; i++) {
    int v = m->outputs[i];
    fprintf(out, "  out%d [shape=doublecircle, label=\"", i);
    dot_text(out, m->values[v].name);
    fputs("\"];\n  ", out);
    dot_source(out, m, v);
    fprintf(out, " -> out%d;\n", i);
  }
  fputs("}\n", out);
}
