#!/usr/bin/python3
"""Writes the small causal-LM ONNX models of tests/bad-input/causal (committed, so the tests
need no Python). Regenerate: /usr/bin/python3 tests/bad-input/causal/make_causal_models.py
Each model is one attention layer (ids [2, 4] -> embedding -> 2 heads of 2 -> logits [2, 4, 8])
whose score chain, between the product node 'scores' and the Softmax, fails raise-transformer's
causality proof in exactly one way; cases-causal.txt pins the --slices refusal of each."""
import os

import numpy as np
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
MIN = np.finfo(np.float32).min
T = 4
LOWER = np.tril(np.ones((T, T), bool))


def const(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def model(name, chain, consts=(), params=()):
    """chain(s) -> (nodes, result): the ops from the scores 's' to the Softmax input, reading
    consts as Constant nodes (how torch.onnx.export writes buffers and literals) and params as
    float initializers (which train)."""
    rng = np.random.default_rng(0)
    w = lambda n, shape: const(n, rng.standard_normal(shape).astype(np.float32) * 0.5)
    inits = [w("E", (8, 4)), w("Wq", (4, 4)), w("Wk", (4, 4)), w("Wv", (4, 4)), w("Wo", (4, 8)),
             const("heads", np.array([2, T, 2, 2], np.int64)), const("rows", np.array([2, T, 4], np.int64))]
    inits += list(params)
    n = helper.make_node
    nodes = [n("Constant", [], [t.name], value=t, name=t.name + "_constant") for t in consts]
    nodes.append(n("Gather", ["E", "ids"], ["x"], name="embed"))
    for p, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [n("MatMul", ["x", "W" + p], [p + "_flat"], name=p + "_proj"),
                  n("Reshape", [p + "_flat", "heads"], [p + "_split"], name=p + "_split"),
                  n("Transpose", [p + "_split"], [p + "_heads"], perm=perm, name=p + "_heads")]
    nodes.append(n("MatMul", ["q_heads", "k_heads"], ["s"], name="scores"))
    chain_nodes, masked = chain("s")
    nodes += chain_nodes
    nodes += [n("Softmax", [masked], ["p"], axis=-1, name="softmax"),
              n("MatMul", ["p", "v_heads"], ["y_heads"], name="attend"),
              n("Transpose", ["y_heads"], ["y_split"], perm=[0, 2, 1, 3], name="merge"),
              n("Reshape", ["y_split", "rows"], ["y"], name="rows"),
              n("MatMul", ["y", "Wo"], ["logits"], name="head")]
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, T])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [2, T, 8])], initializer=inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="make_causal_models")
    m.ir_version = 8
    with open(os.path.join(HERE, name + ".onnx"), "wb") as f:
        f.write(m.SerializeToString())


def where(keep, fill, name="mask"):
    """Where(keep, s, fill) over the scores."""
    def chain(s):
        return [helper.make_node("Where", ["keep", s, "fill"], ["masked"], name=name)], "masked"
    return chain, [const("keep", keep), const("fill", np.array(fill, np.float32))]


def then(first, op, operand, name):
    """first's chain, then op(result, operand) named `name`."""
    def chain(s):
        nodes, r = first(s)
        return nodes + [helper.make_node(op, [r, "operand"], ["out"], name=name)], "out"
    return chain


causal, causal_inits = where(LOWER, MIN)
additive = np.where(LOWER, 0, MIN).astype(np.float32)

# the upper triangle kept: queries see the keys after them
model("anti_causal", *where(~LOWER | np.eye(T, dtype=bool), MIN))
# a padding mask on top of the causal one hides key 0 of batch row 1
padding = np.zeros((2, 1, 1, T), np.float32)
padding[1, 0, 0, 0] = MIN
model("padding", then(causal, "Add", "operand", "padding"), causal_inits + [const("operand", padding)])
# GPT-2's older -10000 fill, not the float minimum
model("fill_small", *where(LOWER, -1e9))
# an additive mask of -1e9
model("additive_small", lambda s: ([helper.make_node("Add", [s, "operand"], ["out"], name="mask")], "out"),
      [const("operand", np.where(LOWER, 0, -1e9).astype(np.float32))])
# a bare Tanh before the mask: not Gemma 2's soft-cap tanh(s / c) * c (raise-softcap.tir has those)
model("softcap", lambda s: ([helper.make_node("Tanh", [s], ["capped"], name="softcap"),
                             helper.make_node("Where", ["keep", "capped", "fill"], ["out"], name="mask")], "out"),
      causal_inits)
# a clamp at -10000 after the additive mask
model("clamp", then(lambda s: ([helper.make_node("Add", [s, "additive"], ["added"], name="mask")], "added"),
                    "Max", "operand", "clamp"),
      [const("additive", additive), const("operand", np.array(-1e4, np.float32))])
# scores scaled by a negative factor
model("negative_scale", then(causal, "Mul", "operand", "scale"), causal_inits + [const("operand", np.array(-0.5, np.float32))])
# a different scale per key
model("uneven_scale", then(causal, "Mul", "operand", "scale"),
      causal_inits + [const("operand", np.array([1, 1, 1, 2], np.float32))])
# the masked scores scaled by 1e-7: finfo.min * 1e-7 may keep weight in the softmax
model("tiny_scale", then(causal, "Mul", "operand", "scale"), causal_inits + [const("operand", np.array(1e-7, np.float32))])
# a mask made from the token ids at run time
model("runtime_mask", lambda s: ([helper.make_node("Unsqueeze", ["ids", "axes"], ["ids4"], name="ids4"),
                                  helper.make_node("Cast", ["ids4"], ["idsf"], to=TensorProto.FLOAT, name="idsf"),
                                  helper.make_node("Add", [s, "idsf"], ["out"], name="mask")], "out"),
      [const("axes", np.array([1, 2], np.int64))])
# the scores as the divisor: 2 / s is not a scale of s
model("scores_divisor", lambda s: (causal(s)[0] + [helper.make_node("Div", ["operand", "masked"], ["out"], name="scale")], "out"),
      causal_inits + [const("operand", np.array(2, np.float32))])
# a trained temperature (a float initializer trains): raising would freeze it
model("param_scale", then(causal, "Mul", "operand", "scale"), causal_inits, [const("operand", np.array(0.5, np.float32))])
