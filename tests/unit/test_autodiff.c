/* Gradients of passes/autodiff.c checked numerically: small modules per differentiable op
 * (and chains that reuse a value, broadcast, split and concatenate), differentiated, run by
 * the reference interpreter and compared with central finite differences of the loss. Also
 * the textual round trip of the differentiated modules, add-loss, --freeze and the errors.
 *
 * Loss: CrossEntropy where the case has logits, else sum(out * W) with a fixed random W, so
 * that every element of `out` gets a different, nonzero gradient.
 * Tolerance (f32 throughout): central differences with step EPS = 1e-2 of an f32 loss
 * carry a rounding error near 1e-7 |L| / EPS and a truncation error near EPS^2 |f'''| / 6,
 * together about 1e-4 for these sizes; a gradient passes when
 *   max |fd - ad| <= TOL * max(1, max |ad|), TOL = 2e-3,
 * which a wrong sign, factor, transpose or missing contribution (errors of order 1) cannot.
 *
 * The GPT fixtures (tests/fixtures/<name>, with PyTorch's loss and gradients in
 * train/grads.safetensors) are imported, raised, re-tied, given a loss, differentiated and
 * run by the interpreter on train/train.bin's first batch: the loss must be within 1e-5
 * relative and every parameter gradient within 1e-4 of PyTorch's relative to that tensor's
 * largest magnitude (the parity bound of tests/parity), and a few entries are checked by finite
 * differences as above. */
#include "frontend/frontend.h"
#include "ir/ir.h"
#include "interp/interp.h"

#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_SAMPLES = 48 };
static const double EPS = 1e-2, TOL = 2e-3;

static int failures;
static double worst_err; /* the largest relative error any case saw (reported at the end) */
#define CHECK(cond)                                                                                                 \
  do {                                                                                                              \
    if (!(cond)) {                                                                                                  \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);                                      \
      failures++;                                                                                                   \
    }                                                                                                               \
  } while (0)

/* ---- building small modules ---- */

typedef struct {
  TpModule *m;
  TpDiag d;
  uint64_t rng;
  int names;
  void *input_data[8]; /* per graph input */
  TpPassOptions opt;   /* what the passes are asked (--freeze, --logits) */
} Case;

static double uniform(Case *c, double lo, double hi) {
  c->rng ^= c->rng << 13, c->rng ^= c->rng >> 7, c->rng ^= c->rng << 17;
  return lo + (hi - lo) * (double)(c->rng >> 11) / (double)(1ull << 53);
}

#define DIMS(...)                                                                                                   \
  (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]) { __VA_ARGS__ }
static TpType f32t(int rank, const int64_t *dims) { return tp_type_make(TP_F32, rank, dims); }

static Case begin_case(uint64_t seed) {
  Case c = {.m = tp_module_new("unit"), .rng = seed * 2654435761u + 1};
  tp_diag_init(&c.d, "test_autodiff", "unit", stderr);
  c.m->opset = 17;
  return c;
}

static void end_case(Case *c) {
  for (int i = 0; i < 8; i++) free(c->input_data[i]);
  tp_module_free(c->m);
}

/* A float PARAM (or CONST) with uniform random values in [lo, hi). */
static int data_value(Case *c, const char *name, TpValueKind kind, TpType t, double lo, double hi) {
  int64_t n = tp_type_numel(&t);
  float *x = malloc((size_t)(n ? n : 1) * sizeof *x);
  for (int64_t i = 0; i < n; i++) x[i] = (float)uniform(c, lo, hi);
  int blob = tp_add_owned_blob(c->m, x, (size_t)n * sizeof *x);
  free(x);
  return tp_add_data_value(c->m, name, kind, t, blob, 0, (TpOrigin){0});
}
static int param(Case *c, const char *name, TpType t) { return data_value(c, name, TP_VAL_PARAM, t, -1, 1); }
static int positive(Case *c, const char *name, TpType t) { return data_value(c, name, TP_VAL_PARAM, t, 0.5, 2); }

/* An i64 CONST with random values in [0, hi). */
static int ids(Case *c, const char *name, int rank, const int64_t *dims, int64_t hi) {
  TpType t = tp_type_make(TP_I64, rank, dims);
  int64_t n = tp_type_numel(&t), *x = malloc((size_t)(n ? n : 1) * sizeof *x);
  for (int64_t i = 0; i < n; i++) x[i] = (int64_t)uniform(c, 0, (double)hi) % hi;
  int v = tp_add_const(c->m, name, t, x, (TpOrigin){0});
  free(x);
  return v;
}

/* op(in...) with attributes set between mk() and fin(); fin() infers and returns result 0. */
static int mk(Case *c, TpOpKind kind, const int *in, int nin, int nout) {
  const char *names[8];
  char buf[8][32];
  for (int i = 0; i < nout; i++) snprintf(buf[i], sizeof buf[i], "v%d", c->names++), names[i] = buf[i];
  char node[32];
  snprintf(node, sizeof node, "/n%d", c->names);
  return tp_add_op(c->m, kind, in, nin, names, nout, (TpOrigin){node, tp_op_info[kind].name});
}
static int fin(Case *c, int op, const TpType *preset) {
  int r = c->m->ops[op].outputs[0];
  if (preset) c->m->values[r].type = *preset;
  CHECK(tp_infer_op(c->m, op, &c->d) == TP_OK);
  return r;
}
#define IN(...) (int[]){__VA_ARGS__}, (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int))
static int un(Case *c, TpOpKind k, int x) { return fin(c, mk(c, k, &x, 1, 1), NULL); }
static int bin(Case *c, TpOpKind k, int x, int y) { return fin(c, mk(c, k, IN(x, y), 1), NULL); }
static int preset1(Case *c, TpOpKind k, int x, TpType t) { return fin(c, mk(c, k, &x, 1, 1), &t); }

