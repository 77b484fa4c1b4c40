/* Unit tests of retie-params and raise-transformer on hand-written IR: every export form
 * (including those the fixtures lack) raises to the expected ops, every near miss stays
 * primitive, and in all cases the module computes the same outputs before and after the
 * passes (reference interpreter, random inputs): the passes must never change numerics. */
#include "ir/ir.h"
#include "interp/interp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int failures;
#define CHECK(cond)                                                                                                 \
  do {                                                                                                              \
    if (!(cond)) {                                                                                                  \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);                                      \
      failures++;                                                                                                   \
    }                                                                                                               \
  } while (0)

typedef struct {
  const char *name;
  const char *ir;     /* the module, without its "tir 1 opset 17" line */
  const char *expect; /* "Op=N ..." op counts after the passes */
} Case;

/* The masks exporters write over T = 4 keys, and the scalars around them. */
#define MASKS                                                                                                       \
  "const %half : f32[] = dense<0.5>\n"                                                                              \
  "const %ninf : f32[] = dense<-inf>\n"                                                                             \
  "const %min : f32[] = dense<-3.4028235e+38>\n"                                                                    \
  "const %lower : bool[4, 4] = dense<[true, false, false, false, true, true, false, false, "                        \
  "true, true, true, false, true, true, true, true]>\n"                                                             \
  "const %upper : bool[1, 1, 4, 4] = dense<[false, true, true, true, false, false, true, "                          \
  "true, false, false, false, true, false, false, false, false]>\n"

/* Attention operands [B=1, H=2, T=4, D=3]. */
#define HEADS                                                                                                       \
  "input %q : f32[1, 2, 4, 3]\n"                                                                                    \
  "input %k : f32[1, 2, 4, 3]\n"                                                                                    \
  "input %v : f32[1, 2, 4, 3]\n"                                                                                    \
  "const %two : f32[1] = dense<2>\n" MASKS                                                                          \
  "const %additive : f32[4, 4] = dense<[0, -inf, -inf, -inf, 0, 0, -inf, -inf, 0, 0, 0, "                           \
  "-inf, 0, 0, 0, 0]>\n"
#define SCORES                                                                                                      \
  "%kt : f32[1, 2, 3, 4] = Transpose(%k) {perm = [0, 1, 3, 2]}\n"                                                   \
  "%s : f32[1, 2, 4, 4] = MatMul(%q, %kt)\n"
#define ATTEND(mask)                                                                                                \
  "%p : f32[1, 2, 4, 4] = Softmax(" mask ") {axis = 3}\n"                                                           \
  "%y : f32[1, 2, 4, 3] = MatMul(%p, %v)\n"                                                                         \
  "output %y\n"

/* Attention operands [B=2, H=2, T=4, D=3], masks with a batch dim, and the 3-D (baddbmm)
 * form of the products with a bias [B*H, 1, T]: 0, or ALiBi's slope (0.5, 0.25 per head)
 * times the key position. */
#define BATCH2                                                                                                      \
  "input %q : f32[2, 2, 4, 3]\n"                                                                                    \
  "input %k : f32[2, 2, 4, 3]\n"                                                                                    \
  "input %v : f32[2, 2, 4, 3]\n"                                                                                    \
  "const %two : f32[] = dense<2>\n" MASKS                                                                           \
  "const %folded : f32[2, 1, 4, 4] = dense<[0, -3.4028235e+38, -3.4028235e+38, -3.4028235e+38, "                    \
  "0, 0, -3.4028235e+38, -3.4028235e+38, 0, 0, 0, -3.4028235e+38, 0, 0, 0, 0, "                                     \
  "0, -3.4028235e+38, -3.4028235e+38, -3.4028235e+38, 0, 0, -3.4028235e+38, -3.4028235e+38, "                       \
  "0, 0, 0, -3.4028235e+38, 0, 0, 0, 0]>\n"                                                                         \
  "const %band : bool[4, 4] = dense<[true, false, false, false, true, true, false, false, "                         \
  "false, true, true, false, false, false, true, true]>\n"                                                          \
  "const %off_band : bool[4, 4] = dense<[true, false, false, false, true, true, false, false, "                     \
  "false, true, false, false, false, false, true, true]>\n"                                                         \
  "const %padding : f32[2, 1, 1, 4] = dense<0>\n"                                                                   \
  "const %padded : f32[2, 1, 1, 4] = dense<[0, 0, 0, 0, -3.4028235e+38, 0, 0, 0]>\n"                                \
  "const %zeros : f32[4, 1, 4] = dense<0>\n"                                                                        \
  "const %alibi : f32[4, 1, 4] = dense<[0, 0.5, 1, 1.5, 0, 0.25, 0.5, 0.75, 0, 0.5, 1, 1.5, "                       \
  "0, 0.25, 0.5, 0.75]>\n"
