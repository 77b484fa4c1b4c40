"""Writes the ONNX models of tests/train (run with Debian's /usr/bin/python3; the outputs
are committed). tiny.onnx is the model tiny_plan.c implements by hand:

    logits = (wte[tokens] + wpe + frozen.shift) @ head.weight_t + head.bias

with B=2, T=8, V=256, C=8; head.weight_t is an exact transpose of wte (an exporter's folded
weight tying, re-tied by the plan) and head.bias an Identity of shared.bias (an exporter's
alias of a de-duplicated initializer). wpe is stored as typed float_data, the rest as
raw_data. Variants: tiny_ext/ (external data), and models whose initializers do not match
the plan (bad_shape, bad_dtype, missing)."""
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

B, T, V, C = 2, 8, 256, 8
here = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(7)
wte = (rng.standard_normal((V, C)) * 0.5).astype(np.float32)
wpe = (rng.standard_normal((T, C)) * 0.5).astype(np.float32)
shift = (rng.standard_normal(C) * 0.1).astype(np.float32)
bias = (rng.standard_normal(V) * 0.1).astype(np.float32)


def model(inits):
    nodes = [
        helper.make_node("Gather", ["wte", "tokens"], ["emb"], name="embed"),
        helper.make_node("Add", ["emb", "wpe"], ["x0"], name="add_pos"),
        helper.make_node("Add", ["x0", "frozen.shift"], ["x"], name="add_shift"),
        helper.make_node("Identity", ["shared.bias"], ["head.bias"], name="alias_bias"),
        helper.make_node("MatMul", ["x", "head.weight_t"], ["mm"], name="head"),
        helper.make_node("Add", ["mm", "head.bias"], ["logits"], name="head_bias"),
    ]
    g = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, [B, T])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [B, T, V])],
        initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def good(overrides={}):
    vals = {"wte": wte, "wpe": wpe, "frozen.shift": shift, "shared.bias": bias,
            "head.weight_t": np.ascontiguousarray(wte.T)}
    vals.update(overrides)
    inits = []
    for name, v in vals.items():
        if v is None:
            continue
        if name == "wpe" and v.dtype == np.float32:
            inits.append(helper.make_tensor(name, TensorProto.FLOAT, v.shape, v.flatten().tolist()))
        else:
            inits.append(numpy_helper.from_array(v, name))
    return model(inits)


onnx.save(good(), os.path.join(here, "tiny.onnx"))
os.makedirs(os.path.join(here, "tiny_ext"), exist_ok=True)
ext = good()
for t in ext.graph.initializer:  # all data in weights.bin, as from_array + save_as_external_data
    if t.HasField("raw_data") is False:
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t), t.name))
onnx.save(ext, os.path.join(here, "tiny_ext", "model.onnx"), save_as_external_data=True,
          all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
onnx.save(good({"wpe": np.zeros((2 * T, C), np.float32)}), os.path.join(here, "bad_shape.onnx"))
onnx.save(good({"frozen.shift": shift.astype(np.float16)}), os.path.join(here, "bad_dtype.onnx"))
onnx.save(good({"shared.bias": None}), os.path.join(here, "missing.onnx"))