/* loss = sum(out * W), W random and constant. */
static int weighted_sum(Case *c, int out) {
  TpType t = c->m->values[out].type;
  int w = data_value(c, "loss.weights", TP_VAL_CONST, t, -1, 1);
  int prod = bin(c, TP_OP_Mul, out, w);
  if (t.rank == 0) return prod;
  int64_t axes[TP_MAX_RANK];
  for (int i = 0; i < t.rank; i++) axes[i] = i;
  int op = mk(c, TP_OP_ReduceSum, &prod, 1, 1);
  tp_set_attr_ints(c->m, op, "axes", axes, t.rank);
  tp_set_attr_int(c->m, op, "keepdims", 0);
  return fin(c, op, NULL);
}

/* ---- running and checking ---- */

static float run_loss(Case *c, TpTensor *outs) {
  TpTensor in[8];
  for (int i = 0; i < c->m->ninputs; i++) {
    in[i] = tp_value_tensor(c->m, c->m->inputs[i]);
    in[i].data = c->input_data[i];
  }
  int rc = tp_interp_run(c->m, in, outs, &c->d);
  CHECK(rc == TP_OK);
  if (rc != TP_OK) return NAN;
  return *(const float *)outs[0].data;
}

static void free_outs(TpTensor *outs, int n) {
  for (int i = 0; i < n; i++) free(outs[i].data);
}

/* print(parse(print(m))) == print(m) for the differentiated module. */
static void check_roundtrip(Case *c, const char *label) {
  char *a = NULL, *b = NULL;
  size_t na = 0, nb = 0;
  FILE *f = open_memstream(&a, &na);
  tp_print_module(c->m, f);
  fclose(f);
  TpModule *back = NULL;
  CHECK(tp_parse_module(a, na, label, &back, &c->d) == TP_OK);
  if (back) {
    f = open_memstream(&b, &nb);
    tp_print_module(back, f);
    fclose(f);
    CHECK(na == nb && memcmp(a, b, na) == 0);
    CHECK(tp_verify(back, &c->d) == TP_OK);
    tp_module_free(back);
  }
  free(a);
  free(b);
}

/* Differentiates c->m (loss set), then compares every gradient with finite differences.
 * Returns the number of params that got a gradient. */
static int check_grads(Case *c, const char *label) {
  TpModule *m = c->m;
  m->noutputs = 0; /* the interpreter computes the loss and the gradients only */
  tp_add_output(m, m->loss);
  if (pass_autodiff(m, &c->opt, &c->d) != TP_OK) {
    fprintf(stderr, "%s: autodiff failed\n", label);
    failures++;
    return 0;
  }
  int params[32], np = 0;
  for (int v = 0; v < m->nvalues; v++)
    if (tp_grad_of(m, v) >= 0) {
      TP_ASSERT(np < 32);
      params[np++] = v;
      tp_add_output(m, tp_grad_of(m, v));
    }
  CHECK(tp_verify(m, &c->d) == TP_OK);
  check_roundtrip(c, label);

  TpTensor outs[40];
  float loss = run_loss(c, outs);
  if (isnan(loss)) return np;
  for (int k = 0; k < np; k++) {
    int p = params[k];
    float *x = (float *)tp_value_data(m, p);
    const float *ad = outs[1 + k].data;
    int64_t n = tp_type_numel(&m->values[p].type), step = n > MAX_SAMPLES ? n / MAX_SAMPLES : 1;
    double max_ad = 0, max_err = 0;
    int64_t at = 0;
    float fd_at = 0;
    for (int64_t i = 0; i < n; i++) max_ad = fmax(max_ad, fabs(ad[i]));
    for (int64_t i = 0; i < n; i += step) {
      float saved = x[i];
      TpTensor o[40];
      x[i] = (float)(saved + EPS);
      float up = run_loss(c, o);
      free_outs(o, 1 + np);
      x[i] = (float)(saved - EPS);
      float down = run_loss(c, o);
      free_outs(o, 1 + np);
      x[i] = saved;
      float fd = (float)(((double)up - down) / (2 * EPS));
      double err = fabs(fd - ad[i]);
      if (!(err <= max_err)) max_err = err, at = i, fd_at = fd; /* a NaN counts as the worst */
    }
    double rel = max_err / fmax(1, max_ad);
    if (rel > worst_err) worst_err = rel;
    if (!(rel <= TOL)) {
      fprintf(stderr,
              "%s: gradient of %%%s: max_abs_err=%.3g at [%lld] (autodiff %.6g, finite difference %.6g, max |grad| "
              "%.3g)\n",
              label, m->values[p].name, max_err, (long long)at, ad[at], fd_at, max_ad);
      failures++;
    }
  }
  free_outs(outs, 1 + np);
  return np;
}

/* The common case: one output `out` of the forward ops, loss = sum(out * W). */
static int check_out(Case *c, const char *label, int out) {
  c->m->loss = weighted_sum(c, out);
  return check_grads(c, label);
}

/* ---- cases: primitives ---- */