#define BMM(bias)                                                                                                   \
  "%q3 : f32[4, 4, 3] = Reshape(%q)\n"                                                                              \
  "%kt4 : f32[2, 2, 3, 4] = Transpose(%k) {perm = [0, 1, 3, 2]}\n"                                                  \
  "%kt3 : f32[4, 3, 4] = Reshape(%kt4)\n"                                                                           \
  "%v3 : f32[4, 4, 3] = Reshape(%v)\n"                                                                              \
  "%s : f32[4, 4, 4] = MatMul(%q3, %kt3)\n"                                                                         \
  "%sa : f32[4, 4, 4] = Mul(%s, %half)\n"                                                                           \
  "%sb : f32[4, 4, 4] = Add(%sa, " bias ")\n"                                                                       \
  "%s4 : f32[2, 2, 4, 4] = Reshape(%sb)\n"                                                                          \
  "%m : f32[2, 2, 4, 4] = Where(%upper, %min, %s4)\n"                                                               \
  "%p : f32[2, 2, 4, 4] = Softmax(%m) {axis = 3}\n"                                                                 \
  "%p3 : f32[4, 4, 4] = Reshape(%p)\n"                                                                              \
  "%y3 : f32[4, 4, 3] = MatMul(%p3, %v3)\n"                                                                         \
  "%y : f32[2, 2, 4, 3] = Reshape(%y3)\n"

/* Query rows [B=1, T=4, H*D = 2*3] over one K/V head [1, 4, 3], the heads inside the
 * queries: scores [1, T*H, T] and [1, T, H, T], masked by [T, 1, T] (or [T, H, T]). */
#define INNER(keep)                                                                                                 \
  "input %x : f32[1, 4, 6]\n"                                                                                       \
  "input %kv : f32[1, 4, 3]\n"                                                                                      \
  "input %vv : f32[1, 4, 3]\n" MASKS                                                                                \
  "const %keep_inner : bool[4, 1, 4] = dense<[true, false, false, false, true, true, false, "                       \
  "false, true, true, true, false, true, true, true, true]>\n"                                                      \
  "const %keep_wrong : bool[4, 2, 4] = dense<[true, false, false, false, true, false, false, "                      \
  "false, true, true, false, false, true, true, false, false, true, true, true, false, "                            \
  "true, true, true, true, true, true, true, true, true, true, true, true]>\n"                                      \
  "%q3 : f32[1, 8, 3] = Reshape(%x)\n"                                                                              \
  "%kt : f32[1, 3, 4] = Transpose(%kv) {perm = [0, 2, 1]}\n"                                                        \
  "%s : f32[1, 8, 4] = MatMul(%q3, %kt)\n"                                                                          \
  "%ss : f32[1, 8, 4] = Mul(%s, %half)\n"                                                                           \
  "%s4 : f32[1, 4, 2, 4] = Reshape(%ss)\n"                                                                          \
  "%m : f32[1, 4, 2, 4] = Where(" keep ", %s4, %min)\n"                                                             \
  "%p : f32[1, 4, 2, 4] = Softmax(%m) {axis = 3}\n"                                                                 \
  "%p3 : f32[1, 8, 4] = Reshape(%p)\n"                                                                              \
  "%y3 : f32[1, 8, 3] = MatMul(%p3, %vv)\n"                                                                         \
  "%y : f32[1, 4, 6] = Reshape(%y3)\n"                                                                              \
  "output %y\n"

/* Two query heads over one K/V head [1, 1, 4, 3]. */
#define GROUPED                                                                                                     \
  "input %q : f32[1, 2, 4, 3]\n"                                                                                    \
  "input %kh : f32[1, 1, 4, 3]\n"                                                                                   \
  "input %vh : f32[1, 1, 4, 3]\n" MASKS

/* x [2, 3, 4] normalised over its last axis; the chain up to n = (x - mean) / sqrt(var + eps). */
#define LN_INPUTS                                                                                                   \
  "input %x : f32[2, 3, 4]\n"                                                                                       \
  "param %g : f32[4] = dense<[-0.521, -0.195, -0.807, 0.936]>\n"                                                    \
  "param %b : f32[4] = dense<[-0.57, 0.344, -0.399, 0.748]>\n"                                                      \
  "const %two : f32[] = dense<2>\n"                                                                                 \
  "const %three : f32[] = dense<3>\n"                                                                               \
  "const %eps : f32[] = dense<1e-05>\n"
#define LN_CHAIN(square, axis, stat)                                                                                \
  "%mu : f32" stat " = ReduceMean(%x) {axes = [" axis "], keepdims = 1}\n"                                          \
  "%d : f32[2, 3, 4] = Sub(%x, %mu)\n"                                                                              \
  "%sq : f32[2, 3, 4] = " square "\n"                                                                               \
  "%var : f32" stat " = ReduceMean(%sq) {axes = [" axis "], keepdims = 1}\n"                                        \
  "%ve : f32" stat " = Add(%eps, %var)\n"                                                                           \
  "%sd : f32" stat " = Sqrt(%ve)\n"                                                                                 \
  "%n : f32[2, 3, 4] = Div(%d, %sd)\n"

#define GELU_INPUTS                                                                                                 \
  "input %x : f32[2, 5]\n"                                                                                          \
  "const %one : f32[] = dense<1>\n"                                                                                 \
  "const %half : f32[] = dense<0.5>\n"                                                                              \
  "const %three : f32[] = dense<3>\n"                                                                               \
  "const %sqrt2 : f32[] = dense<1.4142135>\n"                                                                       \
  "const %rsqrt2 : f32[] = dense<0.70710677>\n"                                                                     \
  "const %k : f32[] = dense<0.044715>\n"                                                                            \
  "const %c : f32[] = dense<0.7978846>\n"
