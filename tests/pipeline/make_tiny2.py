"""Writes tiny2.onnx, the model pipe_plan.c implements by hand (run with Debian's
/usr/bin/python3; the output is committed):

    x      = wte[tokens] + wpe + frozen.shift
    y      = x + cumsum(x over tokens) / (position + 1)    causal prefix mean
    logits = (y * gain) @ head.weight_t + head.bias

with B=4, T=8, V=256, C=8; head.weight_t is an exact transpose of wte (re-tied by the
plan, so wte lives on the first and the last stage), head.bias an Identity of shared.bias.
The prefix mean stands in for attention: a token slice needs the x rows of every earlier
slice, and its backward adds into their gradients."""
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

B, T, V, C = 4, 8, 256, 8
here = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(11)
wte = (rng.standard_normal((V, C)) * 0.5).astype(np.float32)
vals = {
    "wte": wte,
    "wpe": (rng.standard_normal((T, C)) * 0.5).astype(np.float32),
    "frozen.shift": (rng.standard_normal(C) * 0.1).astype(np.float32),
    "gain": (1 + rng.standard_normal(C) * 0.1).astype(np.float32),
    "shared.bias": (rng.standard_normal(V) * 0.1).astype(np.float32),
    "head.weight_t": np.ascontiguousarray(wte.T),
}
counts = np.arange(1, T + 1, dtype=np.float32).reshape(T, 1)
nodes = [
    helper.make_node("Gather", ["wte", "tokens"], ["emb"], name="embed"),
    helper.make_node("Add", ["emb", "wpe"], ["x0"], name="add_pos"),
    helper.make_node("Add", ["x0", "frozen.shift"], ["x"], name="add_shift"),
    helper.make_node("Constant", [], ["axis"], name="axis",
                     value=numpy_helper.from_array(np.array(1, np.int64))),
    helper.make_node("CumSum", ["x", "axis"], ["prefix"], name="prefix_sum"),
    helper.make_node("Constant", [], ["counts"], name="counts", value=numpy_helper.from_array(counts)),
    helper.make_node("Div", ["prefix", "counts"], ["mean"], name="prefix_mean"),
    helper.make_node("Add", ["x", "mean"], ["y"], name="mix"),
    helper.make_node("Mul", ["y", "gain"], ["z"], name="scale"),
    helper.make_node("Identity", ["shared.bias"], ["head.bias"], name="alias_bias"),
    helper.make_node("MatMul", ["z", "head.weight_t"], ["mm"], name="head"),
    helper.make_node("Add", ["mm", "head.bias"], ["logits"], name="head_bias"),
]
g = helper.make_graph(
    nodes, "tiny2",
    [helper.make_tensor_value_info("tokens", TensorProto.INT64, [B, T])],
    [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [B, T, V])],
    initializer=[numpy_helper.from_array(v, k) for k, v in vals.items()])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
m.ir_version = 8
onnx.checker.check_model(m)
onnx.save(m, os.path.join(here, "tiny2.onnx"))