static void test_elementwise(void) {
  static const TpOpKind unary[] = {TP_OP_Sqrt, TP_OP_Neg,  TP_OP_Reciprocal, TP_OP_Exp, TP_OP_Log,
                                   TP_OP_Erf,  TP_OP_Tanh, TP_OP_Sigmoid,    TP_OP_Sin, TP_OP_Cos};
  for (size_t i = 0; i < sizeof unary / sizeof unary[0]; i++) {
    Case c = begin_case(i);
    int x = positive(&c, "x", f32t(DIMS(2, 3)));
    char label[64];
    snprintf(label, sizeof label, "unary %s", tp_op_info[unary[i]].name);
    CHECK(check_out(&c, label, un(&c, unary[i], x)) == 1);
    end_case(&c);
  }
  static const TpOpKind binary[] = {TP_OP_Add, TP_OP_Sub, TP_OP_Mul, TP_OP_Div, TP_OP_Pow};
  for (size_t i = 0; i < sizeof binary / sizeof binary[0]; i++) {
    /* broadcasting both ways: [2, 1, 4] op [3, 1] -> [2, 3, 4] */
    Case c = begin_case(10 + i);
    int a = positive(&c, "a", f32t(DIMS(2, 1, 4))), b = positive(&c, "b", f32t(DIMS(3, 1)));
    char label[64];
    snprintf(label, sizeof label, "binary %s with broadcasting", tp_op_info[binary[i]].name);
    CHECK(check_out(&c, label, bin(&c, binary[i], a, b)) == 2);
    end_case(&c);
  }
  { /* Relu away from its kink; Where picking from both sides */
    Case c = begin_case(20);
    int x = data_value(&c, "x", TP_VAL_PARAM, f32t(DIMS(4, 5)), 0.1, 1);
    /* about half the elements below zero, none within EPS of it */
    int mixed = bin(&c, TP_OP_Mul, x, data_value(&c, "sign", TP_VAL_CONST, f32t(DIMS(5)), -1, 1));
    int r = un(&c, TP_OP_Relu, mixed);
    bool cond[4 * 5];
    for (int i = 0; i < 20; i++) cond[i] = i % 3 == 0;
    int cv = tp_add_const(c.m, "cond", tp_type_make(TP_BOOL, 2, (int64_t[]){4, 5}), cond, (TpOrigin){0});
    int y = param(&c, "y", f32t(DIMS(5)));
    int w = fin(&c, mk(&c, TP_OP_Where, IN(cv, r, y), 1), NULL);
    CHECK(check_out(&c, "Relu, Where", w) == 2);
    end_case(&c);
  }
  for (int i = 0; i < 2; i++) { /* Max, Min with broadcasting, each side chosen somewhere */
    TpOpKind kind = i ? TP_OP_Min : TP_OP_Max;
    Case c = begin_case(24 + i);
    /* a * sign is in +-[0.5, 1], b in [-0.25, 0.25]: never within EPS of each other */
    int a = data_value(&c, "a", TP_VAL_PARAM, f32t(DIMS(2, 1, 4)), 0.5, 1);
    float sign[4] = {1, -1, 1, -1};
    int s = tp_add_const(c.m, "sign", f32t(DIMS(4)), sign, (TpOrigin){0});
    int b = data_value(&c, "b", TP_VAL_PARAM, f32t(DIMS(3, 1)), -0.25, 0.25);
    char label[64];
    snprintf(label, sizeof label, "binary %s with broadcasting", tp_op_info[kind].name);
    CHECK(check_out(&c, label, bin(&c, kind, bin(&c, TP_OP_Mul, a, s), b)) == 2);
    end_case(&c);
    /* a tie everywhere: each side gets half of dy (as torch.maximum), together all of it */
    c = begin_case(26 + i);
    int x = param(&c, "x", f32t(DIMS(3, 4)));
    snprintf(label, sizeof label, "%s(x, x): ties split the gradient", tp_op_info[kind].name);
    CHECK(check_out(&c, label, bin(&c, kind, x, x)) == 1);
    end_case(&c);
  }
  { /* Pow by constants 2 and 3 (the LayerNorm and tanh-GELU chains) */
    Case c = begin_case(21);
    int x = param(&c, "x", f32t(DIMS(3, 4)));
    float two = 2, three = 3;
    int k2 = tp_add_const(c.m, "two", f32t(0, NULL), &two, (TpOrigin){0});
    int k3 = tp_add_const(c.m, "three", f32t(0, NULL), &three, (TpOrigin){0});
    int y = bin(&c, TP_OP_Add, bin(&c, TP_OP_Pow, x, k2), bin(&c, TP_OP_Pow, x, k3));
    CHECK(check_out(&c, "Pow by constants", y) == 1);
    end_case(&c);
  }
  { /* a value used three times, once twice by the same op: contributions summed */
    Case c = begin_case(22);
    int x = param(&c, "x", f32t(DIMS(3, 4)));
    int sq = bin(&c, TP_OP_Mul, x, x);
    int y = bin(&c, TP_OP_Sub, un(&c, TP_OP_Tanh, x), sq);
    CHECK(check_out(&c, "reuse", y) == 1);
    CHECK(tp_find_value(c.m, "x.grad.2") >= 0 && tp_find_value(c.m, "x.grad") == tp_grad_of(c.m, x));
    end_case(&c);
  }
  { /* Cast f32 -> f64 -> f32 */
    Case c = begin_case(23);
    int x = param(&c, "x", f32t(DIMS(6)));
    int wide = preset1(&c, TP_OP_Cast, x, tp_type_make(TP_F64, 1, (int64_t[]){6}));
    int back = preset1(&c, TP_OP_Cast, wide, f32t(DIMS(6)));
    CHECK(check_out(&c, "Cast", un(&c, TP_OP_Tanh, back)) == 1);
    end_case(&c);
  }
}