#define TANH_CHAIN(coef)                                                                                            \
  "%x3 : f32[2, 5] = Pow(%x, %three)\n"                                                                             \
  "%kx3 : f32[2, 5] = Mul(%x3, " coef ")\n"                                                                         \
  "%in : f32[2, 5] = Add(%x, %kx3)\n"                                                                               \
  "%z : f32[2, 5] = Mul(%in, %c)\n"                                                                                 \
  "%t : f32[2, 5] = Tanh(%z)\n"                                                                                     \
  "%u : f32[2, 5] = Add(%t, %one)\n"                                                                                \
  "%xu : f32[2, 5] = Mul(%x, %u)\n"                                                                                 \
  "%y : f32[2, 5] = Mul(%xu, %half)\n"                                                                              \
  "output %y\n"

#define W45                                                                                                         \
  "dense<[0.25, 0.794, 0.551, -0.55, -0.4, 0.747, -0.989, 0.642, 0.594, -0.064, -0.394, "                           \
  "-0.443, -0.49, -0.11, 0.009, 0.107, 0.991, 0.585, 0.244, 0.978]>"
#define W54                                                                                                         \
  "dense<[0.484, -0.817, 0.082, 0.016, 0.743, -0.277, 0.196, -0.881, -0.225, -0.354, "                              \
  "-0.7, 0.633, -0.241, 0.957, 0.18, 0.21, 0.276, 0.353, -0.698, -0.119]>"
#define B5 "dense<[-0.569, -0.68, 0.225, -0.912, -0.929]>"
#define TABLE                                                                                                       \
  "dense<[0.324, -0.737, 0.69, 0.89, 0.808, 0.139, -0.709, -0.615, 0.856, 0.105, "                                  \
  "-0.639, 0.768, 0.283, 0.139, -0.247, -0.178, -0.521, -0.924, 0.752, -0.065, 0.095, "                             \
  "-0.356, 0.503, -0.95]>"
#define TABLE_T                                                                                                     \
  "dense<[0.324, 0.808, 0.856, 0.283, -0.521, 0.095, -0.737, 0.139, 0.105, 0.139, "                                 \
  "-0.924, -0.356, 0.69, -0.709, -0.639, -0.247, 0.752, 0.503, 0.89, -0.615, 0.768, "                               \
  "-0.178, -0.065, -0.95]>"

/* x [2, 3, 4] flattened to rows [6, 4] around an MLP with a residual Add (OPT), whose
 * normalised rows %n are made before it. */
#define FLAT                                                                                                        \
  "input %x : f32[2, 3, 4]\n"                                                                                       \
  "param %g : f32[4] = dense<[-0.521, -0.195, -0.807, 0.936]>\n"                                                    \
  "param %w1 : f32[4, 5] = " W45 "\n"                                                                               \
  "param %w2 : f32[5, 4] = " W54 "\n"                                                                               \
  "%f : f32[6, 4] = Reshape(%x)\n"
#define FLAT_MLP(h)                                                                                                 \
  "%a : f32[6, 5] = MatMul(%n, %w1)\n"                                                                              \
  "%h : f32[6, 5] = Relu(%a)\n"                                                                                     \
  "%b : f32[6, 4] = MatMul(" h ", %w2)\n"                                                                           \
  "%r : f32[6, 4] = Add(%f, %b)\n"                                                                                  \
  "%y : f32[2, 3, 4] = Reshape(%r)\n"                                                                               \
  "output %y\n"

