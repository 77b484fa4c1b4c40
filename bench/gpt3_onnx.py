"""Writes a full-size GPT-3-shaped ONNX model (GPT-2 architecture, tied LM head exported as
a separate transposed copy of the token table, as torch.onnx's legacy exporter does) whose
weights are external data in a sparse file that is never written: only its size is set.
The graph follows tests/fixtures/gpt_o17_erf_tied_bias_static node for node (opset 17,
static shapes, erf GELU, boolean causal mask), so tokpipec raises it the same way.
usage: gpt3_onnx.py OUT_DIR LAYERS HIDDEN HEADS [SEQ [VOCAB]]"""
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def main():
    out, layers, hidden, heads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    seq = int(sys.argv[5]) if len(sys.argv) > 5 else 2048
    vocab = int(sys.argv[6]) if len(sys.argv) > 6 else 50257
    batch, head_dim = 1, hidden // heads
    inits, nodes, offset = [], [], [0]

    def weight(name, dims):  # float32 external data, 64-byte aligned in weights.bin
        tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=dims)
        nbytes = 4 * int(np.prod(dims))
        tensor.data_location = TensorProto.EXTERNAL
        for k, v in (("location", "weights.bin"), ("offset", str(offset[0])), ("length", str(nbytes))):
            tensor.external_data.add(key=k, value=v)
        offset[0] += (nbytes + 63) // 64 * 64
        inits.append(tensor)
        return name

    def const(name, array):
        nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array, name)))
        return name

    def node(op, inputs, output, **attrs):
        nodes.append(helper.make_node(op, inputs, [output], **attrs))
        return output

    mask = numpy_helper.from_array(np.triu(np.ones((1, 1, seq, seq), dtype=bool), k=1), "causal_mask")
    inits.append(mask)
    x = node("Gather", [weight("wte.weight", [vocab, hidden]), "idx"], "/wte/Gather_output_0")
    x = node("Add", [x, weight("onnx::Add_wpe", [seq, hidden])], "/Add_output_0")
    eps = 1e-5
    for i in range(layers):
        p = "/h.%d" % i

        def linear(inp, name, n_in, n_out, tag):
            mm = node("MatMul", [inp, weight("onnx::MatMul_%d_%s" % (i, tag), [n_in, n_out])], p + name + "/MatMul_output_0")
            return node("Add", [weight("h.%d%s.bias" % (i, name.replace("/", ".")), [n_out]), mm], p + name + "/Add_output_0")

        ln = node("LayerNormalization", [x, weight("h.%d.ln_1.weight" % i, [hidden]), weight("h.%d.ln_1.bias" % i, [hidden])],
                  p + "/ln_1/LayerNormalization_output_0", axis=-1, epsilon=eps)
        qkv = linear(ln, "/attn/c_attn", hidden, 3 * hidden, "qkv")
        sizes = const(p + "/attn/Constant_output_0", np.array([hidden] * 3, dtype=np.int64))
        nodes.append(helper.make_node("Split", [qkv, sizes], [p + "/attn/Split_output_%d" % k for k in range(3)], axis=2))
        shape = np.array([batch, seq, heads, head_dim], dtype=np.int64)
        q, k, v = (node("Reshape", [p + "/attn/Split_output_%d" % j, const(p + "/attn/Constant_%d_output_0" % (j + 1), shape)],
                        p + "/attn/Reshape_%d_output_0" % j, allowzero=0) for j in range(3))
        q = node("Transpose", [q], p + "/attn/Transpose_output_0", perm=[0, 2, 1, 3])
        v = node("Transpose", [v], p + "/attn/Transpose_1_output_0", perm=[0, 2, 1, 3])
        k = node("Transpose", [k], p + "/attn/Transpose_2_output_0", perm=[0, 2, 3, 1])
        s = node("MatMul", [q, k], p + "/attn/MatMul_output_0")
        s = node("Mul", [s, const(p + "/attn/Constant_4_output_0", np.array(head_dim ** -0.5, dtype=np.float32))], p + "/attn/Mul_output_0")
        s = node("Where", ["causal_mask", const(p + "/attn/Constant_5_output_0", np.array(-np.inf, dtype=np.float32)), s],
                 p + "/attn/Where_output_0")
        s = node("Softmax", [s], p + "/attn/Softmax_output_0", axis=-1)
        a = node("MatMul", [s, v], p + "/attn/MatMul_1_output_0")
        a = node("Transpose", [a], p + "/attn/Transpose_3_output_0", perm=[0, 2, 1, 3])
        a = node("Reshape", [a, const(p + "/attn/Constant_6_output_0", np.array([batch, seq, hidden], dtype=np.int64))],
                 p + "/attn/Reshape_3_output_0", allowzero=0)
        a = linear(a, "/attn/c_proj", hidden, hidden, "attn_proj")
        x = node("Add", [x, a], p + "/Add_output_0")
        ln = node("LayerNormalization", [x, weight("h.%d.ln_2.weight" % i, [hidden]), weight("h.%d.ln_2.bias" % i, [hidden])],
                  p + "/ln_2/LayerNormalization_output_0", axis=-1, epsilon=eps)
        h = linear(ln, "/c_fc", hidden, 4 * hidden, "fc")
        g = node("Div", [h, const(p + "/gelu/Constant_output_0", np.array(2 ** 0.5, dtype=np.float32))], p + "/gelu/Div_output_0")
        g = node("Erf", [g], p + "/gelu/Erf_output_0")
        g = node("Add", [g, const(p + "/gelu/Constant_1_output_0", np.array(1.0, dtype=np.float32))], p + "/gelu/Add_output_0")
        g = node("Mul", [h, g], p + "/gelu/Mul_output_0")
        g = node("Mul", [g, const(p + "/gelu/Constant_2_output_0", np.array(0.5, dtype=np.float32))], p + "/gelu/Mul_1_output_0")
        g = linear(g, "/c_proj", 4 * hidden, hidden, "proj")
        x = node("Add", [x, g], p + "/Add_1_output_0")
    x = node("LayerNormalization", [x, weight("ln_f.weight", [hidden]), weight("ln_f.bias", [hidden])],
             "/ln_f/LayerNormalization_output_0", axis=-1, epsilon=eps)
    node("MatMul", [x, weight("onnx::MatMul_head", [hidden, vocab])], "logits")  # the tied head, transposed copy

    graph = helper.make_graph(nodes, "gpt3", [helper.make_tensor_value_info("idx", TensorProto.INT64, [batch, seq])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, seq, vocab])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="bench/gpt3_onnx.py")
    onnx.save(model, out + "/model.onnx")
    with open(out + "/weights.bin", "wb") as f:
        f.truncate(offset[0])  # sparse: no weight byte is ever written
    print("%s: %d layers, hidden %d, %d heads, %.2f G parameters, weights.bin %d bytes (sparse)"
          % (out, layers, hidden, heads, offset[0] / 4e9, offset[0]))


main()