static void test_layout(void) {
  { /* Reshape, Transpose, Expand */
    Case c = begin_case(30);
    int x = param(&c, "x", f32t(DIMS(2, 6)));
    int r = preset1(&c, TP_OP_Reshape, x, f32t(DIMS(2, 3, 2)));
    int op = mk(&c, TP_OP_Transpose, &r, 1, 1);
    tp_set_attr_ints(c.m, op, "perm", (int64_t[]){2, 0, 1}, 3);
    int t = fin(&c, op, NULL);
    int b = param(&c, "b", f32t(DIMS(2, 1, 3)));
    int e = preset1(&c, TP_OP_Expand, b, f32t(DIMS(2, 2, 3)));
    CHECK(check_out(&c, "Reshape, Transpose, Expand", bin(&c, TP_OP_Mul, t, e)) == 2);
    end_case(&c);
  }
  { /* Split with one result unused (zeros in its place), then Concat in another order */
    Case c = begin_case(31);
    int x = param(&c, "x", f32t(DIMS(2, 7)));
    int op = mk(&c, TP_OP_Split, &x, 1, 3);
    tp_set_attr_int(c.m, op, "axis", 1);
    for (int i = 0; i < 3; i++) c.m->values[c.m->ops[op].outputs[i]].type = f32t(DIMS(2, i == 1 ? 3 : 2));
    fin(&c, op, NULL);
    int s0 = c.m->ops[op].outputs[0], s2 = c.m->ops[op].outputs[2];
    int y = param(&c, "y", f32t(DIMS(2, 1)));
    op = mk(&c, TP_OP_Concat, IN(s2, y, s0), 1);
    tp_set_attr_int(c.m, op, "axis", 1);
    CHECK(check_out(&c, "Split, Concat", un(&c, TP_OP_Exp, fin(&c, op, NULL))) == 2);
    end_case(&c);
  }
  { /* Slice with a step, Gather on axis 1, Trilu */
    Case c = begin_case(32);
    int x = param(&c, "x", f32t(DIMS(4, 6)));
    int op = mk(&c, TP_OP_Slice, &x, 1, 1);
    tp_set_attr_ints(c.m, op, "starts", (int64_t[]){1, 0}, 2);
    tp_set_attr_ints(c.m, op, "steps", (int64_t[]){1, 2}, 2);
    int s = fin(&c, op, &(TpType){.dtype = TP_F32, .rank = 2, .dims = {3, 3}});
    int idx = ids(&c, "idx", DIMS(5), 3);
    op = mk(&c, TP_OP_Gather, IN(s, idx), 1);
    tp_set_attr_int(c.m, op, "axis", 1);
    int g = fin(&c, op, NULL);
    op = mk(&c, TP_OP_Trilu, &g, 1, 1);
    tp_set_attr_int(c.m, op, "upper", 0);
    CHECK(check_out(&c, "Slice, Gather, Trilu", fin(&c, op, NULL)) == 1);
    end_case(&c);
  }
  { /* ReduceMean keepdims = 0 and ReduceSum keepdims = 1 */
    Case c = begin_case(33);
    int x = param(&c, "x", f32t(DIMS(2, 3, 4)));
    int op = mk(&c, TP_OP_ReduceMean, &x, 1, 1);
    tp_set_attr_ints(c.m, op, "axes", (int64_t[]){0, 2}, 2);
    tp_set_attr_int(c.m, op, "keepdims", 0);
    int mean = fin(&c, op, NULL);
    op = mk(&c, TP_OP_ReduceSum, &x, 1, 1);
    tp_set_attr_ints(c.m, op, "axes", (int64_t[]){1}, 1);
    tp_set_attr_int(c.m, op, "keepdims", 1);
    int sum = fin(&c, op, NULL); /* [2, 1, 4] */
    int t = bin(&c, TP_OP_Mul, sum, un(&c, TP_OP_Tanh, x));
    op = mk(&c, TP_OP_ReduceSum, &t, 1, 1);
    tp_set_attr_ints(c.m, op, "axes", (int64_t[]){0, 2}, 2);
    tp_set_attr_int(c.m, op, "keepdims", 0);
    int y = bin(&c, TP_OP_Mul, fin(&c, op, NULL), mean);
    CHECK(check_out(&c, "ReduceMean, ReduceSum", y) == 1);
    end_case(&c);
  }
  { /* the rotary-table ops: Tile (two dims repeated), GatherElements with repeated and
       negative indices and fewer rows than the data, CumSum exclusive and reversed */
    Case c = begin_case(34);
    int x = param(&c, "x", f32t(DIMS(2, 3)));
    int op = mk(&c, TP_OP_Tile, &x, 1, 1);
    tp_set_attr_ints(c.m, op, "repeats", (int64_t[]){2, 3}, 2);
    int tiled = fin(&c, op, NULL); /* [4, 9] */
    int64_t pick[3 * 9];
    for (int i = 0; i < 27; i++) pick[i] = (i * 5 % 7) - 3; /* in [-3, 3], repeats within columns */
    int idx = tp_add_const(c.m, "pick", tp_type_make(TP_I64, 2, (int64_t[]){3, 9}), pick, (TpOrigin){0});
    op = mk(&c, TP_OP_GatherElements, IN(tiled, idx), 1);
    tp_set_attr_int(c.m, op, "axis", 0);
    int g = fin(&c, op, NULL); /* [3, 9] */
    op = mk(&c, TP_OP_CumSum, &g, 1, 1);
    tp_set_attr_int(c.m, op, "axis", 1);
    tp_set_attr_int(c.m, op, "exclusive", 1);
    tp_set_attr_int(c.m, op, "reverse", 1);
    int cs = fin(&c, op, NULL);
    op = mk(&c, TP_OP_CumSum, &cs, 1, 1);
    tp_set_attr_int(c.m, op, "axis", 0);
    CHECK(check_out(&c, "Tile, GatherElements, CumSum", fin(&c, op, NULL)) == 1);
    end_case(&c);
  }
}

static void test_products(void) {
  { /* MatMul: batched times matrix, and a broadcast batch on the right */
    Case c = begin_case(40);
    int a = param(&c, "a", f32t(DIMS(2, 3, 4))), b = param(&c, "b", f32t(DIMS(4, 5)));
    int d = param(&c, "d", f32t(DIMS(3, 2, 5, 2)));
    int ab = bin(&c, TP_OP_MatMul, a, b);                              /* [2, 3, 5] */
    CHECK(check_out(&c, "MatMul", bin(&c, TP_OP_MatMul, ab, d)) == 3); /* [3, 2, 3, 2] */
    end_case(&c);
  }
  for (int form = 0; form < 4; form++) { /* Gemm, every transA/transB, alpha, beta, C [N] */
    Case c = begin_case(41 + form);
    bool ta = form & 1, tb = form & 2;
    int a = param(&c, "a", ta ? f32t(DIMS(4, 3)) : f32t(DIMS(3, 4)));
    int b = param(&c, "b", tb ? f32t(DIMS(5, 4)) : f32t(DIMS(4, 5)));
    int bias = param(&c, "c", f32t(DIMS(5)));
    int op = mk(&c, TP_OP_Gemm, IN(a, b, bias), 1);
    tp_set_attr_int(c.m, op, "transA", ta);
    tp_set_attr_int(c.m, op, "transB", tb);
    tp_set_attr_float(c.m, op, "alpha", 0.5);
    tp_set_attr_float(c.m, op, "beta", 2);
    char label[64];
    snprintf(label, sizeof label, "Gemm transA=%d transB=%d", ta, tb);
    CHECK(check_out(&c, label, fin(&c, op, NULL)) == 3);
    end_case(&c);
  }
  for (int tw = 0; tw < 2; tw++) { /* Linear with bias, both weight layouts */
    Case c = begin_case(45 + tw);
    int x = param(&c, "x", f32t(DIMS(2, 3, 4)));
    int w = param(&c, "w", tw ? f32t(DIMS(5, 4)) : f32t(DIMS(4, 5))), b = param(&c, "b", f32t(DIMS(5)));
    int op = mk(&c, TP_OP_Linear, IN(x, w, b), 1);
    if (tw) tp_set_attr_int(c.m, op, "transpose_w", 1);
    CHECK(check_out(&c, tw ? "Linear transpose_w" : "Linear", fin(&c, op, NULL)) == 3);
    end_case(&c);
  }
  { /* Linear without bias whose input is constant: dX computed, not given */
    Case c = begin_case(47);
    int x = data_value(&c, "x", TP_VAL_CONST, f32t(DIMS(3, 4)), -1, 1);
    int w = param(&c, "w", f32t(DIMS(4, 2)));
    CHECK(check_out(&c, "Linear, constant input", fin(&c, mk(&c, TP_OP_Linear, IN(x, w), 1), NULL)) == 1);
    end_case(&c);
  }
}