static const Case cases[] = {
    /* causal self-attention */
    {"attention: Where(tril, scores, finfo.min) after Mul(scale)",
     HEADS SCORES "%ss : f32[1, 2, 4, 4] = Mul(%half, %s)\n"
                  "%m : f32[1, 2, 4, 4] = Where(%lower, %ss, %min)\n" ATTEND("%m"),
     "Attention=1 Softmax=0 MatMul=0 Where=0 Mul=0 Transpose=0"},
    {"attention: Where(triu, -inf, scores) before Div(scale), K^T folded into the head transpose",
     HEADS "input %kh : f32[1, 4, 2, 3]\n"
           "%kt : f32[1, 2, 3, 4] = Transpose(%kh) {perm = [0, 2, 3, 1]}\n"
           "%s : f32[1, 2, 4, 4] = MatMul(%q, %kt)\n"
           "%m : f32[1, 2, 4, 4] = Where(%upper, %ninf, %s)\n"
           "%ss : f32[1, 2, 4, 4] = Div(%m, %two)\n" ATTEND("%ss"),
     "Attention=1 Softmax=0 Where=0 Div=0 Transpose=1"},
    {"attention: additive mask, no scale, K^T given",
     HEADS "input %kt : f32[1, 2, 3, 4]\n"
           "%s : f32[1, 2, 4, 4] = MatMul(%q, %kt)\n"
           "%m : f32[1, 2, 4, 4] = Add(%additive, %s)\n" ATTEND("%m"),
     "Attention=1 Softmax=0 Add=0 Transpose=1"},
    {"attention: mask computed from a float tril buffer (no constant folding)",
     HEADS "param %buf : f32[1, 1, 6, 6] = dense<[1, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, "
           "1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1]>\n"
           "const %zero : f32[] = dense<0>\n" SCORES "%ss : f32[1, 2, 4, 4] = Mul(%s, %half)\n"
           "%sl : f32[1, 1, 4, 4] = Slice(%buf) {starts = [0, 0, 0, 0], steps = [1, 1, 1, 1]}\n"
           "%drop : bool[1, 1, 4, 4] = Equal(%sl, %zero)\n"
           "%m : f32[1, 2, 4, 4] = Where(%drop, %ninf, %ss)\n" ATTEND("%m"),
     "Attention=1 Softmax=0 Slice=0 Equal=0 Where=0"},
    {"not attention: anti-causal mask",
     HEADS SCORES "%m : f32[1, 2, 4, 4] = Where(%upper, %s, %ninf)\n" ATTEND("%m"),
     "Attention=0 Softmax=1 MatMul=2 Where=1"},
    {"not attention: no mask", HEADS SCORES ATTEND("%s"), "Attention=0 Softmax=1 MatMul=2"},
    {"not attention: additive mask the wrong way round",
     HEADS SCORES "%m : f32[1, 2, 4, 4] = Sub(%s, %additive)\n" ATTEND("%m"), "Attention=0 Softmax=1"},

    /* what Hugging Face exports put around the attention */
    {"attention: Llama's casts before the mask and after Softmax, a folded [B, 1, T, T] mask",
     BATCH2 "%kt : f32[2, 2, 3, 4] = Transpose(%k) {perm = [0, 1, 3, 2]}\n"
            "%s : f32[2, 2, 4, 4] = MatMul(%q, %kt)\n"
            "%ss : f32[2, 2, 4, 4] = Div(%s, %two)\n"
            "%c : f32[2, 2, 4, 4] = Cast(%ss)\n"
            "%m : f32[2, 2, 4, 4] = Add(%c, %folded)\n"
            "%p : f32[2, 2, 4, 4] = Softmax(%m) {axis = 3}\n"
            "%p1 : f32[2, 2, 4, 4] = Cast(%p)\n"
            "%p2 : f32[2, 2, 4, 4] = Cast(%p1)\n"
            "%y : f32[2, 2, 4, 3] = MatMul(%p2, %v)\n"
            "output %y\n",
     "Attention=1 Softmax=0 Cast=0 MatMul=0 Add=0 Div=0"},
    {"attention: two masks (Where(tril, s, -inf), an all-0 padding mask) and a Max clamp, scaled after",
     BATCH2 "%kt : f32[2, 2, 3, 4] = Transpose(%k) {perm = [0, 1, 3, 2]}\n"
            "%s : f32[2, 2, 4, 4] = MatMul(%q, %kt)\n"
            "%w : f32[2, 2, 4, 4] = Where(%lower, %s, %ninf)\n"
            "%a : f32[2, 2, 4, 4] = Add(%w, %padding)\n"
            "%x : f32[2, 2, 4, 4] = Max(%a, %min)\n"
            "%ss : f32[2, 2, 4, 4] = Mul(%x, %half)\n"
            "%p : f32[2, 2, 4, 4] = Softmax(%ss) {axis = 3}\n"
            "%y : f32[2, 2, 4, 3] = MatMul(%p, %v)\n"
            "output %y\n",
     "Attention=1 Softmax=0 Where=0 Add=0 Max=0 Mul=0"},
    {"attention: baddbmm's 3-D products (alpha, a zero bias) reshaped to 4-D around the mask",
     BATCH2 BMM("%zeros") "output %y\n", "Attention=1 Softmax=0 MatMul=0 Mul=0 Add=0 Where=0 Reshape=1"},
    {"attention: an ALiBi bias [B*H, 1, T] in baddbmm becomes Attention's bias [1, H, 1, T]",
     BATCH2 BMM("%alibi") "output %y\n", "Attention=1 Softmax=0 MatMul=0 Add=0"},
    {"attention: grouped K/V repeated by repeat_kv (Unsqueeze, Expand, Reshape)",
     GROUPED "%ku : f32[1, 1, 1, 4, 3] = Reshape(%kh)\n"
             "%ke : f32[1, 1, 2, 4, 3] = Expand(%ku)\n"
             "%kr : f32[1, 2, 4, 3] = Reshape(%ke)\n"
             "%vu : f32[1, 1, 1, 4, 3] = Reshape(%vh)\n"
             "%ve : f32[1, 1, 2, 4, 3] = Expand(%vu)\n"
             "%vr : f32[1, 2, 4, 3] = Reshape(%ve)\n"
             "%kt : f32[1, 2, 3, 4] = Transpose(%kr) {perm = [0, 1, 3, 2]}\n"
             "%s : f32[1, 2, 4, 4] = MatMul(%q, %kt)\n"
             "%m : f32[1, 2, 4, 4] = Where(%lower, %s, %min)\n"
             "%p : f32[1, 2, 4, 4] = Softmax(%m) {axis = 3}\n"
             "%y : f32[1, 2, 4, 3] = MatMul(%p, %vr)\n"
             "output %y\n",
     "Attention=1 Expand=0 Reshape=0 Transpose=0 MatMul=0"},
    {"attention: torch's SDPA decomposition (dynamo): Q and K^T each scaled by sqrt(scale), K^T a "
     "transpose of the repeated K viewed [B*H, T, D]",
     GROUPED "const %root : f32[] = dense<0.75>\n"
             "%ku : f32[1, 1, 1, 4, 3] = Reshape(%kh)\n"
             "%ke : f32[1, 1, 2, 4, 3] = Expand(%ku)\n"
             "%k3 : f32[2, 4, 3] = Reshape(%ke)\n"
             "%kt3 : f32[2, 3, 4] = Transpose(%k3) {perm = [0, 2, 1]}\n"
             "%kt : f32[1, 2, 3, 4] = Reshape(%kt3)\n"
             "%vu : f32[1, 1, 1, 4, 3] = Reshape(%vh)\n"
             "%ve : f32[1, 1, 2, 4, 3] = Expand(%vu)\n"
             "%vr : f32[1, 2, 4, 3] = Reshape(%ve)\n"
             "%qs : f32[1, 2, 4, 3] = Mul(%q, %root)\n"
             "%kts : f32[1, 2, 3, 4] = Mul(%kt, %root)\n"
             "%s : f32[1, 2, 4, 4] = MatMul(%qs, %kts)\n"
             "%m : f32[1, 2, 4, 4] = Where(%lower, %s, %min)\n"
             "%p : f32[1, 2, 4, 4] = Softmax(%m) {axis = 3}\n"
             "%y : f32[1, 2, 4, 3] = MatMul(%p, %vr)\n"
             "output %y\n",
     "Attention=1 Expand=0 Reshape=0 Transpose=0 MatMul=0 Mul=0"},
    {"attention: one K/V head broadcast by MatMul (Falcon's multi_query)",
     GROUPED "%kt : f32[1, 1, 3, 4] = Transpose(%kh) {perm = [0, 1, 3, 2]}\n"
             "%s : f32[1, 2, 4, 4] = MatMul(%q, %kt)\n"
             "%m : f32[1, 2, 4, 4] = Where(%lower, %s, %min)\n"
             "%p : f32[1, 2, 4, 4] = Softmax(%m) {axis = 3}\n"
             "%y : f32[1, 2, 4, 3] = MatMul(%p, %vh)\n"
             "output %y\n",
     "Attention=1 Transpose=0 MatMul=0"},
    {"attention: a sliding window of 2 keys (Mistral's band mask, GPT-Neo's local layers)",
     BATCH2 "%kt : f32[2, 2, 3, 4] = Transpose(%k) {perm = [0, 1, 3, 2]}\n"
            "%s : f32[2, 2, 4, 4] = MatMul(%q, %kt)\n"
            "%w : f32[2, 2, 4, 4] = Where(%band, %s, %min)\n"
            "%p : f32[2, 2, 4, 4] = Softmax(%w) {axis = 3}\n"
            "%y : f32[2, 2, 4, 3] = MatMul(%p, %v)\n"
            "output %y\n",
     "Attention=1 Softmax=0 Where=0"},
    {"not attention: a band that misses the diagonal",
     BATCH2 "%kt : f32[2, 2, 3, 4] = Transpose(%k) {perm = [0, 1, 3, 2]}\n"
            "%s : f32[2, 2, 4, 4] = MatMul(%q, %kt)\n"
            "%w : f32[2, 2, 4, 4] = Where(%off_band, %s, %min)\n"
            "%p : f32[2, 2, 4, 4] = Softmax(%w) {axis = 3}\n"
            "%y : f32[2, 2, 4, 3] = MatMul(%p, %v)\n"
            "output %y\n",
     "Attention=0 Softmax=1"},
    /* Gemma 2's soft-cap c * tanh(s / c) between the scale and the mask (cap 2: the scores
     * here reach 6, so the tanh bends them) */
    {"attention: Gemma 2's soft-cap Mul(Tanh(Div(s, c)), c) after the scale, before a sliding window",
     BATCH2 "const %cap : f32[] = dense<2>\n"
            "%kt : f32[2, 2, 3, 4] = Transpose(%k) {perm = [0, 1, 3, 2]}\n"
            "%s : f32[2, 2, 4, 4] = MatMul(%q, %kt)\n"
            "%ss : f32[2, 2, 4, 4] = Mul(%s, %half)\n"
            "%d : f32[2, 2, 4, 4] = Div(%ss, %cap)\n"
            "%t : f32[2, 2, 4, 4] = Tanh(%d)\n"
            "%c : f32[2, 2, 4, 4] = Mul(%t, %cap)\n"
            "%w : f32[2, 2, 4, 4] = Where(%band, %c, %min)\n"
            "%p : f32[2, 2, 4, 4] = Softmax(%w) {axis = 3}\n"
            "%y : f32[2, 2, 4, 3] = MatMul(%p, %v)\n"
            "output %y\n",
     "Attention=1 Softmax=0 Tanh=0 Div=0 Mul=0 Where=0"},
    {"attention: a soft-cap by Mul(s, 1 / c) and Mul(c, tanh), a folded additive mask after it",
     BATCH2 "const %cap : f32[] = dense<4>\n"
            "const %inverse : f32[] = dense<0.25>\n"
            "%kt : f32[2, 2, 3, 4] = Transpose(%k) {perm = [0, 1, 3, 2]}\n"
            "%s : f32[2, 2, 4, 4] = MatMul(%q, %kt)\n"
            "%ss : f32[2, 2, 4, 4] = Div(%s, %two)\n"
            "%d : f32[2, 2, 4, 4] = Mul(%inverse, %ss)\n"
            "%t : f32[2, 2, 4, 4] = Tanh(%d)\n"
            "%c : f32[2, 2, 4, 4] = Mul(%cap, %t)\n"
            "%a : f32[2, 2, 4, 4] = Add(%c, %folded)\n"
            "%p : f32[2, 2, 4, 4] = Softmax(%a) {axis = 3}\n"
            "%y : f32[2, 2, 4, 3] = MatMul(%p, %v)\n"
            "output %y\n",
     "Attention=1 Softmax=0 Tanh=0 Mul=0 Add=0"},
    {"not attention: a Tanh in the score chain not multiplied back by its cap",
     BATCH2 "const %cap : f32[] = dense<2>\n"
            "%kt : f32[2, 2, 3, 4] = Transpose(%k) {perm = [0, 1, 3, 2]}\n"
            "%s : f32[2, 2, 4, 4] = MatMul(%q, %kt)\n"
            "%d : f32[2, 2, 4, 4] = Div(%s, %cap)\n"
            "%t : f32[2, 2, 4, 4] = Tanh(%d)\n"
            "%w : f32[2, 2, 4, 4] = Where(%lower, %t, %min)\n"
            "%p : f32[2, 2, 4, 4] = Softmax(%w) {axis = 3}\n"
            "%y : f32[2, 2, 4, 3] = MatMul(%p, %v)\n"
            "output %y\n",
     "Attention=0 Softmax=1 Tanh=1"},
    {"not attention: a soft-cap after the mask (a masked score becomes -c, which keeps weight)",
     BATCH2 "const %cap : f32[] = dense<2>\n"
            "%kt : f32[2, 2, 3, 4] = Transpose(%k) {perm = [0, 1, 3, 2]}\n"
            "%s : f32[2, 2, 4, 4] = MatMul(%q, %kt)\n"
            "%w : f32[2, 2, 4, 4] = Where(%lower, %s, %min)\n"
            "%d : f32[2, 2, 4, 4] = Div(%w, %cap)\n"
            "%t : f32[2, 2, 4, 4] = Tanh(%d)\n"
            "%c : f32[2, 2, 4, 4] = Mul(%t, %cap)\n"
            "%p : f32[2, 2, 4, 4] = Softmax(%c) {axis = 3}\n"
            "%y : f32[2, 2, 4, 3] = MatMul(%p, %v)\n"
            "output %y\n",
     "Attention=0 Softmax=1 Tanh=1"},
    {"not attention: a soft-cap by a trained parameter",
     BATCH2 "param %cap : f32[] = dense<2>\n"
            "%kt : f32[2, 2, 3, 4] = Transpose(%k) {perm = [0, 1, 3, 2]}\n"
            "%s : f32[2, 2, 4, 4] = MatMul(%q, %kt)\n"
            "%d : f32[2, 2, 4, 4] = Div(%s, %cap)\n"
            "%t : f32[2, 2, 4, 4] = Tanh(%d)\n"
            "%c : f32[2, 2, 4, 4] = Mul(%t, %cap)\n"
            "%w : f32[2, 2, 4, 4] = Where(%lower, %c, %min)\n"
            "%p : f32[2, 2, 4, 4] = Softmax(%w) {axis = 3}\n"
            "%y : f32[2, 2, 4, 3] = MatMul(%p, %v)\n"
            "output %y\n",
     "Attention=0 Softmax=1 Tanh=1"},
    {"attention: GPT-BigCode's multi-query scores [B, T*H, T] with the heads inside the queries",
     INNER("%keep_inner"), "Attention=1 Softmax=0 MatMul=0 Where=0 Transpose=0 Reshape=1"},
    {"not attention: the heads inside the queries, a mask wrong in head 1", INNER("%keep_wrong"),
     "Attention=0 Softmax=1"},
    {"not attention: a padding mask hides key 0 of batch row 1",
     BATCH2 "%kt : f32[2, 2, 3, 4] = Transpose(%k) {perm = [0, 1, 3, 2]}\n"
            "%s : f32[2, 2, 4, 4] = MatMul(%q, %kt)\n"
            "%w : f32[2, 2, 4, 4] = Where(%lower, %s, %ninf)\n"
            "%a : f32[2, 2, 4, 4] = Add(%w, %padded)\n"
            "%p : f32[2, 2, 4, 4] = Softmax(%a) {axis = 3}\n"
            "%y : f32[2, 2, 4, 3] = MatMul(%p, %v)\n"
            "output %y\n",
     "Attention=0 Softmax=1"},
    {"not attention: a Max clamp at -10000",
     BATCH2 "const %clamp : f32[] = dense<-10000>\n"
            "%kt : f32[2, 2, 3, 4] = Transpose(%k) {perm = [0, 1, 3, 2]}\n"
            "%s : f32[2, 2, 4, 4] = MatMul(%q, %kt)\n"
            "%a : f32[2, 2, 4, 4] = Add(%s, %folded)\n"
            "%x : f32[2, 2, 4, 4] = Max(%a, %clamp)\n"
            "%p : f32[2, 2, 4, 4] = Softmax(%x) {axis = 3}\n"
            "%y : f32[2, 2, 4, 3] = MatMul(%p, %v)\n"
            "output %y\n",
     "Attention=0 Softmax=1"},

    /* OPT's MLP on rows flattened to [B*T, C] */
    {"unflatten: Reshape [B*T, C], LayerNorm, Linear, Relu, Linear, residual Add, Reshape back",
     FLAT "%n : f32[6, 4] = LayerNorm(%f, %g) {axis = 1, epsilon = 1e-05}\n" FLAT_MLP("%h"),
     "Reshape=1 LayerNorm=1 Linear=2"}, /* the output keeps its Reshape */
    {"not unflatten: a Softmax over the rows (axis 0) in the block",
     FLAT "%n : f32[6, 4] = Softmax(%f) {axis = 0}\n" FLAT_MLP("%h"), "Reshape=2 Softmax=1"},

    /* LayerNorm */
    {"layernorm: opset < 17 chain, affine operands first",
     LN_INPUTS LN_CHAIN("Pow(%d, %two)", "2", "[2, 3, 1]") "%sc : f32[2, 3, 4] = Mul(%g, %n)\n"
                                                           "%y : f32[2, 3, 4] = Add(%b, %sc)\n"
                                                           "output %y\n",
     "LayerNorm=1 ReduceMean=0 Sub=0 Pow=0 Sqrt=0 Div=0 Mul=0 Add=0"},
    {"layernorm: Mul(d, d) and no affine part (scale of ones)",
     LN_INPUTS LN_CHAIN("Mul(%d, %d)", "2", "[2, 3, 1]") "output %n\n", "LayerNorm=1 Mul=0 Div=0"},
    {"not layernorm: cubed", LN_INPUTS LN_CHAIN("Pow(%d, %three)", "2", "[2, 3, 1]") "output %n\n",
     "LayerNorm=0 Div=1"},
    {"not layernorm: over another axis", LN_INPUTS LN_CHAIN("Pow(%d, %two)", "1", "[2, 1, 4]") "output %n\n",
     "LayerNorm=0 Div=1"},

    /* GELU */
    {"gelu: erf(x * 1/sqrt2), u * (x * 0.5)",
     GELU_INPUTS "%a : f32[2, 5] = Mul(%rsqrt2, %x)\n"
                 "%e : f32[2, 5] = Erf(%a)\n"
                 "%u : f32[2, 5] = Add(%one, %e)\n"
                 "%hx : f32[2, 5] = Mul(%x, %half)\n"
                 "%y : f32[2, 5] = Mul(%u, %hx)\n"
                 "output %y\n",
     "Gelu=1 Erf=0 Mul=0 Add=0"},
    {"gelu: erf(x / sqrt2), x * (u * 0.5)",
     GELU_INPUTS "%a : f32[2, 5] = Div(%x, %sqrt2)\n"
                 "%e : f32[2, 5] = Erf(%a)\n"
                 "%u : f32[2, 5] = Add(%e, %one)\n"
                 "%h : f32[2, 5] = Mul(%u, %half)\n"
                 "%y : f32[2, 5] = Mul(%x, %h)\n"
                 "output %y\n",
     "Gelu=1 Erf=0 Div=0 Mul=0"},
    {"gelu: tanh with Pow(x, 3)", GELU_INPUTS TANH_CHAIN("%k"), "Gelu=1 Tanh=0 Pow=0 Mul=0 Add=0"},
    {"not gelu: tanh coefficient 0.0447", GELU_INPUTS "const %k2 : f32[] = dense<0.0447>\n" TANH_CHAIN("%k2"),
     "Gelu=0 Tanh=1"},
    {"not gelu: erf(x / 2)",
     GELU_INPUTS "const %two : f32[] = dense<2>\n"
                 "%a : f32[2, 5] = Div(%x, %two)\n"
                 "%e : f32[2, 5] = Erf(%a)\n"
                 "%u : f32[2, 5] = Add(%e, %one)\n"
                 "%h : f32[2, 5] = Mul(%u, %half)\n"
                 "%y : f32[2, 5] = Mul(%x, %h)\n"
                 "output %y\n",
     "Gelu=0 Erf=1"},

    /* Linear, Embedding, re-tying */
    {"linear: MatMul + Add(bias first), MatMul of Transpose(W)",
     "input %x : f32[2, 3, 4]\n"
     "param %w : f32[4, 5] = " W45 "\n"
     "param %bias : f32[5] = " B5 "\n"
     "param %wt : f32[5, 4] = " W54 "\n"
     "%mm : f32[2, 3, 5] = MatMul(%x, %w)\n"
     "%y : f32[2, 3, 5] = Add(%bias, %mm)\n"
     "%t : f32[4, 5] = Transpose(%wt) {perm = [1, 0]}\n"
     "%y2 : f32[2, 3, 5] = MatMul(%x, %t)\n"
     "output %y\n"
     "output %y2\n",
     "Linear=2 MatMul=0 Add=0 Transpose=0"},
    {"linear: Reshape -> Gemm(transB) -> Reshape",
     "input %x : f32[2, 3, 4]\n"
     "param %w : f32[5, 4] = " W54 "\n"
     "param %bias : f32[5] = " B5 "\n"
     "%f : f32[6, 4] = Reshape(%x)\n"
     "%g : f32[6, 5] = Gemm(%f, %w, %bias) {alpha = 1.0, beta = 1.0, transA = 0, transB = 1}\n"
     "%y : f32[2, 3, 5] = Reshape(%g)\n"
     "output %y\n",
     "Linear=1 Gemm=0 Reshape=0"},
    {"not linear: Gemm alpha 2, MatMul of two activations",
     "input %x : f32[6, 4]\n"
     "input %z : f32[4, 5]\n"
     "param %w : f32[4, 5] = " W45 "\n"
     "%g : f32[6, 5] = Gemm(%x, %w) {alpha = 2.0, beta = 1.0, transA = 0, transB = 0}\n"
     "%mm : f32[6, 5] = MatMul(%x, %z)\n"
     "output %g\n"
     "output %mm\n",
     "Linear=0 Gemm=1 MatMul=1"},
    {"embedding, and a Gather along another axis that is not one",
     "input %ids : i64[2, 3]\n"
     "param %table : f32[6, 4] = " TABLE "\n"
     "%e : f32[2, 3, 4] = Gather(%table, %ids) {axis = 0}\n"
     "%g : f32[6, 2, 3] = Gather(%table, %ids) {axis = 1}\n"
     "output %e\n"
     "output %g\n",
     "Embedding=1 Gather=1"},
    {"retie: a tied LM head exported as a transposed copy of the table",
     "input %ids : i64[2, 3]\n"
     "param %wte : f32[6, 4] = " TABLE "\n"
     "param %head : f32[4, 6] = " TABLE_T "\n"
     "%e : f32[2, 3, 4] = Gather(%wte, %ids) {axis = 0}\n"
     "%y : f32[2, 3, 6] = MatMul(%e, %head)\n"
     "output %y\n",
     "Embedding=1 Linear=1 Transpose=1 Gather=0 MatMul=0"},
};