static void test_nn(void) {
  { /* LayerNorm (the stats results added by autodiff), Gelu both forms, Softmax, LogSoftmax */
    Case c = begin_case(50);
    int x = param(&c, "x", f32t(DIMS(2, 3, 8)));
    int s = positive(&c, "scale", f32t(DIMS(8))), b = param(&c, "bias", f32t(DIMS(8)));
    int op = mk(&c, TP_OP_LayerNorm, IN(x, s, b), 1);
    tp_set_attr_int(c.m, op, "axis", 2);
    tp_set_attr_float(c.m, op, "epsilon", 1e-5);
    int ln = fin(&c, op, NULL);
    op = mk(&c, TP_OP_Gelu, &ln, 1, 1);
    int g = fin(&c, op, NULL);
    op = mk(&c, TP_OP_Gelu, &ln, 1, 1);
    tp_set_attr_string(c.m, op, "approximate", "tanh");
    int gt = fin(&c, op, NULL);
    op = mk(&c, TP_OP_Softmax, &g, 1, 1);
    tp_set_attr_int(c.m, op, "axis", 2);
    int sm = fin(&c, op, NULL);
    op = mk(&c, TP_OP_LogSoftmax, &gt, 1, 1);
    tp_set_attr_int(c.m, op, "axis", 1);
    int lsm = fin(&c, op, NULL);
    CHECK(check_out(&c, "LayerNorm, Gelu, Softmax, LogSoftmax", bin(&c, TP_OP_Add, sm, lsm)) == 3);
    CHECK(c.m->ops[op - 4].noutputs == 3 && c.m->ops[op - 4].outputs[2] >= 0); /* InvStdDev added */
    end_case(&c);
  }
  for (int packed = 0; packed < 2; packed++) { /* causal Attention, 4-D heads and 3-D packed */
    Case c = begin_case(51 + packed);
    TpType t = packed ? f32t(DIMS(2, 5, 8)) : f32t(DIMS(2, 2, 5, 4));
    int q = param(&c, "q", t), k = param(&c, "k", t), v = param(&c, "v", t);
    int op = mk(&c, TP_OP_Attention, IN(q, k, v), 1);
    tp_set_attr_int(c.m, op, "is_causal", 1);
    if (packed) {
      tp_set_attr_int(c.m, op, "q_num_heads", 2);
      tp_set_attr_int(c.m, op, "kv_num_heads", 2);
    }
    CHECK(check_out(&c, packed ? "Attention 3-D" : "Attention 4-D", fin(&c, op, NULL)) == 3);
    end_case(&c);
  }
  for (int packed = 0; packed < 2; packed++) { /* causal Attention with a window and a bias, grouped K/V */
    Case c = begin_case(80 + packed);
    TpType tq = packed ? f32t(DIMS(2, 6, 8)) : f32t(DIMS(2, 4, 6, 2)),
           tk = packed ? f32t(DIMS(2, 6, 4)) : f32t(DIMS(2, 2, 6, 2));
    int q = param(&c, "q", tq), k = param(&c, "k", tk), v = param(&c, "v", tk);
    /* ALiBi-like [1, 4, 1, 6] (4-D), a relative bias [1, 4, 6, 6] (3-D): constants */
    int bias = data_value(&c, "bias", TP_VAL_CONST, packed ? f32t(DIMS(1, 4, 6, 6)) : f32t(DIMS(1, 4, 1, 6)), -2, 2);
    int op = mk(&c, TP_OP_Attention, IN(q, k, v, bias), 1);
    tp_set_attr_int(c.m, op, "is_causal", 1);
    tp_set_attr_int(c.m, op, "window", packed ? 2 : 3);
    if (packed) {
      tp_set_attr_int(c.m, op, "q_num_heads", 4);
      tp_set_attr_int(c.m, op, "kv_num_heads", 2);
    }
    CHECK(check_out(&c, packed ? "Attention 3-D window 2 bias" : "Attention 4-D window 3 ALiBi",
                    fin(&c, op, NULL)) == 3);
    end_case(&c);
  }
  { /* Embedding with a repeated id, Linear head, CrossEntropy: the add-loss path */
    Case c = begin_case(53);
    int64_t bt[2] = {2, 3};
    TpType idt = tp_type_make(TP_I64, 2, bt);
    idt.dimnames[0] = "batch", idt.dimnames[1] = "seq";
    int idx = tp_add_value(c.m, "idx", TP_VAL_INPUT, idt, (TpOrigin){0});
    tp_add_input(c.m, idx);
    int64_t *ids_data = malloc(6 * sizeof *ids_data);
    for (int i = 0; i < 6; i++) ids_data[i] = (i * 3) % 5;
    c.input_data[0] = ids_data;
    int wte = param(&c, "wte", f32t(DIMS(7, 4))), head = param(&c, "head", f32t(DIMS(7, 4)));
    int e = fin(&c, mk(&c, TP_OP_Embedding, IN(wte, idx), 1), NULL);
    int op = mk(&c, TP_OP_Linear, IN(e, head), 1);
    tp_set_attr_int(c.m, op, "transpose_w", 1);
    int logits = fin(&c, op, NULL);
    tp_add_output(c.m, logits);
    CHECK(pass_add_loss(c.m, &c.opt, &c.d) == TP_OK && c.m->loss >= 0 && c.m->ninputs == 2);
    const TpType *tt = &c.m->values[c.m->inputs[1]].type;
    CHECK(tt->dtype == TP_I64 && tt->dims[1] == 3 && tt->dimnames[1] && strcmp(tt->dimnames[1], "seq") == 0);
    CHECK(tp_attr_float(c.m, c.m->nops - 1, "denominator", 0) == 6);
    int64_t *targets = malloc(6 * sizeof *targets);
    for (int i = 0; i < 6; i++) targets[i] = (i * 5 + 1) % 7;
    c.input_data[1] = targets;
    CHECK(check_grads(&c, "Embedding, Linear, CrossEntropy (add-loss)") == 2);
    end_case(&c);
  }
  for (int rank = 2; rank <= 3; rank++) { /* the model's own SoftmaxCrossEntropyLoss */
    Case c = begin_case(54 + rank);
    int x = param(&c, "scores", rank == 2 ? f32t(DIMS(4, 5)) : f32t(DIMS(2, 5, 3)));
    int labels = rank == 2 ? ids(&c, "labels", DIMS(4), 5) : ids(&c, "labels", DIMS(2, 3), 5);
    int op = mk(&c, TP_OP_SoftmaxCrossEntropyLoss, IN(x, labels), 1);
    tp_set_attr_string(c.m, op, "reduction", "mean");
    tp_set_attr_int(c.m, op, "ignore_index", -100);
    int loss = fin(&c, op, NULL);
    tp_add_output(c.m, loss);
    CHECK(pass_add_loss(c.m, &c.opt, &c.d) == TP_OK && c.m->loss == loss && c.m->ninputs == 0);
    CHECK(check_grads(&c, rank == 2 ? "SoftmaxCrossEntropyLoss 2-D" : "SoftmaxCrossEntropyLoss 3-D") == 1);
    end_case(&c);
  }
  { /* LogSoftmax + NegativeLogLikelihoodLoss (sum) */
    Case c = begin_case(58);
    int x = param(&c, "x", f32t(DIMS(3, 4, 2)));
    int op = mk(&c, TP_OP_LogSoftmax, &x, 1, 1);
    tp_set_attr_int(c.m, op, "axis", 1);
    int lp = fin(&c, op, NULL);
    int labels = ids(&c, "labels", DIMS(3, 2), 4);
    op = mk(&c, TP_OP_NegativeLogLikelihoodLoss, IN(lp, labels), 1);
    tp_set_attr_string(c.m, op, "reduction", "sum");
    c.m->loss = fin(&c, op, NULL);
    CHECK(check_grads(&c, "LogSoftmax, NegativeLogLikelihoodLoss") == 1);
    end_case(&c);
  }
}

/* ---- names, freezing, errors ---- */

static void test_freeze_and_errors(void) {
  { /* --freeze: matching params get no gradient, the others do */
    Case c = begin_case(60);
    int w = param(&c, "h.0.w", f32t(DIMS(3, 3))), ln = param(&c, "h.0.ln.weight", f32t(DIMS(3)));
    c.opt.freeze = "ln\\.";
    CHECK(check_out(&c, "freeze", bin(&c, TP_OP_Mul, un(&c, TP_OP_Tanh, w), ln)) == 1);
    CHECK(tp_grad_of(c.m, w) >= 0 && tp_grad_of(c.m, ln) < 0);
    CHECK(strcmp(c.m->values[tp_grad_of(c.m, w)].name, "h.0.w.grad") == 0);
    end_case(&c);
  }
  { /* a bad regex; every param frozen */
    Case c = begin_case(61);
    int w = param(&c, "w", f32t(DIMS(3)));
    c.m->loss = weighted_sum(&c, un(&c, TP_OP_Exp, w));
    TpDiag d;
    tp_diag_init(&d, "test", "m.onnx", NULL);
    c.opt.freeze = "(";
    CHECK(pass_autodiff(c.m, &c.opt, &d) == TP_ERR_INPUT && strstr(d.last, "bad --freeze regex '('"));
    c.opt.freeze = "^w$";
    CHECK(pass_autodiff(c.m, &c.opt, &d) == TP_ERR_INPUT &&
          strstr(d.last, "does not depend on any trainable parameter"));
    end_case(&c);
  }
  { /* no backward: Attention with a trained mask */
    Case c = begin_case(62);
    TpType t = f32t(DIMS(1, 1, 3, 2));
    int q = param(&c, "q", t), mask = param(&c, "mask", f32t(DIMS(3, 3)));
    int op = mk(&c, TP_OP_Attention, IN(q, q, q, mask), 1);
    c.m->loss = weighted_sum(&c, fin(&c, op, NULL));
    TpDiag d;
    tp_diag_init(&d, "test", "m.onnx", NULL);
    CHECK(pass_autodiff(c.m, &c.opt, &d) == TP_ERR_INPUT);
    CHECK(strstr(d.last,
                 "m.onnx: node '/n1' (Attention, opset 17): cannot differentiate op Attention at node '/n1': "
                 "the attention mask would need a gradient") == d.last);
    end_case(&c);
  }
  { /* autodiff without a loss */
    Case c = begin_case(63);
    TpDiag d;
    tp_diag_init(&d, "test", NULL, NULL);
    CHECK(pass_autodiff(c.m, &c.opt, &d) == TP_ERR_INPUT && strstr(d.last, "run add-loss first"));
    end_case(&c);
  }
}