/* Deterministic inputs: floats in [-2, 2), integers in [0, 4) (valid ids for the tables
 * above), bools at random. */
static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double uniform(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (double)(rng >> 11) / 9007199254740992.0;
}

static TpTensor random_input(const TpType *t) {
  TpTensor x = {.dtype = t->dtype, .rank = t->rank};
  memcpy(x.dims, t->dims, sizeof x.dims);
  int64_t n = tp_tensor_numel(&x);
  x.data = calloc((size_t)n + 1, tp_dtype_size(t->dtype));
  TP_ASSERT(x.data);
  for (int64_t i = 0; i < n; i++) {
    if (t->dtype == TP_F32) ((float *)x.data)[i] = (float)(4 * uniform() - 2);
    else if (t->dtype == TP_I64) ((int64_t *)x.data)[i] = (int64_t)(4 * uniform());
    else if (t->dtype == TP_BOOL) ((uint8_t *)x.data)[i] = uniform() < 0.5;
    else TP_ASSERT(!"unexpected input dtype");
  }
  return x;
}

static int count_ops(const TpModule *m, const char *name) {
  int n = 0;
  for (int o = 0; o < m->nops; o++) n += !m->ops[o].dead && strcmp(tp_op_info[m->ops[o].kind].name, name) == 0;
  return n;
}

/* Every "Op=N" of the expectation holds. */
static bool counts_match(const TpModule *m, const char *expect, const char *label) {
  bool ok = true;
  char op[64];
  int want, len;
  for (const char *p = expect; sscanf(p, " %63[A-Za-z]=%d%n", op, &want, &len) == 2; p += len) {
    int got = count_ops(m, op);
    if (got != want) {
      fprintf(stderr, "%s: %d %s, expected %d\n", label, got, op, want);
      ok = false;
    }
  }
  return ok;
}

/* Same outputs within float rounding (NaN where the other has NaN). */
static bool outputs_match(const TpTensor *a, const TpTensor *b, int n, const char *label) {
  bool ok = true;
  for (int i = 0; i < n; i++) {
    TP_ASSERT(a[i].dtype == TP_F32);
    for (int64_t k = 0, numel = tp_tensor_numel(&a[i]); k < numel; k++) {
      double x = ((const float *)a[i].data)[k], y = ((const float *)b[i].data)[k];
      if (isnan(x) || isnan(y) ? isnan(x) != isnan(y) : fabs(x - y) > 1e-5 + 1e-5 * fabs(x)) {
        fprintf(stderr, "%s: output %d element %lld: %.9g before, %.9g after\n", label, i, (long long)k, x, y);
        ok = false;
        break;
      }
    }
  }
  return ok;
}