static void test_add_loss_errors(void) {
  TpDiag d;
  tp_diag_init(&d, "test", "m.onnx", NULL);
  Case c = begin_case(70);
  int a = param(&c, "a", f32t(DIMS(2, 3, 5)));
  int x = un(&c, TP_OP_Exp, a);
  int y = un(&c, TP_OP_Tanh, a);
  int flat = preset1(&c, TP_OP_Reshape, a, f32t(DIMS(6, 5)));
  tp_add_output(c.m, flat);
  CHECK(pass_add_loss(c.m, &c.opt, &d) == TP_ERR_INPUT);
  CHECK(strcmp(d.last,
               "m.onnx: cannot find the logits: no graph output is a float [B, T, V] tensor; pass --logits NAME") ==
        0);
  tp_add_output(c.m, x);
  tp_add_output(c.m, y);
  CHECK(pass_add_loss(c.m, &c.opt, &d) == TP_ERR_INPUT &&
        strstr(d.last, "outputs 'v0' and 'v1' are both float [B, T, V] tensors; pass --logits NAME"));
  c.opt.logits = "nope";
  CHECK(pass_add_loss(c.m, &c.opt, &d) == TP_ERR_INPUT && strstr(d.last, "no graph output is named 'nope'"));
  c.opt.logits = "v2";
  CHECK(pass_add_loss(c.m, &c.opt, &d) == TP_ERR_INPUT &&
        strstr(d.last, "the logits 'v2' must be a float [B, T, V] tensor, not f32[6, 5]"));
  c.opt.logits = "v1";
  CHECK(pass_add_loss(c.m, &c.opt, &d) == TP_OK && c.m->loss >= 0);
  int op = c.m->values[c.m->loss].def;
  CHECK(c.m->ops[op].kind == TP_OP_CrossEntropy && c.m->ops[op].inputs[0] == y);
  CHECK(strcmp(c.m->values[c.m->inputs[0]].name, "targets") == 0);
  end_case(&c);
}

/* ---- whole GPT fixtures against PyTorch ---- */

static char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)len + 1);
  *n = fread(buf, 1, (size_t)len, f);
  buf[*n] = 0;
  fclose(f);
  return buf;
}

/* safetensors: u64 header length, JSON header, data. The F32 tensor `name`, or NULL. */
static const float *st_tensor(const char *st, size_t n, const char *name, int64_t *numel) {
  uint64_t hlen;
  memcpy(&hlen, st, 8);
  char key[512];
  snprintf(key, sizeof key, "\"%s\":{", name);
  const char *at = strstr(st + 8, key), *end = st + 8 + hlen;
  if (!at || at >= end) return NULL;
  const char *close = strchr(at + strlen(key), '}'), *offs = strstr(at, "\"data_offsets\":[");
  if (!close || !offs || offs > close || !strstr(at, "\"F32\"")) return NULL;
  long long a, b;
  if (sscanf(offs + strlen("\"data_offsets\":["), "%lld,%lld", &a, &b) != 2 || 8 + hlen + (uint64_t)b > n)
    return NULL;
  *numel = (b - a) / 4;
  return (const float *)(st + 8 + hlen + a);
}

/* A "__metadata__" string value of the safetensors header, as a number. */
static double st_meta(const char *st, const char *key) {
  char k[64];
  snprintf(k, sizeof k, "\"%s\":\"", key);
  const char *at = strstr(st + 8, k);
  return at ? atof(at + strlen(k)) : NAN;
}

static void test_gpt_fixture(const char *dir, const char *name, bool raise) {
  char path[1400];
  size_t nst, ntok;
  snprintf(path, sizeof path, "%s/train/grads.safetensors", dir);
  char *st = slurp(path, &nst);
  snprintf(path, sizeof path, "%s/train/train.bin", dir);
  char *tok = slurp(path, &ntok);
  if (!st || !tok) {
    free(st), free(tok);
    return;
  }
  int64_t B = (int64_t)st_meta(st, "batch"), T = (int64_t)st_meta(st, "seq");
  double ref_loss = st_meta(st, "loss");
  int32_t header[3];
  memcpy(header, tok, sizeof header);
  CHECK(header[0] == 20240520 && header[1] == 1 && header[2] > B * T && ntok >= 1024 + 2 * (size_t)header[2]);

  Case c = begin_case(99);
  TpImportOptions o = {.token_dims = {B, T}};
  snprintf(path, sizeof path, "%s/model.onnx", dir);
  tp_module_free(c.m);
  c.m = NULL;
  CHECK(tp_import_onnx_file(path, &o, &c.m, &c.d) == TP_OK);
  const char *all[] = {"fold-constants", "dce", "raise-transformer", "retie-params", "dce", "add-loss",
                       "autodiff",       "dce"};
  const char *passes[8];
  int npasses = 0;
  for (int i = 0; i < 8; i++) /* the raise helper's passes where they exist */
    if (tp_find_pass(all[i]) && (raise || strcmp(all[i], "raise-transformer") != 0)) passes[npasses++] = all[i];
  TpPassOptions po = {.verify_each = true};
  if (!c.m || tp_run_passes(c.m, passes, npasses, &po, &c.d) != TP_OK) {
    fprintf(stderr, "%s: import or passes failed\n", name);
    failures++;
    free(st), free(tok);
    end_case(&c);
    return;
  }
  TpModule *m = c.m;
  /* inputs: the tokens and the targets, the same shifted by one */
  const uint16_t *tokens = (const uint16_t *)(tok + 1024);
  for (int i = 0; i < m->ninputs && i < 8; i++) {
    const TpValue *v = &m->values[m->inputs[i]];
    bool targets = strcmp(v->name, "targets") == 0;
    CHECK(tp_type_numel(&v->type) == B * T && (v->type.dtype == TP_I64 || v->type.dtype == TP_I32));
    c.input_data[i] = malloc((size_t)(B * T) * 8);
    for (int64_t k = 0; k < B * T; k++) {
      int64_t id = tokens[k + targets];
      if (v->type.dtype == TP_I64) ((int64_t *)c.input_data[i])[k] = id;
      else ((int32_t *)c.input_data[i])[k] = (int32_t)id;
    }
  }
  m->noutputs = 0;
  tp_add_output(m, m->loss);
  int params[64], np = 0;
  for (int v = 0; v < m->nvalues && np < 64; v++)
    if (tp_grad_of(m, v) >= 0) params[np++] = v, tp_add_output(m, tp_grad_of(m, v));
  TpTensor outs[80];
  float loss = run_loss(&c, outs);
  if (isnan(loss)) {
    free(st), free(tok);
    end_case(&c);
    return;
  }
  double loss_err = fabs(loss - ref_loss) / fabs(ref_loss), worst = 0;
  CHECK(loss_err <= 1e-5);
  int compared = 0;
  const char *worst_name = "";
  for (int k = 0; k < np; k++) {
    int64_t n = 0;
    const float *ref = st_tensor(st, nst, m->values[params[k]].name, &n);
    const float *ad = outs[1 + k].data;
    if (!ref || n != tp_type_numel(&m->values[params[k]].type)) {
      fprintf(stderr, "%s: no PyTorch gradient for %%%s\n", name, m->values[params[k]].name);
      failures++;
      continue;
    }
    double max_ref = 0, max_err = 0;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) max_ref = fmax(max_ref, fabs(ref[i]));
    for (int64_t i = 0; i < n; i++) /* a NaN counts as the worst */
      if (!(fabs(ad[i] - ref[i]) <= max_err)) max_err = fabs(ad[i] - ref[i]), at = i;
    double rel = max_err / fmax(max_ref, 1e-30);
    if (rel > worst) worst = rel, worst_name = m->values[params[k]].name;
    if (!(rel <= 1e-4)) {
      fprintf(stderr,
              "%s: gradient of %%%s: max_abs_err=%.3g at [%lld] (autodiff %.7g, PyTorch %.7g, max |grad| %.3g)\n",
              name, m->values[params[k]].name, max_err, (long long)at, ad[at], ref[at], max_ref);
      failures++;
    }
    compared++;
  }
  /* finite differences on the largest entry of the first, a middle and the last param */
  double worst_fd = 0;
  for (int pick = 0; pick < 3 && np; pick++) {
    int k = pick == 0 ? 0 : pick == 1 ? np / 2 : np - 1, p = params[k];
    const float *ad = outs[1 + k].data;
    int64_t n = tp_type_numel(&m->values[p].type), at = 0;
    double max_ad = 0;
    for (int64_t i = 0; i < n; i++)
      if (fabs(ad[i]) > max_ad) max_ad = fabs(ad[i]), at = i;
    float *x = (float *)tp_value_data(m, p); /* a mapped model file is read-only: copy it */
    if (m->values[p].blob >= 0 && !m->blobs[m->values[p].blob].owned) {
      size_t bytes = (size_t)n * sizeof(float);
      m->values[p].blob = tp_add_owned_blob(m, x, bytes);
      m->values[p].offset = 0;
      x = (float *)tp_value_data(m, p);
    }
    float saved = x[at];
    TpTensor o2[80];
    x[at] = (float)(saved + EPS);
    float up = run_loss(&c, o2);
    free_outs(o2, 1 + np);
    x[at] = (float)(saved - EPS);
    float down = run_loss(&c, o2);
    free_outs(o2, 1 + np);
    x[at] = saved;
    double fd = ((double)up - down) / (2 * EPS), rel = fabs(fd - ad[at]) / fmax(1, max_ad);
    worst_fd = fmax(worst_fd, rel);
    if (!(rel <= 10 * TOL)) {
      fprintf(stderr, "%s: finite difference of %%%s[%lld]: %.6g, autodiff %.6g\n", name, m->values[p].name,
              (long long)at, fd, ad[at]);
      failures++;
    }
  }
  printf("%s%s: loss %.7g (PyTorch %.7g, rel err %.2g); %d gradients, worst %.2g of max |grad| (%s); finite "
         "differences %.2g\n",
         name, raise ? "" : " (primitives)", loss, ref_loss, loss_err, compared, worst, worst_name, worst_fd);
  free_outs(outs, 1 + np);
  free(st), free(tok);
  end_case(&c);
}

static void test_gpt_fixtures(void) {
  char root[1024];
  snprintf(root, sizeof root, "%s", __FILE__);
  char *slash = strrchr(root, '/');
  if (!slash) return;
  snprintf(slash, sizeof root - (size_t)(slash - root), "/../fixtures");
  DIR *dir = opendir(root);
  if (!dir) {
    printf("test_autodiff: no fixtures at %s, GPT checks skipped\n", root);
    return;
  }
  char *names[64];
  int n = 0;
  for (struct dirent *e; (e = readdir(dir)) && n < 64;)
    if (strncmp(e->d_name, "gpt_", 4) == 0) names[n++] = strdup(e->d_name);
  closedir(dir);
  for (int i = 0; i < n; i++) /* in name order, so the log reads the same every run */
    for (int j = i + 1; j < n; j++)
      if (strcmp(names[j], names[i]) < 0) {
        char *t = names[i];
        names[i] = names[j], names[j] = t;
      }
  for (int i = 0; i < n; i++) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", root, names[i]);
    test_gpt_fixture(path, names[i], true);
    test_gpt_fixture(path, names[i], false); /* every primitive's rule, unraised */
    free(names[i]);
  }
}

int main(void) {
  test_elementwise();
  test_layout();
  test_products();
  test_nn();
  test_freeze_and_errors();
  test_add_loss_errors();
  test_gpt_fixtures();
  printf("test_autodiff: largest gradient error %.3g of max(1, max |grad|) (tolerance %.0e, step %.0e)\n", worst_err,
         TOL, EPS);
  if (failures) {
    fprintf(stderr, "test_autodiff: %d failures\n", failures);
    return 1;
  }
  printf("test_autodiff: ok\n");
  return 0;
}