static void run_case(const Case *c) {
  static const char *const passes[] = {"fold-constants", "dce", "retie-params", "raise-transformer", "dce"};
  char text[8192];
  snprintf(text, sizeof text, "tir 1 opset 17\n%s", c->ir);
  TpDiag d;
  tp_diag_init(&d, "test_raise", c->name, stderr);
  TpModule *m = NULL;
  int rc = tp_parse_module(text, strlen(text), c->name, &m, &d);
  CHECK(rc == TP_OK);
  if (rc != TP_OK) return;
  CHECK(tp_verify(m, &d) == TP_OK);
  int nin = m->ninputs, nout = m->noutputs;
  TpTensor in[8], before[8], after[8];
  TP_ASSERT(nin <= 8 && nout <= 8);
  for (int i = 0; i < nin; i++) in[i] = random_input(&m->values[m->inputs[i]].type);
  CHECK(tp_interp_run(m, in, before, &d) == TP_OK);
  TpPassOptions po = {.verify_each = true};
  CHECK(tp_run_passes(m, passes, 5, &po, &d) == TP_OK);
  if (!counts_match(m, c->expect, c->name)) failures++;
  CHECK(m->ninputs == nin);
  CHECK(tp_interp_run(m, in, after, &d) == TP_OK);
  if (!outputs_match(before, after, nout, c->name)) failures++;
  for (int i = 0; i < nin; i++) free(in[i].data);
  for (int i = 0; i < nout; i++) free(before[i].data), free(after[i].data);
  tp_module_free(m);
}

int main(void) {
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(&cases[i]);
  if (failures) {
    fprintf(stderr, "test_raise: %d failure(s)\n", failures);
    return 1;
  }
  printf("test_raise: %zu cases ok\n", sizeof cases / sizeof *cases);
  return 0;
}
